package kmodmetrics

import (
	"log/slog"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

// NewActiveAccess returns the "activeaccess" service: the module's Active
// Access counters (kernel/rdmaplus/aa under the sysfs mounted at
// sysfsRoot: "/sys", or a fixture tree in tests) as rdmaplus_aa_*.
func NewActiveAccess(sysfsRoot string, log *slog.Logger) *Service[kmod.Stats] {
	s := newService("activeaccess", "Active Access", sysfsRoot, "kernel/rdmaplus/aa", "rdmaplus_aa_", kmod.StatsFromDir, log)
	s.gauge("hooks_armed", "1 while the module's data-path probes on rdma_rxe are registered (some page is active), else 0 (kernel: hooks_armed).",
		func(st kmod.Stats) uint64 {
			if st.HooksArmed {
				return 1
			}
			return 0
		})
	s.gauge("domains", "Active Access domains (access logs) alive, all processes (kernel: domains).", func(st kmod.Stats) uint64 { return st.Domains })
	s.gauge("memory_regions", "Memory regions with at least one active page (kernel: mrs).", func(st kmod.Stats) uint64 { return st.MRs })
	s.gauge("pages", "Active 4 KiB pages (kernel: pages).", func(st kmod.Stats) uint64 { return st.Pages })
	s.counter("log_entries", "Access log entries written (kernel: entries).", func(st kmod.Stats) uint64 { return st.Entries })
	s.counter("log_bytes", "Access log bytes written, entry headers and data (kernel: bytes).", func(st kmod.Stats) uint64 { return st.Bytes })
	s.counter("log_data_bytes", "Access data copied into logs (WLD, RLD) (kernel: data_bytes).", func(st kmod.Stats) uint64 { return st.DataBytes })
	s.counter("write_packets", "Incoming RDMA WRITE packets that touched an active page (kernel: writes).", func(st kmod.Stats) uint64 { return st.Writes })
	s.counter("read_packets", "RDMA READ response packets that touched an active page (kernel: reads).", func(st kmod.Stats) uint64 { return st.Reads })
	s.counter("atomics", "Remote atomics that touched an active page (kernel: atomics).", func(st kmod.Stats) uint64 { return st.Atomics })
	s.counter("hidden_write_packets", "Write packets kept out of memory by W=0 (kernel: hidden_writes).", func(st kmod.Stats) uint64 { return st.HiddenWrites })
	s.counter("zeroed_read_packets", "Read packets served as zeros by R=0 (kernel: zeroed_reads).", func(st kmod.Stats) uint64 { return st.ZeroedReads })
	s.counter("refused_write_packets", "Write packets refused because a log was full; the writer got an error (kernel: refused_writes).", func(st kmod.Stats) uint64 { return st.RefusedWrites })
	s.counter("refused_atomics", "Atomics refused (W=0, R=0 or a full log); the requester got an error (kernel: refused_atomics).", func(st kmod.Stats) uint64 { return st.RefusedAtomics })
	s.counter("lost_read_packets", "Read packets served as zeros because a log was full (kernel: lost_reads).", func(st kmod.Stats) uint64 { return st.LostReads })
	s.counter("missed_probes", "Probe hits the kernel skipped, each an access the module did not see; must stay 0 (kernel: missed).", func(st kmod.Stats) uint64 { return st.Missed })
	return s
}

// NewMailboxes returns the "mailboxes" service: the module's counters of
// RVMA's counted mailboxes (kernel/rdmaplus/rvma under the sysfs mounted at
// sysfsRoot) as rdmaplus_rvma_*. They are module-wide, every process's
// windows together; pkg/rvma's collector has each window's own.
func NewMailboxes(sysfsRoot string, log *slog.Logger) *Service[kmod.MailboxStats] {
	s := newService("mailboxes", "counted mailbox (RVMA)", sysfsRoot, "kernel/rdmaplus/rvma", "rdmaplus_rvma_", kmod.MailboxStatsFromDir, log)
	s.gauge("windows", "Counted mailbox windows alive, all processes (kernel: windows).", func(st kmod.MailboxStats) uint64 { return st.Windows })
	s.gauge("ranges", "Gated buffer ranges, pending and published, all processes (kernel: ranges).", func(st kmod.MailboxStats) uint64 { return st.Ranges })
	s.gauge("memory_regions", "Memory regions with a gated range (kernel: mrs).", func(st kmod.MailboxStats) uint64 { return st.MRs })
	s.counter("placed_packets", "Incoming RDMA WRITE packets the module placed into open buffers (kernel: packets).", func(st kmod.MailboxStats) uint64 { return st.Packets })
	s.counter("placed_bytes", "Bytes the module placed into open buffers (kernel: bytes).", func(st kmod.MailboxStats) uint64 { return st.Bytes })
	s.counter("published_records", "Completion records published, one per completed or ended buffer (kernel: published).", func(st kmod.MailboxStats) uint64 { return st.Published })
	s.counter("refused_packets", "Write packets refused (a closed buffer, straddling its edge, another key, or no memory to keep a key); the writer got a remote access error (kernel: refused).", func(st kmod.MailboxStats) uint64 { return st.Refused })
	s.counter("unparsed_packets", "Placed packets whose headers the module could not parse, counted as bytes but never as a message's end; must stay 0 (kernel: unparsed).", func(st kmod.MailboxStats) uint64 { return st.Unparsed })
	s.counter("translated_messages", "Write messages to a window's mailbox key that the module translated to the buffer of their generation (kernel: translated).", func(st kmod.MailboxStats) uint64 { return st.Translated })
	s.counter("untranslated_messages", "Write messages to a window's mailbox key that named no open buffer or did not fit it; rxe refused them with a remote access error (kernel: untranslated).", func(st kmod.MailboxStats) uint64 { return st.Untranslated })
	s.counter("key_nomem_packets", "First packets refused because their message's key could not be kept for want of memory, on a queue pair not named to the module; also in refused_packets (kernel: nomem).", func(st kmod.MailboxStats) uint64 { return st.NoMem })
	return s
}

// NewJBMT returns the "jbmt" service: the module's JBMT counters
// (kernel/rdmaplus/jbmt under the sysfs mounted at sysfsRoot) as
// rdmaplus_jbmt_*, the whole host's registrations and connections.
func NewJBMT(sysfsRoot string, log *slog.Logger) *Service[kmod.JBMTStats] {
	s := newService("jbmt", "JBMT", sysfsRoot, "kernel/rdmaplus/jbmt", "rdmaplus_jbmt_", kmod.JBMTStatsFromDir, log)
	s.gauge("regions", "Memory regions registered for JBMT now, all processes; none of it pinned (kernel: regions).", func(st kmod.JBMTStats) uint64 { return st.Regions })
	s.gauge("registered_bytes", "Bytes of those regions (kernel: registered_bytes).", func(st kmod.JBMTStats) uint64 { return st.RegisteredBytes })
	s.counter("registrations", "Regions registered (kernel: registrations).", func(st kmod.JBMTStats) uint64 { return st.Registrations })
	s.counter("deregistrations", "Regions deregistered by their process (kernel: deregistrations).", func(st kmod.JBMTStats) uint64 { return st.Deregistrations })
	s.counter("revoked_regions", "Regions revoked because their process closed the device or exited (kernel: revoked).", func(st kmod.JBMTStats) uint64 { return st.Revoked })
	s.gauge("peers", "Connections to and from peer hosts up now (kernel: peers).", func(st kmod.JBMTStats) uint64 { return st.Peers })
	s.counter("connects", "Connections this host made to peer hosts (kernel: connects).", func(st kmod.JBMTStats) uint64 { return st.Connects })
	s.counter("accepts", "Connections peer hosts made to this host (kernel: accepts).", func(st kmod.JBMTStats) uint64 { return st.Accepts })
	s.counter("connect_errors", "Connection attempts that failed, either way (kernel: connect_errors).", func(st kmod.JBMTStats) uint64 { return st.ConnectErrors })
	s.counter("disconnects", "Connections that went down: the peer left, died or lost its device (kernel: disconnects).", func(st kmod.JBMTStats) uint64 { return st.Disconnects })
	s.counter("gets", "Get operations this host's processes made (kernel: gets).", func(st kmod.JBMTStats) uint64 { return st.Gets })
	s.counter("puts", "Put operations this host's processes made (kernel: puts).", func(st kmod.JBMTStats) uint64 { return st.Puts })
	s.counter("get_bytes", "Bytes those gets brought here (kernel: get_bytes).", func(st kmod.JBMTStats) uint64 { return st.GetBytes })
	s.counter("put_bytes", "Bytes those puts sent (kernel: put_bytes).", func(st kmod.JBMTStats) uint64 { return st.PutBytes })
	s.counter("op_errors", "Operations that failed: a bad token, rights, range, unmapped pages, a lost connection, a timeout (kernel: op_errors).", func(st kmod.JBMTStats) uint64 { return st.OpErrors })
	s.counter("sections", "Sections this host started (kernel: sections).", func(st kmod.JBMTStats) uint64 { return st.Sections })
	s.counter("sections_served", "Peers' sections this host served (kernel: sections_served).", func(st kmod.JBMTStats) uint64 { return st.SectionsServed })
	s.counter("sections_refused", "Peers' sections this host refused: a bad token, rights, range, unmapped pages (kernel: sections_refused).", func(st kmod.JBMTStats) uint64 { return st.SectionsRefused })
	const refusals = "Peers' sections this host refused, by reason; they sum to sections_refused. bad_token: a token this host never issued (kernel: refused_noent). stale: a token of a region since revoked; the peer should ask its owner for a new one (kernel: refused_stale). permission: the region lacks the right (kernel: refused_perm). range: outside the region (kernel: refused_range). fault: the region's pages not mapped, or its process gone (kernel: refused_fault). nomem: no memory or sink on this host (kernel: refused_nomem). invalid: a malformed request (kernel: refused_inval)."
	s.counterBy("section_refusals", refusals, "reason",
		series[kmod.JBMTStats]{"bad_token", func(st kmod.JBMTStats) uint64 { return st.RefusedNoEnt }},
		series[kmod.JBMTStats]{"stale", func(st kmod.JBMTStats) uint64 { return st.RefusedStale }},
		series[kmod.JBMTStats]{"permission", func(st kmod.JBMTStats) uint64 { return st.RefusedPerm }},
		series[kmod.JBMTStats]{"range", func(st kmod.JBMTStats) uint64 { return st.RefusedRange }},
		series[kmod.JBMTStats]{"fault", func(st kmod.JBMTStats) uint64 { return st.RefusedFault }},
		series[kmod.JBMTStats]{"nomem", func(st kmod.JBMTStats) uint64 { return st.RefusedNoMem }},
		series[kmod.JBMTStats]{"invalid", func(st kmod.JBMTStats) uint64 { return st.RefusedInval }})
	s.counter("leases_expired", "Sinks granted to a peer and taken back unfinished after their lease (kernel: leases_expired).", func(st kmod.JBMTStats) uint64 { return st.LeasesExpired })
	s.gauge("pinned_pages", "Pages JBMT holds pinned now, for sections in flight either way and in cached ranges (kernel: pinned_pages).", func(st kmod.JBMTStats) uint64 { return st.PinnedPages })
	s.gauge("pin_budget_pages", "The pin budget of each side, pages: what this host's operations may hold pinned, and what it may pin to serve peers; the module parameter jbmt_pin_budget_pages sets it (kernel: pin_budget_pages).", func(st kmod.JBMTStats) uint64 { return st.PinBudgetPages })
	s.gauge("op_pinned_pages", "Pages this host's operations hold pinned now (kernel: op_pinned_pages).", func(st kmod.JBMTStats) uint64 { return st.OpPinnedPages })
	s.gauge("served_pinned_pages", "Pages pinned now to serve peers (kernel: served_pinned_pages).", func(st kmod.JBMTStats) uint64 { return st.ServedPinned })
	s.gauge("op_pinned_hwm_pages", "High-water mark of op_pinned_pages since load or its last reset (kernel: op_pinned_hwm).", func(st kmod.JBMTStats) uint64 { return st.OpPinnedHWM })
	s.gauge("served_pinned_hwm_pages", "High-water mark of served_pinned_pages since load or its last reset (kernel: served_pinned_hwm).", func(st kmod.JBMTStats) uint64 { return st.ServedPinnedHWM })
	s.counter("nacks_sent", "Peers' sections answered NOPIN because the serving budget was full; they are asked again (kernel: nacks_sent).", func(st kmod.JBMTStats) uint64 { return st.NACKsSent })
	s.counter("nacks_received", "This host's sections answered NOPIN by a peer and asked again (kernel: nacks_received).", func(st kmod.JBMTStats) uint64 { return st.NACKsReceived })
	s.counter("budget_waits", "Operations that waited for the pin budget; rising fast means the budget is too small for the load (kernel: budget_waits).", func(st kmod.JBMTStats) uint64 { return st.BudgetWaits })
	s.counter("sections_inline", "Peers' sections served at once in the completion handler, their pages resident (kernel: sections_inline).", func(st kmod.JBMTStats) uint64 { return st.SectionsInline })
	s.counter("sections_deferred", "Peers' sections served from a work item because a page had to be faulted in or the address space was locked: JBMT's asynchronous faults (kernel: sections_deferred).", func(st kmod.JBMTStats) uint64 { return st.SectionsDefer })
	s.counter("async_submitted", "Asynchronous operations this host's processes submitted (kernel: async_submitted).", func(st kmod.JBMTStats) uint64 { return st.AsyncSubmitted })
	s.counter("async_completed", "Asynchronous operations whose completion the module posted; submitted minus completed is in flight (kernel: async_completed).", func(st kmod.JBMTStats) uint64 { return st.AsyncCompleted })
	s.counter("pin_cache_hits", "Sections whose pages a cached range already held pinned: no page walk (kernel: pin_cache_hits).", func(st kmod.JBMTStats) uint64 { return st.PinCacheHits })
	s.counter("pin_cache_misses", "Sections that found no cached range and pinned their pages as a new one, with the pin cache on (kernel: pin_cache_misses).", func(st kmod.JBMTStats) uint64 { return st.PinCacheMisses })
	s.counter("pin_cache_stale_ranges", "Cached ranges dropped because their process's mapping changed (munmap, mremap, mprotect, fork, exit) (kernel: pin_cache_stale).", func(st kmod.JBMTStats) uint64 { return st.PinCacheStale })
	s.counter("pin_cache_evicted_ranges", "Idle cached ranges given back because a section needed their budget or memory was short (kernel: pin_cache_evicted).", func(st kmod.JBMTStats) uint64 { return st.PinCacheEvicted })
	s.gauge("pin_cache_pages", "Pages cached ranges hold pinned now, counted in pinned_pages and in their side's budget (kernel: pin_cache_pages).", func(st kmod.JBMTStats) uint64 { return st.PinCachePages })
	s.gauge("pin_cache_idle_pages", "Of pin_cache_pages, those no section uses now; the first given back (kernel: pin_cache_idle_pages).", func(st kmod.JBMTStats) uint64 { return st.PinCacheIdle })
	return s
}
