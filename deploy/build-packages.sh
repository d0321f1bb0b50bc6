#!/usr/bin/env bash
# Builds the Debian packages (cmake/MooncakePackaging.cmake): a release tree
# without tests, `cpack -G DEB`, the .deb paths on stdout.
#
#   deploy/build-packages.sh [--build-dir DIR] [--out DIR] [--jobs N] [--lintian]
#
#   --build-dir DIR  the build tree (default: <repo>/build-deb); configured
#                    Release, prefix /usr, tests and benchmarks off, no
#                    bundle RPATH
#   --out DIR        where the .debs go (default: DIR/packages)
#   --jobs N         parallel build jobs (default: nproc)
#   --lintian        run lintian on each .deb: fails on errors (E:), lists
#                    warnings (deploy/install-deps.sh installs lintian)
# Makes mooncaked, libmooncake-client, libmooncake-client-dev, mooncake-tools
# and, when pybind11 and the Python headers are there, python3-mooncake-client
# (deploy/README.md, "Debian packages").
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$repo/build-deb
out=""
jobs=$(nproc)
lintian=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --lintian) lintian=1; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-packages.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done
out=${out:-$build/packages}

log() { echo "build-packages: $*" >&2; }
die() { echo "build-packages: $*" >&2; exit 1; }

command -v dpkg-shlibdeps >/dev/null 2>&1 || die "dpkg-shlibdeps not found: apt-get install dpkg-dev"
if [[ $lintian -eq 1 ]]; then
  command -v lintian >/dev/null 2>&1 || die "lintian not found: deploy/install-deps.sh"
fi

# Prefix /usr at configure time: GNUInstallDirs then uses Debian's multiarch
# libdir (lib/<triplet>). MOONCAKE_BUNDLE_RPATH off: packaged programs find
# their libraries in the system paths (CPack strips any RPATH anyway).
# Debian's compiler and linker flags, all hardening on (fortify, stack
# protector, relro, bindnow), as a Debian build would use them.
export DEB_BUILD_MAINT_OPTIONS=${DEB_BUILD_MAINT_OPTIONS:-hardening=+all}
eval "$(dpkg-buildflags --export=sh)"
log "configuring $build"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DMOONCAKE_BUILD_TESTS=OFF -DMOONCAKE_BUILD_BENCH=OFF -DMOONCAKE_BUNDLE_RPATH=OFF >&2
log "building"
cmake --build "$build" -j"$jobs" >&2

rm -rf "$out"
mkdir -p "$out"
log "cpack -G DEB into $out"
(cd "$build" && cpack -G DEB -B "$out" >&2)
rm -rf "$out/_CPack_Packages"

shopt -s nullglob
debs=("$out"/*.deb)
[[ ${#debs[@]} -gt 0 ]] || die "cpack made no .deb in $out"
printf '%s\n' "${debs[@]}"

if [[ $lintian -eq 1 ]]; then
  errors=0
  for deb in "${debs[@]}"; do
    # Exit status 1 = errors were found (the tags say which), 2 = lintian
    # itself failed. Its stderr (e.g. the warning about running as root)
    # is shown only in the second case.
    rc=0
    report=$(lintian --display-level '>=warning' "$deb" 2>"$out/lintian.err") || rc=$?
    [[ $rc -le 1 ]] || die "lintian failed on $deb ($rc): $(cat "$out/lintian.err")"
    rm -f "$out/lintian.err"
    if grep -q '^E: ' <<<"$report"; then
      errors=1
    fi
    if [[ -n "$report" ]]; then
      log "lintian $(basename "$deb"):"
      sed 's/^/  /' <<<"$report" >&2
    else
      log "lintian $(basename "$deb"): clean"
    fi
  done
  [[ $errors -eq 0 ]] || die "lintian reported errors (E:) above"
fi
