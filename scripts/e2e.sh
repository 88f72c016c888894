#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end test of the Debian package under a real systemd: boots this
# machine's own root file system read-only in systemd-nspawn (a tmpfs overlay
# takes the writes; nothing on the host changes), installs airs-memd's .deb
# there with dpkg together with libairs0 (so the maintainer scripts run
# against a live systemd and D-Bus), and drives the service as a user would:
#   - the package's postinst creates group airs, /run/airs, the sysctl file,
#     enables and starts the service;
#   - `systemctl start airs-memd` reaches active (Type=notify: READY=1);
#   - `systemctl reload` (SIGHUP) looks the group names up again, same pid;
#   - `airsctl status` works for a member of airs and is refused by the bus
#     policy (AccessDenied) for a non-member; admin methods are root's only;
#   - a client loads a model lazily and opens a KV session (when the client
#     tools exist; otherwise reported as not yet available, never faked);
#   - `systemctl restart dbus` while a client is mid-load: the daemon lives
#     on, the client's bytes are right, the daemon is back on the new bus;
#   - a member of airs, trusted, maps a model lazily through /dev/userfaultfd
#     with the group and mode of the packaged udev rule, and reads its bytes;
#   - `systemctl restart` adopts a filled model (nothing read again) and
#     refuses a model whose file changed in place, whose region's bytes no
#     longer hash to its content id, or whose region is too small;
#   - `systemctl stop` is clean; `systemctl kill -s KILL` gets it restarted
#     (Restart=on-failure) and clients reconnect; a hung daemon (SIGSTOP) is
#     restarted by the watchdog;
#   - `systemd-analyze verify` of the installed unit, and
#     `systemd-analyze security` (written to the work dir);
#   - dpkg --purge stops the service and removes its files.
# Ends with "N passed, N failed, N skipped"; exits non-zero on any failure.
#
#   scripts/e2e.sh [--build-dir DIR] [--deb FILE] [--keep]
#
# --build-dir: a configured build directory (default: build); the .debs are
#   made there with cpack after building the packaged targets. The build
#   must use CMAKE_INSTALL_PREFIX=/usr: the script sets it if not.
# --deb: test this airs-memd .deb instead of building one (the libairs0
#   .deb it depends on must be next to it).
# --keep: leave the container running and print how to enter it.
# Needs: root, systemd-container (installed if missing), huge pages (reserved
# here with scripts/hugepages.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
. scripts/root.sh; become_root "$@"

build=build; deb=""; keep=0
while (($#)); do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --deb) deb=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--build-dir DIR] [--deb FILE] [--keep]" >&2; exit 2 ;;
  esac
done

t0=$(date +%s.%N)
elapsed() { printf '%.1f' "$(echo "$(date +%s.%N) - $t0" | bc)"; }
log() { echo "==> [$(elapsed)s] $*"; }
passed=0; failed=0; skipped=0; failures=()
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); failures+=("$*"); }
skip() { echo "SKIP: $*"; skipped=$((skipped + 1)); }

if ! command -v systemd-nspawn >/dev/null; then
  log "installing systemd-container (systemd-nspawn)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd-container bc >/dev/null
fi
command -v bc >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bc >/dev/null

work=$(mktemp -d /var/tmp/airs-e2e.XXXXXX)
machine=airs-e2e-$$
root=$work/root
nspawn_pid=""

cleanup() {
  local rc=$?
  if ((keep)) && [[ -n $nspawn_pid ]]; then
    echo "container left running: nsenter -t $(leader) -a bash   (stop: kill $nspawn_pid; umount $root)"
    return $rc
  fi
  if [[ -n $nspawn_pid ]] && kill -0 "$nspawn_pid" 2>/dev/null; then
    # SIGTERM to nspawn = a clean poweroff of the container.
    kill -TERM "$nspawn_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$nspawn_pid" 2>/dev/null || true
    wait "$nspawn_pid" 2>/dev/null || true
  fi
  mountpoint -q "$root" && umount "$root"
  rm -rf "$work"
  return $rc
}
trap cleanup EXIT

# ---- the package -----------------------------------------------------------
if [[ -z $deb ]]; then
  [[ -f $build/CMakeCache.txt ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  if ! grep -qx 'CMAKE_INSTALL_PREFIX:PATH=/usr' "$build/CMakeCache.txt"; then
    log "setting CMAKE_INSTALL_PREFIX=/usr in $build (the unit runs /usr/sbin/airs-memd)"
    cmake -DCMAKE_INSTALL_PREFIX=/usr "$build" >/dev/null
  fi
  log "building the packaged targets in $build"
  cmake --build "$build" -j"$(nproc)" --target airs-package
  log "cpack -G DEB"
  (cd "$build" && cpack -G DEB -B "$work/pkg" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; exit 1; }
  deb=$(ls "$work"/pkg/airs-memd_*.deb)
fi
deb=$(readlink -f "$deb")
lib_deb=$(ls "$(dirname "$deb")"/libairs0_*.deb 2>/dev/null | head -1 || true)
[[ -n $lib_deb ]] || { fail "no libairs0_*.deb next to $deb (airs-memd depends on it)"; exit 1; }
log "packages: $deb $lib_deb"

# The package's file list, as Debian expects it.
contents=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|')
for f in /usr/sbin/airs-memd /usr/bin/airsctl /usr/lib/systemd/system/airs-memd.service \
         /usr/share/dbus-1/system.d/org.aios.Airs1.conf /usr/share/dbus-1/system-services/org.aios.Airs1.service \
         /usr/lib/sysusers.d/airs.conf /usr/lib/tmpfiles.d/airs.conf /usr/lib/udev/rules.d/60-airs-userfaultfd.rules \
         /etc/airs/airs-memd.conf /etc/airs/airs-memd.conf.d/; do
  grep -qx "$f" <<<"$contents" || fail "package lacks $f"
done
if grep -q '^/usr/etc/' <<<"$contents"; then
  fail "package installs under /usr/etc (an install rule uses the relative CMAKE_INSTALL_SYSCONFDIR): $(grep '^/usr/etc/.*[^/]$' <<<"$contents" | tr '\n' ' ')"
else
  pass "package file list (binaries, unit, bus policy and activation, sysusers, tmpfiles, udev, /etc/airs)"
fi
[[ $(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles) == /etc/airs/airs-memd.conf ]] \
  && pass "conffiles: /etc/airs/airs-memd.conf" || fail "conffiles is not /etc/airs/airs-memd.conf"

# ---- huge pages on the host (the container shares the host's kernel pool) --
pool_mib=64
scripts/hugepages.sh $(( (pool_mib + 32) * 1024 * 1024 ))

# ---- boot ------------------------------------------------------------------
# nspawn refuses "/" itself as the image; a read-only bind of the root file
# system (without the mounts below it) is the same tree.
mkdir -p "$root"
mount --bind / "$root"
mount -o remount,bind,ro "$root"
mkdir -p "$work/share"
cp "$deb" "$lib_deb" "$work/share/"
# Clients create userfaultfds through the host's device (nspawn's /dev is
# its own tmpfs).
uffd_bind=()
[[ -c /dev/userfaultfd ]] && uffd_bind=(--bind=/dev/userfaultfd)
log "booting $machine (systemd-nspawn --volatile=overlay -b)"
boot_start=$(date +%s.%N)
# basic.target: the host's enabled services (databases, ...) stay down; the
# D-Bus socket is up and our unit pulls in what it needs.
systemd-nspawn -D "$root" --volatile=overlay --keep-unit --register=no -M "$machine" \
  --bind-ro="$work/share:/e2e" "${uffd_bind[@]}" --console=passive \
  --capability=CAP_IPC_LOCK,CAP_SYS_RESOURCE \
  -b systemd.unit=basic.target >"$work/nspawn.log" 2>&1 &
nspawn_pid=$!

leader() { pgrep -P "$nspawn_pid" | head -1; }
ct() {  # run a command in the container as root, with a clean environment
  nsenter -t "$(leader)" -m -u -i -n -p -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
}
as_user() {  # as_user USER CMD...: in the container as USER (with its groups)
  local u=$1; shift
  ct setpriv --reuid="$u" --regid="$(ct id -g "$u")" --init-groups -- env -i PATH=/usr/bin:/bin HOME=/ "$@"
}
svc() { ct systemctl show -P "$1" airs-memd.service; }
# journal_has SECONDS PATTERN [journalctl match...]: waits (bounded) until the
# journal holds a line matching the extended regex PATTERN. journald stores a
# unit's lines asynchronously, so a line may land after the state that caused
# it is visible. The journal is read whole and then searched: piping it into
# `grep -q` under pipefail fails when grep exits before journalctl is done.
journal_has() {
  local n=$(( $1 * 10 )) pat=$2 j; shift 2
  (($# > 0)) || set -- -u airs-memd.service
  for _ in $(seq "$n"); do
    j=$(ct journalctl --no-pager -o cat "$@" 2>/dev/null || true)
    grep -qiE -- "$pat" <<<"$j" && return 0
    sleep 0.1
  done
  return 1
}

state=""
for _ in $(seq 300); do
  kill -0 "$nspawn_pid" 2>/dev/null || { cat "$work/nspawn.log"; fail "container did not boot"; exit 1; }
  if [[ -n $(leader) ]]; then
    state=$(ct systemctl is-system-running 2>/dev/null || true)
    [[ $state == running || $state == degraded ]] && break
  fi
  sleep 0.1
done
boot_s=$(printf '%.1f' "$(echo "$(date +%s.%N) - $boot_start" | bc)")
if [[ $state == running || $state == degraded ]]; then
  pass "container booted to '$state' in ${boot_s}s"
  [[ $state == degraded ]] && ct systemctl --failed --no-pager --no-legend | sed 's/^/  failed unit in container: /'
else
  fail "container not running after ${boot_s}s (state '$state')"; exit 1
fi
ct systemctl is-active -q dev-hugepages.mount 2>/dev/null || ct systemctl start dev-hugepages.mount
ct findmnt -n -t hugetlbfs /dev/hugepages >/dev/null && pass "dev-hugepages.mount: hugetlbfs on /dev/hugepages in the container" \
  || fail "no hugetlbfs on /dev/hugepages in the container"

# ---- install -----------------------------------------------------------------
# A small pool for the test (the machine's profile would take 4 GiB); the
# drop-in directory is the package's, created first so the postinst's start
# already uses it.
ct mkdir -p /etc/airs/airs-memd.conf.d
# Images made for Docker ship a policy-rc.d that forbids maintainer scripts
# to start or stop services (exit 101), and this machine's root is one:
# remove it in the container's overlay, as on a real Debian system.
ct rm -f /usr/sbin/policy-rc.d
ct sh -c "printf '[pool]\nsize = \"${pool_mib}M\"\n' >/etc/airs/airs-memd.conf.d/50-e2e.conf"
log "dpkg -i $(basename "$lib_deb") $(basename "$deb")"
if ct dpkg -i "/e2e/$(basename "$lib_deb")" "/e2e/$(basename "$deb")" >"$work/dpkg-i.log" 2>&1; then
  pass "dpkg -i (maintainer scripts under a running systemd)"
else
  cat "$work/dpkg-i.log"; fail "dpkg -i failed"; exit 1
fi
ct getent group airs >/dev/null && pass "postinst: group airs exists" || fail "postinst: no group airs"
[[ $(ct stat -c '%a %U %G' /run/airs 2>/dev/null) == "750 root airs" ]] && pass "postinst: /run/airs 0750 root:airs" \
  || fail "postinst: /run/airs is '$(ct stat -c '%a %U %G' /run/airs 2>&1)'"
[[ $(ct systemctl is-enabled airs-memd.service 2>/dev/null) == enabled ]] && pass "postinst: airs-memd.service enabled" \
  || fail "postinst: airs-memd.service is '$(ct systemctl is-enabled airs-memd.service 2>&1)'"
if ct grep -Eq '^vm\.nr_hugepages = [0-9]+$' /etc/sysctl.d/60-airs-memd.conf 2>/dev/null; then
  pass "postinst: /etc/sysctl.d/60-airs-memd.conf for this machine ($(ct grep -E '^vm\.' /etc/sysctl.d/60-airs-memd.conf))"
else
  hp=$(awk '/^Hugepagesize:/ {print $2}' /proc/meminfo)
  [[ -z $hp ]] && skip "sysctl file: kernel without hugetlbfs" || fail "postinst wrote no /etc/sysctl.d/60-airs-memd.conf"
fi
# The postinst started it already (Debian's convention).
[[ $(ct systemctl is-active airs-memd.service) == active ]] && pass "postinst started airs-memd.service" \
  || fail "postinst did not start airs-memd.service ($(ct systemctl is-active airs-memd.service))"

# Static checks on the installed unit with the real binary.
out=$(ct systemd-analyze verify --man=no /usr/lib/systemd/system/airs-memd.service 2>&1 || true)
[[ -z $out ]] && pass "systemd-analyze verify (installed unit): no warnings" || fail "systemd-analyze verify: $out"
ct systemd-analyze security --no-pager airs-memd.service >"$work/security.txt" 2>&1 || true
score=$(grep -o 'Overall exposure level for airs-memd.service: .*' "$work/security.txt" || true)
echo "  $score"
[[ -n ${AIRS_E2E_SECURITY_OUT:-} ]] && cp "$work/security.txt" "$AIRS_E2E_SECURITY_OUT"

# ---- start / status ----------------------------------------------------------
ct systemctl stop airs-memd.service
t_start=$(date +%s.%N)
if ct systemctl start airs-memd.service; then
  start_ms=$(printf '%.0f' "$(echo "($(date +%s.%N) - $t_start) * 1000" | bc)")
  # Type=notify: start returns when READY=1 arrived.
  if [[ $(svc ActiveState) == active && $(svc SubState) == running ]]; then
    pass "systemctl start airs-memd: active (READY=1) in ${start_ms} ms"
  else
    fail "after start: $(svc ActiveState)/$(svc SubState)"
  fi
else
  fail "systemctl start airs-memd failed"; ct journalctl -u airs-memd --no-pager | tail -30
fi
[[ $(svc WatchdogUSec) == 10s ]] && pass "watchdog armed (WatchdogUSec=10s)" || fail "WatchdogUSec is '$(svc WatchdogUSec)'"
# systemctl reload (ExecReload: SIGHUP) looks the group names up again; the
# same process goes on serving.
pid_before=$(svc MainPID)
if ct systemctl reload airs-memd.service; then
  reloaded=""
  for _ in $(seq 100); do
    reloaded=$(ct journalctl --no-pager -o cat "_SYSTEMD_INVOCATION_ID=$(svc InvocationID)" 2>/dev/null |
      grep -m1 'SIGHUP: looking up daemon.admin_group' || true)
    [[ -n $reloaded ]] && break
    sleep 0.1
  done
  [[ -n $reloaded && $(svc MainPID) == "$pid_before" && $(ct systemctl is-active airs-memd.service) == active ]] &&
    pass "systemctl reload: the same daemon looked its group names up again" ||
    fail "systemctl reload: log '${reloaded:-none}', MainPID $pid_before -> $(svc MainPID)"
else
  fail "systemctl reload airs-memd failed"
fi
# Capabilities: exactly the unit's two (as far as the container has them:
# nspawn grants CAP_IPC_LOCK on request; some hosts withhold CAP_SYS_RESOURCE).
mpid=$(svc MainPID)
eff=$(ct awk '/^CapEff:/ {print $2}' "/proc/$mpid/status")
bnd=$(ct awk '/^CapBnd:/ {print $2}' "/proc/1/status")
want=$(printf '%016x' $(( (0x$bnd) & ((1 << 14) | (1 << 24)) )))
[[ $eff == "$want" ]] && pass "daemon capabilities: CapEff=$eff (CAP_IPC_LOCK, CAP_SYS_RESOURCE where the host has them)" \
  || fail "daemon CapEff=$eff, want $want"
# The unit's I/O class (each O_DIRECT model read carries its own on top).
io=$(ct ionice -p "$mpid" 2>&1 || true)
[[ $io == "best-effort: prio 0" ]] && pass "daemon I/O priority: $io (IOSchedulingClass=best-effort, IOSchedulingPriority=0)" \
  || fail "daemon I/O priority: '$io', want 'best-effort: prio 0'"
ct busctl --system status org.aios.Airs1 >/dev/null 2>&1 && pass "org.aios.Airs1 owned on the system bus" \
  || fail "org.aios.Airs1 not on the system bus"

ct useradd -M -N -s /usr/sbin/nologin -G airs airs-member
ct useradd -M -N -s /usr/sbin/nologin airs-outsider
if out=$(as_user airs-member airsctl status 2>&1); then
  pass "airsctl status as a member of airs"
  sed 's/^/  | /' <<<"$out" | head -20
else
  fail "airsctl status as a member of airs: $out"
fi
if out=$(as_user airs-outsider airsctl status 2>&1); then
  fail "airsctl status as a non-member succeeded (bus policy not applied)"
elif grep -q 'AccessDenied\|Access denied\|access denied' <<<"$out"; then
  pass "airsctl status as a non-member: refused by the bus policy (AccessDenied)"
else
  fail "airsctl status as a non-member failed, but not with AccessDenied: $out"
fi
# Admin methods: root only, by policy.
evict=(busctl --system call org.aios.Airs1 /org/aios/Airs1 org.aios.Airs1.Manager Evict 'a{sv}b' 0 true)
if out=$(as_user airs-member "${evict[@]}" 2>&1); then
  fail "Manager.Evict as a member of airs was allowed"
elif grep -qi 'access denied\|AccessDenied' <<<"$out"; then
  pass "Manager.Evict (admin) as a member of airs: AccessDenied"
else
  fail "Manager.Evict as a member failed without AccessDenied: $out"
fi
# For root the call must reach the daemon: success, or the daemon's own
# error, never the bus's AccessDenied.
if out=$(ct "${evict[@]}" 2>&1) || ! grep -qi 'access denied\|AccessDenied' <<<"$out"; then
  pass "Manager.Evict (dry run) as root: passed by the bus policy${out:+ (daemon answered: $out)}"
else
  fail "Manager.Evict as root: $out"
fi

# ---- a client: lazy model load and a KV session --------------------------------
ct airs-mkmodel --out /var/tmp/e2e.gguf --size 16M --seed 7 >/dev/null 2>&1 && ct chmod 0644 /var/tmp/e2e.gguf || true
if out=$(as_user airs-member airsctl load --name e2e /var/tmp/e2e.gguf 2>&1); then
  pass "airsctl load as a member of airs: $(tail -1 <<<"$out")"
  models=$(as_user airs-member airsctl --json status 2>&1 || true)
  grep -q '"name":"e2e"' <<<"$models" && pass "the model is listed in status" || fail "model not in status: $models"
else
  fail "airsctl load as a member: $out"
fi
# The lazy path and a KV session through libairs (airs-demo compares every
# tensor with the file). As root: the udev rule for /dev/userfaultfd is for
# real machines; the container shares the host's /dev.
if out=$(ct airs-demo --bus system /var/tmp/e2e.gguf 2>&1); then
  pass "a client maps the model lazily, checks its bytes and opens a KV session (airs-demo)"
else
  fail "airs-demo: $out"
fi

# ---- the shmem pool's huge-folio tmpfs (airs-memd-generator) ------------------
# On a kernel with transparent huge pages the package's generator gives the
# service a huge=within_size tmpfs at /run/airs/shm (without them it writes
# nothing: huge= would stop the service there). The daemon in a shmem mode
# then puts its pool there in huge folios; a client reads the file's bytes.
dropin=/run/systemd/generator/airs-memd.service.d/huge-shmem.conf
if [[ -r /sys/kernel/mm/transparent_hugepage/hpage_pmd_size ]]; then
  if grep -q "$dropin" <<<"$(svc DropInPaths)"; then
    pass "generator: $dropin (this kernel has transparent huge pages)"
    ct sh -c "printf '[models]\nmode = \"small-pages\"\n' >/etc/airs/airs-memd.conf.d/60-e2e-shmem.conf"
    if ct systemctl restart airs-memd.service; then
      note=$(ct journalctl --no-pager -o cat "_SYSTEMD_INVOCATION_ID=$(svc InvocationID)" 2>/dev/null | grep -o 'shmem files: .*' | head -1 || true)
      if [[ $note == "shmem files: tmpfs /run/airs/shm files in "*" huge folios"* ]]; then
        pass "small-pages mode under the unit: the pool is in huge folios ($note)"
      else
        fail "small-pages mode under the unit: the pool is not on the generator's tmpfs: '${note:-no shmem line in the journal}'"
      fi
      if out=$(ct airs-demo --bus system /var/tmp/e2e.gguf 2>&1); then
        pass "small-pages mode under the unit: a client reads the file's bytes (airs-demo)"
      else
        fail "small-pages mode under the unit: airs-demo: $out"
      fi
    else
      fail "restart in small-pages mode failed"; ct journalctl -u airs-memd --no-pager | tail -20
    fi
    ct rm -f /etc/airs/airs-memd.conf.d/60-e2e-shmem.conf
    ct systemctl restart airs-memd.service || fail "restart back in the default mode failed"
    # Two starts of this test's own: the unit's start limit (systemd's
    # default, 5 starts in 10 s) must not count them against the SIGKILL
    # restart below.
    ct systemctl reset-failed airs-memd.service
  else
    fail "generator: no $dropin on a kernel with transparent huge pages (DropInPaths: $(svc DropInPaths))"
  fi
else
  grep -q "$dropin" <<<"$(svc DropInPaths)" && fail "generator: $dropin written on a kernel without transparent huge pages" \
    || pass "generator: no huge-folio tmpfs on a kernel without transparent huge pages"
fi

# ---- the system bus restarted under the daemon ----------------------------------
# `systemctl restart dbus` (what a dbus upgrade does) while a client is
# mid-load: the daemon keeps serving the client's faults without the bus
# (same process, no restart, no core dump), takes its name again on the new
# bus, and the client reads the file's bytes. The fill is paced (a drop-in,
# warmup_rate 1 MiB/s: 16 s for the model) so the load is under way when the
# bus goes; the client maps the model lazily and waits (airs-demo --wait-go)
# until the bus was restarted, then reads every tensor.
ct sh -c "printf '[daemon]\ntrusted_group = \"airs\"\n[models]\nwarmup_rate = \"1M\"\n' >/etc/airs/airs-memd.conf.d/70-e2e-paced.conf"
ct airs-mkmodel --out /var/tmp/e2e-paced.gguf --size 16M --seed 8 >/dev/null 2>&1 && ct chmod 0644 /var/tmp/e2e-paced.gguf || true
if ct systemctl restart airs-memd.service; then
  inv=$(svc InvocationID); pid=$(svc MainPID); restarts=$(svc NRestarts)
  ct rm -f /run/e2e-go /run/e2e-demo.out /run/e2e-demo.rc
  ct mkfifo /run/e2e-go
  # The shell holds the fifo open read-write: neither side blocks in open().
  ct sh -c 'exec 3<>/run/e2e-go; airs-demo --bus system --wait-go --no-session /var/tmp/e2e-paced.gguf <&3 \
            >/run/e2e-demo.out 2>&1; echo $? >/run/e2e-demo.rc' &
  demo_job=$!
  for _ in $(seq 300); do ct grep -q 'waiting for a line' /run/e2e-demo.out 2>/dev/null && break; sleep 0.1; done
  loading=$(as_user airs-member airsctl --json status 2>/dev/null |
    python3 -c 'import json,sys; print(sum(1 for m in json.load(sys.stdin)["models"] if m["state"] == "loading"))' 2>/dev/null || true)
  if [[ $loading == 1 ]] && ct grep -q 'loading in the background' /run/e2e-demo.out; then
    ct systemctl restart dbus.service
    ct sh -c 'echo go >/run/e2e-go'
    for _ in $(seq 600); do ct test -s /run/e2e-demo.rc && break; sleep 0.1; done
    wait "$demo_job" 2>/dev/null || true
    journal_inv=$(ct journalctl --no-pager -o cat "_SYSTEMD_INVOCATION_ID=$inv" 2>/dev/null || true)
    out=$(ct cat /run/e2e-demo.out 2>/dev/null || true)
    if [[ $(ct cat /run/e2e-demo.rc 2>/dev/null) == 0 ]] && grep -q 'match the file byte for byte.*served by airs-memd' <<<"$out"; then
      pass "dbus restarted mid-load: the client read every byte, served by airs-memd ($(grep -o '[0-9.]* MiB' <<<"$out" | head -1))"
    else
      fail "dbus restarted mid-load: the client: rc $(ct cat /run/e2e-demo.rc 2>/dev/null || echo none): $out"
    fi
    if [[ $(svc MainPID) == "$pid" && $(svc NRestarts) == "$restarts" && $(svc ActiveState) == active ]] \
        && ! grep -qiE 'dumped core|terminate called' <<<"$journal_inv$(ct journalctl --no-pager -o cat -u airs-memd.service 2>/dev/null | tail -50)"; then
      pass "dbus restarted: airs-memd lived on (same MainPID $pid, no restart, no core dump)"
    else
      fail "dbus restarted: MainPID $pid -> $(svc MainPID), NRestarts $restarts -> $(svc NRestarts), $(svc ActiveState)"
    fi
    reconnected=0
    journal_has 15 'serving org.aios.Airs1 on system as .* again' "_SYSTEMD_INVOCATION_ID=$inv" && reconnected=1
    journal_inv=$(ct journalctl --no-pager -o cat "_SYSTEMD_INVOCATION_ID=$inv" 2>/dev/null || true)
    # The daemon's own measure: from the loss to the name owned again.
    offline=$(grep -o 'again, after [0-9]* ms without the bus ([0-9]* attempt(s))' <<<"$journal_inv" | head -1 || true)
    if ((reconnected)) && [[ $(grep -c 'lost the bus at system' <<<"$journal_inv") == 1 ]] \
        && [[ $(svc StatusText) == "serving org.aios.Airs1 on system (reconnected after losing the bus 1 time(s))" ]]; then
      pass "dbus restarted: the loss logged once, the name taken again on the new bus ${offline#again, } (STATUS=$(svc StatusText))"
    else
      fail "dbus restarted: not back on the bus (STATUS=$(svc StatusText)): $(grep -iE 'bus' <<<"$journal_inv" | tail -5 | tr '\n' ' ')"
    fi
    if out=$(as_user airs-member airsctl status 2>&1) && out2=$(ct airs-demo --bus system /var/tmp/e2e.gguf 2>&1); then
      pass "after the dbus restart: airsctl status as a member, and a new client with a KV session (airs-demo)"
    else
      fail "after the dbus restart: $out ${out2:-}"
    fi
  else
    fail "dbus restart test: the client was not mid-load (models loading: '${loading}'; $(ct cat /run/e2e-demo.out 2>/dev/null))"
    ct sh -c 'echo go >/run/e2e-go' || true
    wait "$demo_job" 2>/dev/null || true
  fi
else
  fail "restart with a paced warm-up failed"; ct journalctl -u airs-memd --no-pager | tail -20
fi
# ---- the udev rule: a member of airs on the userfaultfd path ------------------
# The package's rule gives group airs /dev/userfaultfd (0660), so a member's
# client can make a userfaultfd without privileges. The container has no
# udevd (its /sys is read-only) and its /dev/userfaultfd is the host's node,
# bound in: so a node of the same device of its own (mknod on the
# container's /dev, which is not nodev, bound over /dev/userfaultfd in the
# container's mount namespace only; the host's node is not touched), with
# the group and mode the packaged rule gives it. A member is trusted (daemon.trusted_group = "airs", in the
# paced drop-in above) as a site that lets its users map models lazily
# would; the model is paced, so the client maps it before it is resident:
# the daemon counts it among the model's userfaultfd clients while it waits.
if [[ ! -c /dev/userfaultfd ]]; then
  skip "udev rule: this kernel has no /dev/userfaultfd (Linux < 6.1 or CONFIG_USERFAULTFD off): nothing to give the group"
else
  rule=/usr/lib/udev/rules.d/60-airs-userfaultfd.rules
  mm=$(stat -c '%t %T' /dev/userfaultfd)
  ct rm -f /dev/e2e-userfaultfd
  ct mknod -m 0600 /dev/e2e-userfaultfd c "$((16#${mm% *}))" "$((16#${mm#* }))"
  ct mount --bind /dev/e2e-userfaultfd /dev/userfaultfd
  airs_gid=$(ct getent group airs | cut -d: -f3)
  if ct sh -c 'command -v udevadm' >/dev/null 2>&1; then
    udev=$(ct udevadm test --action=add /sys/devices/virtual/misc/userfaultfd 2>&1 || true)
    group=$(grep -E "^GROUP [^ ]+ $rule:" <<<"$udev" | tail -1 | cut -d' ' -f2 || true)
    mode=$(grep -E "^MODE [0-7]+ $rule:" <<<"$udev" | tail -1 | cut -d' ' -f2 || true)
    how="as udevadm test evaluates $rule"
  else
    # No udev on this machine (a container image): the rule's own line.
    udev=$(ct grep -E '^[^#]*KERNEL=="userfaultfd"' "$rule" || true)
    group=$(sed -n 's/.*GROUP="\([^"]*\)".*/\1/p' <<<"$udev" | tail -1)
    mode=$(sed -n 's/.*MODE="\([0-7]*\)".*/\1/p' <<<"$udev" | tail -1)
    how="read from $rule: no udevadm here to evaluate it"
  fi
  [[ $group == airs ]] && group=$airs_gid
  mode=${mode#0}
  if [[ -n $group && -n $mode && $group == "$airs_gid" ]]; then
    ct chgrp "$group" /dev/userfaultfd
    ct chmod "$mode" /dev/userfaultfd
    node=$(ct stat -c '%G %a' /dev/userfaultfd)
    ct airs-mkmodel --out /var/tmp/e2e-member.gguf --size 8M --seed 10 >/dev/null 2>&1 && ct chmod 0644 /var/tmp/e2e-member.gguf
    ct rm -f /run/e2e-go /run/e2e-member.out /run/e2e-member.rc
    ct mkfifo -m 0666 /run/e2e-go
    ct sh -c 'exec 3<>/run/e2e-go; setpriv --reuid=airs-member --regid="$(id -g airs-member)" --init-groups -- env -i \
              PATH=/usr/bin:/bin HOME=/ airs-demo --bus system --wait-go --no-session /var/tmp/e2e-member.gguf <&3 \
              >/run/e2e-member.out 2>&1; echo $? >/run/e2e-member.rc' &
    member_job=$!
    for _ in $(seq 300); do ct grep -q 'waiting for a line' /run/e2e-member.out 2>/dev/null && break; sleep 0.1; done
    models=$(as_user airs-member airsctl --json status 2>/dev/null || true)
    lazy=$(python3 -c 'import json,sys; m=[x for x in json.load(sys.stdin)["models"] if x["name"].startswith("demo") and x["owner_uid"]!=0]; print(m[0]["clients"], m[0]["state"]) if len(m)==1 else None' <<<"$models" 2>/dev/null || true)
    ct sh -c 'echo go >/run/e2e-go'
    for _ in $(seq 600); do ct test -s /run/e2e-member.rc && break; sleep 0.1; done
    wait "$member_job" 2>/dev/null || true
    out=$(ct cat /run/e2e-member.out 2>/dev/null || true)
    if [[ $node == "airs $mode" && $lazy == "1 loading" ]]; then
      pass "udev rule: /dev/userfaultfd $node (GROUP/MODE $how); a member's client took the userfaultfd path (the daemon counts it a userfaultfd client of the loading model)"
    else
      fail "udev rule: node '$node', the member's model (clients state): '${lazy:-not listed}'; client: $out"
      python3 -c 'import json,sys; [print("  | model", x["name"], x["owner_uid"], x["clients"], x["state"]) for x in json.load(sys.stdin)["models"]]' <<<"$models" || echo "  | status: $models"
    fi
    if [[ $(ct cat /run/e2e-member.rc 2>/dev/null) == 0 ]] && grep -q 'match the file byte for byte.*served by airs-memd' <<<"$out"; then
      pass "udev rule: the member's lazy client read every byte of the file (airs-demo)"
    else
      fail "udev rule: the member's lazy client: rc $(ct cat /run/e2e-member.rc 2>/dev/null || echo none): $out"
    fi
  else
    fail "udev rule: no GROUP airs ($airs_gid) and MODE ($how): group '$group' mode '$mode'"
    sed 's/^/  | /' <<<"$udev" | tail -15
  fi
  ct umount /dev/userfaultfd 2>/dev/null || true
  ct rm -f /dev/e2e-userfaultfd
fi
ct rm -f /etc/airs/airs-memd.conf.d/70-e2e-paced.conf /run/e2e-go
ct systemctl restart airs-memd.service || fail "restart without the paced warm-up failed"
ct systemctl reset-failed airs-memd.service

# ---- systemctl restart: a filled model is adopted, a spoiled one is not ------
# `systemctl restart` keeps the fd store (a job runs through the stop), so a
# filled model is adopted as after a crash: resident at once, nothing read.
# Three more models, each kept, then spoiled while the daemon runs, each in
# one of the ways the adoption checks for (daemon/kept_models.cpp; the host
# suites do not cover these): its file changed in place (root's own 0644
# file: taken on its stat identity, which a write moves), its region's bytes
# changed (they no longer hash to the recorded content id), its region cut
# short (smaller than the file). None may be adopted, and a client of each
# reads the file's bytes. The region of a model is found among the daemon's
# open files (as root, through /proc): the one whose first bytes are the file's.
# Room in the pool: the clients' models so far go (airs-demo names them
# demo, demo-2, ...; e2e.gguf among them), e2e is loaded again below.
for n in $(as_user airs-member airsctl --json status 2>/dev/null |
           python3 -c 'import json,sys; print(" ".join(x["name"] for x in json.load(sys.stdin)["models"]))' 2>/dev/null); do
  ct airsctl unload "$n" >/dev/null 2>&1 || true
done
restart_json() {  # NAME: that model's status as one JSON object, or nothing
  as_user airs-member airsctl --json status 2>/dev/null |
    python3 -c 'import json,sys; m=[x for x in json.load(sys.stdin)["models"] if x["name"]==sys.argv[1]]; print(json.dumps(m[0]) if m else "")' "$1" 2>/dev/null || true
}
jfield() { python3 -c "import json,sys; print(json.loads(sys.argv[1]).get('$1',''))" "$2" 2>/dev/null || true; }
kept_lines() { ct journalctl -u airs-memd --no-pager -o cat 2>/dev/null | grep -c "region kept by the service manager" || true; }
k0=$(kept_lines)
spoiled=0
ct airsctl load --name e2e /var/tmp/e2e.gguf >/dev/null 2>&1 || true  # resident already, or loaded again
for spec in "inplace 2M 11" "badhash 4M 12" "short 6M 13"; do
  read -r n sz seed <<<"$spec"
  ct airs-mkmodel --out "/var/tmp/e2e-$n.gguf" --size "$sz" --seed "$seed" >/dev/null 2>&1 && ct chmod 0644 "/var/tmp/e2e-$n.gguf" &&
    ct airsctl load --name "$n" "/var/tmp/e2e-$n.gguf" >/dev/null 2>&1 || true
done
for _ in $(seq 100); do (( $(kept_lines) >= k0 + 3 )) && break; sleep 0.1; done
e2e_id=$(jfield content_id "$(restart_json e2e)")
if (( $(kept_lines) >= k0 + 3 )) && [[ -n $e2e_id ]]; then
  mpid=$(svc MainPID)
  region_of() {  # FILE: the daemon's fd path of that model's region (its bytes are the file's)
    ct python3 - "$mpid" "$1" <<'PY'
import os, sys
pid, path = sys.argv[1], sys.argv[2]
want = open(path, "rb").read(1 << 20)
found = {}
for fd in os.listdir(f"/proc/{pid}/fd"):
    p = f"/proc/{pid}/fd/{fd}"
    try:
        link = os.readlink(p)
        if not (link.startswith("/dev/hugepages/") or link.startswith("/memfd:airs-model:")): continue
        with open(p, "rb") as f: head = f.read(len(want))
    except OSError:
        continue
    if head == want: found[os.stat(p).st_ino] = p
if len(found) == 1: print(next(iter(found.values())))
PY
  }
  hash_fd=$(region_of /var/tmp/e2e-badhash.gguf); short_fd=$(region_of /var/tmp/e2e-short.gguf)
  # inplace: a write moves mtime and ctime.
  ct python3 -c 'import os,sys; f=open(sys.argv[1],"r+b"); f.seek(-4096,2); b=f.read(4096); f.seek(-4096,2); f.write(bytes(x^0x5a for x in b)); f.close()' \
    /var/tmp/e2e-inplace.gguf && spoiled=$((spoiled + 1))
  # badhash: one byte of its last page, in the region (a tensor's bytes).
  [[ -n $hash_fd ]] && ct python3 -c '
import mmap, os, sys
size = os.path.getsize(sys.argv[2]); unit = 2 << 20
off = (size - 4096) // unit * unit
fd = os.open(sys.argv[1], os.O_RDWR); m = mmap.mmap(fd, unit, mmap.MAP_SHARED, offset=off)
m[size - 4096 - off] ^= 0x5a; m.close(); os.close(fd)' "$hash_fd" /var/tmp/e2e-badhash.gguf && spoiled=$((spoiled + 1))
  # short: its region cut to one unit.
  [[ -n $short_fd ]] && ct python3 -c 'import os,sys; os.truncate(sys.argv[1], 2 << 20)' "$short_fd" && spoiled=$((spoiled + 1))
fi
if ((spoiled == 3)); then
  pass "restart: e2e, inplace, badhash and short kept in the fd store; then inplace's file, badhash's region bytes and short's region size changed"
  pid=$(svc MainPID)
  ct systemctl restart airs-memd.service || fail "systemctl restart airs-memd failed"
  m=$(restart_json e2e)
  if [[ $(svc MainPID) != "$pid" && $(jfield adopted "$m") == True && $(jfield state "$m") == resident \
        && $(jfield content_id "$m") == "$e2e_id" && $(jfield bytes_read "$m") == 0 ]]; then
    pass "systemctl restart: the filled model was adopted (new pid, resident at once, same content id, 0 bytes read)"
  else
    fail "systemctl restart: the model was not adopted: ${m:-not listed}"
    ct journalctl -u airs-memd --no-pager -o cat 2>&1 | grep -iE 'kept|adopt' | tail -8 | sed 's/^/  journal: /'
  fi
  if out=$(ct airs-demo --bus system --no-session /var/tmp/e2e.gguf 2>&1); then
    pass "systemctl restart: a client reads the adopted model byte for byte (airs-demo)"
  else
    fail "systemctl restart: airs-demo on the adopted model: $out"
  fi
  # journald takes the daemon's lines through a stream: wait for them (bounded).
  for _ in $(seq 50); do
    journal=$(ct journalctl -u airs-memd --no-pager -o cat _PID="$(svc MainPID)" 2>/dev/null || true)
    (( $(grep -c 'dropped, not served' <<<"$journal" || true) >= 3 )) && break
    sleep 0.1
  done
  for spec in "inplace:the file changed" "badhash:the region's bytes are not the file's" "short:the region is too small"; do
    n=${spec%%:*} why=${spec#*:}
    m=$(restart_json "$n")
    if grep -q "dropped, not served: $why" <<<"$journal" && [[ $(jfield adopted "$m") != True ]] &&
       out=$(ct airs-demo --bus system --no-session "/var/tmp/e2e-$n.gguf" 2>&1); then
      pass "systemctl restart: $n not adopted ($why); a client reads the file's bytes (airs-demo)"
    else
      fail "systemctl restart: $n (${why}): ${m:-not listed}; ${out:-}; $(grep -i "kept model" <<<"$journal" | tr '\n' ' ')"
    fi
  done
else
  fail "restart: could not keep and spoil the three models (kept lines $(kept_lines), was $k0; e2e content id '${e2e_id:-}'; regions '${hash_fd:-}' '${short_fd:-}')"
  ct sh -c "ls -l /proc/$(svc MainPID)/fd | grep hugepages" 2>&1 | sed 's/^/  | /' || true
  as_user airs-member airsctl status 2>&1 | sed -n '/^MODELS/,/^$/p' | sed 's/^/  | /'
fi
ct systemctl reset-failed airs-memd.service

# ---- stop, kill, watchdog --------------------------------------------------------
t_stop=$(date +%s.%N)
ct systemctl stop airs-memd.service
stop_ms=$(printf '%.0f' "$(echo "($(date +%s.%N) - $t_stop) * 1000" | bc)")
if [[ $(svc ActiveState) == inactive && $(svc Result) == success && $(svc ExecMainStatus) == 0 ]]; then
  pass "systemctl stop: clean (exit 0, Result=success) in ${stop_ms} ms"
else
  fail "systemctl stop: $(svc ActiveState) Result=$(svc Result) status=$(svc ExecMainStatus)"
fi
left=$(ct find /dev/hugepages -mindepth 1 2>/dev/null | wc -l)
((left == 0)) && pass "no pool files left in /dev/hugepages after stop" || fail "$left files left in /dev/hugepages after stop"

wait_restarted() {  # old_pid timeout_s: waits for a new main pid, active
  local old=$1 n=$(( $2 * 10 )) pid
  for _ in $(seq "$n"); do
    pid=$(svc MainPID)
    if [[ $pid != 0 && $pid != "$old" && $(svc ActiveState) == active ]]; then return 0; fi
    sleep 0.1
  done
  return 1
}

ct systemctl start airs-memd.service
# A filled model survives the crash: its region is kept in systemd's fd
# store (FileDescriptorStoreMax=) and the restarted daemon adopts it after
# checking the file and the bytes (docs/state.md), reading nothing again.
model_json() {  # the e2e model's status as one JSON object, or nothing
  as_user airs-member airsctl --json status 2>/dev/null |
    python3 -c 'import json,sys; m=[x for x in json.load(sys.stdin)["models"] if x["name"]=="e2e"]; print(json.dumps(m[0]) if m else "")' 2>/dev/null || true
}
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1]).get('$1',''))" "$2" 2>/dev/null || true; }
kept_id=""
if as_user airs-member airsctl load --name e2e /var/tmp/e2e.gguf >/dev/null 2>&1; then
  for _ in $(seq 100); do
    m=$(model_json); kept_id=$(field content_id "$m")
    [[ -n $kept_id ]] && break
    sleep 0.1
  done
  [[ -n $kept_id ]] && ! journal_has 10 "region kept by the service manager" && kept_id=""
fi
[[ -n $kept_id ]] && pass "a resident model's region is kept in the fd store (content id $kept_id)" \
  || fail "the loaded model was never kept: $(ct journalctl -u airs-memd --no-pager -o cat | tail -5)"
# A model whose file its owner can write: kept too, then changed through a
# shared mapping of the tmpfs file (neither mtime nor ctime moves). The
# restarted daemon must not adopt the old bytes: it hashes such a file
# again, drops the region, and the owner's client reads the file as it is.
owned=/dev/shm/e2e-owned.gguf
owned_kept=0
# (8 MiB: the member's share of the 64 MiB pool holds it beside e2e's 18.)
if as_user airs-member airs-mkmodel --out "$owned" --size 8M --seed 9 >/dev/null 2>&1 &&
   as_user airs-member airsctl load --name owned "$owned" >/dev/null 2>&1; then
  for _ in $(seq 100); do
    [[ $(ct journalctl -u airs-memd --no-pager -o cat 2>/dev/null | grep -c "region kept by the service manager") -ge 2 ]] &&
      { owned_kept=1; break; }
    sleep 0.1
  done
fi
if ((owned_kept)) && as_user airs-member python3 -c '
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR); size = os.fstat(fd).st_size
m = mmap.mmap(fd, size, mmap.MAP_SHARED); m[size - 4096:size] = bytes(b ^ 0x5a for b in m[size - 4096:size]); m.close()' "$owned"; then
  pass "an owner-writable model was kept, then changed through a shared mapping (no time moved)"
else
  fail "the owner-writable model was not kept or not changed: $(ct journalctl -u airs-memd --no-pager -o cat | tail -3)"
fi
pid=$(svc MainPID); restarts=$(svc NRestarts)
t_k=$(date +%s.%N)
ct systemctl kill -s KILL airs-memd.service
if wait_restarted "$pid" 15; then
  if ((owned_kept)); then
    if ! journal_has 10 "dropped, not served: the file's bytes changed"; then
      fail "the changed owner-writable model: the journal never said its region was dropped: $(ct journalctl -u airs-memd --no-pager -o cat | grep -i kept | tail -3)"
    elif out=$(as_user airs-member airs-demo --bus system "$owned" 2>&1); then
      pass "the changed owner-writable model was not adopted; its owner reads the file's new bytes (airs-demo)"
    else
      fail "the changed owner-writable model was dropped, but its owner's airs-demo failed: $out"
    fi
  fi
  m=$(model_json)
  if [[ -n $kept_id && $(field adopted "$m") == True && $(field state "$m") == resident && $(field content_id "$m") == "$kept_id" \
        && $(field bytes_read "$m") == 0 ]]; then
    pass "after SIGKILL the restarted daemon adopted the model: resident at once, same content, 0 bytes read"
  else
    fail "the model was not adopted after the restart: ${m:-not listed}"
    ct journalctl -u airs-memd.service --no-pager -o cat 2>&1 | grep -iE 'kept|adopt|fd store|state_dir' | tail -8 | sed 's/^/  journal: /' 
  fi
  if out=$(ct airs-demo --bus system /var/tmp/e2e.gguf 2>&1); then
    pass "a client reads the adopted model byte for byte (airs-demo)"
  else
    fail "airs-demo on the adopted model: $out"
  fi
  k_s=$(printf '%.1f' "$(echo "$(date +%s.%N) - $t_k" | bc)")
  (( $(svc NRestarts) == restarts + 1 )) && pass "SIGKILL: restarted by Restart=on-failure in ${k_s}s (pid $pid -> $(svc MainPID))" \
    || fail "SIGKILL: new pid but NRestarts $(svc NRestarts), was $restarts"
  as_user airs-member airsctl status >/dev/null 2>&1 && pass "clients reconnect after the restart (airsctl status as member)" \
    || fail "airsctl status after the restart failed"
else
  fail "SIGKILL: not restarted within 15 s ($(svc ActiveState)/$(svc SubState))"
fi

pid=$(svc MainPID); restarts=$(svc NRestarts)
t_w=$(date +%s.%N)
if [[ $pid == 0 ]]; then
  # (kill -STOP 0 would stop the caller's own process group.)
  fail "watchdog: the daemon is not running before the hang test ($(svc ActiveState)/$(svc SubState))"
  ct journalctl -u airs-memd.service --no-pager -o cat 2>&1 | tail -5 | sed 's/^/  journal: /'
else
ct kill -STOP "$pid"
# Watchdog 10 s, SIGABRT (+SIGCONT from systemd), RestartSec 1 s.
if wait_restarted "$pid" 45; then
  w_s=$(printf '%.1f' "$(echo "$(date +%s.%N) - $t_w" | bc)")
  # journald stores PID 1's message asynchronously: it may land after the
  # restart was seen, so wait for it (bounded).
  wd_logged=0
  journal_has 10 'watchdog timeout' && wd_logged=1
  if ((wd_logged)); then
    pass "hung daemon (SIGSTOP): watchdog timeout, restarted in ${w_s}s"
  else
    fail "hung daemon restarted in ${w_s}s, but the journal shows no watchdog timeout"
  fi
else
  fail "hung daemon not restarted within 45 s ($(svc ActiveState)/$(svc SubState))"
  ct kill -CONT "$pid" 2>/dev/null || true
fi
fi

# ---- D-Bus activation: a call to the stopped service starts it ------------------
ct systemctl stop airs-memd.service
if as_user airs-member airsctl status >/dev/null 2>&1 && [[ $(svc ActiveState) == active ]]; then
  pass "bus activation: airsctl status as a member started the stopped service (SystemdService=)"
else
  fail "bus activation: airsctl status on the stopped service gave $(svc ActiveState)"
fi

# ---- remove and purge ------------------------------------------------------------
if ct dpkg --purge airs-memd libairs0 >"$work/dpkg-purge.log" 2>&1; then
  [[ $(ct systemctl is-active airs-memd.service 2>/dev/null) != active ]] \
    && ! ct test -e /usr/lib/systemd/system/airs-memd.service \
    && ! ct test -e /etc/sysctl.d/60-airs-memd.conf \
    && ! ct test -e /usr/share/dbus-1/system.d/org.aios.Airs1.conf \
    && pass "dpkg --purge: service stopped, unit, bus policy and sysctl file gone" \
    || fail "dpkg --purge left the service running or files behind"
else
  cat "$work/dpkg-purge.log"; fail "dpkg --purge failed"
fi

journal=$(ct journalctl -u airs-memd.service --no-pager -o short-monotonic 2>/dev/null | tail -40 || true)

# ---- the sandbox lets the daemon resize the pool, and nothing else ----------
# nspawn keeps /sys and /proc/sys read-only, so the resize path is checked in
# a second container with writable API file systems: a transient service
# with every sandbox setting of the shipped unit writes the huge page knobs
# (their current value back: the host's pool does not change) and must fail
# on any other kernel tunable or file.
if [[ -n $(awk '/^Hugepagesize:/ {print $2}' /proc/meminfo) ]]; then
  kill -TERM "$nspawn_pid"; wait "$nspawn_pid" 2>/dev/null || true
  SYSTEMD_NSPAWN_API_VFS_WRITABLE=1 systemd-nspawn -D "$root" --volatile=overlay --keep-unit --register=no \
    -M "$machine-vfs" --console=passive --capability=CAP_IPC_LOCK,CAP_SYS_RESOURCE -b systemd.unit=basic.target \
    >"$work/nspawn2.log" 2>&1 &
  nspawn_pid=$!
  for _ in $(seq 300); do
    [[ -n $(leader) ]] && [[ $(ct systemctl is-system-running 2>/dev/null) =~ ^(running|degraded)$ ]] && break
    sleep 0.1
  done
  props=()
  while IFS= read -r line; do props+=(-p "$line"); done < <(
    dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/lib/systemd/system/airs-memd.service |
      sed -n '/^\[Service\]/,/^\[/p' | grep -E '^[A-Za-z]+=' |
      grep -Ev '^(Type|NotifyAccess|BusName|ExecStart|WatchdogSec|Restart|RestartSec|TimeoutStopSec)=')
  hp_kb=$(awk '/^Hugepagesize:/ {print $2}' /proc/meminfo)
  knob=/sys/kernel/mm/hugepages/hugepages-${hp_kb}kB/nr_hugepages
  node_knob=$(ls /sys/devices/system/node/node0/hugepages/hugepages-${hp_kb}kB/nr_hugepages 2>/dev/null || true)
  probe="for f in $knob /proc/sys/vm/nr_hugepages $node_knob; do v=\$(cat \$f) && echo \$v >\$f && echo rw:\$f || echo ro:\$f; done
         for f in /proc/sys/vm/swappiness /sys/kernel/mm/transparent_hugepage/defrag; do v=\$(cat \$f) && echo \$v >\$f 2>/dev/null && echo rw:\$f || echo ro:\$f; done
         touch /etc/airs-x 2>/dev/null && echo rw:/etc || echo ro:/etc
         touch /dev/hugepages/airs-x 2>/dev/null && rm -f /dev/hugepages/airs-x && echo rw:/dev/hugepages || echo ro:/dev/hugepages"
  out=$(ct systemd-run --wait --pipe -q "${props[@]}" sh -c "$probe" 2>&1 || true)
  want="rw:$knob rw:/proc/sys/vm/nr_hugepages${node_knob:+ rw:$node_knob} ro:/proc/sys/vm/swappiness ro:/sys/kernel/mm/transparent_hugepage/defrag ro:/etc rw:/dev/hugepages"
  if [[ $(grep -E '^(rw|ro):' <<<"$out" | tr '\n' ' ' | sed 's/ $//') == "$want" ]]; then
    pass "unit sandbox: huge page knobs and /dev/hugepages writable; other tunables and /etc read-only"
  else
    fail "unit sandbox: got '$(tr '\n' ' ' <<<"$out")', want '$want'"
  fi
fi

if ((failed)); then
  echo "journal of airs-memd in the container:"
  echo "$journal"
  printf 'failed: %s\n' "${failures[@]}"
fi
echo "e2e: boot ${boot_s}s, total $(elapsed)s"
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))
