#!/usr/bin/env bash
# Installs the Debian packages Mooncake builds against (Debian 12 / bookworm).
# Idempotent: asks apt only for what dpkg says is missing, and runs
# `apt-get update` only then. Works as root or through sudo; never prompts.
#
#   deploy/install-deps.sh           install what is missing
#   deploy/install-deps.sh --check   list what is missing; exit 1 if anything is
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libibverbs-dev ibverbs-providers
  libgtest-dev libgmock-dev
  clang-format git
  clang-14 libclang-rt-14-dev
  # A real etcd (3.4) for the etcd client's tests (tests/daemon/etcd_client_test.cc):
  # cross-node membership (daemon/etcd/) is tested against the server, not a fake.
  etcd-server
  # etcdctl: deploy/etcd-rbac.sh and its test (tests/deploy/etcd_rbac_test.sh).
  etcd-client
  # openssl makes the certificates of the peer-port mTLS test
  # (tests/integration/peer_tls_test.cc).
  openssl
  # The Python package (python/, tests/python/): pybind11 2.10 and the
  # Debian interpreter's headers and numpy (zero-copy buffer tests).
  pybind11-dev python3-dev python3-numpy
  # Prometheus metrics (daemon/metrics/): prometheus-cpp core + pull (its
  # embedded civetweb HTTP exposer), served only when metrics_listen is set.
  prometheus-cpp-dev
  # The Debian packages (cmake/MooncakePackaging.cmake, tests/packaging):
  # lintian checks the .debs that `cpack -G DEB` makes (dpkg-shlibdeps comes
  # with dpkg-dev, in build-essential).
  lintian
  # Man pages generated from each program's --help at build time
  # (cmake/MooncakeManPages.cmake); without it the hand-written deploy/man pages.
  help2man
)

check_only=0
case "${1:-}" in
  "") ;;
  --check) check_only=1 ;;
  -h|--help)
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
    exit 0 ;;
  *)
    echo "install-deps.sh: unknown argument '$1' (try --help)" >&2
    exit 64 ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps.sh: dpkg-query not found: this script supports Debian and Ubuntu only;" \
       "install the equivalents of: ${PACKAGES[*]}" >&2
  exit 1
fi

# The Kubernetes manifests' validator (deploy/k8s/validate, CTest
# deploy_k8s_manifests): kubernetes-models and js-yaml from the npm registry,
# versions and hashes pinned by its package-lock.json, into its own
# node_modules (about 30 MiB; nothing global). Node.js itself is the
# machine's (nodejs, with npm). Runs after the Debian packages below.
k8s_validate_deps() {
  local dir
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/k8s/validate"
  if ! command -v npm >/dev/null 2>&1; then
    echo "install-deps.sh: npm not found: install nodejs (with npm) for deploy/k8s/validate" >&2
    return 1
  fi
  # `npm ls` fails when a pinned package is missing or another version.
  if (cd "$dir" && npm ls --depth=0 >/dev/null 2>&1); then
    echo "install-deps.sh: deploy/k8s/validate node_modules are installed"
    return 0
  fi
  if [[ $check_only -eq 1 ]]; then
    echo "install-deps.sh: missing: deploy/k8s/validate node_modules (npm ci)"
    return 1
  fi
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  state=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [[ "$state" == "installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps.sh: all ${#PACKAGES[@]} packages are installed"
  k8s_validate_deps
  exit $?
fi
echo "install-deps.sh: missing: ${missing[*]}"
if [[ $check_only -eq 1 ]]; then
  k8s_validate_deps || true
  exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  # -n: fail instead of prompting when sudo would need a password.
  as_root=(sudo -n)
else
  echo "install-deps.sh: not root and sudo is not installed: run as root:" \
       "apt-get install ${missing[*]}" >&2
  exit 1
fi

apt_env=(env DEBIAN_FRONTEND=noninteractive)
"${as_root[@]}" "${apt_env[@]}" apt-get update -q
"${as_root[@]}" "${apt_env[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"

# Verify: a package apt could not provide must not pass silently.
still=()
for pkg in "${missing[@]}"; do
  state=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [[ "$state" == "installed" ]] || still+=("$pkg")
done
if [[ ${#still[@]} -gt 0 ]]; then
  echo "install-deps.sh: still missing after apt-get install: ${still[*]}" >&2
  exit 1
fi
echo "install-deps.sh: installed ${missing[*]}"
k8s_validate_deps
