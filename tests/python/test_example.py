"""python/examples/two_rank.py: two processes on the host platform, a real mooncaked."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

import mc_testing as t

EXAMPLE = os.environ.get("MOONCAKE_PY_EXAMPLE") or os.path.join(
    t.HERE, "..", "..", "python", "examples", "two_rank.py"
)


class TwoRankExampleTest(t.DaemonTestCase):
    def run_pair(self, *extra: str):
        group = self.group() + "-" + "-".join(extra).strip("-")
        procs = []
        for rank in (0, 1):
            p = subprocess.Popen(
                [sys.executable, EXAMPLE, "--socket", self.daemon.socket, "--group", group,
                 "--rank", str(rank), "--bytes", "100003", "--timeout-ms", "20000", *extra],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)
            self.addCleanup(lambda p=p: (p.poll() is None and p.kill(), p.wait()))
            procs.append(p)
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=40)
            outs.append(out)
        for rank, (p, out) in enumerate(zip(procs, outs)):
            self.assertEqual(p.returncode, 0, f"rank {rank}:\n{out}")
            self.assertIn("PASS", out.splitlines())
        self.assertIn("rank 1 received 100003 bytes, all correct", outs[1])
        return outs

    def test_pair_p2p(self):
        outs = self.run_pair()
        self.assertIn("(memfd, group", outs[0])

    def test_pair_over_rdma_softnic(self):
        # Every byte as mlx5 WQEs that softnic in the daemon executes.
        self.run_pair("--route", "rdma")

    def test_bad_arguments(self):
        r = subprocess.run([sys.executable, EXAMPLE, "--rank", "2", "--world-size", "2"],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 64, r.stderr)


if __name__ == "__main__":
    unittest.main()
