#!/usr/bin/env python3
"""The two-rank device-transport example, in Python (examples/device_transport/ in C++).

Start one process per rank, on a node where mooncaked runs:

    two_rank.py --socket S --group G --rank 0 &
    two_rank.py --socket S --group G --rank 1

Rank 0 writes a message into rank 1's buffer and signals; rank 1 waits for
the signal and checks every byte. Both use the same buffer layout as the
C++ example:

    [0, 64 KiB)                 signals: one uint64 flag per source rank
    [64 KiB + s * B, ... )      slot s: the B-byte message rank s sent here

--platform host (default): CPU "kernels" over shared memory, through the
package's host-platform testing aids (comm.put / comm.signal /
comm.wait_signal: the Device API's mc_put_thread / mc_signal /
mc_wait_until called from Python). Every byte and flag really crosses
processes through the mapping (or, with --route rdma, as WQEs that softnic in
the daemon executes).

--platform cuda (needs torch): the buffer is GPU memory and rank 1 sees it as
a torch tensor (torch.from_dlpack(comm.buffer), no copy). Rank 0 writes with
torch copies into rank 1's buffer as mapped into its process, the address a
kernel's mc_route_put() would use: read from the device table comm.ctx
points at (CommCtx.p2p.peer_ptrs). A real application passes comm.ctx to its
own kernel instead (tests/gpu/python_check.sh has one that calls mc_put_block
and mc_signal).

Prints PASS and exits 0 when every byte checks out; 1 on wrong data, 2 on a
setup error, 3 on a timeout, 64 on bad arguments (as the C++ example).
"""

from __future__ import annotations

import argparse
import struct
import sys
import time

import mooncake_client as mc

SIGNAL_BYTES = 64 * 1024


def slot_offset(msg_bytes: int, src: int) -> int:
    return SIGNAL_BYTES + msg_bytes * src


def flag_offset(src: int) -> int:
    return src * 8


def pattern(msg_bytes: int, src: int, dst: int) -> bytes:
    """The byte rank `src` sends rank `dst` at offset i (examples/device_transport/example_common.h)."""
    return bytes(((i * 131 + src * 31 + dst * 7 + 1) & 0xFF) for i in range(msg_bytes))


def run_host(comm: mc.Communicator, msg_bytes: int, timeout_s: float) -> int:
    import numpy as np

    buf = np.asarray(comm.buffer)  # this rank's buffer, no copy
    if comm.rank == 0:
        own = slot_offset(msg_bytes, 0)
        buf[own : own + msg_bytes] = np.frombuffer(pattern(msg_bytes, 0, 1), dtype=np.uint8)
        comm.put(1, own, own, msg_bytes)
        comm.signal(1, flag_offset(0), 1)  # release: rank 1 sees every byte with the flag
        comm.quiet()  # over RDMA, the WQEs complete before this process goes
        print(f"rank 0 wrote {msg_bytes} bytes to rank 1 and signalled")
        return 0
    if comm.rank == 1:
        try:
            comm.wait_signal(flag_offset(0), 1, timeout=timeout_s)
        except mc.DeadlineExceededError:
            print("rank 1: timed out waiting for rank 0's signal", file=sys.stderr)
            return 3
        got = buf[slot_offset(msg_bytes, 0) : slot_offset(msg_bytes, 0) + msg_bytes]
        want = np.frombuffer(pattern(msg_bytes, 0, 1), dtype=np.uint8)
        bad = int(np.count_nonzero(got != want))
        if bad:
            print(f"rank 1: {bad} of {msg_bytes} bytes wrong", file=sys.stderr)
            return 1
        print(f"rank 1 received {msg_bytes} bytes, all correct")
        return 0
    print(f"rank {comm.rank} idle in pair mode")
    return 0


class _DeviceArray:
    """A CUDA pointer as something torch.as_tensor() takes (__cuda_array_interface__).

    torch places such a tensor on the device the pointer belongs to (a peer's
    memory may live on another GPU): never pass device=, which would copy.
    """

    def __init__(self, address: int, shape, typestr: str):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (address, False),
            "strides": None,
            "version": 3,
        }


def run_cuda(comm: mc.Communicator, msg_bytes: int, timeout_s: float, torch) -> int:
    dev = torch.device(comm.buffer.device)
    mine = torch.from_dlpack(comm.buffer)  # uint8 tensor over this rank's buffer
    assert mine.data_ptr() == comm.buffer.address
    if comm.rank == 0:
        # CommCtx begins with P2PContext {available, peer_ptrs, local_base}:
        # peer_ptrs is a device table of void*[world_size].
        _, peer_ptrs, _ = struct.unpack_from("<QQQ", comm.ctx.to_bytes())
        table = torch.as_tensor(_DeviceArray(peer_ptrs, (comm.world_size,), "<i8"))
        peer_base = int(table[1].item())
        own = slot_offset(msg_bytes, 0)
        src = torch.tensor(list(pattern(msg_bytes, 0, 1)), dtype=torch.uint8, device=dev)
        mine[own : own + msg_bytes].copy_(src)
        peer_slot = torch.as_tensor(_DeviceArray(peer_base + own, (msg_bytes,), "|u1"))
        assert peer_slot.data_ptr() == peer_base + own  # a view, not a copy
        peer_slot.copy_(mine[own : own + msg_bytes])  # a copy kernel writing over P2P
        torch.cuda.synchronize()  # the data is complete before the flag is written
        flag = torch.as_tensor(_DeviceArray(peer_base + flag_offset(0), (1,), "<i8"))
        flag.fill_(1)
        torch.cuda.synchronize()
        print(f"rank 0 wrote {msg_bytes} bytes to rank 1 and signalled")
        return 0
    if comm.rank == 1:
        flag = mine[flag_offset(0) : flag_offset(0) + 8]
        deadline = time.monotonic() + timeout_s
        while int(flag.cpu().view(torch.int64)[0]) < 1:
            if time.monotonic() > deadline:
                print("rank 1: timed out waiting for rank 0's signal", file=sys.stderr)
                return 3
            time.sleep(0.001)
        got = mine[slot_offset(msg_bytes, 0) : slot_offset(msg_bytes, 0) + msg_bytes].cpu()
        want = torch.tensor(list(pattern(msg_bytes, 0, 1)), dtype=torch.uint8)
        bad = int((got != want).sum())
        if bad:
            print(f"rank 1: {bad} of {msg_bytes} bytes wrong", file=sys.stderr)
            return 1
        print(f"rank 1 received {msg_bytes} bytes, all correct")
        return 0
    print(f"rank {comm.rank} idle in pair mode")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", choices=["host", "cuda"], default="host")
    ap.add_argument("--socket", default=None, help="mooncaked's socket (default: $MOONCAKE_SOCKET)")
    ap.add_argument("--group", default="device-transport-example-py")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--bytes", type=int, default=1 << 20, help="message size")
    ap.add_argument("--timeout-ms", type=int, default=30000)
    ap.add_argument("--device", type=int, default=None, help="CUDA device (default: rank %% count)")
    ap.add_argument("--route", choices=["auto", "p2p", "rdma"], default="auto")
    try:
        a = ap.parse_args()
    except SystemExit as e:
        return 0 if e.code == 0 else 64
    if a.world_size < 2 or not 0 <= a.rank < a.world_size or a.bytes <= 0:
        print("two_rank.py: need --world-size >= 2, 0 <= --rank < world size, --bytes > 0",
              file=sys.stderr)
        return 64
    who = f"rank {a.rank}/{a.world_size}"
    torch = None
    if a.platform == "cuda":
        try:
            import torch  # noqa: F811
        except ImportError:
            print(f"two_rank.py {who}: --platform cuda needs torch", file=sys.stderr)
            return 2
        if torch.cuda.device_count() == 0:
            print(f"two_rank.py {who}: --platform cuda: torch sees no CUDA device", file=sys.stderr)
            return 2
        device = a.device if a.device is not None else a.rank % torch.cuda.device_count()
        torch.cuda.set_device(device)
        torch.zeros(1, device="cuda")  # the context the buffer is allocated in
    timeout_s = a.timeout_ms / 1000.0
    try:
        comm = mc.Communicator.create(
            group=a.group,
            rank=a.rank,
            world_size=a.world_size,
            buffer_bytes=SIGNAL_BYTES + a.bytes * a.world_size,
            platform=a.platform,
            route=a.route,
            socket=a.socket,
            timeout=timeout_s,
            client_name=f"two_rank.py {who}",
        )
    except mc.MooncakeError as e:
        print(f"two_rank.py {who}: setup failed: {e}", file=sys.stderr)
        return 3 if isinstance(e, mc.DeadlineExceededError) else 2
    with comm:
        print(f"{who}: ready in {comm.setup_time * 1e3:.1f} ms ({comm.handle_kind}, group {a.group})")
        if a.platform == "host":
            rc = run_host(comm, a.bytes, timeout_s)
        else:
            rc = run_cuda(comm, a.bytes, timeout_s, torch)
        if rc == 0:
            print("PASS")
        return rc


if __name__ == "__main__":
    sys.exit(main())
