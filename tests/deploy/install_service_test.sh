#!/usr/bin/env bash
# deploy/install-service.sh --destdir: stages the service, then checks what
# is there, with which modes, and that systemd-analyze verify accepts the
# staged unit (pointed at the staged binary by a drop-in, since verify
# checks that ExecStart's program exists).
#   install_service_test.sh INSTALL_SERVICE_SH BUILD_DIR WORK_DIR
set -euo pipefail
script=${1:?} build=${2:?} work=${3:?}
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze not installed"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
stage=$work/root
fail=0
bad() { echo "FAIL: $*"; fail=1; }

"$script" --destdir "$stage" --build-dir "$build" --prefix /usr/local

# path -> expected octal mode
declare -A modes=(
  [usr/local/bin/mooncaked]=755
  [usr/local/bin/mcctl]=755
  [etc/systemd/system/mooncaked.service]=644
  [etc/mooncake]=755
  [etc/mooncake/mooncaked.conf]=644
  [etc/mooncake/mooncaked.conf.example]=644
  [usr/local/lib/sysusers.d/mooncake.conf]=644
)
for path in "${!modes[@]}"; do
  if [[ ! -e "$stage/$path" ]]; then
    bad "$path was not installed"
    continue
  fi
  mode=$(stat -c %a "$stage/$path")
  [[ "$mode" == "${modes[$path]}" ]] || bad "$path has mode $mode, expected ${modes[$path]}"
done
ls "$stage"/usr/local/lib/libmooncake_client.so.* >/dev/null 2>&1 || bad "libmooncake_client is missing"

# The group the sockets belong to: declared for sysusers, named by the config.
grep -Eq '^g[[:space:]]+mooncake[[:space:]]' "$stage/usr/local/lib/sysusers.d/mooncake.conf" ||
  bad "sysusers.d/mooncake.conf does not declare group mooncake"
grep -q '^socket_group = mooncake$' "$stage/etc/mooncake/mooncaked.conf" ||
  bad "the new mooncaked.conf does not set socket_group = mooncake"
grep -q '^ExecStart=/usr/local/bin/mooncaked ' "$stage/etc/systemd/system/mooncaked.service" ||
  bad "the staged unit does not start /usr/local/bin/mooncaked"

# An administrator's config survives a second run.
echo "node_id = kept" >>"$stage/etc/mooncake/mooncaked.conf"
"$script" --destdir "$stage" --build-dir "$build" >/dev/null
grep -q '^node_id = kept$' "$stage/etc/mooncake/mooncaked.conf" || bad "a second run replaced mooncaked.conf"

# systemd-analyze verify: the staged unit, with ExecStart pointed at the
# staged program (a drop-in next to a copy; the unit itself is unchanged).
verify=$work/verify
mkdir -p "$verify/mooncaked.service.d"
cp "$stage/etc/systemd/system/mooncaked.service" "$verify/"
cat >"$verify/mooncaked.service.d/10-staged.conf" <<DROPIN
[Service]
ExecStart=
ExecStart=$stage/usr/local/bin/mooncaked --config $stage/etc/mooncake/mooncaked.conf
DROPIN
# Any message (an unknown key is only a warning) fails the test.
if ! out=$(cd "$work" && systemd-analyze verify "$verify/mooncaked.service" 2>&1) || [[ -n "$out" ]]; then
  echo "$out"
  bad "systemd-analyze verify does not accept the staged unit"
fi

(( fail == 0 )) && echo "PASS: install-service.sh --destdir $stage"
exit $fail
