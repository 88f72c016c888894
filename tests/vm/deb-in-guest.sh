#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The arm64 .deb under a real systemd, inside an arm64 guest booted with
# systemd as PID 1 (run-vm.sh --init systemd; ctest vm.debian13-6.12-arm64-deb).
# Runs in the guest as root, like the amd64 e2e test (scripts/e2e.sh) does in
# a container:
#   - dpkg -i libairs0 + airs-memd (their real maintainer scripts, under the
#     running systemd and system bus): group airs, /run/airs, the unit
#     enabled and started, the sysctl file for this machine;
#   - systemctl stop / start (Type=notify: active once READY=1 came);
#   - airsctl status: mode full, the pool in pages of this kernel's default
#     huge page size (Hugepagesize of /proc/meminfo), hugetlbfs;
#   - a model made with airs-mkmodel, loaded with airsctl, read by a client
#     (airs-demo compares every tensor with the file) over the system bus;
#   - systemctl stop: clean, and every huge page of the pool back in the
#     kernel (HugePages_Free = HugePages_Total, nothing reserved, nothing in
#     /dev/hugepages);
#   - dpkg --purge: the service stopped, unit, bus policy, sysctl file gone.
# Each step prints PASS/FAIL and its time ("deb-timing:"); ends with
# "N passed, N failed"; exit 0 only when all passed, 77 (skip) without the
# .debs.
#
#   deb-in-guest.sh DEB_DIR
set -uo pipefail
dir=${1:?usage: deb-in-guest.sh DEB_DIR}
arch=$(dpkg --print-architecture)
deb=$(ls "$dir"/airs-memd_*_"$arch".deb 2>/dev/null | head -1)
lib=$(ls "$dir"/libairs0_*_"$arch".deb 2>/dev/null | head -1)
[[ -n $deb && -n $lib ]] || { echo "SKIP: no airs-memd and libairs0 $arch .deb in $dir (scripts/cross-arm64.sh builds them)"; exit 77; }

passed=0 failed=0
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
now() { cut -d' ' -f1 /proc/uptime; }
t_step=$(now)
timing() { local t; t=$(now); echo "deb-timing: $1 $(awk -v a="$t_step" -v b="$t" 'BEGIN { printf "%.1f", b - a }') s"; t_step=$t; }
svc() { systemctl show -P "$1" airs-memd.service; }
meminfo() { awk -v k="$1:" '$1 == k { print $2 }' /proc/meminfo; }
# One scalar of airsctl's one-line JSON: json KEY [OBJECT] (OBJECT: the
# flat sub-object, e.g. pool, to look in; else the top level, with every
# nested object taken out first: some hold keys of the same name).
json() {
  local s
  if [[ -n ${2:-} ]]; then
    s=$(grep -o "\"$2\":{[^{}]*}" <<<"$status_json" | head -1)
  else
    s=$(sed -E -e 's/^\{//; s/\}$//' -e ':a' -e 's/\{[^{}]*\}/X/g' -e 'ta' <<<"$status_json")
  fi
  grep -o "\"$1\":[^,}]*" <<<"$s" | head -1 | cut -d: -f2- | tr -d '"'
}
finish() {
  if ((failed)); then
    echo "journal of airs-memd:"
    journalctl -u airs-memd.service --no-pager -o short-monotonic 2>&1 | tail -40 | sed 's/^/  | /'
  fi
  echo "$passed passed, $failed failed"
  ((failed == 0))
  exit
}

[[ -d /run/systemd/system && $(readlink /proc/1/exe) == */systemd ]] || { fail "PID 1 is not systemd"; finish; }
echo "kernel $(uname -r) $(uname -m), $(getconf PAGESIZE)-byte pages, huge pages of $(meminfo Hugepagesize) kB" \
  "($(meminfo HugePages_Total) reserved), systemd $(systemctl --version | head -1 | cut -d' ' -f2)"
systemctl is-active -q dbus.socket && pass "systemd is PID 1, the system bus socket is up" || fail "dbus.socket is not active"
hp_kb=$(meminfo Hugepagesize)
total0=$(meminfo HugePages_Total) free0=$(meminfo HugePages_Free)
echo "before: HugePages_Total $total0 Free $free0 Rsvd $(meminfo HugePages_Rsvd)"
timing boot-checks

# ---- install --------------------------------------------------------------
# A small pool (the machine's profile would take 2-4 GiB): the package's
# drop-in directory, made first so the postinst's start already uses it.
pool_mib=64
mkdir -p /etc/airs/airs-memd.conf.d
printf '[pool]\nsize = "%sM"\n' "$pool_mib" > /etc/airs/airs-memd.conf.d/50-vm.conf
if dpkg -i "$lib" "$deb" > /tmp/dpkg-i.log 2>&1; then
  pass "dpkg -i $(basename "$lib") $(basename "$deb") (maintainer scripts under systemd)"
else
  cat /tmp/dpkg-i.log; fail "dpkg -i failed"; finish
fi
getent group airs >/dev/null && pass "postinst: group airs" || fail "postinst: no group airs"
[[ $(stat -c '%a %U %G' /run/airs 2>&1) == "750 root airs" ]] && pass "postinst: /run/airs 0750 root:airs" \
  || fail "postinst: /run/airs is '$(stat -c '%a %U %G' /run/airs 2>&1)'"
[[ $(systemctl is-enabled airs-memd.service 2>&1) == enabled ]] && pass "postinst: airs-memd.service enabled" \
  || fail "postinst: airs-memd.service is '$(systemctl is-enabled airs-memd.service 2>&1)'"
grep -Eq '^vm\.nr_hugepages = [0-9]+$' /etc/sysctl.d/60-airs-memd.conf 2>/dev/null \
  && pass "postinst: $(grep -E '^vm\.' /etc/sysctl.d/60-airs-memd.conf) in /etc/sysctl.d/60-airs-memd.conf (pages of $hp_kb kB)" \
  || fail "postinst wrote no /etc/sysctl.d/60-airs-memd.conf"
[[ $(systemctl is-active airs-memd.service) == active ]] && pass "postinst started airs-memd.service" \
  || fail "postinst did not start airs-memd.service ($(systemctl is-active airs-memd.service))"
timing install

# ---- stop, start, status --------------------------------------------------
systemctl stop airs-memd.service
if systemctl start airs-memd.service && [[ $(svc ActiveState) == active && $(svc SubState) == running ]]; then
  pass "systemctl start: active (READY=1)"
else
  fail "systemctl start: $(svc ActiveState)/$(svc SubState)"; finish
fi
timing start
status_json=$(airsctl --json status 2>&1) || fail "airsctl --json status: $status_json"
airsctl status 2>&1 | head -12 | sed 's/^/  | /'
mode=$(json mode) page=$(json page_size) backend=$(json backend pool) pages=$(json total_pages pool)
[[ $mode == full ]] && pass "status: mode full" || fail "status: mode '$mode' ($(json mode_reason)), want full"
[[ $page == $((hp_kb * 1024)) ]] && pass "status: page_size $page = this kernel's Hugepagesize" \
  || fail "status: page_size '$page', the kernel's huge page is $((hp_kb * 1024))"
[[ $backend == hugetlbfs && $pages == $((pool_mib * 1024 / hp_kb)) ]] \
  && pass "status: pool of $pages pages of $hp_kb kB on hugetlbfs ($pool_mib MiB)" \
  || fail "status: pool backend '$backend', $pages pages; want hugetlbfs, $((pool_mib * 1024 / hp_kb)) pages"
used=$(( $(meminfo HugePages_Total) - $(meminfo HugePages_Free) + $(meminfo HugePages_Rsvd) ))
((used >= pool_mib * 1024 / hp_kb)) && pass "the kernel counts the pool's pages in use or reserved ($used)" \
  || fail "the kernel counts only $used huge pages in use or reserved for a $pool_mib MiB pool"
timing status

# ---- a model through a client ------------------------------------------------
model=/var/tmp/vm.gguf
airs-mkmodel --out "$model" --size 16M --seed 7 >/dev/null && chmod 0644 "$model" || fail "airs-mkmodel"
if out=$(airsctl load --name vm "$model" 2>&1); then
  pass "airsctl load: $(tail -1 <<<"$out")"
else
  fail "airsctl load: $out"
fi
status_json=$(airsctl --json status 2>&1)
grep -q '"name":"vm"' <<<"$status_json" && pass "the model is listed in status" || fail "model not in status: $status_json"
timing load
if out=$(timeout 300 airs-demo --bus system "$model" 2>&1); then
  pass "a client maps the model lazily, checks its bytes and opens a KV session (airs-demo)"
  tail -3 <<<"$out" | sed 's/^/  | /'
else
  fail "airs-demo (exit $?): $out"
fi
timing client

# ---- stop: the pool back in the kernel -----------------------------------------
systemctl stop airs-memd.service
if [[ $(svc ActiveState) == inactive && $(svc Result) == success && $(svc ExecMainStatus) == 0 ]]; then
  pass "systemctl stop: clean (exit 0, Result=success)"
else
  fail "systemctl stop: $(svc ActiveState) Result=$(svc Result) status=$(svc ExecMainStatus)"
fi
total1=$(meminfo HugePages_Total) free1=$(meminfo HugePages_Free) rsvd1=$(meminfo HugePages_Rsvd)
echo "after stop: HugePages_Total $total1 Free $free1 Rsvd $rsvd1"
# The postinst may raise the boot pool (never lowers it): compare with the
# total now. Nothing else in this guest uses huge pages.
((free1 == total1 && rsvd1 == 0 && free0 == total0)) && pass "the pool's huge pages are all back in the kernel" \
  || fail "huge pages not given back: Total $total1 Free $free1 Rsvd $rsvd1 (before: Total $total0 Free $free0)"
left=$(find /dev/hugepages -mindepth 1 2>/dev/null | wc -l)
((left == 0)) && pass "nothing left in /dev/hugepages" || fail "$left files left in /dev/hugepages"
timing stop

# ---- purge ------------------------------------------------------------------
if dpkg --purge airs-memd libairs0 > /tmp/dpkg-purge.log 2>&1; then
  [[ $(systemctl is-active airs-memd.service 2>/dev/null) != active ]] \
    && ! test -e /usr/lib/systemd/system/airs-memd.service \
    && ! test -e /etc/sysctl.d/60-airs-memd.conf \
    && ! test -e /usr/share/dbus-1/system.d/org.aios.Airs1.conf \
    && pass "dpkg --purge: service stopped, unit, bus policy and sysctl file gone" \
    || fail "dpkg --purge left the service running or files behind"
else
  cat /tmp/dpkg-purge.log; fail "dpkg --purge failed"
fi
timing purge
finish
