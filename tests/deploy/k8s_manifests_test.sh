#!/usr/bin/env bash
# deploy/k8s as a cluster would take it, without a cluster:
#   1. every manifest against the Kubernetes OpenAPI schemas, strictly (no
#      unknown fields), and the project's rules (deploy/k8s/validate/);
#   2. the validator fails on broken copies (a misspelt field, a wrong type,
#      privileged: true, an extra capability, a tenant pod mounting the
#      node's socket directory): a check that cannot fail checks nothing;
#   3. the ConfigMap's mooncaked.conf starts a real mooncaked (sockets moved
#      into a temporary directory) that reads the ConfigMap's tenants.policy
#      through a link as the kubelet mounts it, and the readiness probe's command,
#      `mcctl status`, passes on its socket and on each tenant's.
# Usage: k8s_manifests_test.sh REPO_DIR BIN_DIR
set -euo pipefail
repo=$1
bin=$2
k8s=$repo/deploy/k8s
validate=$k8s/validate

command -v node >/dev/null || { echo "FAIL: node not found (deploy/install-deps.sh)"; exit 1; }
[[ -d $validate/node_modules/kubernetes-models ]] ||
  { echo "FAIL: $validate/node_modules missing: run deploy/install-deps.sh (npm ci there)"; exit 1; }

tmp=$(mktemp -d)
daemon_pid=""
cleanup() {
  if [[ -n $daemon_pid ]]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

failed=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failed=1; }

# 1. The manifests as shipped.
if node "$validate/validate.js" "$k8s"/*.yaml >"$tmp/out" 2>&1; then
  pass "deploy/k8s/*.yaml validate ($(tail -1 "$tmp/out"))"
else
  cat "$tmp/out"; fail "deploy/k8s/*.yaml do not validate"
fi

# 2. Broken copies must fail, each for its reason.
expect_failure() {  # NAME PATTERN FILE SED-SCRIPT
  local name=$1 pattern=$2 file=$3 script=$4
  mkdir -p "$tmp/$name"
  cp "$k8s"/*.yaml "$tmp/$name/"
  sed -i "$script" "$tmp/$name/$file"
  if cmp -s "$k8s/$file" "$tmp/$name/$file"; then fail "$name: the edit changed nothing"; return; fi
  if node "$validate/validate.js" "$tmp/$name"/*.yaml >"$tmp/$name.out" 2>&1; then
    fail "$name: accepted"
  elif grep -q -- "$pattern" "$tmp/$name.out"; then
    pass "$name: refused"
  else
    cat "$tmp/$name.out"; fail "$name: refused, but not for '$pattern'"
  fi
}
ds=mooncaked-daemonset.yaml
expect_failure misspelt-field "livenesProbe: no such field" $ds 's/livenessProbe:/livenesProbe:/'
expect_failure wrong-type "must be integer" $ds 's/terminationGracePeriodSeconds: 30/terminationGracePeriodSeconds: half-a-minute/'
expect_failure privileged "privileged" $ds '0,/privileged: false/s//privileged: true/'
expect_failure extra-capability "capability SYS_ADMIN" $ds 's/add: \["IPC_LOCK"\]/add: ["IPC_LOCK", "SYS_ADMIN"]/'
expect_failure no-probe "readinessProbe must exec" $ds 's|\["/usr/bin/mcctl", "--socket", "/run/mooncake/mooncaked.sock", "status"\]|["/bin/true"]|'
expect_failure tenant-mounts-node "hostPath /run/mooncake " example-two-rank-pod.yaml 's|path: /run/mooncake/tenants/team-a|path: /run/mooncake|'
expect_failure unknown-tenant "not in tenant_sockets" mooncaked-config.yaml 's/tenant_sockets = team-a,team-b/tenant_sockets = team-b/'

# 3. The ConfigMap's config in a real daemon, probed as the kubelet would.
[[ -x $bin/mooncaked && -x $bin/mcctl ]] || { echo "FAIL: mooncaked/mcctl not built in $bin"; exit 1; }
node -e '
  const y = require(process.argv[1]);
  const docs = y.loadAll(require("fs").readFileSync(process.argv[2], "utf8"));
  process.stdout.write(docs.find((d) => d && d.kind === "ConfigMap").data["mooncaked.conf"]);
' "$validate/node_modules/js-yaml" "$k8s/mooncaked-config.yaml" >"$tmp/mooncaked.conf"
# Its tenants.policy key, mounted as the kubelet does (the file a symbolic
# link, 0644 and root's), at the path the config names.
mkdir -p "$tmp/etc/..data"
node -e '
  const y = require(process.argv[1]);
  const docs = y.loadAll(require("fs").readFileSync(process.argv[2], "utf8"));
  process.stdout.write(docs.find((d) => d && d.kind === "ConfigMap").data["tenants.policy"]);
' "$validate/node_modules/js-yaml" "$k8s/mooncaked-config.yaml" >"$tmp/etc/..data/tenants.policy"
chmod 0644 "$tmp/etc/..data/tenants.policy"
ln -s ..data/tenants.policy "$tmp/etc/tenants.policy"
grep -q '^tenant_policy_file = /etc/mooncake/tenants.policy$' "$tmp/mooncaked.conf" ||
  fail "the ConfigMap's mooncaked.conf does not name /etc/mooncake/tenants.policy"
sed -i "s|^tenant_policy_file = .*|tenant_policy_file = $tmp/etc/tenants.policy|" "$tmp/mooncaked.conf"
# Flags override the file: the node's socket (and with it the tenants' default
# directory) under $tmp; no GPU driver is loaded here.
"$bin/mooncaked" --config "$tmp/mooncaked.conf" --socket "$tmp/run/mooncaked.sock" \
  --node-id k8s-test --cuda-library libcuda-absent.so.1 >"$tmp/daemon.log" 2>&1 &
daemon_pid=$!
ready=0
for _ in $(seq 1 100); do
  if "$bin/mcctl" --socket "$tmp/run/mooncaked.sock" status >/dev/null 2>&1; then ready=1; break; fi
  kill -0 "$daemon_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ $ready -eq 1 ]]; then pass "the ConfigMap's mooncaked.conf starts mooncaked; mcctl status answers"; else
  cat "$tmp/daemon.log"; fail "mooncaked with the ConfigMap's config did not become ready"; fi
if grep -q "tenant span policy: 3 tenant lines" "$tmp/daemon.log"; then
  pass "the ConfigMap's tenants.policy is read through its link"
else
  cat "$tmp/daemon.log"; fail "mooncaked did not read the ConfigMap's tenants.policy"; fi
for tenant in team-a team-b; do
  sock=$tmp/run/tenants/$tenant/mooncaked.sock
  if out=$("$bin/mcctl" --json --socket "$sock" status 2>&1) && grep -q "\"$tenant\"" <<<"$out"; then
    pass "tenant $tenant: readiness command passes on $sock"
  else
    echo "$out"; fail "tenant $tenant: mcctl status on $sock"
  fi
done

[[ $failed -eq 0 ]] && { echo "k8s_manifests: PASS"; exit 0; }
echo "k8s_manifests: FAIL"
exit 1
