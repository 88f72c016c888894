#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Boots a Debian kernel in a small VM and runs a ctest selection of a build
# tree inside it, on that kernel, with this machine's own userland.
#
#   run-vm.sh --arch amd64 --suite bookworm --kernel linux-image-amd64 \
#             --build BUILD_DIR [--label L] [--regex R] [--exclude R] [--name NAME]
#             [--mem MiB] [--smp N] [--hugepages N] [--timeout SEC]
#             [--ctest-timeout SEC] [--ctest-jobs N] [--hugepagesz SIZE]
#             [--per-test]       each test in a process of its own, as ctest
#                                runs it (default: the selection's gtest
#                                tests one process per binary, tests/vm/batch.py)
#             [--accel auto|kvm|tcg]   (or AIRS_VM_ACCEL; auto = kvm when native)
#             (AIRS_VM_TCG_CPU: the -cpu of a TCG guest, default below)
#             [--userland host|own]  (default: host for this machine's
#                                architecture, own for another)
#             [--pre-job CMD]    a shell command run in the guest before ctest
#             [--host-setup R]   ctest -R R in the build tree here, before the
#                                boot (fixture setups that need what the guest
#                                has not: the network, the cross compiler)
#             [--fixture-exclude-setup F]  ctest -FS F in the guest (the
#                                fixtures --host-setup has set up)
#             [--tcg-exclude R]  tests not run when the guest runs under TCG
#                                (those that race a client's start against a
#                                timed load: TCG starts processes ~10x slower)
#             [--init chroot|systemd]  chroot (default): the initramfs runs
#                                the job in a chroot of the guest root;
#                                systemd: the guest root boots with systemd
#                                as PID 1 (--userland own only; its userland
#                                has systemd, D-Bus and a dpkg database) and
#                                runs the job as a service
#                                (systemd.run=), then powers off
#             [--job CMD]        a shell command run in the guest instead of
#                                ctest; its exit code is the result (77 =
#                                skipped) and its output job.log
#             [--require GLOB]   skip (77) before booting when no file
#                                matches GLOB (what the job needs from the
#                                build tree, such as the .deb)
#
# With AIRS_VM_PREPARE=1 it only fetches and builds what the guest boots
# (the kernel, busybox, the initramfs, its own userland) into the cache and
# exits 0, without a build tree: scripts/test.sh does this beside the first
# build, so the network and disk work of a fresh machine is off the VM
# stage's clock.
#
# What the guest is:
# - the kernel (vmlinuz and its modules) of the given package, downloaded for
#   the given Debian suite and architecture with `apt-get download` (a private
#   apt configuration for a suite or architecture the host does not track:
#   the host's apt state never changes), extracted, depmod'ed, cached under
#   $AIRS_VM_CACHE (default /var/cache/airs-vm);
# - a tiny initramfs (busybox-static of that architecture, the virtio, 9p,
#   ext4 and overlay modules) that mounts this host's root read-only over
#   virtio-9p with a scratch ext4 disk as an overlay on top (writes stay in
#   the guest), /tmp and /var/tmp on that ext4 disk (as on a Debian 12
#   machine), tmpfs on /run and /dev/shm, proc/sys/devtmpfs/devpts, cgroup2
#   at /sys/fs/cgroup (memory, io, cpu and pids enabled for children),
#   hugetlbfs at /dev/hugepages, the kernel's own modules at
#   /lib/modules/$(uname -r), and a writable 9p share for the results only;
# - no network device.
# With --userland own (the default for an architecture that is not this
# machine's), the root is instead a minimal Debian userland of the guest's
# architecture and of this machine's suite (the build tree links against
# this machine's :ARCH multiarch libraries, so the same versions): the
# packages below and their dependencies, extracted (mmdebstrap
# --variant=extract: no maintainer scripts, so no binfmt/qemu-user needed)
# from the Debian archive this machine's apt uses, cached under
# $AIRS_VM_CACHE/userland-$suite-$arch. The build tree's source and build
# directories are overlaid at their own paths from the host root (read-only
# 9p, writes stay in the guest). ctest's cross-compiling emulator
# (/usr/bin/qemu-aarch64 in the test commands) is an `exec "$@"` there: the
# guest runs the binaries natively.
# It chroots into that root, runs ctest in the build tree (same absolute path
# as here), writes ctest's output and exit code to the results share, and
# powers off. This script then prints the output and exits with ctest's code.
#
# Exit codes: ctest's (0 = all passed); 77 = skipped (no qemu for the
# architecture, or no usable /dev/kvm for a native guest), with a "SKIP:" line
# naming what is missing; 1 = the VM itself failed (download, boot, timeout).
# Timings of each stage are printed as "vm-timing:" lines.
set -euo pipefail

arch=amd64 suite="" kernel_pkg="" build="" label="" regex="" exclude="" tcg_exclude="" name="" userland="" pre_job="" host_setup="" fixture_exclude_setup="" init=chroot job_cmd="" require=""
mem_mib=6144 smp=2 accel_opt=${AIRS_VM_ACCEL:-auto} accel_forced=no hugepages="" hugepagesz="" vm_timeout=1800 ctest_timeout=600 ctest_jobs="" per_test=""
while (($#)); do
  case $1 in
    --arch) arch=$2; shift 2 ;;
    --accel) accel_opt=$2; accel_forced=yes; shift 2 ;;
    --suite) suite=$2; shift 2 ;;
    --kernel) kernel_pkg=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    --regex) regex=$2; shift 2 ;;
    --exclude) exclude=$2; shift 2 ;;
    --tcg-exclude) tcg_exclude=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --mem) mem_mib=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --hugepages) hugepages=$2; shift 2 ;;
    --hugepagesz) hugepagesz=$2; shift 2 ;;
    --userland) userland=$2; shift 2 ;;
    --pre-job) pre_job=$2; shift 2 ;;
    --init) init=$2; shift 2 ;;
    --job) job_cmd=$2; shift 2 ;;
    --require) require=$2; shift 2 ;;
    --host-setup) host_setup=$2; shift 2 ;;
    --fixture-exclude-setup) fixture_exclude_setup=$2; shift 2 ;;
    --timeout) vm_timeout=$2; shift 2 ;;
    --ctest-timeout) ctest_timeout=$2; shift 2 ;;
    --ctest-jobs) ctest_jobs=$2; shift 2 ;;
    --per-test) per_test=yes; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-vm.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n $kernel_pkg && -n $build ]] || { echo "run-vm.sh: --kernel and --build are required" >&2; exit 2; }
[[ $init == chroot || $init == systemd ]] || { echo "run-vm.sh: --init is chroot or systemd" >&2; exit 2; }
[[ -n $label || -n $regex ]] || label=integration
prepare=${AIRS_VM_PREPARE:-}
if [[ -z $prepare ]]; then
  [[ -f $build/CTestTestfile.cmake ]] || { echo "SKIP: ${name:-$kernel_pkg-$arch}: no build tree at $build (for arm64: scripts/cross-arm64.sh builds build-arm64)"; exit 77; }
  build=$(cd "$build" && pwd -P)
fi
[[ $build != *[[:space:]]* ]] || { echo "run-vm.sh: the build path must not contain spaces" >&2; exit 2; }
host_suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
suite=${suite:-$host_suite}
name=${name:-$suite-$kernel_pkg-$arch}
[[ -n $ctest_jobs ]] || ctest_jobs=$smp
skip() { echo "SKIP: $name: $*"; exit 77; }
if [[ -n $require && -z $prepare ]]; then
  compgen -G "$require" >/dev/null || skip "no $require (for arm64: scripts/cross-arm64.sh builds the tree and its .deb)"
fi
stamp() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(stamp)" 'BEGIN { printf "%.1f", b - a }'; }

# --- what the host must have -------------------------------------------------
case $arch in
  # -erms,-fsrm: TCG runs `rep movsb`/`rep stosb` a byte at a time, and
  # with ERMS the guest kernel zeroes pages (clear_page_erms) and copies to
  # and from user memory that way, as glibc does large copies and fills.
  # Without it they take `rep movsq`/`stosq` and vector loops, 8 bytes or
  # more a step. Measured here, a 6.1 guest read a cached file at 2.4 GB/s
  # against 0.41, booted in 7.9 s against 14.8, and ran five integration
  # tests in 13.6 s against 22.5 (docs/vm-tests.md). The mechanisms the
  # tests reach (userfaultfd, hugetlbfs, shmem, io_uring) do not depend on
  # which string routine the kernel has.
  amd64) qemu=qemu-system-x86_64 qemu_pkg=qemu-system-x86 console=ttyS0 qemu_user=qemu-x86_64 tcg_cpu=${AIRS_VM_TCG_CPU:-max,-erms,-fsrm} ;;
  # pauth-impdef: pointer authentication with QEMU's own cheap hash instead
  # of QARMA5, which TCG computes at every signed return (the guest kernel
  # signs each of its own): the kernel's page handling runs several times
  # faster. The guest sees the same features (PAC present, implementation
  # defined algorithm), as on cores that do not use QARMA.
  arm64) qemu=qemu-system-aarch64 qemu_pkg=qemu-system-arm console=ttyAMA0 qemu_user=qemu-aarch64 tcg_cpu=${AIRS_VM_TCG_CPU:-max,pauth-impdef=on} ;;
  *) echo "run-vm.sh: unsupported --arch $arch (amd64, arm64)" >&2; exit 2 ;;
esac
host_arch=$(dpkg --print-architecture)
command -v "$qemu" >/dev/null || skip "$qemu is not installed (apt-get install $qemu_pkg)"
if [[ $accel_opt == auto ]]; then
  if [[ $arch == "$host_arch" ]]; then accel_opt=kvm; else accel_opt=tcg; fi
fi
# Why KVM cannot boot a stock kernel here, or nothing when it can: no
# /dev/kvm, no access to it, or (x86) a CPU without vmx/svm, where /dev/kvm
# comes from kvm_pvm (PVM runs only guest kernels built for PVM; Debian's
# stock kernels are not) or another software-only KVM. Instant; no boot try.
kvm_unusable() {
  [[ -c /dev/kvm ]] || { echo "no /dev/kvm"; return; }
  { exec 9<>/dev/kvm; } 2>/dev/null || { echo "/dev/kvm is not usable by $(id -un) (needs read-write access, group kvm)"; return; }
  exec 9>&-
  if [[ $host_arch == amd64 ]] && ! grep -qwE 'vmx|svm' /proc/cpuinfo; then
    if [[ -d /sys/module/kvm_pvm ]]; then
      echo "/dev/kvm is kvm_pvm (the CPU has no vmx/svm; PVM boots only PVM-built guest kernels, not Debian's)"
    else
      echo "/dev/kvm exists but the CPU has no vmx/svm flag (no hardware virtualisation to run a stock kernel)"
    fi
  fi
}
why=""
if [[ $accel_opt == kvm ]]; then
  why=$(kvm_unusable)
  if [[ -n $why && $accel_forced == no && ${AIRS_VM_ACCEL:-auto} == auto ]]; then
    echo "NOTE: $name: KVM cannot boot this guest: $why; using TCG"
    accel_opt=tcg
  fi
fi
if [[ $accel_opt == kvm ]]; then
  [[ -z $why ]] || skip "--accel kvm: $why"
  accel=(-accel kvm -cpu host)
else
  accel=(-accel tcg,thread=multi -cpu "$tcg_cpu")
fi
for tool in apt-get dpkg-deb depmod cpio mkfs.ext4 timeout; do
  command -v "$tool" >/dev/null || skip "$tool is not installed"
done
[[ $EUID -eq 0 ]] || skip "must run as root (the guest mounts the host root as root)"
[[ -n $prepare || -d $build/Testing || -f $build/CTestTestfile.cmake ]] || { echo "run-vm.sh: $build is not a ctest build tree" >&2; exit 2; }

cache=${AIRS_VM_CACHE:-/var/cache/airs-vm}
kdir=$cache/$suite-$kernel_pkg-$arch
mkdir -p "$kdir"
exec 8>"$kdir/.lock"
flock 8  # one download/extract at a time per kernel; boots run in parallel

# --- apt: the host's own for its suite and architectures, else private --------
apt_private=()
host_arches=" $host_arch $(dpkg --print-foreign-architectures | tr '\n' ' ') "
if [[ $suite != "$host_suite" || $host_arches != *" $arch "* ]]; then
  adir=$cache/apt-$suite-$arch
  mkdir -p "$adir/lists/partial" "$adir/cache/archives/partial" "$adir/parts"
  # The host's Debian sources with its suite name swapped (deb822 and
  # one-line files alike); no host name is written anywhere but this cache.
  {
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [[ -f $f ]] || continue
      awk -v from="$host_suite" -v to="$suite" -v arch="$arch" '
        $1 == "deb" { uri = ""; for (i = 2; i <= NF; ++i) if ($i !~ /^\[/ && $i !~ /\]$/ && $i !~ /=/) { uri = $i; s = $(i + 1); break }
          if (uri ~ /debian/ && (s == from || index(s, from "-") == 1)) { sub("^" from, to, s); print "deb [arch=" arch "] " uri " " s " main" } }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
      [[ -f $f ]] || continue
      awk -v from="$host_suite" -v to="$suite" -v arch="$arch" '
        function flush() { if (uri ~ /debian/) { n = split(suites, s, " "); for (i = 1; i <= n; ++i)
            if (s[i] == from || index(s[i], from "-") == 1) { x = s[i]; sub("^" from, to, x); print "deb [arch=" arch "] " uri " " x " main" } }
          uri = ""; suites = "" }
        /^[[:space:]]*$/ { flush(); next }
        $1 == "URIs:" { uri = $2 } $1 == "Suites:" { $1 = ""; suites = $0 }
        END { flush() }' "$f"
    done
  } | sort -u > "$adir/sources.list"
  [[ -s $adir/sources.list ]] || { echo "run-vm.sh: found no Debian archive in the host's apt sources to derive $suite from" >&2; exit 1; }
  apt_private=(-o Dir::Etc::SourceList="$adir/sources.list" -o Dir::Etc::SourceParts="$adir/parts"
               -o Dir::State::Lists="$adir/lists" -o Dir::Cache="$adir/cache"
               -o APT::Architecture="$arch" -o APT::Architectures="$arch" -o Dir::State::status=/dev/null
               -o Debug::NoLocking=1)
  # Lists older than a day are refreshed (a kernel update removes the old .deb).
  if [[ -z $(find "$adir/lists" -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1) ]]; then
    t=$(stamp)
    apt-get "${apt_private[@]}" -qq update || { echo "run-vm.sh: apt-get update for $suite/$arch failed" >&2; exit 1; }
    echo "vm-timing: $name apt lists for $suite/$arch $(took "$t") s"
  fi
fi
apt_q() { apt-get "${apt_private[@]}" "$@"; }
cache_q() { apt-cache "${apt_private[@]}" "$@"; }

# Resolves a metapackage (linux-image-amd64) to the versioned image it pulls.
resolve_image() {
  local p=$1 dep
  for _ in 1 2 3; do
    dep=$(cache_q depends "$p:$arch" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
    [[ -n $dep ]] || break
    p=${dep%%:*}
  done
  echo "$p"
}

download() {  # package -> path of its .deb in $kdir
  local pkg=$1 deb
  deb=$(find "$kdir" -maxdepth 1 -name "${pkg}_*_${arch}.deb" | head -1)
  if [[ -z $deb ]]; then
    (cd "$kdir" && apt_q download -qq "$pkg:$arch" 2>&1 | grep -v 'unsandboxed' >&2 || true)
    deb=$(find "$kdir" -maxdepth 1 -name "${pkg}_*_${arch}.deb" | head -1)
    [[ -n $deb ]] || { echo "run-vm.sh: could not download $pkg:$arch from $suite" >&2; exit 1; }
  fi
  echo "$deb"
}

# --- kernel and busybox ---------------------------------------------------------
t=$(stamp)
image_pkg=$(resolve_image "$kernel_pkg")
kdeb=$(download "$image_pkg")
bdeb=$(download busybox-static)
echo "vm-timing: $name download $(took "$t") s ($(basename "$kdeb"))"
# --- the guest's own userland (--userland own) -----------------------------------
[[ -n $userland ]] || { if [[ $arch == "$host_arch" ]]; then userland=host; else userland=own; fi; }
# What the tests need: a shell and core tools, ctest, dbus-daemon (private
# buses), script(1), kmod, and the runtime libraries the build links.
userland_pkgs=dash,bash,libc-bin,coreutils,util-linux,bsdutils,procps,findutils,grep,sed,gawk,diffutils,tar,gzip,xz-utils,zstd
userland_pkgs+=,kmod,base-passwd,base-files,busybox,cmake,dbus-daemon
userland_pkgs+=,libstdc++6,libsdbus-c++1,liburing2,libnuma1,libspdlog1.10,libfmt9,libsystemd0,libxxhash0,libtomlplusplus3
# --init systemd: systemd as PID 1, the system bus, and dpkg with a
# database of what is there (tests/vm/dpkg-status.sh), so a .deb installs
# with its real maintainer scripts. A userland of its own.
ul_variant="" extract_hook=() ul_recipe=$userland_pkgs
if [[ $init == systemd ]]; then
  [[ $userland != host ]] || { echo "run-vm.sh: --init systemd needs --userland own" >&2; exit 2; }
  userland=own
  userland_pkgs+=,systemd,dbus,dpkg,init-system-helpers
  ul_variant=-systemd
  hook=$(cd "$(dirname "$0")" && pwd)/dpkg-status.sh
  extract_hook=(--extract-hook="$hook \"\$1\"")
  ul_recipe="$userland_pkgs $(md5sum < "$hook" | cut -c1-12)"
fi
guest_root=/ overlays=""
if [[ $userland == own ]]; then
  command -v mmdebstrap >/dev/null || skip "mmdebstrap is not installed (apt-get install mmdebstrap): it builds the $arch userland"
  guest_root=$cache/userland-$host_suite-$arch$ul_variant
  # Guests of other kernels (16k and 4k pages) share this userland.
  exec 7>"$guest_root.lock"
  flock 7
  if [[ ! -f $guest_root/.done || $(cat "$guest_root/.done") != "$ul_recipe" ]]; then
    t=$(stamp)
    src_list=""
    for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do [[ -s $f ]] && { src_list=$f; break; }; done
    [[ -n $src_list ]] || { echo "run-vm.sh: no apt sources on this machine to build the $arch userland from" >&2; exit 1; }
    rm -rf "$guest_root" "$guest_root.tmp"
    # Without the descriptors this script inherited (ctest's, a CI
    # runner's): mmdebstrap hands apt a pipe by number, and apt's hook runs
    # `cat >&N` in dash, which takes one-digit descriptors only ("Bad fd
    # number" once enough are open that the pipe lands at 10 or above). The
    # locks stay held: this shell keeps its descriptors.
    (
      for fd in $(ls /proc/$BASHPID/fd); do ((fd > 2)) && eval "exec $fd>&-"; done
      exec timeout 900 mmdebstrap --quiet --mode=root --variant=extract --architectures="$arch" \
        --include="$userland_pkgs" "${extract_hook[@]}" "$host_suite" "$guest_root.tmp" "$src_list"
    ) || { echo "run-vm.sh: mmdebstrap of the $arch userland failed" >&2; exit 1; }
    cp "$guest_root.tmp/usr/share/base-passwd/passwd.master" "$guest_root.tmp/etc/passwd"
    cp "$guest_root.tmp/usr/share/base-passwd/group.master" "$guest_root.tmp/etc/group"
    # The system users the packages' maintainer scripts (and a first boot)
    # would create (messagebus, systemd-journal, ...), from their sysusers.d.
    if [[ $init == systemd ]]; then
      if command -v systemd-sysusers >/dev/null; then
        systemd-sysusers --root="$guest_root.tmp" >/dev/null
      fi
      # awk for maintainer scripts (airs-memd's postinst): an alternative,
      # which gawk's own postinst would have made.
      update-alternatives --root "$guest_root.tmp" --quiet --install /usr/bin/awk awk /usr/bin/gawk 10
    fi
    printf '%s\n' 0123456789abcdef0123456789abcdef > "$guest_root.tmp/etc/machine-id"
    printf '#!/bin/sh\n# ctest cross-compiling emulator: the guest runs %s natively.\nexec "$@"\n' "$arch" \
      > "$guest_root.tmp/usr/bin/$qemu_user"
    chmod 755 "$guest_root.tmp/usr/bin/$qemu_user"
    echo "$ul_recipe" > "$guest_root.tmp/.done"
    mv "$guest_root.tmp" "$guest_root"
    echo "vm-timing: $name userland ($arch, $host_suite) $(took "$t") s"
  fi
  flock -u 7
fi
# The build tree's source and build directories, at their own paths: always
# in the guest's own userland; in this machine's root only where the guest
# mounts its own directories over them (/tmp and /var/tmp are on its scratch
# disk), or the guest would find an empty directory and no tests.
tree=()
if [[ -z $prepare ]]; then
  src_dir=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
  for d in $src_dir $build; do
    [[ ${#tree[@]} -gt 0 && $d == "${tree[0]}"/* ]] && continue
    tree+=("$d")
  done
fi
masked() { [[ $1 == /tmp/* || $1 == /var/tmp/* || $1 == /run/* || $1 == /dev/shm/* ]]; }
for d in "${tree[@]}"; do
  if [[ $userland == own ]] || masked "$d"; then overlays=${overlays:+$overlays,}$d; fi
done

kroot=$kdir/root
if [[ ! -f $kroot/.done || $kroot/.done -ot $kdeb ]]; then
  rm -rf "$kroot"; mkdir -p "$kroot"
  dpkg-deb -x "$kdeb" "$kroot"
  # Merged /usr (trixie): the modules are under usr/lib; depmod looks in lib.
  [[ -e $kroot/lib ]] || ln -s usr/lib "$kroot/lib"
  kver=$(ls "$kroot/lib/modules" | head -1)
  depmod -b "$kroot" "$kver"
  touch "$kroot/.done"
fi
kver=$(ls "$kroot/lib/modules" | head -1)
vmlinuz=$(ls "$kroot"/boot/vmlinu[xz]-"$kver" | head -1)
moddir=$kroot/lib/modules/$kver

# --- initramfs (cached per kernel and busybox) ----------------------------------
initrd=$kdir/initrd-$kver.cpio
if [[ ! -f $initrd || $initrd -ot $0 || $initrd -ot $(dirname "$0")/guest-init.sh || $initrd -ot $bdeb ]]; then
  t=$(stamp)
  ir=$kdir/initrd.d; rm -rf "$ir"; mkdir -p "$ir"/{bin,dev,proc,sys,mnt,newroot,lower,scratch,modules}
  bbx=$kdir/busybox.d; rm -rf "$bbx"; dpkg-deb -x "$bdeb" "$bbx"
  bb=$bbx/bin/busybox; [[ -f $bb ]] || bb=$bbx/usr/bin/busybox  # merged /usr from trixie on
  cp "$bb" "$ir/bin/busybox"
  # The modules the init needs, with their dependencies first (modules.dep).
  declare -A seen=()
  order=()
  add_mod() {
    local m=$1 line path d
    [[ -z ${seen[$m]:-} ]] || return 0
    seen[$m]=1
    line=$(grep -E "(^|/)$m\.ko(\.[a-z]+)?:" "$moddir/modules.dep" | head -1) || true
    [[ -n $line ]] || return 0  # built in
    path=${line%%:*}
    for d in ${line#*:}; do add_mod "$(basename "${d%%.ko*}")"; done
    order+=("$path")
  }
  for m in virtio_pci virtio_mmio virtio_blk 9pnet_virtio 9p ext4 overlay crc32c_generic crc32c-intel crc32c-arm64-ce; do
    add_mod "$m"
  done
  : > "$ir/modules/load"
  for p in "${order[@]}"; do
    f=$(basename "$p")
    case $f in
      *.ko.xz) xz -dc "$moddir/$p" > "$ir/modules/${f%.xz}"; f=${f%.xz} ;;
      *.ko.zst) zstd -qdc "$moddir/$p" > "$ir/modules/${f%.zst}"; f=${f%.zst} ;;
      *.ko.gz) gzip -dc "$moddir/$p" > "$ir/modules/${f%.gz}"; f=${f%.gz} ;;
      *) cp "$moddir/$p" "$ir/modules/$f" ;;
    esac
    echo "$f" >> "$ir/modules/load"
  done
  cp "$(dirname "$0")/guest-init.sh" "$ir/init"
  chmod 755 "$ir/init" "$ir/bin/busybox"
  (cd "$ir" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > "$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  rm -rf "$ir" "$bbx"
  echo "vm-timing: $name initramfs $(took "$t") s"
fi
flock -u 8
if [[ -n $prepare ]]; then echo "==> $name: prepared (kernel $kver, initramfs, ${userland} userland) in $cache"; exit 0; fi

if [[ -n $host_setup ]]; then
  t=$(stamp)
  # One host setup at a time (guests may boot side by side; npm's cache
  # and the setup's downloads are shared).
  exec 6>"$cache/.host-setup.lock"
  flock 6
  timeout 900 ctest --test-dir "$build" --output-on-failure -R "$host_setup" > "$kdir/host-setup.log" 2>&1 ||
    { cat "$kdir/host-setup.log"; echo "FAIL: $name: the host-side setup ($host_setup) failed"; exit 1; }
  flock -u 6
  echo "vm-timing: $name host setup ($host_setup) $(took "$t") s"
fi

# --- the job, the scratch disk, the boot ----------------------------------------
results=$build/vm-results/$name
rm -rf "$results"; mkdir -p "$results"
log=ctest.log
[[ -z $job_cmd ]] || log=job.log
write_job() {  # the ctest run for the accelerator in use ($accel_opt)
  local selector=() ex=$exclude
  if [[ $accel_opt == tcg* && -n $tcg_exclude ]]; then
    ex=${ex:+$ex|}$tcg_exclude
    echo "NOTE: $name: under TCG these tests are not run (timing races with a slowed guest): $tcg_exclude"
  fi
  [[ -z $label ]] || selector+=(-L "$label")
  [[ -z $regex ]] || selector+=(-R "$regex")
  [[ -z $ex ]] || selector+=(-E "$ex")
  [[ -z $fixture_exclude_setup ]] || selector+=(-FS "$fixture_exclude_setup")
  # The selection, read back from ctest here and grouped one process per
  # test binary (tests/vm/batch.py): under TCG a process costs a second
  # or more before its first test.
  if [[ -z $job_cmd && -z $per_test ]]; then
    "$(dirname "$0")/batch.py" plan "$build" "$results" "$ctest_timeout" "$ctest_jobs" "${selector[@]}" ||
      { echo "FAIL: $name: no test selection to run in $build"; return 1; }
  fi
  {
    echo "#!/bin/sh"
    if [[ $init == systemd ]]; then
      echo "# Runs inside the guest as systemd's kernel-command-line.service, on kernel $kver."
      # The generated service is ordered after basic.target but pulls in only
      # sysinit.target: start the rest of a basic boot (sockets: the system
      # bus; timers, paths, slices).
      echo "systemctl start basic.target"
      echo "t0=\$(cut -d' ' -f1 /proc/uptime)"
    else
      echo "# Runs inside the guest, in the host's root (chroot), on kernel $kver."
    fi
    echo "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb LANG=C.UTF-8"
    # An extracted userland has no linker cache yet.
    [[ $userland != own ]] || echo "ldconfig"
    echo "cd $build || exit 1"
    [[ -z $pre_job ]] || echo "$pre_job"
    if [[ -n $job_cmd ]]; then
      echo "( $job_cmd ) > $results/$log 2>&1"
    elif [[ -z $per_test ]]; then
      echo "sh $results/batch.sh > $results/$log 2>&1"
    else
      printf 'ctest --test-dir %q --output-on-failure --timeout %q -j%q --output-junit %q' "$build" "$ctest_timeout" \
        "$ctest_jobs" "$results/junit.xml"
      printf ' %q' "${selector[@]}"
      echo " > $results/$log 2>&1"
    fi
    echo "echo \$? > $results/rc"
    if [[ $init == systemd ]]; then
      # The initramfs wrote its own times; systemd's boot and the job's here.
      echo "t1=\$(cut -d' ' -f1 /proc/uptime)"
      echo "awk -v a=\"\$t0\" -v b=\"\$t1\" -v s=\"\$(cat $results/init-done 2>/dev/null || echo 0)\" 'BEGIN { printf \"systemd-boot %.1f\\nguest-tests %.1f\\n\", a - s, b - a }' >> $results/timing"
      echo "sync"
    fi
  } > "$results/job.sh"
  chmod 755 "$results/job.sh"
}
write_job || exit 1

# Huge pages: by default half the guest's memory in pages of the default
# (or the given) huge page size; 2 MiB unless --hugepagesz says otherwise.
if [[ -z $hugepages ]]; then
  hp_kib=2048
  [[ -z $hugepagesz ]] || hp_kib=$(( $(numfmt --from=iec "${hugepagesz^^}") / 1024 ))
  hugepages=$(( mem_mib * 1024 / 2 / hp_kib ))
fi
scratch=$results/scratch.img
truncate -s 16G "$scratch"
mkfs.ext4 -q -F -E lazy_itable_init=1,lazy_journal_init=1 "$scratch"

cmdline="console=$console panic=-1 oops=panic loglevel=4 psi=1 hugepages=$hugepages"
[[ -z $hugepagesz ]] || cmdline="hugepagesz=$hugepagesz default_hugepagesz=$hugepagesz $cmdline"
cmdline="$cmdline airs.job=$results/job.sh airs.results=$results airs.kver=$kver"
[[ $userland != own ]] || cmdline="$cmdline airs.root=own"
[[ -z $overlays ]] || cmdline="$cmdline airs.overlays=$overlays"
if [[ $init == systemd ]]; then
  # systemd-run-generator: the job is the boot's one service (default.target
  # becomes it, after basic.target), and its end powers the guest off.
  cmdline="$cmdline airs.init=systemd systemd.run=$results/job.sh"
  cmdline="$cmdline systemd.run_success_action=poweroff-force systemd.run_failure_action=poweroff-force"
fi
case $arch in
  amd64) machine=(-M q35) ;;
  arm64) machine=(-M virt) ;;
esac
echo "==> $name: booting $kver ($(basename "$vmlinuz")), ${mem_mib} MiB, $smp CPUs, $hugepages huge pages, $accel_opt; $(grep -E "^(ctest|\\( )" "$results/job.sh")"
boot() {  # accel args... ; runs qemu under timeout, in the background
  timeout -k 10 "$vm_timeout" "$qemu" "${machine[@]}" "$@" -m "$mem_mib" -smp "$smp" \
    -nographic -no-reboot -nodefaults -serial "file:$results/console.log" -monitor none \
    -kernel "$vmlinuz" -initrd "$initrd" -append "$cmdline" -nic none \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs local,path="$guest_root",mount_tag=guestroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs local,path="$moddir",mount_tag=modules,security_model=none,readonly=on \
    -virtfs local,path="$results",mount_tag=results,security_model=none \
    -drive file="$scratch",if=none,id=scratch,format=raw,cache=unsafe,discard=unmap \
    -device virtio-blk-pci,drive=scratch \
    </dev/null > "$results/qemu.log" 2>&1 &
  qpid=$!
}
t=$(stamp)
set +e
boot "${accel[@]}"
# A KVM that passed kvm_unusable can still hang in the kernel's first
# 64-bit code (no console output, one vCPU spinning). With --accel auto, a
# KVM guest that has not reached its init in 30 s (a KVM boot reaches it in
# under 5) is stopped and the boot is redone under TCG, loudly.
if [[ $accel_opt == kvm && ${AIRS_VM_ACCEL:-auto} == auto && $accel_forced == no ]]; then
  for _ in $(seq 30); do
    [[ -f $results/booted ]] || ! kill -0 "$qpid" 2>/dev/null && break
    sleep 1
  done
  if [[ ! -f $results/booted ]] && kill -0 "$qpid" 2>/dev/null; then
    echo "WARNING: $name: the KVM guest did not reach its init in 30 s (nested KVM hang?); booting again under TCG"
    kill "$qpid"; wait "$qpid"
    rm -f "$results/console.log"
    accel=(-accel tcg,thread=multi -cpu "$tcg_cpu"); accel_opt=tcg-fallback
    write_job || exit 1
    boot "${accel[@]}"
  fi
fi
wait "$qpid"
qrc=$?
set -e
rm -f "$scratch"
total=$(took "$t")
if [[ -f $results/$log ]]; then cat "$results/$log"; fi
[[ ! -f $results/timing ]] || while read -r k v; do echo "vm-timing: $name $k $v s"; done < "$results/timing"
echo "vm-timing: $name boot+tests+poweroff $total s"
batched() { [[ -z $job_cmd && -z $per_test ]]; }
# The batch's output, test by test, into junit.xml (a guest that did not
# finish names the test it was in, and the ones it never reached).
if batched; then
  set +e
  "$(dirname "$0")/batch.py" junit "$results"
  batch_rc=$?
  set -e
fi
if [[ ! -s $results/rc ]]; then
  if ((qrc == 124 || qrc == 137)); then echo "FAIL: $name: the VM did not finish within ${vm_timeout} s"; fi
  if batched && [[ -n ${AIRS_RESULTS_DIR:-} && -s $results/junit.xml ]]; then cp "$results/junit.xml" "$AIRS_RESULTS_DIR/vm-$name.xml"; fi
  echo "FAIL: $name: no result from the guest (qemu exit $qrc); last console lines ($results/console.log):"
  tail -40 "$results/console.log" 2>/dev/null || true
  cat "$results/qemu.log" 2>/dev/null || true
  exit 1
fi
rc=$(cat "$results/rc")
if batched; then
  rc=$batch_rc
elif [[ -z $job_cmd && $rc == 0 ]]; then
  # A ctest that found nothing to run exits 0: that is no result.
  ran=$(sed -nE 's/.*tests passed, [0-9]+ tests? failed out of ([0-9]+).*/\1/p' "$results/$log" | tail -1)
  if [[ -z $ran || $ran == 0 ]] || grep -q 'No tests were found' "$results/$log"; then
    echo "FAIL: $name: the guest's ctest ran no test in $build (see $results/$log)"
    exit 1
  fi
fi
# The guest's own results, test by test, for scripts/test.sh's count.
if [[ -n ${AIRS_RESULTS_DIR:-} && -s $results/junit.xml ]]; then cp "$results/junit.xml" "$AIRS_RESULTS_DIR/vm-$name.xml"; fi
echo "==> $name: ${job_cmd:+job }${job_cmd:-ctest} exit $rc (kernel $kver, accel $accel_opt, init $init; console log $results/console.log)"
exit "$rc"
