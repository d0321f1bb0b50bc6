#!/usr/bin/env bash
# Prepares HERE (the build machine) what tests/gpu/upstream_ep/run.sh needs
# on the GPU machine, all under .gpu/upstream-ep/ (git-ignored, as .gpu/ is):
#   1. src/   upstream's sources at the pinned commit, by `git archive` from
#             the mirror, never edited (never copied into the repository):
#             mooncake-ep/ (CMake, kernels, host code, tests/test_ep_grid.py,
#             benchmarks/legacy_buffer_perf.py), the few files of
#             mooncake-wheel/mooncake/ that EP's Python path imports, and
#             mooncake-wheel/tests/test_mooncake_ep.py with its helper. Each
#             file is checked against its blob at the commit; MANIFEST.sha256
#             lets run.sh check they are still unchanged there.
#   2. deps/  glog + gflags (+ libunwind, which Debian's glog needs) shared
#             libraries and headers, from Debian 12 packages (the GPU machine
#             has neither), and <infiniband/*.h> for mooncake_ep_configs.cuh.
#   3. lib/libmooncake_ep_device.so: upstream's CUDA kernels (src/*.cu)
#             compiled here with nvcc for sm_90 only (slow on 2 cores, so it
#             is done once here, not on device time). Skipped with --no-build.
# Then send to the GPU machine (run tool, carry): .gpu/prefix/lib,
# .gpu/prefix/bin/mooncaked, .gpu/prefix/include, .gpu/upstream-ep
# (deploy/make-gpu-bundle.sh makes .gpu/prefix).
#
# Usage: tests/gpu/upstream_ep/prepare.sh [--no-build]
# Environment: MC_UPSTREAM_MIRROR (bare git dir), MC_UPSTREAM_COMMIT,
#   MC_PREFIX (.gpu/prefix), MC_EP_DEVICE_BUILD (build-ep-device), JOBS (2)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
mirror=${MC_UPSTREAM_MIRROR:-/work/.mirror/kvcache-ai+Mooncake/repo}
# Pinned: the snapshot issue 25 is written against.
commit=${MC_UPSTREAM_COMMIT:-3b5a594133958449a1feaf1c9e0fc1b553e34a28}
prefix=${MC_PREFIX:-$root/.gpu/prefix}
out=$root/.gpu/upstream-ep
# Outside .gpu/upstream-ep so the object files do not travel (/build*/ is ignored).
build=${MC_EP_DEVICE_BUILD:-$root/build-ep-device}
jobs=${JOBS:-2}
do_build=1
[[ "${1:-}" == "--no-build" ]] && do_build=0
log() { echo "upstream_ep/prepare: $*"; }

# ---- 1. upstream sources, unchanged ------------------------------------------
# Only what the build and the test read: EP's Python path imports
# mooncake/{__init__,buffer_pool,ep,pg,mooncake_ep_buffer}.py.
paths=(
  mooncake-ep
  mooncake-wheel/mooncake/__init__.py
  mooncake-wheel/mooncake/buffer_pool.py
  mooncake-wheel/mooncake/ep.py
  mooncake-wheel/mooncake/pg.py
  mooncake-wheel/mooncake/mooncake_ep_buffer.py
  mooncake-wheel/tests/test_mooncake_ep.py
  mooncake-wheel/tests/ep_test_utils.py
)
git --git-dir="$mirror" cat-file -e "$commit^{commit}" || { log "commit $commit not in $mirror"; exit 1; }
rm -rf "$out/src"
mkdir -p "$out/src"
# The mirror lacks some large blobs elsewhere in the tree; git archive names
# them on stderr and exits 0. Kept quiet here: the check below is what counts.
git --git-dir="$mirror" archive --format=tar "$commit" -- "${paths[@]}" 2>"$out/archive.err" | tar -x -C "$out/src"
{
  echo "kvcache-ai/Mooncake $commit (git archive, unchanged)"
  git --git-dir="$mirror" ls-tree -r "$commit" -- "${paths[@]}"
} >"$out/src/UPSTREAM"
# Every extracted file is byte for byte the blob at $commit.
while read -r _ _ blob path; do
  got=$(git hash-object "$out/src/$path" 2>/dev/null || echo missing)
  [[ "$got" == "$blob" ]] || { log "$path: $got, expected blob $blob"; cat "$out/archive.err" >&2; exit 1; }
done < <(tail -n +2 "$out/src/UPSTREAM")
rm -f "$out/archive.err"
(cd "$out/src" && find mooncake-ep mooncake-wheel -type f -print0 | sort -z | xargs -0 sha256sum) >"$out/src/MANIFEST.sha256"
log "extracted $(wc -l <"$out/src/MANIFEST.sha256") files of $commit into $out/src"

# ---- 2. glog, gflags, libunwind, infiniband headers --------------------------
# From the Debian packages, unpacked into a scratch folder (apt-get download +
# dpkg -x: nothing is installed on this machine). Needs `apt-get update` once.
debs=(libgoogle-glog-dev libgoogle-glog0v6 libgflags-dev libgflags2.2 libunwind8 libibverbs-dev)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && apt-get download "${debs[@]}" >/dev/null 2>"$tmp/apt.err"); then
  cat "$tmp/apt.err" >&2
  log "apt-get download ${debs[*]} failed (run apt-get update first)"
  exit 1
fi
for d in "$tmp"/*.deb; do dpkg -x "$d" "$tmp/x"; done
x=$tmp/x/usr
rm -rf "$out/deps"
mkdir -p "$out/deps/lib" "$out/deps/include"
# Real files under their sonames (no symlinks to lose on the way).
for so in libglog.so.1 libgflags.so.2.2 libunwind.so.8; do
  cp -L "$x/lib/x86_64-linux-gnu/$so" "$out/deps/lib/$so"
done
cp -r "$x/include/glog" "$x/include/gflags" "$x/include/infiniband" "$out/deps/include/"
log "deps: $(cd "$out/deps" && find . -type f | wc -l) files, $(du -sh "$out/deps" | cut -f1)"

# ---- 3. the device library, sm_90 only ---------------------------------------
if [[ $do_build -eq 0 ]]; then
  log "--no-build: skipped the device library"
  exit 0
fi
[[ -e "$prefix/include/transport/device/comm_device.cuh" ]] || { log "$prefix has no compat headers: run deploy/make-gpu-bundle.sh"; exit 1; }
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DEP_PART=device -DEP_SRC="$out/src" -DMC_PREFIX="$prefix" -DEP_DEPS="$out/deps" \
  -DCMAKE_CUDA_COMPILER="$(command -v nvcc)"
cmake --build "$build" --target mooncake_ep_device -j "$jobs"
mkdir -p "$out/lib"
cp "$build/lib/libmooncake_ep_device.so" "$out/lib/"
strip --strip-unneeded "$out/lib/libmooncake_ep_device.so"
log "device library: $(du -h "$out/lib/libmooncake_ep_device.so" | cut -f1); .gpu/upstream-ep: $(du -sh "$out" | cut -f1)"
cuobjdump --list-elf "$out/lib/libmooncake_ep_device.so" 2>/dev/null | sed 's/^/  /' || true
