"""Shared by the Python package's tests: a real private mooncaked, and child processes.

The daemon binary comes from $MOONCAKED (CMake passes the built one). The
package comes from $PYTHONPATH (the build tree's python/ folder). Nothing here
skips: a missing binary or package is a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "rank_worker.py")

# Symmetric buffer layout the tests and rank_worker.py share.
BUFFER_BYTES = 64 * 1024
FLAG_DATA = 0  # rank 0 -> rank 1: "the data is there"
FLAG_ACK = 8  # rank 1 -> rank 0: "checked; and my reply is in your buffer"
SLOT = 4096  # where rank 0 puts its message in rank 1's buffer
SRC = 8192  # where rank 0 stages the message in its own buffer
REPLY = 16384  # where rank 1 writes its reply into rank 0's buffer (peer mapping)
MSG_BYTES = 3000  # not a multiple of 8 or 16: the copy's tail path is used too


def pattern(n: int, seed: int) -> bytes:
    """Bytes that differ at every position and for every seed."""
    return bytes(((i * 131 + seed * 31 + 1) & 0xFF) for i in range(n))


class Daemon:
    """A private mooncaked on a socket in a temporary directory."""

    def __init__(self, node_id: str = "pytest-node"):
        exe = os.environ.get("MOONCAKED")
        if not exe or not os.access(exe, os.X_OK):
            raise RuntimeError(f"$MOONCAKED must name the built mooncaked binary (got {exe!r})")
        self.dir = tempfile.mkdtemp(prefix="mcpytest-")
        self.socket = os.path.join(self.dir, "mooncaked.sock")
        self.log_path = os.path.join(self.dir, "mooncaked.log")
        self._log = open(self.log_path, "w+b")
        # Ready means READY=1 on $NOTIFY_SOCKET (sd_notify), sent once the
        # daemon serves and its fd channel is up: the socket file alone
        # appears before that.
        notify_path = os.path.join(self.dir, "notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        try:
            self.proc = subprocess.Popen(
                [exe, "--socket", self.socket, "--node-id", node_id, "--log-level", "warning"],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(os.environ, NOTIFY_SOCKET=notify_path),
            )
            deadline = time.monotonic() + 20
            while True:
                if self.proc.poll() is not None:
                    log = self.log()
                    self.stop()
                    raise RuntimeError(f"mooncaked exited with {self.proc.returncode}:\n{log}")
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("mooncaked did not report READY=1 within 20 s")
                notify.settimeout(0.1)
                try:
                    message = notify.recv(4096)
                except socket.timeout:
                    continue
                if b"READY=1" in message.split(b"\n"):
                    break
        finally:
            notify.close()

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Worker:
    """rank_worker.py in a child process: lines on stdout, killed if still alive at cleanup."""

    def __init__(self, args: List[str]):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, WORKER] + args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
        )
        self.lines: List[str] = []

    def expect_line(self, prefix: str, timeout: float = 20.0) -> str:
        """Reads lines until one starts with `prefix` (fails on EOF or timeout)."""
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"worker: no '{prefix}' line within {timeout} s: {self.lines}")
                if not sel.select(left):
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    raise AssertionError(f"worker ended before '{prefix}': {self.lines}")
                self.lines.append(line.rstrip("\n"))
                if line.startswith(prefix):
                    return line.rstrip("\n")
        finally:
            sel.close()

    def finish(self, timeout: float = 20.0) -> int:
        """Waits for the exit status; the output is kept in self.lines."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, _ = self.proc.communicate()
            raise AssertionError(f"worker did not exit within {timeout} s: {self.lines}")
        self.lines.extend(out.splitlines())
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self) -> None:
        self.kill()
        if self.proc.stdout:
            self.proc.stdout.close()


class DaemonTestCase(unittest.TestCase):
    """One private daemon per test class; workers and communicators cleaned up per test."""

    daemon: Optional[Daemon] = None

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        if cls.daemon is not None:
            cls.daemon.stop()
            cls.daemon = None

    def worker(self, *args: str) -> Worker:
        w = Worker(["--socket", self.daemon.socket] + list(args))
        self.addCleanup(w.cleanup)
        return w

    def group(self) -> str:
        """A group name of its own for each test."""
        return f"{self.id().rsplit('.', 1)[-1]}-{os.getpid()}"
