#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mmdebstrap --extract-hook of the systemd userland (run-vm.sh --init
# systemd): records every package mmdebstrap extracted into ROOT (the .debs
# still in ROOT/var/cache/apt/archives) as installed in ROOT's dpkg
# database, with its file list, so that `dpkg -i` in the guest resolves the
# dependencies of the package under test against the packages that are
# really there (and finds no file owned twice). Their maintainer scripts
# never ran (extraction: the host cannot run arm64 code); what they would
# have set up and the guest needs is done by run-vm.sh (users and groups
# with systemd-sysusers, the awk alternative, the linker cache at boot).
# Runs on the host.
#
#   dpkg-status.sh ROOT
set -euo pipefail
root=$1
debs=("$root"/var/cache/apt/archives/*.deb)
[[ -e ${debs[0]} ]] || { echo "dpkg-status.sh: no .deb in $root/var/cache/apt/archives" >&2; exit 1; }
db=$root/var/lib/dpkg
mkdir -p "$db/info" "$db/updates" "$db/triggers"
# Database format 1: Multi-Arch: same packages' files are info/pkg:arch.*.
echo 1 > "$db/info/format"
: > "$db/status.new"
for deb in "${debs[@]}"; do
  control=$(dpkg-deb -f "$deb")
  pkg=$(dpkg-deb -f "$deb" Package)
  # Multi-Arch: same packages are named pkg:arch in the database.
  name=$pkg
  if [[ $(dpkg-deb -f "$deb" Multi-Arch) == same ]]; then name=$pkg:$(dpkg-deb -f "$deb" Architecture); fi
  # The status entry: the control fields with Status after Package.
  awk 'NR == 1 { print; print "Status: install ok installed"; next } { print }' <<<"$control" >> "$db/status.new"
  # Conffiles, as dpkg records them (path and md5sum of the shipped file).
  # (Lines with a flag, "remove-on-upgrade /etc/x", name no shipped file.)
  conf=$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles 2>/dev/null || true)
  entries=$(while read -r f; do
              [[ $f == /* && $f != *" "* && -f $root$f ]] && echo " $f $(md5sum < "$root$f" | cut -d' ' -f1)"
            done <<<"$conf"; true)
  [[ -z $entries ]] || printf 'Conffiles:\n%s\n' "$entries" >> "$db/status.new"
  echo >> "$db/status.new"
  dpkg-deb --fsys-tarfile "$deb" | tar -t | sed 's|^\./|/|; s|/$||; s|^$|/.|' > "$db/info/$name.list"
  dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./md5sums > "$db/info/$name.md5sums" 2>/dev/null || rm -f "$db/info/$name.md5sums"
done
mv "$db/status.new" "$db/status"
for f in available diversions statoverride; do [[ -e $db/$f ]] || : > "$db/$f"; done
echo "dpkg-status.sh: ${#debs[@]} packages recorded as installed in $db/status"
