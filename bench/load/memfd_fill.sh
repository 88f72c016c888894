#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The base-page shmem fill (docs/shmem-base-pages.md) in one run: load_bench
# with the shmem pool forced onto memfds of base pages (--memfd: what a kernel
# without transparent huge pages, as stock Raspberry Pi OS, gets), the
# pager's copy fill off (reads straight into the region mapping) and on
# (reads into a bounce buffer, then a write into the file), full mode
# (hugetlbfs) alongside in every invocation, cold, compute 0. Repetitions
# interleaved (off, on, then on, off, ...), on the machine's own disk and
# throttled to an SD card's ~90 MB/s (bench/support/throttle.sh).
#
#   bench/load/memfd_fill.sh --build BUILD_DIR [--reps 3] [--size-mib 512] [--sd-bps 94371840]
# Prints one line per invocation and scenario, then the median pass ratio
# against full mode per variant. Root only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=""
reps=3
size_mib=512
sd_bps=94371840
file=/var/tmp/airs-memfd-fill.bin
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --size-mib) size_mib=$2; shift 2 ;;
    --sd-bps) sd_bps=$2; shift 2 ;;
    --file) file=$2; shift 2 ;;
    *) echo "usage: $0 --build BUILD_DIR [--reps N] [--size-mib N] [--sd-bps N] [--file F]" >&2; exit 2 ;;
  esac
done
[[ -n $build ]] || { echo "memfd_fill.sh: --build BUILD_DIR is required" >&2; exit 2; }
[[ $EUID -eq 0 ]] || { echo "memfd_fill.sh: needs root (drop_caches, cgroups)" >&2; exit 1; }
bench=$build/bench/load/load_bench
[[ -x $bench ]] || { echo "memfd_fill.sh: $bench missing (build it with -DAIRS_BUILD_BENCH=ON)" >&2; exit 1; }
source "$here/../support/throttle.sh"
trap throttle_off EXIT

out=$(mktemp)
trap 'throttle_off; rm -f "$out"' EXIT
# One invocation: rows "speed rep copy scenario pass_ms pass/(d) loop_cpu_ms cpu_ms".
run() {
  local speed=$1 rep=$2 copy=$3
  "$bench" --file "$file" --size-mib "$size_mib" --layers 16 --compute-us 0 --only def --memfd \
    --copy-fill "$copy" 2>/dev/null |
    awk -v s="$speed" -v r="$rep" -v c="$copy" '
      /^\(d\) airs lazy \(full\) +[0-9]/ { print s, r, c, "full", $(NF-8), $(NF-2), $(NF-1), $NF }
      /^\(e\) airs small-pages +[0-9]/ { print s, r, c, "small-pages", $(NF-8), $(NF-2), $(NF-1), $NF }
      /^\(f\) airs cooperative +[0-9]/ { print s, r, c, "cooperative", $(NF-8), $(NF-2), $(NF-1), $NF }'
}
series() {
  local speed=$1
  for ((rep = 1; rep <= reps; ++rep)); do
    if ((rep % 2)); then order="0 1"; else order="1 0"; fi
    for copy in $order; do run "$speed" "$rep" "$copy" | tee -a "$out"; done
  done
}
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "speed rep copy_fill scenario pass_ms pass/full loop_cpu_ms cpu_ms"
series fast
throttle_on "$file" "$sd_bps"
series sd
throttle_off
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "median over $reps repetitions: pass ms, pass/full, loop CPU ms, process CPU ms"
for speed in fast sd; do
  for scen in full small-pages cooperative; do
    for copy in 0 1; do
      awk -v s="$speed" -v c="$copy" -v n="$scen" '$1 == s && $3 == c && $4 == n { print $5, $6, $7, $8 }' "$out" |
        sort -n | awk -v s="$speed" -v c="$copy" -v n="$scen" '
          { p[NR] = $1; line[NR] = $0 }
          END { if (NR) { split(line[int((NR + 1) / 2)], m, " ");
                          printf "%-5s %-12s copy_fill=%s  pass %7.1f  pass/full %6s  loop %5s  cpu %5s\n", s, n, c, m[1], m[2], m[3], m[4] } }'
    done
  done
done
