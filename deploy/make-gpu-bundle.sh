#!/usr/bin/env bash
# Builds the project here and makes a relocatable install prefix that runs on
# the GPU machine (shared/gpu.md, "Build here, run there"):
#   1. configure + build in its own build dir (default build-gpu), CUDA on;
#   2. install what was built into .gpu/prefix (git-ignored), every
#      component, the GPU tests and benchmarks included
#      (-DMOONCAKE_INSTALL_TESTS=ON), directory by directory, so a
#      half-finished area (daemon, client, ...) does not stop the GPU tests
#      and benchmarks from being installed;
#   3. copy every shared library that ldd names for the installed binaries
#      and that the GPU machine lacks (gRPC, protobuf, Abseil, c-ares, re2,
#      upb, address_sorting, and prometheus-cpp with civetweb for mooncaked's
#      metrics) into .gpu/prefix/lib; the binaries find them
#      through DT_RPATH=$ORIGIN/../lib. NCCL, the CUDA driver, glibc,
#      libstdc++, zlib, OpenSSL, rdma-core, systemd are on that machine and
#      are never copied;
#   4. strip, and check the prefix stays under 64 MiB (the limit of what
#      travels to the GPU machine).
# If the whole project does not configure (someone's area is mid-edit), it
# falls back to a GPU-only project made of bench/gpu and tests/gpu, and says so.
#
# Usage: deploy/make-gpu-bundle.sh [--build-dir DIR] [--prefix DIR] [--jobs N] [--gpu-only]
#                                  [--targets "T1 T2 ..."] [--pack]
# --targets builds only those targets (and what they need), e.g.
# "mooncaked mooncake_client" for tests/gpu/python_check.sh; the
# install step then skips the directories whose targets were not built.
# --pack also writes .gpu/bundle.tar.gz (gzip, about a third of the prefix;
# prefix/ inside). What travels to the GPU machine is the working tree plus
# what is carried, 64 MiB in all: the prefix with bin/etcd (for the cluster
# and elastic steps) and the tree exceed it, the tarball and the tree do not.
# Carry .gpu/bundle.tar.gz alone and hand it to run.sh, which unpacks it.
# Then, on the GPU machine, from the repository root:
#   tests/gpu/run.sh .gpu/prefix            (or: tests/gpu/run.sh .gpu/bundle.tar.gz)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-gpu"
prefix="$root/.gpu/prefix"
jobs=2
gpu_only=0
pack=0
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --prefix) prefix=$(realpath -m "$2"); shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --gpu-only) gpu_only=1; shift ;;
    --targets) read -r -a targets <<<"$2"; shift 2 ;;
    --pack) pack=1; shift ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "make-gpu-bundle: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
limit_bytes=$((64 * 1024 * 1024))

log() { echo "make-gpu-bundle: $*"; }

# Libraries the GPU machine does not have (gpu.md); everything else ldd
# lists must already be there.
bundled_re='^lib(grpc|gpr|protobuf|protoc|absl_|cares|re2|upb|address_sorting|prometheus-cpp|civetweb)'
# Never ship these, whatever pattern matches.
never_re='^lib(nccl|cuda|cudart|nvidia|c\.so|m\.so|stdc\+\+|gcc_s|pthread|dl\.so|rt\.so|z\.so|ssl|crypto|ibverbs|mlx5|nl-|systemd)'

configure_full() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMOONCAKE_WITH_CUDA=ON -DMOONCAKE_BUNDLE_RPATH=ON -DMOONCAKE_INSTALL_TESTS=ON \
    -DCMAKE_INSTALL_PREFIX="$prefix"
}

# A project with only the GPU tests and benchmarks (header-only device code).
configure_gpu_only() {
  local src="$build-gpuonly-src"
  mkdir -p "$src"
  cat >"$src/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(MooncakeGpuOnly LANGUAGES C CXX)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
set(CMAKE_CUDA_ARCHITECTURES 90)
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 20)
find_package(CUDAToolkit REQUIRED)
find_package(Threads REQUIRED)
include(GNUInstallDirs)
set(CMAKE_INSTALL_RPATH "\$ORIGIN/../\${CMAKE_INSTALL_LIBDIR}")
add_link_options("LINKER:--disable-new-dtags")
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY \${CMAKE_BINARY_DIR}/bin)
set(MOONCAKE_HAVE_CUDA ON)
set(MOONCAKE_INSTALL_TESTS ON)
add_subdirectory("$root/bench/gpu" bench_gpu)
add_subdirectory("$root/tests/gpu" tests_gpu)
EOF
  build="$build-gpuonly"
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix"
}

if [[ $gpu_only -eq 1 ]]; then
  configure_gpu_only
elif ! configure_full; then
  log "the full project does not configure (see above); building the GPU-only subset (bench/gpu, tests/gpu)"
  configure_gpu_only
fi

# Keep going past targets that fail to build: install whatever was built.
build_rc=0
cmake --build "$build" -j "$jobs" ${targets[@]+--target "${targets[@]}"} -- -k 0 || build_rc=$?
if [[ $build_rc -ne 0 ]]; then
  log "WARNING: some targets failed to build (rc=$build_rc); installing the ones that did"
fi

rm -rf "$prefix"
mkdir -p "$prefix"
# Install directory by directory: a failing install script (a target that
# did not build) skips only its own directory. Parents include their
# children, so a child may be installed twice; installs are idempotent.
install_failed=()
while IFS= read -r script; do
  dir=$(dirname "$script")
  if ! cmake -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LOCAL_ONLY=ON -P "$script" >/dev/null 2>"$build/install-err.txt"; then
    install_failed+=("${dir#"$build"/}")
  fi
done < <(find "$build" -name cmake_install.cmake -not -path '*/_deps/*' | sort)
if [[ ${#install_failed[@]} -gt 0 ]]; then
  log "WARNING: not installed (not built): ${install_failed[*]}"
fi

mkdir -p "$prefix/lib"
# etcd for the cluster step (tests/gpu/cluster_e2e.sh): the GPU machine has
# none and reaches no package mirror.
if [[ -x /usr/bin/etcd ]]; then cp /usr/bin/etcd "$prefix/bin/etcd"; else log "WARNING: no /usr/bin/etcd: the cluster step will skip"; fi
# Everything ELF under bin/ and lib/.
mapfile -t elves < <(find "$prefix/bin" "$prefix/lib" -type f 2>/dev/null | while read -r f; do
  if head -c 4 "$f" 2>/dev/null | grep -q $'\x7fELF'; then echo "$f"; fi
done)

copy_deps() {
  local f="$1" line name path
  while IFS= read -r line; do
    # "libfoo.so.1 => /path/libfoo.so.1 (0x...)" or "libfoo.so.1 => not found"
    name=$(awk '{print $1}' <<<"$line")
    path=$(awk '$2=="=>" {print $3}' <<<"$line")
    [[ -z "$name" ]] && continue
    if [[ "$path" == "not" ]]; then
      # Already bundled next to it (found through $ORIGIN) is fine.
      [[ -e "$prefix/lib/$name" ]] || log "WARNING: $(basename "$f") needs $name, which ldd cannot find here"
      continue
    fi
    [[ -z "$path" || ! -e "$path" ]] && continue
    if [[ "$name" =~ $never_re ]]; then continue; fi
    if [[ "$name" =~ $bundled_re ]]; then
      if [[ ! -e "$prefix/lib/$name" ]]; then
        cp -L "$path" "$prefix/lib/$name"
        chmod u+w "$prefix/lib/$name"
      fi
    fi
  done < <(ldd "$f" 2>/dev/null | grep '=>' || true)
}
for f in "${elves[@]}"; do copy_deps "$f"; done

# Strip symbols the binaries do not need at run time (no object files or
# static archives travel).
find "$prefix" \( -name '*.a' -o -name '*.o' \) -delete
for f in $(find "$prefix/bin" "$prefix/lib" -type f 2>/dev/null); do
  if head -c 4 "$f" | grep -q $'\x7fELF'; then strip --strip-unneeded "$f" 2>/dev/null || true; fi
done

# Report, and check what the bundle still needs from the GPU machine.
log "installed into $prefix:"
find "$prefix/bin" -type f -printf '  bin/%f\n' 2>/dev/null | sort
n_libs=$(find "$prefix/lib" -maxdepth 1 -name '*.so*' | wc -l)
log "bundled $n_libs shared libraries into lib/"
needs=$(for f in $(find "$prefix/bin" "$prefix/lib" -type f); do
  head -c 4 "$f" | grep -q $'\x7fELF' && readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
done | sort -u | while read -r n; do [[ -e "$prefix/lib/$n" ]] || echo "$n"; done | tr '\n' ' ')
log "expected on the GPU machine: $needs"
size=$(du -sb "$prefix" | awk '{print $1}')
log "bundle size: $((size / 1024 / 1024)) MiB ($size bytes)"
if [[ $size -ge $limit_bytes ]]; then
  log "ERROR: the bundle is over 64 MiB; it cannot travel to the GPU machine"
  exit 1
fi
if [[ ! -d "$prefix/bin" ]] || [[ -z "$(ls -A "$prefix/bin" 2>/dev/null)" ]]; then
  log "ERROR: nothing was installed into $prefix/bin"
  exit 1
fi
# A target that failed leaves its previous binary in the build tree, and
# that stale binary was installed above: say so with the exit status, so a
# GPU run never measures old code by accident (MC_BUNDLE_PARTIAL_OK=1 to
# accept a partial bundle on purpose).
if [[ $build_rc -ne 0 && "${MC_BUNDLE_PARTIAL_OK:-0}" != 1 ]]; then
  log "ERROR: some targets failed to build (see above); bin/ may hold stale binaries of them"
  exit 1
fi
# What the tree itself sends (tracked and untracked-not-ignored files).
tree_bytes=$(cd "$root" && git ls-files -co --exclude-standard -z 2>/dev/null |
  xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
if [[ $pack -eq 1 ]]; then
  tarball="$(dirname "$prefix")/bundle.tar.gz"
  tar -C "$(dirname "$prefix")" -czf "$tarball" "$(basename "$prefix")"
  packed=$(stat -c %s "$tarball")
  log "packed $tarball: $((packed / 1024 / 1024)) MiB; with the tree ($((tree_bytes / 1024 / 1024)) MiB)" \
    "$(((packed + tree_bytes) / 1024 / 1024)) MiB travel (limit 64)"
  log "on the GPU machine: tests/gpu/run.sh ${tarball#"$root"/} (carry it alone, not ${prefix#"$root"/})"
  if [[ $((packed + tree_bytes)) -ge $limit_bytes ]]; then
    log "ERROR: the tarball and the tree are over 64 MiB together"
    exit 1
  fi
elif [[ $((size + tree_bytes)) -ge $limit_bytes ]]; then
  log "NOTE: the prefix and the tree ($((tree_bytes / 1024 / 1024)) MiB) are over 64 MiB together:" \
    "carry less, or run again with --pack and carry the tarball"
fi
exit 0
