//go:build lab

package dht

import (
	"fmt"
	"strings"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// What a failing lab test logs of an AM table's state (the tests are in
// package dht_test).

func qpString(qp *verbs.QP) string {
	if qp == nil {
		return "no QP"
	}
	a, err := qp.Query()
	if err != nil {
		return fmt.Sprintf("QP %d: %v", qp.QPN(), err)
	}
	return fmt.Sprintf("QP %d (to %d) %v sq_psn %d rq_psn %d", qp.QPN(), a.DestQPN, a.State, a.SQPSN, a.RQPSN)
}

// DebugState describes the source's counters and its QP.
func (a *AMTable) DebugState() string {
	if !a.mu.TryLock() {
		return "AM source: busy"
	}
	defer a.mu.Unlock()
	return fmt.Sprintf("AM source: posted %d reaped %d queued %d status %+v token %d, %s",
		a.posted, a.reaped, len(a.pend), a.st, a.token, qpString(a.k.qp))
}

// DebugState describes every source's state at the target.
func (t *AMTarget) DebugState() string {
	if !t.mu.TryLock() {
		return "AM target: the handler holds its lock"
	}
	defer t.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "AM target: %+v", t.Stats())
	for _, c := range t.byQPN {
		a := c.am
		fmt.Fprintf(&b, "; source %d: status %+v sent %d reposts %d sqUsed %d needSend %v, %s",
			a.serial, a.st, a.sent, len(a.reposts), a.sqUsed, a.needSend, qpString(c.qp))
	}
	return b.String()
}
