# SPDX-License-Identifier: Apache-2.0
# Sourced (bash) by the scripts that need root, after they cd to the source
# tree's top:  . scripts/root.sh; become_root "$@"
#
# become_root ARGS...: returns when already root (a root shell needs no
# sudo, and a fresh Debian container has none); otherwise re-runs the
# calling script under sudo with the same arguments and environment; with
# neither root nor sudo, says what to do and exits 1.
become_root() {
  [[ $EUID -eq 0 ]] && return 0
  local me
  me=$PWD/scripts/$(basename "$0")
  if command -v sudo >/dev/null 2>&1; then exec sudo -E "$me" "$@"; fi
  {
    echo "$(basename "$0"): needs root (it installs packages with apt-get and reserves huge pages),"
    echo "and this user is not root and sudo is not installed. Either:"
    echo "  - run it as root:  su -c '$me${*:+ $*}'"
    echo "  - or install sudo and add yourself to group sudo (then log in again):"
    echo "      su -c 'apt-get install -y sudo && adduser $(id -un) sudo'"
  } >&2
  exit 1
}
