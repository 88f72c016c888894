#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/load: the recorded access order against the static layer order
# (order_bench), on the fast disk and under the SD-card throttle (~90 MB/s:
# a cgroup v1 blkio.throttle.read_bps_device, or cgroup v2 io.max, on the
# disk holding the model file; the pager's O_DIRECT reads are throttled, its
# io_uring workers are threads of the same process).
#
#   bench/load/bench_order.sh --build BUILD_DIR [--bps 90000000] [--reps 3] [order_bench options]
# Needs root.
set -euo pipefail
build="" bps=90000000 extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --bps) bps=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
[[ -n $build ]] || { echo "bench_order: --build BUILD_DIR is required" >&2; exit 2; }
[[ $EUID -eq 0 ]] || { echo "bench_order: needs root (drop_caches, cgroups)" >&2; exit 1; }
bench=$build/bench/load/order_bench
[[ -x $bench ]] || { echo "bench_order: $bench missing (build it)" >&2; exit 1; }
file=/var/tmp/airs-order-bench.bin
for ((i = 0; i < ${#extra[@]}; i++)); do [[ ${extra[i]} == --file ]] && file=${extra[i + 1]}; done
mkdir -p "$(dirname "$file")"

"$bench" --label "fast disk" "${extra[@]}"

# The whole disk under the file system holding the file.
src=$(df --output=source "$(dirname "$file")" | tail -1)
disk=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1)
majmin=$(lsblk -dno MAJ:MIN "/dev/${disk:-$(basename "$src")}" | tr -d ' ')
cg=""
if [[ -d /sys/fs/cgroup/blkio ]]; then
  cg=/sys/fs/cgroup/blkio/airs-bench-order-$$
  mkdir "$cg"
  echo "$majmin $bps" >"$cg/blkio.throttle.read_bps_device"
elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw io /sys/fs/cgroup/cgroup.controllers; then
  echo +io >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  cg=/sys/fs/cgroup/airs-bench-order-$$
  mkdir "$cg"
  echo "$majmin rbps=$bps" >"$cg/io.max"
else
  echo "bench_order: no blkio or io cgroup controller: no SD-card row" >&2
  exit 0
fi
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
(echo "$BASHPID" >"$cg/cgroup.procs" && exec "$bench" --label "SD card ($((bps / 1000000)) MB/s, $majmin)" "${extra[@]}")
