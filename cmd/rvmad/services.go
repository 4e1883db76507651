package main

import (
	"log/slog"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/devices"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/jbmtbudget"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/kmodmetrics"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/service"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sockets"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/softroce"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sysfs"
)

// buildServices lists rvmad's services in start order (they stop in
// reverse). A new service is added here.
func buildServices(cfg config.Config, log *slog.Logger) []service.Service {
	fs := sysfs.New(cfg.SysfsRoot)
	return []service.Service{
		// Provision first, so the devices it creates exist for the rest.
		softroce.New(softroce.Netlink{FS: fs}, log.With("service", "softroce"), cfg),
		devices.New(fs, log.With("service", "devices"), cfg),
		kmodmetrics.NewActiveAccess(cfg.SysfsRoot, log.With("service", "activeaccess")),
		kmodmetrics.NewMailboxes(cfg.SysfsRoot, log.With("service", "mailboxes")),
		kmodmetrics.NewJBMT(cfg.SysfsRoot, log.With("service", "jbmt")),
		jbmtbudget.New(log.With("service", "jbmt-budget"), cfg),
		sockets.New(log.With("service", "sockets"), cfg),
	}
}
