#!/usr/bin/env bash
# make test-packages: the Debian packages, installed for real.
#
# Builds rvmad and rdmaplus-dkms (packaging/build-deb, into build/deb/),
# checks them with lintian, then, in a Debian 13 (trixie) chroot:
#   1. installs the lab's trixie kernel (image and headers) with apt;
#   2. apt install ./rvmad_*.deb ./rdmaplus-dkms_*.deb: DKMS builds and
#      installs rdmaplus.ko for that kernel;
#   3. installs Debian 12's kernel (the lab's bookworm 6.1, image and
#      headers), then trixie-backports' 7.x: DKMS builds the module for
#      each new kernel by itself (AUTOINSTALL), as on a kernel upgrade;
#   4. checks dkms status, each .ko's vermagic against a module of the same
#      kernel, modprobe's view, rvmad's files and its start with the shipped
#      configuration;
#   5. apt purge: nothing of either package is left (DKMS tree, modules,
#      unit, configuration, user);
#   6. dkms add of the module's directory as in a checkout (kmod/dkms.conf
#      reads the version from the source), build, remove.
# The built modules are copied to build/packages/ko/<abi>/rdmaplus.ko.
#
# PACKAGES_SUITE=bookworm runs the same in a Debian 12 chroot: the lab's
# bookworm kernel first, then bookworm-backports' current one.
#
# The chroot is made once with debootstrap --variant=minbase and kept in the
# lab's cache ($SOFTROCE_CACHE or ~/.cache/rdmaplus-softroce, as
# chroots/<suite>-packages, next to the lab's build chroots); each run works
# on an overlay of it (build/packages/root), so every run starts from the
# same fresh system. Downloaded packages are kept in the cache
# (apt/<suite>-packages/archives). Needs root and the network. Besides
# build/ and the cache, it changes the host only by installing the Debian
# packages it needs there when they are missing (debootstrap, lintian, and
# make deb's debhelper, dh-dkms, dpkg-dev).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

work=$repo/build/packages
log=$work/test.log
cache=${SOFTROCE_CACHE:-$HOME/.cache/rdmaplus-softroce}
suite=${PACKAGES_SUITE:-trixie}
case "$suite" in trixie | bookworm) ;; *) echo "test/packages: PACKAGES_SUITE is trixie or bookworm" >&2; exit 2 ;; esac
base=$cache/chroots/$suite-packages
archives=$cache/apt/$suite-packages/archives
root=$work/root

# The private mount namespace: the overlay and every bind mount end with
# this script, however it ends.
if [ -z "${RDMAPLUS_PKGTEST_NS:-}" ]; then
	[ "$(id -u)" = 0 ] || { echo "test/packages: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
	export RDMAPLUS_PKGTEST_NS=1
	exec unshare --mount --propagation private -- "$0" "$@"
fi

t0=$(date +%s)
step_name=setup
mkdir -p "$work"
: >"$log"
say() { echo "$*"; echo "== $*" >>"$log"; }
step() { step_name=$*; say "-- $* ($(( $(date +%s) - t0 )) s)"; }
fail() {
	echo "FAIL: $step_name: $*" | tee -a "$log"
	exit 1
}
on_exit() {
	local rc=$?
	if [ $rc != 0 ]; then
		echo "---- last lines of $log:"
		tail -n 30 "$log"
		echo "FAIL: test-packages (step: $step_name; log $log; the chroot's changes are kept in $work/root.upper)"
	fi
}
trap on_exit EXIT
# run: a command whose output goes to the log only.
run() {
	echo "+ $*" >>"$log"
	"$@" >>"$log" 2>&1
}
inroot() {
	chroot "$root" /usr/bin/env -i DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 HOME=/root \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}
apt_in() { run inroot apt-get -y -q -o Dpkg::Use-Pty=0 "$@"; }

ensure_host_packages() {
	local need=() p
	for p in "$@"; do
		dpkg-query -W -f '${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || need+=("$p")
	done
	[ ${#need[@]} = 0 ] && return
	say "installing on the host: ${need[*]}"
	run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" ||
		{ run apt-get update -q && run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"; }
}

# The host's Debian mirrors (as the lab finds them), else deb.debian.org.
host_mirror() { # $1: debian or debian-security
	cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
		grep -oE "(https?|file)://[^ ]*/$1/?( |$)" | head -n 1 | tr -d ' ' | sed 's,/$,,' || true
}
mirror=${DEBIAN_MIRROR:-$(host_mirror debian)}
mirror=${mirror:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-$(host_mirror debian-security)}
security=${security:-http://deb.debian.org/debian-security}

# ---------------------------------------------------------------- packages
step "make deb"
ensure_host_packages debootstrap lintian kmod xz-utils zstd
tb=$(date +%s)
packaging/build-deb | tee -a "$log"
say "make deb took $(( $(date +%s) - tb )) s"
deb_rvmad=$(ls build/deb/rvmad_*.deb)
deb_dkms=$(ls build/deb/rdmaplus-dkms_*.deb)
version=$(dpkg-deb -f "$deb_rvmad" Version)
release=$(sed -n 's/^#define RDMAPLUS_RELEASE "\(.*\)"$/\1/p' build/deb/src/kmod/rdmaplus_main.c)
[ "$(dpkg-deb -f "$deb_dkms" Version)" = "$version" ] || fail "the two packages' versions differ"
case "$version" in "$release" | "$release"+git*) ;; *) fail "version $version does not start with the module's release $release" ;; esac
dpkg-deb -f "$deb_dkms" Depends | grep -q '\bdkms\b' || fail "rdmaplus-dkms does not depend on dkms"

step "lintian"
# Every tag of every level, experimental ones too; overrides (each
# explained in packaging/debian/*.lintian-overrides) are allowed.
set +e
lintian_out=$(lintian --pedantic -I -E --fail-on error,warning,info,pedantic,experimental build/deb/*.changes 2>&1)
rc=$?
set -e
lintian_out=$(echo "$lintian_out" | grep -v 'running with root privileges' || true)
if [ $rc != 0 ] || [ -n "$lintian_out" ]; then
	echo "$lintian_out" | tee -a "$log"
	fail "lintian (exit $rc)"
fi
say "lintian: no tags at any level ($(lintian --pedantic -I -E --show-overrides build/deb/*.changes 2>/dev/null | grep -c '^O:') overridden, explained in packaging/debian/*.lintian-overrides)"

# ------------------------------------------------------------------ chroot
step "the $suite chroot"
if [ ! -f "$base/.complete" ] || ! chroot "$base" apt-get --version >/dev/null 2>&1; then
	say "making $base with debootstrap (once; about a minute)"
	rm -rf "$base.tmp"
	mkdir -p "$(dirname "$base")"
	run debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg "$suite" "$base.tmp" "$mirror"
	cat >"$base.tmp/etc/apt/sources.list" <<-EOF
		deb $mirror $suite main
		deb $mirror $suite-updates main
		deb $security $suite-security main
	EOF
	# In bookworm, its backports for a newer kernel (apt takes from there
	# only what it is asked to, -t bookworm-backports).
	[ "$suite" = bookworm ] && echo "deb $mirror bookworm-backports main" >>"$base.tmp/etc/apt/sources.list"
	# In trixie, Debian 12's suites for its 6.1 kernel (only what trixie
	# lacks is taken from there: priority 100).
	[ "$suite" = trixie ] && cat >>"$base.tmp/etc/apt/sources.list" <<-EOF
		deb $mirror bookworm main
		deb $mirror bookworm-updates main
		deb $security bookworm-security main
	EOF
	[ "$suite" = trixie ] && cat >"$base.tmp/etc/apt/preferences.d/bookworm" <<-EOF
		Package: *
		Pin: release n=bookworm
		Pin-Priority: 100

		Package: *
		Pin: release n=bookworm-security
		Pin-Priority: 100

		Package: *
		Pin: release n=bookworm-updates
		Pin-Priority: 100
	EOF
	# As the lab's chroots: the mirror may serve Release files past their
	# Valid-Until (signatures are still checked).
	printf 'Acquire::Check-Valid-Until "false";\nAcquire::Languages "none";\n' >"$base.tmp/etc/apt/apt.conf.d/90package-test"
	# No services start in the chroot, and kernel images get no initramfs
	# (nothing boots from it).
	printf '#!/bin/sh\nexit 101\n' >"$base.tmp/usr/sbin/policy-rc.d"
	chmod +x "$base.tmp/usr/sbin/policy-rc.d"
	run chroot "$base.tmp" dpkg-divert --local --rename --add /usr/sbin/update-initramfs
	ln -s /bin/true "$base.tmp/usr/sbin/update-initramfs"
	echo "$suite" >"$base.tmp/.complete"
	rm -rf "$base"
	mv "$base.tmp" "$base"
fi

# A fresh system each run: an overlay on the cached chroot.
umount -R "$root" 2>/dev/null || true
rm -rf "$root" "$work/root.upper" "$work/root.work" "$work/ko"
mkdir -p "$root" "$work/root.upper" "$work/root.work" "$archives"
mount -t overlay overlay -o "lowerdir=$base,upperdir=$work/root.upper,workdir=$work/root.work" "$root"
mount -t proc proc "$root/proc"
mount --bind "$archives" "$root/var/cache/apt/archives"
mkdir -p "$root/debs"
mount --bind "$repo/build/deb" "$root/debs"
mount -o remount,bind,ro "$root/debs"
# The module builds with one job: the machine is shared.
mkdir -p "$root/etc/dkms/framework.conf.d"
echo 'parallel_jobs=1' >"$root/etc/dkms/framework.conf.d/package-test.conf"
# trixie-backports, for the newest kernel of the lab's table (7.x); apt
# takes from there only what it is asked to (-t trixie-backports).
[ "$suite" = trixie ] && echo "deb $mirror trixie-backports main" >"$root/etc/apt/sources.list.d/trixie-backports.list"
apt_in update || fail "apt-get update in the chroot"

# The lab's kernels: the ABI the lab runs (its cache), or the one the
# archive's metapackage names now.
lab_abi() { # $1: flavour
	local f=$cache/kernels/$1/.abi
	[ -f "$f" ] && awk '{print $2}' "$f"
}
meta_abi() { # $1: release
	inroot apt-cache depends -t "$1" linux-headers-amd64 2>/dev/null | sed -n 's/.*Depends: linux-headers-\(.*-amd64\)$/\1/p' | head -n 1
}
pick_abi() { # $1: flavour
	local abi
	abi=$(lab_abi "$1" || true)
	if [ -n "$abi" ] && inroot apt-cache show "linux-headers-$abi" >/dev/null 2>&1; then
		echo "$abi"
		return
	fi
	[ -n "$abi" ] && echo "the lab's $1 kernel $abi is no longer in the archive; taking the current one" >&2
	meta_abi "$1"
}
# The kernel installed before the packages, and the one installed after.
abi_first=$(pick_abi "$suite")
[ -n "$abi_first" ] || fail "no $suite kernel ABI"
# In trixie, bookworm's packages have a low priority and apt takes them
# where trixie has none; bookworm-backports' must be asked for (-t).
if [ "$suite" = trixie ]; then
	abi_later=$(pick_abi bookworm)
	later_release=bookworm
	later_target=()
else
	abi_later=$(meta_abi bookworm-backports)
	later_release=bookworm-backports
	later_target=(-t bookworm-backports)
fi
[ -n "$abi_later" ] || fail "no $later_release kernel ABI"
kernels=("$abi_first" "$abi_later")
# In trixie, the 7.x kernel of trixie-backports last (its headers build
# with trixie's gcc).
abi_new=""
if [ "$suite" = trixie ]; then
	abi_new=$(meta_abi trixie-backports)
	[ -n "$abi_new" ] || fail "no trixie-backports kernel ABI"
	kernels+=("$abi_new")
fi
say "kernels: $abi_first, then $abi_later ($later_release)${abi_new:+, then $abi_new (trixie-backports)}"

step "kernel $abi_first (image and headers)"
apt_in install "linux-image-$abi_first" "linux-headers-$abi_first" || fail "apt-get install linux-image-$abi_first linux-headers-$abi_first"

# ----------------------------------------------------------------- install
step "apt install ./rvmad_*.deb ./rdmaplus-dkms_*.deb"
inroot getent passwd rvmad >/dev/null && fail "a user rvmad exists before the install"
ti=$(date +%s)
apt_in install "/debs/$(basename "$deb_rvmad")" "/debs/$(basename "$deb_dkms")" || fail "apt install of the packages"
say "installed in $(( $(date +%s) - ti )) s (DKMS built the module for $abi_first)"

dkms_installed() { # $1: abi
	inroot dkms status -m rdmaplus -v "$version" -k "$1" 2>/dev/null | tee -a "$log" | grep -q "installed"
}
dkms_installed "$abi_first" || fail "dkms status: rdmaplus/$version not installed for $abi_first"

step "kernel $abi_later installed after the module (image and headers)"
apt_in install "${later_target[@]}" "linux-image-$abi_later" "linux-headers-$abi_later" ||
	fail "apt-get install linux-image-$abi_later linux-headers-$abi_later"
dkms_installed "$abi_later" || fail "dkms status: rdmaplus/$version not installed for $abi_later after its headers came"
if [ -n "$abi_new" ]; then
	step "kernel $abi_new (trixie-backports) installed after the module (image and headers)"
	apt_in install -t trixie-backports "linux-image-$abi_new" "linux-headers-$abi_new" ||
		fail "apt-get install -t trixie-backports linux-image-$abi_new linux-headers-$abi_new"
	dkms_installed "$abi_new" || fail "dkms status: rdmaplus/$version not installed for $abi_new after its headers came"
fi
say "dkms status:"
inroot dkms status 2>>"$log" | sed 's/^/    /' | tee -a "$log"

# ------------------------------------------------------------------ checks
step "the modules"
ref_module() { # $1: abi; a module of that kernel's own build
	local f
	for f in "$root/lib/modules/$1/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko"* \
		"$cache"/kernels/*/"$1/lib/modules/$1/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko"*; do
		[ -f "$f" ] && { echo "$f"; return; }
	done
}
kos=()
for abi in "${kernels[@]}"; do
	ko=$(ls "$root/lib/modules/$abi/updates/dkms/rdmaplus.ko"* 2>/dev/null | head -n 1)
	[ -n "$ko" ] || fail "no rdmaplus.ko in /lib/modules/$abi/updates/dkms"
	mkdir -p "$work/ko/$abi"
	case "$ko" in
	*.ko.xz) xz -dc "$ko" >"$work/ko/$abi/rdmaplus.ko" ;;
	*.ko.zst) zstd -dcq "$ko" >"$work/ko/$abi/rdmaplus.ko" ;;
	*.ko.gz) gzip -dc "$ko" >"$work/ko/$abi/rdmaplus.ko" ;;
	*) cp "$ko" "$work/ko/$abi/rdmaplus.ko" ;;
	esac
	out=$work/ko/$abi/rdmaplus.ko
	vm=$(modinfo -F vermagic "$out")
	[ "$(modinfo -F version "$out")" = "$release" ] || fail "$abi: modinfo version $(modinfo -F version "$out"), want $release"
	ref=$(ref_module "$abi")
	if [ -n "$ref" ]; then
		want=$(modinfo -F vermagic "$ref")
		[ "$vm" = "$want" ] || fail "$abi: vermagic '$vm', the kernel's rdma_rxe has '$want'"
		say "$abi: ${ko#"$root"}: vermagic '$vm' (the kernel's rdma_rxe.ko: the same)"
	else
		case "$vm" in "$abi "*) ;; *) fail "$abi: vermagic '$vm' is not for $abi" ;; esac
		say "$abi: ${ko#"$root"}: vermagic '$vm' (no module of that kernel here to compare with: release checked)"
	fi
	grep -q "^updates/dkms/rdmaplus.ko[^:]*:" "$root/lib/modules/$abi/modules.dep" ||
		fail "$abi: modules.dep does not list updates/dkms/rdmaplus.ko"
	kos+=("$out")
	# modprobe finds it with the rest of the kernel's modules.
	inroot modprobe -n -v -S "$abi" rdmaplus >>"$log" 2>&1 || fail "modprobe -n -S $abi rdmaplus"
	inroot modprobe -n -v -S "$abi" rdmaplus 2>&1 | grep -q "insmod .*/modules/$abi/updates/dkms/rdmaplus.ko" ||
		fail "modprobe -n -S $abi rdmaplus does not load updates/dkms/rdmaplus.ko"
	say "$abi: modprobe rdmaplus (dry run) loads $(inroot modprobe -n -v -S "$abi" rdmaplus 2>&1 | grep -c '^insmod') modules, rdmaplus from updates/dkms"
done

step "rvmad's files"
unit=""
for u in /usr/lib/systemd/system/rvmad.service /lib/systemd/system/rvmad.service; do
	[ -f "$root$u" ] && { unit=$u; break; }
done
[ -n "$unit" ] || fail "no rvmad.service"
for f in /usr/bin/rvmad /etc/default/rvmad /etc/rvmad/rvmad.json /usr/share/man/man8/rvmad.8.gz \
	/usr/share/doc/rvmad/rvmad.md /usr/share/doc/rvmad/operations.md /usr/share/doc/rvmad/copyright \
	/usr/share/doc/rvmad/examples/rvmad.example.json /usr/share/doc/rvmad/examples/rvmad-alerts.yml \
	/usr/share/doc/rvmad/examples/rvmad-alerts_test.yml /usr/share/doc/rvmad/examples/rvmad-dashboard.json \
	"/usr/src/rdmaplus-$version/dkms.conf" "/usr/src/rdmaplus-$version/Kbuild"; do
	[ -f "$root$f" ] || fail "missing $f"
done
grep -qx 'ExecStart=/usr/bin/rvmad serve $RVMAD_OPTS' "$root$unit" || fail "$unit: ExecStart is not /usr/bin/rvmad serve \$RVMAD_OPTS"
grep -qx 'EnvironmentFile=-/etc/default/rvmad' "$root$unit" || fail "$unit does not read /etc/default/rvmad"
grep -qx 'Documentation=man:rvmad(8) file:///usr/share/doc/rvmad/rvmad.md' "$root$unit" || fail "$unit: Documentation= is not rvmad(8) and rvmad.md"
[ -L "$root/etc/systemd/system/multi-user.target.wants/rvmad.service" ] || fail "rvmad.service is not enabled"
grep -qx 'RVMAD_OPTS=--config=/etc/rvmad/rvmad.json' "$root/etc/default/rvmad" || fail "/etc/default/rvmad does not name /etc/rvmad/rvmad.json"
inroot dpkg-query -W -f '${Conffiles}\n' rvmad | grep -q '/etc/rvmad/rvmad.json' || fail "/etc/rvmad/rvmad.json is not a conffile"
inroot dpkg-query -W -f '${Conffiles}\n' rvmad | grep -q '/etc/default/rvmad' || fail "/etc/default/rvmad is not a conffile"
got=$(inroot rvmad version)
case "$got" in "rvmad $version "*) ;; *) fail "rvmad version says '$got', want $version" ;; esac
say "$got"
# Every flag of `rvmad serve` is in the manual page.
for flag in $(inroot rvmad serve --help 2>&1 | sed -n 's/^  -\([a-z-]*\).*/\1/p'); do
	zcat "$root/usr/share/man/man8/rvmad.8.gz" | grep -qF -- "\\-\\-${flag//-/\\-}" || fail "rvmad(8) does not describe --$flag"
done
# The service's command line with the shipped configuration: rvmad starts
# (in a network namespace of its own) and stops cleanly on SIGTERM.
set +e
unshare --net chroot "$root" /bin/sh -c '. /etc/default/rvmad; /usr/bin/rvmad serve $RVMAD_OPTS & pid=$!; sleep 3; kill -TERM $pid; wait $pid' >"$work/rvmad.log" 2>&1
rc=$?
set -e
cat "$work/rvmad.log" >>"$log"
[ $rc = 0 ] || fail "rvmad serve \$RVMAD_OPTS with the shipped configuration: exit $rc (want 0 after SIGTERM)"
grep -q 'rvmad ready to serve' "$work/rvmad.log" || fail "rvmad serve \$RVMAD_OPTS did not get ready"
say "rvmad serve with /etc/default/rvmad and /etc/rvmad/rvmad.json: started, exit 0 on SIGTERM"
inroot getent passwd rvmad >/dev/null && fail "the packages created a user rvmad"

# ------------------------------------------------------------------- purge
step "apt purge rvmad rdmaplus-dkms"
apt_in purge rvmad rdmaplus-dkms || fail "apt purge"
left=()
for p in rvmad rdmaplus-dkms; do
	s=$(inroot dpkg-query -W -f '${db:Status-Abbrev}' "$p" 2>/dev/null || true)
	[ -z "$s" ] || [ "$s" = "un " ] || [ "${s:0:2}" = "pn" ] || left+=("dpkg status of $p: '$s'")
done
for f in /var/lib/dkms/rdmaplus "/usr/src/rdmaplus-$version" /usr/bin/rvmad "$unit" \
	/etc/systemd/system/multi-user.target.wants/rvmad.service /etc/default/rvmad /etc/rvmad /usr/share/doc/rvmad \
	/usr/share/doc/rdmaplus-dkms /usr/share/man/man8/rvmad.8.gz; do
	[ -e "$root$f" ] || [ -L "$root$f" ] && left+=("$f")
done
for abi in "${kernels[@]}"; do
	grep -q rdmaplus "$root/lib/modules/$abi/modules.dep" && left+=("rdmaplus in /lib/modules/$abi/modules.dep")
done
while IFS= read -r f; do left+=("$f"); done < <(cd "$root" && find . -xdev \( -path ./proc -o -path ./debs \) -prune -o \
	\( -iname '*rdmaplus*' -o -iname '*rvmad*' \) -print | sed 's,^\.,,')
inroot getent passwd rvmad >/dev/null && left+=("user rvmad")
if [ ${#left[@]} != 0 ]; then
	printf '    left behind: %s\n' "${left[@]}" | tee -a "$log"
	fail "the purge left files behind"
fi
say "nothing of either package is left (DKMS tree, /usr/src, modules and modules.dep, unit, its enablement, configuration, docs, user)"

# ------------------------------------------------------------ from a checkout
step "dkms add of kmod/ as in a checkout"
rm -rf "$root/tmp/rdmaplus-kmod"
cp -r build/deb/src/kmod "$root/tmp/rdmaplus-kmod"
run inroot dkms add /tmp/rdmaplus-kmod || fail "dkms add /tmp/rdmaplus-kmod"
inroot dkms status -m rdmaplus | grep -q "^rdmaplus/$release" || fail "dkms add: the version is not $release"
run inroot dkms build -m rdmaplus -v "$release" -k "$abi_first" || fail "dkms build rdmaplus/$release -k $abi_first"
inroot dkms status -m rdmaplus -v "$release" -k "$abi_first" | grep -q built || fail "dkms status: not built"
run inroot dkms remove "rdmaplus/$release" --all || fail "dkms remove"
rm -rf "$root/usr/src/rdmaplus-$release" "$root/tmp/rdmaplus-kmod"
[ ! -e "$root/var/lib/dkms/rdmaplus" ] || fail "dkms remove left /var/lib/dkms/rdmaplus"
say "dkms add/build/remove of the module's directory: rdmaplus/$release built for $abi_first"

# -------------------------------------------------------------------- done
chroot_procs() { # processes running in the chroot
	local p r
	for p in /proc/[0-9]*; do
		r=$(readlink "$p/root" 2>/dev/null) || continue
		case "$r" in "$root" | "$root"/*) echo "${p#/proc/} $(tr '\0' ' ' <"$p/cmdline")" ;; esac
	done
}
# dkms prints its progress dots from a `sleep 3` loop, whose last sleep can
# outlive the build by a few seconds.
for _ in $(seq 10); do
	[ -z "$(chroot_procs)" ] && break
	sleep 1
done
if ! umount -R "$root" 2>>"$log"; then
	say "processes left in the chroot: $(chroot_procs)"
	fail "unmounting the chroot"
fi
rm -rf "$root" "$work/root.upper" "$work/root.work"
say "modules DKMS built, for booting a guest with them:"
for ko in "${kos[@]}"; do say "    ${ko#"$repo/"}"; done
say "PASS: test-packages ($version in $suite; $(( $(date +%s) - t0 )) s; log $log)"
