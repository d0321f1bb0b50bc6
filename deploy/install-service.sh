#!/usr/bin/env bash
# Installs mooncaked as a systemd service: the one procedure, documented in
# deploy/README.md ("Install the service").
#
#   sudo deploy/install-service.sh [--build-dir DIR] [--prefix DIR] [--enable]
#   deploy/install-service.sh --destdir DIR [--build-dir DIR] [--prefix DIR]
#
# What it installs (under DIR when --destdir is given: a staging root for a
# package or an image, nothing on this machine is touched):
#   PREFIX/bin/{mooncaked,mcctl,...}, PREFIX/lib/..., headers  cmake --install of the build
#   /etc/systemd/system/mooncaked.service       0644, ExecStart under PREFIX
#   /etc/mooncake/                              0755
#   /etc/mooncake/mooncaked.conf.example        0644, refreshed every time
#   /etc/mooncake/mooncaked.conf                0644, only if absent: the example with
#                                               socket_group = mooncake
#   PREFIX/lib/sysusers.d/mooncake.conf         0644, declares the system group
#                                               "mooncake" that owns the sockets
# Without --destdir (as root) it then creates the group (systemd-sysusers, or
# groupadd where that is missing) and runs systemctl daemon-reload; with
# --enable also `systemctl enable --now mooncaked`. Adding users to the group
# is left to the administrator (usermod -aG mooncake USER).
#
# Options:
#   --build-dir DIR  the configured and built tree (default: <repo>/build)
#   --prefix DIR     install prefix (default: /usr/local)
#   --destdir DIR    stage everything under DIR (no root needed)
#   --enable         enable and start the service (not with --destdir)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$repo/build
prefix=/usr/local
destdir=""
enable=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    --destdir) destdir=$(realpath -m "$2"); shift 2 ;;
    --enable) enable=1; shift ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-service.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done

log() { echo "install-service: $*"; }
die() { echo "install-service: $*" >&2; exit 1; }

[[ "$prefix" == /* ]] || die "--prefix must be an absolute path (got '$prefix')"
[[ -f "$build/CMakeCache.txt" ]] ||
  die "$build is not a configured build tree: cmake -S . -B build -G Ninja && cmake --build build"
[[ -x "$build/bin/mooncaked" ]] || die "$build/bin/mooncaked is not built: cmake --build $build"
if [[ -z "$destdir" ]]; then
  [[ $(id -u) -eq 0 ]] || die "installing into the system needs root: sudo $0 $*"
else
  [[ $enable -eq 0 ]] || die "--enable starts the service here: it does not go with --destdir"
fi
root=${destdir:-}  # "" = the real root

# 1. Binaries, library, headers, CMake package (every component but tests).
log "installing the build into ${root}${prefix}"
DESTDIR="$root" cmake --install "$build" --prefix "$prefix" >/dev/null

# 2. The unit, pointing at this prefix.
unit_dir=$root/etc/systemd/system
install -d -m 0755 "$unit_dir"
sed "s|/usr/local/bin/mooncaked|$prefix/bin/mooncaked|g" "$repo/deploy/mooncaked.service" \
  >"$unit_dir/mooncaked.service.tmp"
chmod 0644 "$unit_dir/mooncaked.service.tmp"
mv "$unit_dir/mooncaked.service.tmp" "$unit_dir/mooncaked.service"
log "unit: /etc/systemd/system/mooncaked.service"

# 3. Configuration: the example always, the config only if there is none
# (an administrator's file is never overwritten).
conf_dir=$root/etc/mooncake
install -d -m 0755 "$conf_dir"
install -m 0644 "$repo/deploy/mooncaked.conf.example" "$conf_dir/mooncaked.conf.example"
if [[ -e "$conf_dir/mooncaked.conf" ]]; then
  log "config: keeping the existing /etc/mooncake/mooncaked.conf"
  grep -Eq '^[[:space:]]*socket_group[[:space:]]*=' "$conf_dir/mooncaked.conf" ||
    log "note: it sets no socket_group: only root can connect (socket_mode 0660)"
else
  sed 's/^# socket_group = mooncake$/socket_group = mooncake/' \
    "$repo/deploy/mooncaked.conf.example" >"$conf_dir/mooncaked.conf.tmp"
  grep -q '^socket_group = mooncake$' "$conf_dir/mooncaked.conf.tmp" ||
    die "deploy/mooncaked.conf.example lost its '# socket_group = mooncake' line"
  chmod 0644 "$conf_dir/mooncaked.conf.tmp"
  mv "$conf_dir/mooncaked.conf.tmp" "$conf_dir/mooncaked.conf"
  log "config: /etc/mooncake/mooncaked.conf (socket_group = mooncake)"
fi

# 4. The socket group, declared for systemd-sysusers (it also creates it at
# boot on an image that ships this file).
sysusers_dir=$root$prefix/lib/sysusers.d
install -d -m 0755 "$sysusers_dir"
install -m 0644 "$repo/deploy/mooncake.sysusers" "$sysusers_dir/mooncake.conf"
log "group: $prefix/lib/sysusers.d/mooncake.conf (group mooncake)"

if [[ -n "$destdir" ]]; then
  log "staged under $destdir; on the target: systemd-sysusers, systemctl daemon-reload," \
      "systemctl enable --now mooncaked"
  exit 0
fi

# 5. On this machine: create the group, tell systemd.
if getent group mooncake >/dev/null; then
  log "group mooncake exists"
elif command -v systemd-sysusers >/dev/null 2>&1; then
  systemd-sysusers "$sysusers_dir/mooncake.conf"
  log "created group mooncake (systemd-sysusers)"
else
  groupadd --system mooncake
  log "created group mooncake (groupadd)"
fi
systemctl daemon-reload
if [[ $enable -eq 1 ]]; then
  systemctl enable --now mooncaked
  log "mooncaked enabled and started: systemctl status mooncaked"
else
  log "next: systemctl enable --now mooncaked"
fi
log "let users connect: usermod -aG mooncake USER (they log in again to pick it up)"
