#!/usr/bin/env bash
# Checks a built libmooncake_client.so (see CMakeLists.txt).
#   check_library.sh needed  LIB   no NEEDED libcudart / libcuda
#   check_library.sh exports LIB   only the public API is exported
set -euo pipefail
mode=${1:?usage: check_library.sh needed|exports LIB}
lib=${2:?usage: check_library.sh needed|exports LIB}
[[ -f "$lib" ]] || { echo "FAIL: $lib does not exist"; exit 1; }

case "$mode" in
needed)
  needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  echo "NEEDED of $(basename "$lib"):"
  sed 's/^/  /' <<<"$needed"
  # The CUDA runtime and driver, and the runtime's companions: the CUDA
  # transport resolves the driver at run time (drivers/), and needs no
  # runtime at all.
  bad=$(grep -E '^lib(cudart|cuda|nvrtc|cudadevrt)\.so' <<<"$needed" || true)
  if [[ -n "$bad" ]]; then
    echo "FAIL: $(basename "$lib") links CUDA at load time:" $bad
    echo "      a host-platform application would not load on a node without it"
    exit 1
  fi
  echo "PASS: no CUDA library among the NEEDED entries"
  ;;
exports)
  # Every defined dynamic symbol, demangled: "<address> <type> <name>",
  # then only the qualified name (parameter types name other namespaces
  # legitimately: Client::nextEvent(absl::Duration)).
  symbols=$(nm -D --defined-only -C "$lib" | cut -d' ' -f3- | sed 's/(.*//')
  count=$(grep -c . <<<"$symbols" || true)
  echo "$(basename "$lib") exports $count symbols"
  # The public API is a few classes and factory functions (their methods,
  # vtables and typeinfo); 124 on 2026-12-04, with the upstream-compatible
  # TransferEngine. A bound well above that catches a lost version script
  # or visibility preset (about 1900 without them).
  max=180
  fail=0
  kind='^(typeinfo for |typeinfo name for |vtable for |VTT for |non-virtual thunk to |guard variable for )?'
  forbidden="${kind}(mooncake::v1::|google::|grpc|gpr_|absl::|descriptor_table_|TableStruct_)"
  internal="${kind}mooncake::(.*::internal::|Client::Impl::|drivers::|LogLine|SetLogLevel|ErrnoStatus|SendFrame|RecvFrame)"
  if leaked=$(grep -E "$forbidden" <<<"$symbols"); then
    echo "FAIL: protobuf/gRPC/Abseil or mooncake::v1 symbols are exported:"
    head -20 <<<"$leaked" | sed 's/^/  /'
    fail=1
  fi
  if leaked=$(grep -E "$internal" <<<"$symbols"); then
    echo "FAIL: internal symbols are exported:"
    head -20 <<<"$leaked" | sed 's/^/  /'
    fail=1
  fi
  if outside=$(grep -vE '^(typeinfo for |typeinfo name for |vtable for |non-virtual thunk to )?mooncake::' <<<"$symbols"); then
    echo "FAIL: symbols outside namespace mooncake are exported:"
    head -20 <<<"$outside" | sed 's/^/  /'
    fail=1
  fi
  if (( count > max )); then
    echo "FAIL: $count exported symbols, more than $max: is the version script or" \
         "-fvisibility=hidden lost? (client/CMakeLists.txt)"
    fail=1
  fi
  if (( fail )); then exit 1; fi
  echo "PASS: only the public API (namespace mooncake) is exported"
  ;;
*)
  echo "usage: check_library.sh needed|exports LIB" >&2
  exit 64
  ;;
esac
