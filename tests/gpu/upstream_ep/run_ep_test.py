#!/usr/bin/env python3
"""Runs one of upstream Mooncake's own EP tests, unchanged, against this project.

  perf   mooncake-ep/benchmarks/legacy_buffer_perf.py, 2 ranks through
         torch.distributed.run: upstream's latency benchmark at the pinned
         commit (dispatch + combine timed in C++, legacy_buffer_perf.cpp,
         P2P route); prints avg/min/max microseconds per rank.
  grid   mooncake-ep/tests/test_ep_grid.py (unittest; pass -k PATTERN to
         select configurations): dispatch/combine correctness, BF16/FP8,
         async and receive-hook modes, P2P or RDMA (disable_p2p), the Python
         fallback, a failed rank. Ranks: torch.cuda.device_count(), made 2.
  wheel  mooncake-wheel/tests/test_mooncake_ep.py: NOTE at the pinned commit
         it calls Buffer.get_next_combine_buffer() (zero-copy combine), which
         upstream's own mooncake_ep_buffer.py raises NotImplementedError for
         since #2883; it stops there, before its latency section.

Sources are upstream's, extracted unchanged by prepare.sh. This launcher
only arranges where Python finds things:

  PYTHONPATH = upstream's mooncake-wheel/ (the 'mooncake' package)
             : upstream's mooncake-wheel/tests/ (ep_test_utils, for 'wheel')
             : EP_PY (mooncake/_ep*.so, built by run.sh)
             : a scratch folder holding mooncake/pg_<torch version>.py
             : this folder (ep_harness.py)

upstream's mooncake/__init__.py extends its __path__ with every 'mooncake'
folder on sys.path (pkgutil.extend_path), so mooncake._ep and
mooncake.pg_<version> are found in the two extra folders. The latter is the
slot of upstream's compiled PG extension; here it imports ep_harness, which
applies the harness changes listed there (rank placement, gloo) in every
process. Environment: GLOO_SOCKET_IFNAME=lo; for 'wheel' MASTER_ADDR
127.0.0.1, a free MASTER_PORT and one node (WORLD_SIZE=1, RANK=0 in
upstream's init_dist's meaning); for 'grid' MC_EP_NUM_RANKS=2 and
DEVICE_FILTER="" (no NIC list for upstream's PG, which is not used).

Usage: run_ep_test.py {perf,grid,wheel} --upstream SRC --ep-py DIR [--timeout S] [-- ARGS]
Prints the test's output, then its result lines again; exits with the
test's status (124 on timeout).
"""

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
SUMMARY = re.compile(r"Dispatch|Combine|dispatch \+ combine|Allocating buffer|Profiling skipped"
                     r"|^Ran \d+ test|^OK|^FAILED|Error|Traceback")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, cwd, env, timeout):
    """Streams cmd's output; kills its whole session after `timeout` s."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timed_out = threading.Event()

    def kill():
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    rc = proc.wait()
    timer.cancel()
    if timed_out.is_set():
        print(f"run_ep_test: timed out after {timeout:.0f} s", flush=True)
        rc = 124
    return rc, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("test", choices=["perf", "grid", "wheel"])
    ap.add_argument("--upstream", required=True, help=".gpu/upstream-ep/src")
    ap.add_argument("--ep-py", required=True, help="folder holding mooncake/_ep*.so")
    ap.add_argument("--timeout", type=float, default=300.0)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    extra = argv[cut + 1:]  # passed to the test

    import torch  # only for the version suffix upstream's pg.py/ep.py compute

    version = re.match(r"\d+(?:\.\d+)*", torch.__version__).group()
    src = os.path.abspath(a.upstream)
    wheel = os.path.join(src, "mooncake-wheel")
    tests = os.path.join(wheel, "tests")
    if a.test == "perf":
        cwd = os.path.join(src, "mooncake-ep", "benchmarks")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", os.path.join(cwd, "legacy_buffer_perf.py")] + extra
    elif a.test == "grid":
        cwd = os.path.join(src, "mooncake-ep", "tests")
        cmd = [sys.executable, os.path.join(cwd, "test_ep_grid.py")] + extra
    else:
        cwd = tests
        cmd = [sys.executable, os.path.join(tests, "test_mooncake_ep.py")] + extra
    if not os.path.isfile(cmd[-1 - len(extra)]):
        print(f"run_ep_test: {cmd[-1 - len(extra)]} missing (prepare.sh)", file=sys.stderr)
        return 2

    shim = tempfile.mkdtemp(prefix="mc-ep-shim-")
    os.makedirs(os.path.join(shim, "mooncake"))
    pg_name = "pg_" + version.replace(".", "_")
    with open(os.path.join(shim, "mooncake", pg_name + ".py"), "w") as f:
        f.write("# Stands in for upstream's Mooncake PG extension: see ep_harness.py.\n"
                "import ep_harness as _ep_harness  # noqa: F401\n")

    env = dict(os.environ)
    path = [wheel, tests, os.path.abspath(a.ep_py), shim, HERE]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(path), PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1",
               GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"))
    if a.test == "wheel":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1",
                   RANK="0")
    if a.test == "grid":
        env.update(MC_EP_NUM_RANKS="2", DEVICE_FILTER="")
    print(f"run_ep_test: {a.test}: torch {torch.__version__}, {torch.cuda.device_count()} GPU(s); "
          f"mooncake.{pg_name} -> ep_harness; MOONCAKE_SOCKET={env.get('MOONCAKE_SOCKET')}",
          flush=True)
    # Where the package and mooncake._ep come from.
    subprocess.run([sys.executable, "-c",
                    "import mooncake, mooncake.ep, mooncake._ep as m; "
                    "print('run_ep_test: mooncake', mooncake.__file__, '| _ep', m.__file__)"],
                   env=env, check=False)

    rc, lines = run(cmd, cwd, env, a.timeout)
    print(f"\n==== upstream EP, {a.test}: {' '.join(os.path.basename(c) for c in cmd[1:])} ====")
    for line in lines:
        if SUMMARY.search(line):
            print("  " + line.rstrip())
    print(f"run_ep_test: {a.test}: exit status {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
