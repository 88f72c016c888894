# SPDX-License-Identifier: Apache-2.0
# Sourced by the benches (bash): an SD card's read speed for this shell and
# every process it starts from now on. A cgroup v2 io.max throttle where the
# io controller is on the v2 hierarchy, else the cgroup v1 blkio one (hybrid
# hierarchies bind io to v1), on the whole disk holding FILE. Root only.
#
#   throttle_on FILE BYTES_PER_S   # sets throttle_kind, throttle_disk, throttle_majmin
#   throttle_off                   # back to the shell's own group; the group is removed
throttle_cg=""
throttle_home=""
throttle_kind=""
throttle_disk=""
throttle_majmin=""
throttle_on() {
  local file=$1 bps=$2 src parent v2=/sys/fs/cgroup/unified
  src=$(findmnt -no SOURCE -T "$file")
  parent=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1 || true)
  throttle_disk=${parent:+/dev/$parent}
  throttle_disk=${throttle_disk:-$src}
  throttle_majmin=$(lsblk -dno MAJ:MIN "$throttle_disk" | tr -d ' ')
  [[ -f /sys/fs/cgroup/cgroup.controllers ]] && v2=/sys/fs/cgroup
  if [[ -f $v2/cgroup.controllers ]] && grep -qw io "$v2/cgroup.controllers"; then
    throttle_cg=$v2/airs-bench-sd.$$
    mkdir -p "$throttle_cg"
    grep -qw io "$v2/cgroup.subtree_control" || echo +io >"$v2/cgroup.subtree_control"
    echo "$throttle_majmin rbps=$bps" >"$throttle_cg/io.max"
    throttle_home=$v2$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
    throttle_kind="cgroup v2 io.max"
  elif [[ -d /sys/fs/cgroup/blkio ]]; then
    throttle_cg=/sys/fs/cgroup/blkio/airs-bench-sd.$$
    mkdir -p "$throttle_cg"
    echo "$throttle_majmin $bps" >"$throttle_cg/blkio.throttle.read_bps_device"
    throttle_home=/sys/fs/cgroup/blkio$(awk -F: '$2 == "blkio" {print $3}' /proc/self/cgroup)
    throttle_kind="cgroup v1 blkio.throttle.read_bps_device (the io controller is bound to v1 here)"
  else
    echo "throttle: no cgroup io controller (v2 io.max or v1 blkio) to throttle with" >&2
    return 1
  fi
  echo $$ >"$throttle_cg/cgroup.procs"  # children inherit it
}
throttle_off() {
  [[ -n $throttle_cg ]] || return 0
  echo $$ >"$throttle_home/cgroup.procs" 2>/dev/null || true
  rmdir "$throttle_cg" 2>/dev/null || true
  throttle_cg=""
}
