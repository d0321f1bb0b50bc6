"""The other rank of the Python package's tests (a child process of the test).

  rank_worker.py --socket S --group G writer
      rank 0 of 2: stages a message in its own buffer, comm.put()s it into
      rank 1's buffer and comm.signal()s; waits for rank 1's ack, checks the
      reply rank 1 wrote into this buffer through its peer mapping (read back
      through numpy.asarray(comm.buffer), zero-copy), then leaves.
  rank_worker.py --socket S --group G holder
      rank 0 of 2: joins, prints READY, and holds the group until killed.

Prints progress lines the test reads; exits 0 on success, 1 on a failed
check, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import mc_testing as t
import mooncake_client as mc


def writer(comm: mc.Communicator) -> int:
    buf = np.asarray(comm.buffer)
    if buf.ctypes.data != comm.buffer.address:
        print("FAIL numpy.asarray(comm.buffer) copied the buffer")
        return 1
    buf[t.SRC : t.SRC + t.MSG_BYTES] = np.frombuffer(t.pattern(t.MSG_BYTES, 0), dtype=np.uint8)
    comm.put(1, t.SLOT, t.SRC, t.MSG_BYTES)
    comm.signal(1, t.FLAG_DATA, 1)
    print("SIGNALLED", flush=True)
    comm.wait_signal(t.FLAG_ACK, 1, timeout=20)
    reply = bytes(buf[t.REPLY : t.REPLY + t.MSG_BYTES])
    if reply != t.pattern(t.MSG_BYTES, 1):
        bad = sum(a != b for a, b in zip(reply, t.pattern(t.MSG_BYTES, 1)))
        print(f"FAIL reply from rank 1: {bad} of {t.MSG_BYTES} bytes wrong")
        return 1
    print("REPLY OK", flush=True)
    comm.leave()
    return 0


def holder(comm: mc.Communicator) -> int:
    print("READY", flush=True)
    time.sleep(60)
    print("FAIL holder was not killed within 60 s")
    return 3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("role", choices=["writer", "holder"])
    a = ap.parse_args()
    try:
        comm = mc.Communicator.create(
            group=a.group,
            rank=0,
            world_size=2,
            buffer_bytes=t.BUFFER_BYTES,
            socket=a.socket,
            timeout=20,
            client_name=f"rank_worker {a.role}",
        )
    except mc.MooncakeError as e:
        print(f"SETUP FAILED {e.code}: {e.message}")
        return 2
    with comm:
        return writer(comm) if a.role == "writer" else holder(comm)


if __name__ == "__main__":
    sys.exit(main())
