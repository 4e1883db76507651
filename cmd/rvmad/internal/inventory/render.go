package inventory

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes inv as indented JSON.
func WriteJSON(w io.Writer, inv Inventory) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(inv); err != nil {
		return fmt.Errorf("inventory: %w", err)
	}
	return nil
}

// WriteTable writes inv as three aligned tables: ports, GIDs, and
// character devices. It returns the first write error.
func WriteTable(w io.Writer, inv Inventory) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tPORT\tSTATE\tPHYS_STATE\tRATE\tLINK_LAYER\tNETDEV\tMTU\tNODE_GUID\tFW")
	if len(inv.Devices) == 0 {
		fmt.Fprintln(tw, "(no RDMA devices)")
	}
	for _, d := range inv.Devices {
		if len(d.Ports) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t%s\t-\t%s\t%s\n", d.Name, dash(d.Parent), dash(d.NodeGUID), dash(d.FWVersion))
		}
		for _, p := range d.Ports {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
				d.Name, p.Port, dash(p.StateName), dash(p.PhysStateName), dash(p.Rate), dash(p.LinkLayer),
				dash(p.Netdev), mtu(p), dash(d.NodeGUID), dash(d.FWVersion))
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "DEVICE\tPORT\tINDEX\tGID\tTYPE\tNETDEV")
	for _, d := range inv.Devices {
		for _, p := range d.Ports {
			for _, g := range p.GIDs {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", d.Name, p.Port, g.Index, g.GID, dash(g.Type), dash(g.Netdev))
			}
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "DEVICE\tCHAR_DEVICES")
	for _, d := range inv.Devices {
		fmt.Fprintf(tw, "%s\t%s\n", d.Name, dash(strings.Join(d.CharDevices, " ")))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("inventory: %w", err)
	}
	return nil
}

// mtu shows "1024/1500" (active RDMA MTU / netdev MTU) when both are known.
func mtu(p Port) string {
	switch {
	case p.ActiveMTU > 0 && p.NetdevMTU > 0:
		return strconv.Itoa(p.ActiveMTU) + "/" + strconv.Itoa(p.NetdevMTU)
	case p.NetdevMTU > 0:
		return "-/" + strconv.Itoa(p.NetdevMTU)
	}
	return "-"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
