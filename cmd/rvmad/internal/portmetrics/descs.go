package portmetrics

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// Descs returns the descriptors of every metric the collector exports
// under a name of rvmad's own: rvmad_devices, the port state gauges, and
// the counters of every kernel file rvmad knows (the PMA counters, the
// driver's per-port and device-wide hw_counters, the CM counters). A
// counter file rvmad does not know is exported too, under a name made from
// the file's, which no list holds; dashboards and alerting rules use only
// the names Descs returns. The Collector itself stays unchecked (its
// Describe sends nothing): which of these a host has depends on its
// drivers.
func Descs() []*prometheus.Desc {
	out := []*prometheus.Desc{descDevices, descState, descPhysState, descActive, descRate, descNetdevMTU, descActiveMTU}
	seen := map[string]bool{}
	add := func(s Spec, deviceOnly bool) {
		if seen[s.Name] {
			return
		}
		seen[s.Name] = true
		l := labels
		if deviceOnly {
			l = labels[:1]
		}
		out = append(out, prometheus.NewDesc(s.Name, s.Help, l, nil))
	}
	for _, f := range sortedKeys(pmaCounters) {
		add(PortCounterSpec(f), false)
	}
	for _, f := range append(sortedKeys(hwCounters), lifespanFile) {
		add(HWCounterSpec(f, false), false)
		add(HWCounterSpec(f, true), true)
	}
	groups := make([]string, 0, len(cmGroups))
	for g := range cmGroups {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	msgs := make([]string, 0, len(cmMessages))
	for m := range cmMessages {
		msgs = append(msgs, m)
	}
	sort.Strings(msgs)
	for _, g := range groups {
		for _, m := range msgs {
			add(CMCounterSpec(g, m), false)
		}
	}
	return out
}

func sortedKeys(m map[string]known) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
