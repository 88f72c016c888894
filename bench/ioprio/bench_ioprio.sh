#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A client's fault latency (p50, p99) while a second model warms up, with
# and without the pager's per-read I/O priorities (fault best-effort 0,
# warm-up idle: src/pager/fill_engine.hpp), under each I/O scheduler this
# kernel has that honours priorities (mq-deadline, bfq). Prints each side
# and the ratio (without / with). Root only.
#
# The device: priorities only matter where the scheduler holds requests,
# i.e. where more are queued than the device takes. Both models sit on one
# ext4 on a loop device (--direct-io=on to an image on this machine's disk)
# with 64 KiB requests: a 2 MiB unit is 32 of them, the pager's 16 reads in
# flight ~512, against the loop driver's 128 tags; nr_requests 1024 keeps
# them all in the scheduler (at 128 the rest would wait for a tag, in no
# order of priority). The loop device is the slow device: a throttle would
# not do. blk-throttle on the loop device holds bios above the scheduler,
# where no priority counts; on the disk under it, it does not reach the
# loop's reads of its backing file on a cgroup v1 blkio hierarchy (measured
# here: the warm-up ran at 628 MB/s under a 40 MiB/s limit).
#
#   bench/ioprio/bench_ioprio.sh --build BUILD_DIR [--faults 32]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=""; faults=32
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    *) echo "usage: $0 --build BUILD_DIR [--faults N]" >&2; exit 2 ;;
  esac
done
[[ -n $build ]] || { echo "bench_ioprio.sh: --build BUILD_DIR is required" >&2; exit 2; }
[[ $EUID -eq 0 ]] || { echo "bench_ioprio.sh: needs root (loop devices, cgroups, drop_caches)" >&2; exit 1; }
bench=$build/bench/ioprio/ioprio_bench
[[ -x $bench ]] || { echo "bench_ioprio.sh: $bench missing (build it with -DAIRS_BUILD_BENCH=ON)" >&2; exit 1; }

img=/var/tmp/airs-ioprio-bench.$$.img
mnt=/tmp/airs-ioprio-bench.$$
dev=""
cleanup() {
  mountpoint -q "$mnt" && umount "$mnt"
  rmdir "$mnt" 2>/dev/null || true
  [[ -n $dev ]] && losetup -d "$dev"
  rm -f "$img"
}
trap cleanup EXIT
truncate -s 1G "$img"
dev=$(losetup --find --show --direct-io=on "$img")
mkfs.ext4 -q -F "$dev"
mkdir -p "$mnt"
mount "$dev" "$mnt"
q=/sys/block/${dev#/dev/}/queue
echo 64 >"$q/max_sectors_kb"
echo "device: $dev (loop, direct I/O to $img), max_sectors_kb $(cat "$q/max_sectors_kb")"
echo "kernel $(uname -r); schedulers: $(cat "$q/scheduler")"
echo "machine: $(nproc) CPUs, shared with other work while this ran (the numbers are one run each)"

declare -A p50 p99
for sched in mq-deadline bfq; do
  if ! grep -qw "$sched" "$q/scheduler"; then echo "SKIP $sched: not offered by this kernel"; continue; fi
  echo "$sched" >"$q/scheduler"
  echo 1024 >"$q/nr_requests"
  for prio in 0 1; do
    out=$("$bench" --client-file "$mnt/client.bin" --warm-file "$mnt/warm.bin" --priorities "$prio" --faults "$faults" 2>&1 |
          grep -v '^\[' | tail -1)
    echo "$sched (nr_requests $(cat "$q/nr_requests")): $out"
    p50[$sched.$prio]=$(grep -o 'p50 [0-9.]*' <<<"$out" | cut -d' ' -f2)
    p99[$sched.$prio]=$(grep -o 'p99 [0-9.]*' <<<"$out" | cut -d' ' -f2)
  done
  if [[ -n ${p50[$sched.1]:-} && -n ${p50[$sched.0]:-} ]]; then
    awk -v s="$sched" -v a="${p50[$sched.0]}" -v b="${p50[$sched.1]}" -v c="${p99[$sched.0]}" -v d="${p99[$sched.1]}" \
      'BEGIN { printf "%s: fault p50 %.1f -> %.1f ms (%.2fx), p99 %.1f -> %.1f ms (%.2fx) without -> with priorities\n", s, a, b, (b > 0 ? a / b : 0), c, d, (d > 0 ? c / d : 0) }'
  fi
done
