package rvma

import (
	"errors"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// TestSendQueue checks the bookkeeping of selectively signaled puts: a
// lone put is signaled, a stream signals one in putSignalEvery, a
// completion reports the puts before it, and unsignaled puts left behind
// the last signaled work request ask for a tail.
func TestSendQueue(t *testing.T) {
	var q sendQueue
	var flags []verbs.SendFlags
	post := func(wrs ...verbs.SendWR) error {
		for _, wr := range wrs {
			flags = append(flags, wr.Flags)
		}
		return nil
	}
	ops := make([]*PutOp, 40)
	seqs := make([]uint64, 40)
	put := func(i int) {
		ops[i] = &PutOp{}
		if err := q.postPut(post, verbs.SendWR{}, uint64(i), ops[i], func(s uint64) { seqs[i] = s }); err != nil {
			t.Fatal(err)
		}
	}
	signaled := func(i int) bool { return flags[i]&verbs.SendSignaled != 0 }

	put(0)
	if !signaled(0) {
		t.Fatal("a lone put is unsignaled")
	}
	if done := q.completed(seqs[0], true); len(done) != 0 || q.needsTail() {
		t.Fatalf("lone put: %d reported, tail %v", len(done), q.needsTail())
	}

	// A stream of 33 puts: signaled at 1, 1+16, 1+32.
	for i := 1; i <= 33; i++ {
		put(i)
	}
	var sig []int
	for i := 1; i <= 33; i++ {
		if signaled(i) {
			sig = append(sig, i)
		}
	}
	if len(sig) != 3 || sig[0] != 1 || sig[1] != 17 || sig[2] != 33 {
		t.Fatalf("signaled puts %v, want [1 17 33]", sig)
	}
	if done := q.completed(seqs[17], true); len(done) != 16 || done[0].op != ops[1] || done[15].op != ops[16] {
		t.Fatalf("completion of put 17 reported %d puts", len(done))
	}
	// A control send behind put 33 and an unsignaled put 34 after it.
	if err := q.postSignaled(post, verbs.SendWR{}); err != nil {
		t.Fatal(err)
	}
	ctrlSeq := q.seq
	put(34)
	if signaled(len(flags) - 1) {
		t.Fatal("put 34 signaled with two signaled work requests outstanding")
	}
	if done := q.completed(seqs[33], true); len(done) != 15 {
		t.Fatalf("completion of put 33 reported %d puts, want 15", len(done))
	}
	if q.needsTail() {
		t.Fatal("tail asked for while the control send is outstanding")
	}
	if done := q.completed(ctrlSeq, false); len(done) != 0 {
		t.Fatalf("control completion reported %d puts, want 0 (put 34 is behind it)", len(done))
	}
	if !q.needsTail() {
		t.Fatal("put 34 waits behind no signaled work request and no tail is asked for")
	}
	if err := q.postSignaled(post, verbs.SendWR{}); err != nil {
		t.Fatal(err)
	}
	if done := q.completed(q.seq, false); len(done) != 1 || done[0].op != ops[34] || q.needsTail() {
		t.Fatalf("tail completion reported %d puts", len(done))
	}

	// A failed post leaves the queue as it was.
	seq := q.seq
	fail := func(...verbs.SendWR) error { return errors.New("wrong state") }
	if err := q.postPut(fail, verbs.SendWR{}, 99, &PutOp{}, func(uint64) {}); err == nil || q.seq != seq || len(q.puts) != 0 {
		t.Fatalf("failed post recorded: %v, seq %d, %d puts", err, q.seq, len(q.puts))
	}
}
