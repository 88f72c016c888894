# SPDX-License-Identifier: Apache-2.0
# Sourced by the streaming benches (bash; bench/stream, bench/moe), after
# bench/llama/memd_lib.sh (bench_tools) and bench/support/throttle.sh: what
# they share about a run at equal memory.
#
# The caller sets: bench (its name, for messages), work (its directory),
# memd (the daemon), pool_bytes (the pool), sd_bps (the read throttle: on
# cgroup v2 a process is in one group only, so its memory group carries
# the throttle too).
#
#   bus_start                    a private dbus-daemon; sets bus
#   start_memd MODE [TOML]       airs-memd on it, forced to MODE, pool_bytes
#                                (and pool_page_size when set: the pool's
#                                unit), no state directory; TOML appended to
#                                its configuration; sets memd_pid
#   stop_memd
#   stream_cleanup               the daemon, the bus, the memory group, the
#                                throttle (an EXIT trap)
#   cold                         page cache dropped
#   read_bytes PID               bytes PID caused to be read from storage
#   memcg_make LIMIT / memcg_drop  a memory group of LIMIT bytes (sets memcg,
#                                memcg_kind)
#   held_start KEY CGROUP CMD... / held_wait KEY REGEX / held_line / held_end
#   / held_kill                  one cold process, its stdin a fifo held here
#   ratio A B, mib BYTES         printing
memd_pid=""
memcg=""
memcg_kind=""
held_pid=""

bus_start() {
  dbus-daemon --config-file="$src/tests/support/test-bus.conf" --print-address=3 --print-pid=4 --fork \
    3>"$work/bus.addr" 4>"$work/dbus.pid" 2>/dev/null
  bus=$(head -1 "$work/bus.addr")
}

start_memd() {  # mode [more toml]; pool_page_size (if set): the pool's unit
  local page=""
  [[ -z ${pool_page_size:-} ]] || page="page_size = \"$pool_page_size\""$'\n'
  printf '[pool]\nprofile = "custom"\nsize = "%d"\n%s[models]\nmode = "%s"\n%s' "$pool_bytes" "$page" "$1" "${2:-}" \
    >"$work/memd.conf"
  # Emptied here, not by the redirection: that runs in the child, and the
  # wait below could find the last daemon's "serving" line first (a client
  # then met no daemon on the bus).
  : >"$work/memd.log"
  "$memd" --config "$work/memd.conf" --bus "$bus" --state-dir "" >>"$work/memd.log" 2>&1 &
  memd_pid=$!
  wait_memd_up "$work/memd.log" "$memd_pid" "$bench"
}
stop_memd() { kill "$memd_pid"; wait "$memd_pid" 2>/dev/null || true; memd_pid=""; }

stream_cleanup() {
  [[ -n $held_pid ]] && kill "$held_pid" 2>/dev/null || true
  [[ -n $memd_pid ]] && kill "$memd_pid" 2>/dev/null || true
  [[ -f $work/dbus.pid ]] && kill "$(cat "$work/dbus.pid")" 2>/dev/null || true
  [[ -n $memcg ]] && rmdir "$memcg" 2>/dev/null || true
  throttle_off
}

cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2f", a/b; else printf "-" }'; }
mib() { awk -v b="$1" 'BEGIN{printf "%.1f", b/1048576}'; }

# Bytes a process caused to be read from storage (/proc/PID/io read_bytes:
# its page faults' reads and readahead, its io_uring workers' O_DIRECT reads);
# other processes on the machine do not count.
read_bytes() { awk '/^read_bytes:/ {print $2}' "/proc/$1/io"; }

# A memory cgroup for one command: LIMIT bytes (no swap), and on cgroup v2
# the speed's read throttle too (a v2 process is in one group only).
# cgroup v1: the memory hierarchy's own group; the throttle stays inherited.
memcg_make() {  # limit
  local v2=/sys/fs/cgroup/unified
  [[ -f /sys/fs/cgroup/cgroup.controllers ]] && v2=/sys/fs/cgroup
  if [[ -d /sys/fs/cgroup/memory && ! -f /sys/fs/cgroup/cgroup.controllers ]]; then
    memcg=/sys/fs/cgroup/memory/airs-bench-mem.$$
    mkdir -p "$memcg"
    echo "$1" >"$memcg/memory.limit_in_bytes"
    [[ -f $memcg/memory.memsw.limit_in_bytes ]] && echo "$1" >"$memcg/memory.memsw.limit_in_bytes"
    memcg_kind="cgroup v1 memory.limit_in_bytes"
  elif grep -qw memory "$v2/cgroup.controllers" 2>/dev/null; then
    memcg=$v2/airs-bench-mem.$$
    grep -qw memory "$v2/cgroup.subtree_control" || echo +memory >"$v2/cgroup.subtree_control"
    mkdir -p "$memcg"
    echo "$1" >"$memcg/memory.max"
    [[ -f $memcg/memory.swap.max ]] && echo 0 >"$memcg/memory.swap.max"
    if [[ -n $throttle_cg && $throttle_kind == "cgroup v2 io.max" ]]; then
      grep -qw io "$v2/cgroup.subtree_control" || echo +io >"$v2/cgroup.subtree_control"
      echo "$throttle_majmin rbps=$sd_bps" >"$memcg/io.max"
    fi
    memcg_kind="cgroup v2 memory.max"
  else
    echo "$bench: no memory cgroup controller" >&2; exit 1
  fi
}
memcg_drop() { rmdir "$memcg" 2>/dev/null || true; memcg=""; }

# held_start KEY CGROUP CMD...: CMD from a cold page cache (in CGROUP's
# procs if not empty), its stdin a fifo this shell holds open (fd 7), its
# output in $work/KEY.out and .err; sets held_pid.
held_start() {
  local key=$1 cg=$2; shift 2
  rm -f "$work/hold.fifo"; mkfifo "$work/hold.fifo"
  cold
  sh -c '[ -z "$1" ] || echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$@" \
    <"$work/hold.fifo" >"$work/$key.out" 2>"$work/$key.err" &
  held_pid=$!
  exec 7>"$work/hold.fifo"
}
# held_wait KEY REGEX: until a line of its output matches (held_timeout
# seconds at most, 20 minutes unless set); false, saying why with its
# stderr, when it ended or timed out first.
held_timeout=1200
held_wait() {
  local end=$(( $(date +%s) + held_timeout ))
  while (( $(date +%s) < end )); do
    grep -qE "$2" "$work/$1.out" && return 0
    kill -0 "$held_pid" 2>/dev/null || break
    sleep 0.02
  done
  grep -qE "$2" "$work/$1.out" && return 0
  if kill -0 "$held_pid" 2>/dev/null; then
    echo "$bench: $1 did not print /$2/ within $held_timeout s" >&2
  else
    echo "$bench: $1 ended before it printed /$2/" >&2
  fi
  cat "$work/$1.err" >&2
  return 1
}
# held_kill: the process ended (SIGKILL), its status collected.
held_kill() {
  [[ -n $held_pid ]] || return 0
  kill -9 "$held_pid" 2>/dev/null || true
  exec 7>&-
  wait "$held_pid" 2>/dev/null || true
  held_pid=""
}
held_line() { echo >&7; }
# held_end: EOF on its stdin; its exit status.
held_end() {
  exec 7>&-
  local rc=0
  wait "$held_pid" || rc=$?
  held_pid=""
  return $rc
}
