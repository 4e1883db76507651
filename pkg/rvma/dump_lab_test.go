//go:build lab

package rvma

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// labDump describes ep's puts, links, views and windows for a lab test
// that gave up waiting: what a hang left behind. Where another goroutine
// holds the endpoint's, a link's, a view's or a window's lock, it says
// "busy" instead of waiting.
func labDump(ep *Endpoint) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	try := func(mu *sync.Mutex, what string) bool {
		if mu.TryLock() {
			return true
		}
		p("  %s: busy", what)
		return false
	}
	p("endpoint %v", ep.addr)
	var links []*link
	if try(&ep.mu, "ep.mu") {
		p("  puts in flight: %d", len(ep.puts))
		ids := make([]uint64, 0, len(ep.puts))
		for id := range ep.puts {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		for _, id := range ids {
			op := ep.puts[id]
			qpn := uint32(0)
			if op.st != nil {
				qpn = op.st.qp.QPN()
			}
			p("    id %d: mb %v off %d len %d gen %d qp %d refusals %d flushes %d", id, op.mb, op.off, op.n, op.gen, qpn, op.refusals, op.flushes)
		}
		for k, q := range ep.queues {
			p("  queue %v %v: %d waiting", k.dst, k.mb, len(q))
		}
		links = ep.allLinksLocked()
		ep.mu.Unlock()
		p("  %+v", ep.Stats()) // takes ep.mu
	}
	for _, l := range links {
		p("  link %d peer %v dial %v", l.id, l.peer, l.dial)
		for i := range l.stripes {
			st := l.stripes[i].Load()
			if st == nil {
				p("    stripe %d: none", i)
				continue
			}
			p("    stripe %d: qp %d up %v dead %v fault %d credits %d/%d ctrl %d", i, st.qp.QPN(), st.up.Load(), st.dead.Load(), st.fault.Load(), len(st.credits), cap(st.credits), st.ctrlOut.Load())
		}
		if !try(&l.mu, "link.mu") {
			continue
		}
		views := make([]*remoteView, 0, len(l.views))
		for _, v := range l.views {
			views = append(views, v)
		}
		p("    connected %d err %v", l.connected, l.err)
		l.mu.Unlock()
		for _, v := range views {
			if !try(&v.mu, "view.mu") {
				continue
			}
			if v.sv == nil {
				p("    view %v: slot %d unresolved, err %v", v.mb, v.slot, v.err)
			} else {
				e := v.sv.entry
				p("    view %v: slot %d seq %d state %v head %d ndesc %d floor %d mine %v", v.mb, v.slot, e.Seq, e.State, e.Head, e.NDesc, v.sv.floor, v.sv.mine)
			}
			v.mu.Unlock()
		}
	}
	for _, w := range ep.e.table.Values() {
		if !try(&w.mu, "window.mu") {
			continue
		}
		st := w.st
		p("  window %v: kid %d counted %v state %v nextGen %d head %d seq %d pushed seq %d head %d, stats %+v", w.mailbox, w.kid, st.counted, st.state, st.nextGen, st.head, st.seq, w.pushed.Seq, w.pushed.Head, st.stats)
		for _, bf := range st.pending {
			p("    pending gen %d state %v bytes %d ops %d threshold %d bound %v binding %v registered %v", bf.gen, bf.state, bf.bytes, bf.ops, bf.threshold, bf.bound, bf.binding, bf.registered)
		}
		p("    held %d, waiting %d, kept %d, toBind %d, toUnbind %d, toRegister %d", len(st.held), len(st.waiting), len(st.kept), len(st.toBind), len(st.toUnbind), len(st.toRegister))
		w.mu.Unlock()
	}
	return b.String()
}
