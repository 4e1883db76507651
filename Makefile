# rdmaplus: the two commands a user types are `make demo` and `make test`.
# Both install what they need (Debian packages, the guest kernel) on first use.

GO      ?= go
export PATH := $(PATH):/usr/local/go/bin
LAB     := $(GO) run ./test/softroce

# For lab-test and lab-shell.
PKG     ?= ./pkg/verbs
RUN     ?= .
GUESTS  ?= 1
# The guest kernel: bookworm (default), trixie, sid; for lab, bench, lab-test, lab-shell.
KERNEL  ?= bookworm

.PHONY: all build setup host-deps check vet staticcheck deploy-check sockpreload unit deb test-packages lab lab-newer test test-kernels bench demo lab-test lab-shell clean
.NOTPARALLEL:

all: build

# Host packages, the guest kernel, the initramfs and the kernel module.
setup:
	$(LAB) setup

build: setup
	$(GO) build ./...

# What cgo needs to build pkg/verbs on the host (vet, staticcheck and the
# unit tests): a C compiler and rdma-core's headers. Installed when missing
# (as root; otherwise the apt-get command is printed); nothing else of the
# lab's (qemu, the guest kernel) is needed by the host checks.
HOST_DEPS := gcc libc6-dev libibverbs-dev librdmacm-dev
host-deps:
	@missing=; for p in $(HOST_DEPS); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q ' installed$$' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "missing host packages; install them with: apt-get install --no-install-recommends$$missing"; exit 1; fi; \
		echo "installing host packages:$$missing"; \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 $$missing; }; \
	fi

# The host checks, without booting a guest or fetching a guest kernel (about
# a minute and a half once staticcheck is in Go's module cache): gofmt and go vet (with
# and without the lab tag), staticcheck, the Prometheus rules' checks and the
# host unit tests with -race.
check: vet staticcheck deploy-check sockpreload unit

# The sockets-over-RDMA shim (cmd/sockpreload) and its conformance program,
# into build/sockpreload/ (librdmaplus-sockets.so, conformance); the unit
# tests run the program plainly and under the shim on the host.
sockpreload: host-deps
	$(MAKE) -C cmd/sockpreload O=$(abspath build/sockpreload)

# gofmt fails on any unformatted file, then go vet with and without the lab tag.
vet: host-deps
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags lab ./...

# staticcheck with its default checks, over the host and the lab build
# (-matrix: code used only by lab tests is not reported unused). The version
# is pinned here; go run fetches it into Go's module cache on first use.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
staticcheck: host-deps
	printf 'host:\nlab: -tags=lab\n' | $(STATICCHECK) -matrix ./...

unit: host-deps
	$(GO) test -race ./...

# The operators' Prometheus rules (deploy/prometheus): promtool checks them
# and runs their unit tests; cmd/rvmad's Go tests use promtool too. A
# promtool on PATH is used; otherwise the one of Debian's prometheus package,
# unpacked into build/promtool (the package is not installed: that would
# start a Prometheus server).
PROMTOOL_DIR := build/promtool
PROMTOOL     ?= $(or $(shell command -v promtool 2>/dev/null),$(PROMTOOL_DIR)/usr/bin/promtool)

deploy-check: $(PROMTOOL)
	cd deploy/prometheus && $(abspath $(PROMTOOL)) check rules rvmad-alerts.yml
	cd deploy/prometheus && $(abspath $(PROMTOOL)) test rules rvmad-alerts_test.yml

$(PROMTOOL_DIR)/usr/bin/promtool:
	rm -rf $(PROMTOOL_DIR) && mkdir -p $(PROMTOOL_DIR)
	cd $(PROMTOOL_DIR) && { apt-get download prometheus || { apt-get update -q && apt-get download prometheus; }; }
	dpkg-deb --fsys-tarfile $(PROMTOOL_DIR)/prometheus_*.deb | tar -x -C $(PROMTOOL_DIR) ./usr/bin/promtool
	rm -f $(PROMTOOL_DIR)/prometheus_*.deb
	$@ --version

# The Debian packages rdmaplus-dkms and rvmad, from the commit checked out
# (uncommitted changes are left out), into build/deb/ (packaging/).
deb:
	packaging/build-deb

# The packages installed for real: lintian, then apt install in a Debian 13
# chroot, DKMS builds for the lab's trixie and bookworm kernels, apt purge
# leaves nothing (test/packages/run.sh; about 2.5 minutes with its cache warm);
# then a guest of each kernel loads the module DKMS built and passes the
# smoke and JBMT suites (about a minute).
DKMS_KO := build/packages/ko
test-packages: setup
	test/packages/run.sh
	$(LAB) run -kernel bookworm -kmod "$$(ls $(DKMS_KO)/6.1.*/rdmaplus.ko)" smoke-1guest jbmt
	$(LAB) run -kernel trixie -kmod "$$(ls $(DKMS_KO)/6.12.*/rdmaplus.ko)" smoke-1guest jbmt

# Every suite in test/softroce/suites, the lab's self-tests included.
lab: setup
	$(LAB) all -kernel $(KERNEL)

# Every suite on every guest kernel (bookworm, trixie, sid), one after the
# other; the first run on a machine also makes the trixie and sid build
# chroots (about a minute each).
test-kernels: setup
	$(LAB) all -kernel all

# The module's, Active Access's, JBMT's and RVMA's suites on Debian 13's kernel
# (6.12), within CI's time: the first run on a machine fetches that kernel
# and makes its build chroot.
NEWER_KERNEL ?= trixie
NEWER_SUITES ?= aa-2guests aa-dht aa-kmod aa-lifecycle aa-model aa-perftest \
	aa-usecases jbmt jbmt-2guests kmod-repost-fork rvma-guests rvma-loopback
lab-newer: setup
	$(LAB) run -kernel $(NEWER_KERNEL) $(NEWER_SUITES)

# The host checks (make check), the Debian packages, every lab suite, then
# the module's suites on a newer kernel (in this order: the Makefile runs
# serially, and setup runs once).
test: check test-packages lab lab-newer

# Benchmarks (test/softroce/bench): figures for docs/benchmarks.md.
bench: setup
	$(LAB) bench -kernel $(KERNEL)

demo: setup
	$(LAB) run test/softroce/demo/demo.sh

# One package's lab tests: make lab-test PKG=./pkg/verbs RUN='TestWrite' GUESTS=2
lab-test: setup
	$(LAB) gotest -kernel $(KERNEL) -guests $(GUESTS) $(PKG) -test.run '$(RUN)' -test.v

# A shell in a booted guest: make lab-shell GUESTS=2 (Ctrl-A X quits).
lab-shell: setup
	$(LAB) shell -kernel $(KERNEL) -guests $(GUESTS)

clean:
	rm -rf build
