#!/usr/bin/env bash
# CTest packaging_deb (tests/packaging/CMakeLists.txt): builds the Debian
# packages from an already built tree and checks them without installing
# anything on this machine.
#
#   run_packaging_test.sh --build-dir B --work-dir W --libdir LIBDIR --python 0|1
#
#  1. cpack -G DEB with B's CPackConfig.cmake, output and staging under W;
#  2. the expected .debs and their control data (Depends, conffiles, scripts);
#  3. dpkg -x of every package into W/root; the files (unit == deploy's unit
#     with /usr/bin, sysusers entry, conffile), no RPATH;
#  4. mcctl --version and device_transport_example from the root
#     (LD_LIBRARY_PATH into it), the Python package imported from it;
#  5. the maintainer scripts: sh -n, the container/chroot guard, and a run of
#     each against stub commands (getent, groupadd, systemd-sysusers,
#     systemctl, systemd-detect-virt) as in a container: nothing enabled or
#     started, the host untouched;
#  6. tests/install/consumer configured and built against W/root/usr
#     (find_package(Mooncake)) and run;
#  7. lintian on all .debs when it is installed: E: fails, W: is printed.
# Exit 77 (skipped) where dpkg-deb or dpkg-shlibdeps is missing.
set -euo pipefail

build="" work="" libdir=lib python=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --work-dir) work="$2"; shift 2 ;;
    --libdir) libdir="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) echo "run_packaging_test.sh: unknown argument '$1'" >&2; exit 64 ;;
  esac
done
[[ -n "$build" && -n "$work" ]] || { echo "usage: see the header" >&2; exit 64; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

fail() { echo "packaging test: FAIL: $*" >&2; exit 1; }
step() { echo "== $* ($(( SECONDS ))s)"; }
for tool in dpkg-deb dpkg-shlibdeps cpack; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "packaging test: $tool not found: skipped"
    exit 77
  fi
done
[[ -f "$build/CPackConfig.cmake" ]] || fail "$build/CPackConfig.cmake missing (MooncakePackaging.cmake not included?)"

rm -rf "$work"
mkdir -p "$work"
out=$work/debs root=$work/root

step "1. cpack -G DEB"
(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$out") >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log" >&2; fail "cpack -G DEB"; }
rm -rf "$out/_CPack_Packages"

step "2. the packages and their control data"
packages=(mooncaked libmooncake-client libmooncake-client-dev mooncake-tools)
[[ "$python" == 1 ]] && packages+=(python3-mooncake-client)
declare -A deb
for p in "${packages[@]}"; do
  f=$(compgen -G "$out/${p}_*.deb" || true)
  [[ -n "$f" && $(wc -l <<<"$f") -eq 1 ]] || fail "expected one $out/${p}_*.deb, got: $(ls "$out")"
  deb[$p]=$f
  echo "  $(basename "$f")"
done
n=$(compgen -G "$out/*.deb" | wc -l)
[[ $n -eq ${#packages[@]} ]] || fail "$n .debs, expected ${#packages[@]}: $(ls "$out")"
field() { dpkg-deb -f "${deb[$1]}" "$2"; }
version=$(field libmooncake-client Version)
for p in "${packages[@]}"; do
  [[ $(field "$p" Package) == "$p" ]] || fail "${deb[$p]}: Package is $(field "$p" Package)"
  [[ $(field "$p" Version) == "$version" ]] || fail "$p: Version $(field "$p" Version) != $version"
  [[ -n $(field "$p" Maintainer) && -n $(field "$p" Homepage) && -n $(field "$p" Section) ]] ||
    fail "$p: Maintainer, Homepage or Section missing"
  [[ $(field "$p" Architecture) == $(dpkg --print-architecture) ]] || fail "$p: Architecture"
done
deps() { field "$1" Depends; }
grep -q 'libc6' <<<"$(deps libmooncake-client)" || fail "libmooncake-client Depends lacks dpkg-shlibdeps' libc6: $(deps libmooncake-client)"
grep -Fq "libmooncake-client (= $version)" <<<"$(deps libmooncake-client-dev)" || fail "dev Depends: $(deps libmooncake-client-dev)"
grep -q 'libabsl-dev' <<<"$(deps libmooncake-client-dev)" || fail "dev Depends lacks libabsl-dev"
grep -Fq "libmooncake-client (= $version)" <<<"$(deps mooncake-tools)" || fail "tools Depends: $(deps mooncake-tools)"
if [[ "$python" == 1 ]]; then
  grep -Fq "libmooncake-client (= $version)" <<<"$(deps python3-mooncake-client)" &&
    grep -q 'python3 (>=' <<<"$(deps python3-mooncake-client)" ||
    fail "python Depends: $(deps python3-mooncake-client)"
  grep -q python3-numpy <<<"$(field python3-mooncake-client Recommends)" || fail "python Recommends"
fi
ctrl=$work/control
mkdir -p "$ctrl"
dpkg-deb -e "${deb[mooncaked]}" "$ctrl"
[[ $(cat "$ctrl/conffiles") == /etc/mooncake/mooncaked.conf ]] || fail "conffiles: $(cat "$ctrl/conffiles")"
for s in postinst prerm postrm; do
  [[ -x "$ctrl/$s" ]] || fail "mooncaked has no executable $s"
done
libfiles=$(dpkg-deb -c "${deb[libmooncake-client]}")
grep -q "libmooncake_client\.so\.[0-9]" <<<"$libfiles" || fail "no versioned library"
if grep -Eq "libmooncake_client\.so( |$)" <<<"$libfiles"; then
  fail "the .so link is in libmooncake-client (belongs to -dev)"
fi
[[ -f "$work/control-lib/shlibs" ]] || dpkg-deb -e "${deb[libmooncake-client]}" "$work/control-lib"
grep -q '^libmooncake_client 0 libmooncake-client' "$work/control-lib/shlibs" || fail "libmooncake-client has no shlibs entry"
grep -q 'ldconfig' "$work/control-lib/triggers" || fail "libmooncake-client has no ldconfig trigger"

step "3. unpacked root"
for p in "${packages[@]}"; do dpkg-deb -x "${deb[$p]}" "$root"; done
usr=$root/usr
for f in usr/bin/mooncaked usr/bin/mcctl usr/bin/device_transport_example \
         usr/lib/systemd/system/mooncaked.service usr/lib/sysusers.d/mooncake.conf \
         etc/mooncake/mooncaked.conf usr/share/man/man8/mooncaked.8.gz usr/share/man/man1/mcctl.1.gz \
         usr/share/bash-completion/completions/mcctl \
         "usr/$libdir/cmake/Mooncake/MooncakeConfig.cmake" "usr/$libdir/pkgconfig/mooncake.pc" \
         "usr/$libdir/libmooncake_client.so" usr/include/mooncake/client/client.h \
         usr/share/doc/mooncaked/copyright usr/share/doc/libmooncake-client/changelog.Debian.gz; do
  [[ -e "$root/$f" ]] || fail "$f is missing from the unpacked packages"
done
# The man page describes the program it ships with (help2man from --help, or
# the hand-written fallback): both name the doctor command.
zcat "$root/usr/share/man/man1/mcctl.1.gz" | grep -q 'doctor' || fail "mcctl.1 does not describe mcctl doctor"
# mooncaked.8 documents every configuration key (its CONFIGURATION section,
# from deploy/man/mooncaked.h2m or the fallback page): each key the parser
# takes (daemon/config/daemon_config.cc), font escapes aside.
zcat "$root/usr/share/man/man8/mooncaked.8.gz" | sed 's/\\f[BIRP]//g' >"$work/mooncaked.8.txt"
while read -r key; do
  grep -qw -- "$key" "$work/mooncaked.8.txt" || fail "mooncaked.8 does not document the config key $key"
done < <(sed -n 's/.*key == "\([a-z_]*\)".*/\1/p' "$repo/daemon/config/daemon_config.cc" | sort -u)
bash -n "$root/usr/share/bash-completion/completions/mcctl" || fail "the bash completion does not parse"
sed 's|/usr/local/bin/mooncaked|/usr/bin/mooncaked|g' "$repo/deploy/mooncaked.service" >"$work/expected.service"
diff -u "$work/expected.service" "$usr/lib/systemd/system/mooncaked.service" ||
  fail "the packaged unit differs from deploy/mooncaked.service (ExecStart under /usr)"
cmp "$repo/deploy/mooncake.sysusers" "$usr/lib/sysusers.d/mooncake.conf" || fail "sysusers entry differs"
grep -q '^socket_group = mooncake$' "$root/etc/mooncake/mooncaked.conf" || fail "conffile sets no socket_group"
while IFS= read -r -d '' f; do
  if [[ $(od -An -tx1 -N4 "$f" | tr -d ' \n') == 7f454c46 ]]; then
    dyn=$(readelf -d "$f")
    if grep -Eq '\((RPATH|RUNPATH)\)' <<<"$dyn"; then
      fail "$f keeps an RPATH: $(grep -E 'RPATH|RUNPATH' <<<"$dyn")"
    fi
  fi
done < <(find "$root" -type f -print0)

step "4. programs from the root"
export LD_LIBRARY_PATH=$usr/$libdir
v=$("$usr/bin/mcctl" --version) || fail "mcctl --version"
[[ "$v" == "mcctl ${version%-*}" ]] || fail "mcctl --version said '$v', expected 'mcctl ${version%-*}'"
echo "  $v"
"$usr/bin/mooncaked" --version >/dev/null || fail "mooncaked --version"
"$usr/bin/device_transport_example" --help >/dev/null 2>&1 || true  # only that it loads:
ldd "$usr/bin/device_transport_example" | grep -q 'not found' && fail "device_transport_example: $(ldd "$usr/bin/device_transport_example" | grep 'not found')"
if [[ "$python" == 1 ]]; then
  PYTHONPATH=$usr/lib/python3/dist-packages python3 -c \
    'import mooncake_client, sys; assert mooncake_client.__file__.startswith(sys.argv[1]), mooncake_client.__file__' \
    "$usr/lib/python3/dist-packages" || fail "import mooncake_client from the unpacked root"
  echo "  import mooncake_client: ok"
fi
unset LD_LIBRARY_PATH

step "5. maintainer scripts"
for s in postinst prerm postrm; do sh -n "$ctrl/$s" || fail "sh -n $s"; done
grep -q 'systemd-detect-virt --quiet --container' "$ctrl/postinst" &&
  grep -q '/run/systemd/system' "$ctrl/postinst" && grep -q 'DPKG_ROOT' "$ctrl/postinst" ||
  fail "postinst lacks the container/chroot guard"
# Every command they may run is a stub that logs its arguments; the stubs say
# "container", and the group exists, so nothing must be enabled or started
# (and nothing on this machine changes).
stubs=$work/stubs calls=$work/calls.log
mkdir -p "$stubs"
: >"$calls"
for c in systemctl systemd-sysusers groupadd deb-systemd-helper deb-systemd-invoke; do
  printf '#!/bin/sh\necho "%s $*" >>"%s"\n' "$c" "$calls" >"$stubs/$c"
done
printf '#!/bin/sh\necho "getent $*" >>"%s"\nexit 0\n' "$calls" >"$stubs/getent"
printf '#!/bin/sh\necho "systemd-detect-virt $*" >>"%s"\ncase "$*" in *--container*) exit 0;; esac\nexit 1\n' \
  "$calls" >"$stubs/systemd-detect-virt"
chmod +x "$stubs"/*
runscript() { env -u DPKG_ROOT PATH="$stubs:$PATH" sh "$ctrl/$1" "${@:2}" || fail "$1 $* exited $?"; }
runscript postinst configure
runscript postinst configure 0.0.1-1
started='systemctl|deb-systemd-helper (enable|update-state|unmask)|deb-systemd-invoke'
if grep -Eq "$started" "$calls"; then
  fail "postinst in a container ran: $(grep -E "$started" "$calls")"
fi
grep -q 'getent group mooncake' "$calls" || fail "postinst did not look for the group mooncake"
DPKG_ROOT=/x PATH="$stubs:$PATH" sh "$ctrl/postinst" configure || fail "postinst with DPKG_ROOT"
runscript prerm remove
runscript prerm upgrade 0.1.0-1
runscript postrm remove
runscript postrm purge
if grep -Eq 'systemctl|deb-systemd-helper enable|deb-systemd-invoke (start|restart)' "$calls"; then
  fail "scripts enabled or started: $(cat "$calls")"
fi
echo "  calls: $(tr '\n' ';' <"$calls")"

step "6. consumer against the dev package"
cmake -S "$repo/tests/install/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$usr" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON \
  >"$work/consumer.log" 2>&1 || { cat "$work/consumer.log" >&2; fail "consumer configure"; }
grep -q "Mooncake_DIR:PATH=$usr/$libdir/cmake/Mooncake" "$work/consumer/CMakeCache.txt" ||
  fail "the consumer found a Mooncake outside the unpacked root: $(grep Mooncake_DIR "$work/consumer/CMakeCache.txt")"
cmake --build "$work/consumer" >>"$work/consumer.log" 2>&1 || { cat "$work/consumer.log" >&2; fail "consumer build"; }
LD_LIBRARY_PATH=$usr/$libdir "$work/consumer/consumer" "$work/no-daemon.sock" || fail "consumer run"

step "7. lintian"
if command -v lintian >/dev/null 2>&1; then
  rc=0
  lintian --display-level '>=warning' "${deb[@]}" >"$work/lintian.txt" 2>"$work/lintian.err" || rc=$?
  [[ $rc -le 1 ]] || { cat "$work/lintian.err" >&2; fail "lintian failed ($rc)"; }
  cat "$work/lintian.txt"
  if grep -q '^E: ' "$work/lintian.txt"; then fail "lintian errors (E:) above"; fi
  echo "  lintian: $(grep -c '^W: ' "$work/lintian.txt" || true) warnings, no errors"
else
  echo "  lintian not installed (deploy/install-deps.sh): skipped"
fi

rm -rf "$root" "$work/consumer"
echo "packaging test: PASS ($(( SECONDS ))s)"
