#!/bin/busybox sh
# SPDX-License-Identifier: Apache-2.0
# PID 1 of the test VM's initramfs (built by run-vm.sh). Mounts the host's
# root (read-only 9p) under an overlay whose upper layer is the scratch disk,
# sets up the mounts a Debian machine has, runs the job in a chroot there,
# and powers off. Parameters come on the kernel command line (airs.*).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
up0=$(cut -d' ' -f1 /proc/uptime)

for arg in $(cat /proc/cmdline); do
  case $arg in
    airs.job=*) job=${arg#airs.job=} ;;
    airs.results=*) results=${arg#airs.results=} ;;
    airs.kver=*) kver=${arg#airs.kver=} ;;
    airs.root=*) root=${arg#airs.root=} ;;
    airs.overlays=*) overlays=${arg#airs.overlays=} ;;
    airs.init=*) init=${arg#airs.init=} ;;
  esac
done

die() {
  echo "guest-init: $*" > /dev/console
  [ -d /newroot$results ] && echo "guest-init: $*" > /newroot$results/init-error
  sync; poweroff -f
}

for m in $(cat /modules/load); do insmod /modules/$m 2>/dev/null; done
p9="trans=virtio,version=9p2000.L,msize=512000"
# The root: this host's (airs.root=host, the default) or the guest
# architecture's own userland (airs.root=own), with the host root beside it
# at /host for the overlaid build-tree paths.
if [ "${root:-host}" = own ]; then
  mount -t 9p -o "$p9,ro,cache=loose" guestroot /lower || die "cannot mount the guest userland (9p guestroot)"
  mkdir -p /host
  mount -t 9p -o "$p9,ro,cache=loose" hostroot /host || die "cannot mount the host root (9p hostroot)"
else
  mount -t 9p -o "$p9,ro,cache=loose" hostroot /lower || die "cannot mount the host root (9p hostroot)"
fi
mount -t ext4 /dev/vda /scratch || die "cannot mount the scratch disk"
mkdir -p /scratch/upper /scratch/work /scratch/tmp /scratch/var-tmp
chmod 1777 /scratch/tmp /scratch/var-tmp
mount -t overlay -o lowerdir=/lower,upperdir=/scratch/upper,workdir=/scratch/work overlay /newroot \
  || die "cannot mount the overlay root"
r=/newroot
mount -t proc proc $r/proc
mount -t sysfs sysfs $r/sys
mount -t devtmpfs devtmpfs $r/dev
mkdir -p $r/dev/pts $r/dev/shm $r/dev/hugepages
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts $r/dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $r/dev/shm
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs $r/run
mkdir -p $r/run/lock $r/run/user && chmod 1777 $r/run/lock
mount --bind /scratch/tmp $r/tmp
mount --bind /scratch/var-tmp $r/var/tmp
# Host paths (the build tree) at their own paths in the guest's root,
# writable through an overlay on the scratch disk: in the guest
# architecture's own userland, and in the host's root where the guest
# mounts its own over them (a tree under /tmp or /var/tmp). After those
# mounts, which would hide them.
hostroot=/host
[ "${root:-host}" = own ] || hostroot=/lower
i=0
for p in $(echo "${overlays:-}" | tr ',' ' '); do
  i=$((i + 1))
  mkdir -p /scratch/ov$i/upper /scratch/ov$i/work $r$p
  mount -t overlay -o lowerdir=$hostroot$p,upperdir=/scratch/ov$i/upper,workdir=/scratch/ov$i/work overlay $r$p \
    || die "cannot overlay $p from the host"
done
# airs.init=systemd: systemd mounts the cgroups itself (v2, as on a
# Debian 12 machine) and /run stays as mounted here.
if [ "${init:-chroot}" != systemd ]; then
# cgroups laid out as on the host that runs the suite (hybrid): v2 at
# /sys/fs/cgroup/unified with memory, cpu and pids for child groups (memory
# pressure tests), v1 blkio at /sys/fs/cgroup/blkio (the client tests slow
# the daemon's reads with its throttle; v2 io has no equivalent there).
mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs $r/sys/fs/cgroup
mkdir -p $r/sys/fs/cgroup/unified $r/sys/fs/cgroup/blkio
mount -t cgroup -o blkio cgroup $r/sys/fs/cgroup/blkio
mount -t cgroup2 -o nsdelegate cgroup2 $r/sys/fs/cgroup/unified
for c in cpu memory pids; do echo "+$c" > $r/sys/fs/cgroup/unified/cgroup.subtree_control 2>/dev/null; done
fi
mount -t hugetlbfs -o mode=1770 hugetlbfs $r/dev/hugepages
mount -t debugfs debugfs $r/sys/kernel/debug 2>/dev/null
# The guest kernel's modules where modprobe looks for them.
mkdir -p $r/lib/modules/$kver
mount -t 9p -o "$p9,ro" modules $r/lib/modules/$kver || die "cannot mount the kernel's modules (9p modules)"
mkdir -p $r$results
mount -t 9p -o "$p9,cache=none" results $r$results || die "cannot mount the results share (9p results)"
echo "$(cut -d' ' -f1 /proc/uptime)" > $r$results/booted
ln -sf /proc/self/fd $r/dev/fd 2>/dev/null
hostname airs-vm

up1=$(cut -d' ' -f1 /proc/uptime)
if [ "${init:-chroot}" = systemd ]; then
  # systemd as PID 1 on the guest root; the job (systemd.run= on the
  # command line) adds its own times and powers the guest off.
  chroot $r /sbin/ldconfig
  {
    echo "kernel-boot $up0"
    echo "guest-setup $(awk -v a=$up0 -v b=$up1 'BEGIN { printf "%.1f", b - a }')"
  } > $r$results/timing
  echo "$up1" > $r$results/init-done
  echo "guest-init: kernel $(uname -r), switching to systemd for $job" > /dev/console
  exec switch_root $r /lib/systemd/systemd
fi
echo "guest-init: kernel $(uname -r), running $job" > /dev/console
chroot $r /bin/sh "$job" < /dev/null > /dev/console 2>&1
up2=$(cut -d' ' -f1 /proc/uptime)
{
  echo "kernel-boot $up0"
  echo "guest-setup $(awk -v a=$up0 -v b=$up1 'BEGIN { printf "%.1f", b - a }')"
  echo "guest-tests $(awk -v a=$up1 -v b=$up2 'BEGIN { printf "%.1f", b - a }')"
} > $r$results/timing
sync
umount $r$results
poweroff -f
