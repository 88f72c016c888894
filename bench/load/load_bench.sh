#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/load at two storage speeds in one run: load_bench (every loader and
# every airs mode side by side, cold) on the machine's own disk, then with the
# disk holding the file throttled to an SD card's ~90 MB/s (bench/support/
# throttle.sh: cgroup io.max, or v1 blkio where io is bound there; load_bench,
# its pager and the ring's workers all read inside the group).
#
#   bench/load/load_bench.sh --build BUILD_DIR [--sd-bps 94371840]
#       [--fast-args "..."] [--sd-args "..."]
# The args go to load_bench (defaults: 512 MiB / 16 layers fast, 256 MiB / 16
# layers throttled, compute 0 and 3000 µs per layer). Root only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=""
sd_bps=94371840
file=/var/tmp/airs-load-bench.bin
fast_args="--size-mib 512 --layers 16 --compute-us 0 3000"
sd_args="--size-mib 256 --layers 16 --compute-us 0 3000"
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --sd-bps) sd_bps=$2; shift 2 ;;
    --fast-args) fast_args=$2; shift 2 ;;
    --sd-args) sd_args=$2; shift 2 ;;
    --file) file=$2; shift 2 ;;
    *) echo "usage: $0 --build BUILD_DIR [--sd-bps N] [--fast-args ARGS] [--sd-args ARGS] [--file F]" >&2; exit 2 ;;
  esac
done
[[ -n $build ]] || { echo "load_bench.sh: --build BUILD_DIR is required" >&2; exit 2; }
[[ $EUID -eq 0 ]] || { echo "load_bench.sh: needs root (drop_caches, cgroups)" >&2; exit 1; }
bench=$build/bench/load/load_bench
[[ -x $bench ]] || { echo "load_bench.sh: $bench missing (build it with -DAIRS_BUILD_BENCH=ON)" >&2; exit 1; }
source "$here/../support/throttle.sh"
trap throttle_off EXIT

echo "=== fast: the machine's own disk ==="
# shellcheck disable=SC2086
"$bench" --file "$file.fast" $fast_args 2>&1 | grep -v '^\['
throttle_on "$file.fast" "$sd_bps"
echo
echo "=== sd: throttled to $sd_bps B/s with a $throttle_kind on $throttle_disk ($throttle_majmin) ==="
# shellcheck disable=SC2086
"$bench" --file "$file.sd" $sd_args 2>&1 | grep -v '^\['
throttle_off
