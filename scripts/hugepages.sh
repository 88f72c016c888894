#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Makes sure at least N huge pages of the default size are free and that a
# hugetlbfs is mounted at /dev/hugepages (what Debian's dev-hugepages.mount
# does under systemd). Usage: hugepages.sh BYTES. Run as root.
set -euo pipefail
want_bytes=${1:?usage: hugepages.sh BYTES}
hp_kb=$(awk '/^Hugepagesize:/ {print $2}' /proc/meminfo)
if [[ -z "$hp_kb" ]]; then
  echo "this kernel has no hugetlbfs (CONFIG_HUGETLBFS off): airs-memd will use its shmem backend" >&2
  exit 0
fi
need=$(( (want_bytes / 1024 + hp_kb - 1) / hp_kb ))
free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
total=$(awk '/^HugePages_Total:/ {print $2}' /proc/meminfo)
if (( free < need )); then
  target=$(( total + need - free ))
  echo "==> vm.nr_hugepages: $total -> $target (${hp_kb} kB pages)"
  echo "$target" > /proc/sys/vm/nr_hugepages
  free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
  if (( free < need )); then
    echo "only $free of $need huge pages could be reserved (memory fragmented?)." >&2
    echo "Reserve them at boot: hugepages=$target on the kernel command line" \
         "(cmdline.txt on Raspberry Pi OS) or vm.nr_hugepages=$target in /etc/sysctl.d/." >&2
    exit 1
  fi
fi
if ! grep -q ' /dev/hugepages hugetlbfs ' /proc/mounts; then
  mkdir -p /dev/hugepages
  mount -t hugetlbfs -o mode=1770 hugetlbfs /dev/hugepages
fi
echo "==> huge pages: $(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo) free of $(awk '/^HugePages_Total:/ {print $2}' /proc/meminfo) (${hp_kb} kB)"
