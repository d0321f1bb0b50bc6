"""The Python package on CUDA, end to end (run by tests/gpu/python_check.sh on the GPU machine).

Two processes form a 2-rank group on the cuda platform through a private
mooncaked; each sees its buffer as a torch tensor (torch.from_dlpack, no
copy). Rank 0 writes a message into rank 1's tensor with a Device API kernel
(mc_put_block + mc_signal, device_api_kernels.cu, launched with comm.ctx);
rank 1 waits for the signal with mc_wait_until in a kernel, checks every byte
through its tensor, and replies the same way into rank 0's tensor, which rank
0 checks. Ranks go on GPU rank % device_count (one GPU: both on GPU 0).

  cuda_two_process.py [--import-order torch-first|mooncake-first]
                                       the parent: daemon + both ranks
  cuda_two_process.py --rank R ...     one rank (the parent starts these)

--import-order says which of torch and mooncake_client each rank imports
first (default torch-first); python_check.sh runs both: either order must
work (issue 11: mooncake_client first once aborted inside torch's import).

Environment: MOONCAKED (the daemon binary), MC_PYCHECK_KERNELS (the built
device_api_kernels shared library), PYTHONPATH with the built package.
Prints PASS and exits 0, or says what failed and exits 1.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # mc_testing

BUFFER_BYTES = 8 << 20
FLAG_DATA = 0  # rank 0 -> 1
FLAG_REPLY = 8  # rank 1 -> 0
SLOT = 1 << 20  # the message's place in the receiver's buffer
SRC = 4 << 20  # where the sender stages it in its own buffer
MSG_BYTES = (3 << 20) + 13  # odd size: the copy's tail path too


def expected(torch, seed: int):
    i = torch.arange(MSG_BYTES, dtype=torch.int64)
    return ((i * 131 + seed * 31 + 1) & 0xFF).to(torch.uint8)


KERNELS_ABI = 2  # mc_pycheck_abi() of the device_api_kernels.cu these signatures match


def load_kernels():
    """device_api_kernels.cu's entry points, with their C signatures.

    ctypes checks nothing against the library, so the library says which
    signatures it has (mc_pycheck_abi) and a mismatch fails here, not as a
    SIGSEGV inside a call.
    """
    lib = ctypes.CDLL(os.environ["MC_PYCHECK_KERNELS"])
    lib.mc_pycheck_abi.argtypes = []
    lib.mc_pycheck_abi.restype = ctypes.c_int
    abi = lib.mc_pycheck_abi()
    if abi != KERNELS_ABI:
        raise RuntimeError(f"{os.environ['MC_PYCHECK_KERNELS']}: mc_pycheck_abi() = {abi}, "
                           f"this script needs {KERNELS_ABI}: rebuild device_api_kernels.cu")
    lib.mc_pycheck_ctx_size.argtypes = []
    lib.mc_pycheck_ctx_size.restype = ctypes.c_int
    # (device, ctx_address, dst, dst_offset, src_offset, nbytes, flag_offset, value)
    lib.mc_pycheck_put_signal.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int] + [
        ctypes.c_uint64
    ] * 5
    lib.mc_pycheck_put_signal.restype = ctypes.c_int
    # (device, ctx_address, flag_offset, value, timeout_ns, seen)
    lib.mc_pycheck_wait_signal.argtypes = [ctypes.c_int, ctypes.c_void_p] + [
        ctypes.c_uint64
    ] * 3 + [ctypes.POINTER(ctypes.c_uint64)]
    lib.mc_pycheck_wait_signal.restype = ctypes.c_int
    return lib


def rank_main(a) -> int:
    if a.import_order == "mooncake-first":
        import mooncake_client as mc
        import torch
    else:
        import torch

        import mooncake_client as mc

    lib = load_kernels()
    who = f"rank {a.rank}"
    if torch.cuda.device_count() == 0:
        print(f"{who}: FAIL torch sees no CUDA device", flush=True)
        return 1
    device = a.rank % torch.cuda.device_count()
    torch.cuda.set_device(device)
    torch.zeros(1, device="cuda")  # torch's context: the buffer is allocated in it

    comm = mc.Communicator.create(
        group=a.group,
        rank=a.rank,
        world_size=2,
        buffer_bytes=BUFFER_BYTES,
        platform="cuda",
        socket=a.socket,
        timeout=60,
        device=device,
        client_name=f"cuda_two_process {who}",
    )
    with comm:
        b = comm.buffer
        print(f"{who}: ready in {comm.setup_time * 1e3:.0f} ms on cuda:{device}, {comm.handle_kind}"
              f" ({a.import_order})", flush=True)
        checks = []

        def check(cond, what):
            checks.append((bool(cond), what))
            if not cond:
                print(f"{who}: FAIL {what}", flush=True)

        check(b.is_cuda and b.device == f"cuda:{device}", f"buffer device {b.device}")
        check(b.__dlpack_device__() == (2, device), f"__dlpack_device__ {b.__dlpack_device__()}")
        check(not hasattr(b, "__array_interface__"), "a CUDA buffer has no __array_interface__")
        try:
            memoryview(b)
            check(False, "memoryview of a CUDA buffer must raise BufferError")
        except BufferError:
            pass
        t = torch.from_dlpack(b)
        check(t.data_ptr() == b.address, "torch.from_dlpack(comm.buffer) did not copy")
        check(t.device == torch.device("cuda", device) and t.dtype == torch.uint8,
              f"tensor {t.device} {t.dtype}")
        check(t.numel() == BUFFER_BYTES, f"tensor size {t.numel()}")
        cai = torch.as_tensor(b)  # __cuda_array_interface__
        check(cai.data_ptr() == b.address and cai.is_cuda, "torch.as_tensor via the CAI")
        check(comm.ctx.nbytes == lib.mc_pycheck_ctx_size(), "CommCtx size agrees with the kernel")
        try:
            comm.put(1 - a.rank, 0, 0, 8)
            check(False, "comm.put on cuda must raise")
        except mc.FailedPreconditionError:
            pass

        seen = ctypes.c_uint64(0)
        if a.rank == 0:
            t[SRC : SRC + MSG_BYTES].copy_(expected(torch, 0).to(t.device))
            torch.cuda.synchronize()  # staged before the (other runtime's) kernel reads it
            st = lib.mc_pycheck_put_signal(device, comm.ctx.address, 1, SLOT, SRC, MSG_BYTES, FLAG_DATA, 1)
            check(st == 0, f"put+signal to rank 1: status {st}")
            ok = lib.mc_pycheck_wait_signal(device, comm.ctx.address, FLAG_REPLY, 1, 30_000_000_000,
                                            ctypes.byref(seen))
            check(ok == 1, f"wait for rank 1's reply: {ok} (flag {seen.value})")
            if ok == 1:
                bad = int((t[SLOT : SLOT + MSG_BYTES].cpu() != expected(torch, 1)).sum())
                check(bad == 0, f"reply: {bad} of {MSG_BYTES} bytes wrong")
        else:
            ok = lib.mc_pycheck_wait_signal(device, comm.ctx.address, FLAG_DATA, 1, 30_000_000_000,
                                            ctypes.byref(seen))
            check(ok == 1, f"wait for rank 0's data: {ok} (flag {seen.value})")
            if ok == 1:
                bad = int((t[SLOT : SLOT + MSG_BYTES].cpu() != expected(torch, 0)).sum())
                check(bad == 0, f"message: {bad} of {MSG_BYTES} bytes wrong")
                print(f"{who}: received {MSG_BYTES} bytes in its tensor, {bad} wrong", flush=True)
                t[SRC : SRC + MSG_BYTES].copy_(expected(torch, 1).to(t.device))
                torch.cuda.synchronize()
                st = lib.mc_pycheck_put_signal(device, comm.ctx.address, 0, SLOT, SRC, MSG_BYTES,
                                               FLAG_REPLY, 1)
                check(st == 0, f"put+signal to rank 0: status {st}")
            # Stay until rank 0 has read the reply (it leaves first).
            for ev in comm.events(timeout=30):
                if ev.kind in (mc.EventKind.LEFT, mc.EventKind.LOST):
                    break
        failed = [w for ok_, w in checks if not ok_]
        print(f"{who}: {len(checks) - len(failed)} of {len(checks)} checks passed", flush=True)
        return 1 if failed else 0


def parent_main(import_order: str) -> int:
    import mc_testing

    daemon = mc_testing.Daemon(node_id="gpu-python-check")
    procs = []
    try:
        group = f"python-cuda-{os.getpid()}"
        for rank in (0, 1):
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--rank", str(rank),
                 "--socket", daemon.socket, "--group", group, "--import-order", import_order],
                env=dict(os.environ, PYTHONUNBUFFERED="1")))
        deadline = time.monotonic() + 240
        rcs = []
        for p in procs:
            try:
                rcs.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                rcs.append(p.wait())
        if any(rcs):
            print(f"FAIL: rank exit statuses {rcs}")
            print("--- mooncaked log ---\n" + daemon.log())
            return 1
        print(f"PASS ({import_order})")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        daemon.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int)
    ap.add_argument("--socket")
    ap.add_argument("--group")
    ap.add_argument("--import-order", choices=("torch-first", "mooncake-first"),
                    default="torch-first")
    a = ap.parse_args()
    if a.rank is None:
        return parent_main(a.import_order)
    try:
        return rank_main(a)
    except Exception as e:  # noqa: BLE001 - report anything, with its type
        print(f"rank {a.rank}: FAIL {type(e).__name__}: {e}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
