"""mooncake_client.Communicator on the host platform: two processes, a real mooncaked.

This process is rank 1; rank_worker.py in a child process is rank 0.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import os
import signal
import threading
import time
import unittest

import numpy as np

import mc_testing as t
import mooncake_client as mc


def create(test: t.DaemonTestCase, group: str, rank: int = 1, world_size: int = 2) -> mc.Communicator:
    comm = mc.Communicator.create(
        group=group,
        rank=rank,
        world_size=world_size,
        buffer_bytes=t.BUFFER_BYTES,
        socket=test.daemon.socket,
        timeout=20,
        client_name="python test",
    )
    test.addCleanup(comm.close)
    return comm


class RdmaOptionsTest(t.DaemonTestCase):
    """The RDMA options reach the daemon, or are refused before anything is asked of it."""

    def test_ring_memory_and_nics_are_checked(self):
        with self.assertRaises(mc.InvalidArgumentError) as e:
            mc.Communicator.create(
                group="py-rings-bad", rank=0, world_size=2, buffer_bytes=t.BUFFER_BYTES,
                socket=self.daemon.socket, timeout=5, rdma_ring_memory="vram",
            )
        self.assertIn("expected auto, host or gpu", str(e.exception))
        # GPU rings on the host platform: a setup error naming why.
        with self.assertRaises(mc.MooncakeError) as e:
            mc.Communicator.create(
                group="py-rings-gpu", rank=0, world_size=2, buffer_bytes=t.BUFFER_BYTES,
                socket=self.daemon.socket, timeout=5, route="rdma", rdma_ring_memory="gpu",
            )
        self.assertIn("ring_memory kGpu needs the CUDA platform", str(e.exception))
        # A NIC the daemon does not serve: named, with what it serves.
        with self.assertRaises(mc.MooncakeError) as e:
            mc.Communicator.create(
                group="py-nic", rank=0, world_size=2, buffer_bytes=t.BUFFER_BYTES,
                socket=self.daemon.socket, timeout=5, route="rdma", rdma_nics=["mlx5_7"],
            )
        self.assertIn('NIC "mlx5_7" is not served by mooncaked here', str(e.exception))

    def test_a_group_without_rdma_peers_has_no_rings(self):
        comm = mc.Communicator.create(
            group="py-no-rdma", rank=0, world_size=1, buffer_bytes=t.BUFFER_BYTES,
            socket=self.daemon.socket, timeout=20, route="rdma", rdma_ring_memory="host",
        )
        self.addCleanup(comm.close)
        self.assertIsNone(comm.rdma_ring_memory)
        self.assertFalse(comm.nic_atomics)

    def test_atomics_route(self):
        with self.assertRaises(mc.InvalidArgumentError) as e:
            mc.Communicator.create(
                group="py-atomics-bad", rank=0, world_size=1, buffer_bytes=t.BUFFER_BYTES,
                socket=self.daemon.socket, timeout=5, atomics_route="sideways",
            )
        self.assertIn("expected auto, device or nic", str(e.exception))
        # NIC atomics on a rank alone: its loopback queue pair is its RDMA.
        comm = mc.Communicator.create(
            group="py-atomics-nic", rank=0, world_size=1, buffer_bytes=t.BUFFER_BYTES,
            socket=self.daemon.socket, timeout=20, atomics_route="nic",
        )
        self.addCleanup(comm.close)
        self.assertTrue(comm.nic_atomics)
        self.assertEqual(comm.rdma_ring_memory, "host")


class TwoRankTest(t.DaemonTestCase):
    def test_put_signal_into_peer_buffer_zero_copy(self):
        w = self.worker("--group", self.group(), "writer")
        comm = create(self, self.group())
        self.assertEqual((comm.rank, comm.world_size, comm.platform), (1, 2, "host"))
        self.assertEqual(comm.handle_kind, "memfd")
        view = comm.view
        self.assertEqual([m.rank for m in view.members], [0, 1])
        self.assertEqual(view.members[0].pid, w.proc.pid)
        self.assertTrue(view.members[0].p2p_reachable)

        # Zero-copy: numpy's array, memoryview and the DLPack import are the
        # communicator's memory itself.
        buf = np.asarray(comm.buffer)
        self.assertEqual(buf.dtype, np.uint8)
        self.assertEqual(buf.shape, (t.BUFFER_BYTES,))
        self.assertEqual(buf.ctypes.data, comm.buffer.address)
        self.assertEqual(buf.__array_interface__["data"][0], comm.buffer.address)
        self.assertTrue(np.shares_memory(buf, np.from_dlpack(comm.buffer)))
        mv = memoryview(comm.buffer)
        self.assertEqual((mv.nbytes, mv.format, mv.readonly), (t.BUFFER_BYTES, "B", False))

        # Rank 0 puts and signals (comm.put + comm.signal in its process).
        seen = comm.wait_signal(t.FLAG_DATA, 1, timeout=20)
        self.assertEqual(seen, 1)
        self.assertEqual(bytes(buf[t.SLOT : t.SLOT + t.MSG_BYTES]), t.pattern(t.MSG_BYTES, 0))
        self.assertEqual(buf[t.FLAG_DATA : t.FLAG_DATA + 8].view(np.uint64)[0], 1)
        w.expect_line("SIGNALLED")

        # Reply through the peer mapping: rank 0's buffer as mapped here.
        peer = np.asarray(comm.peer_buffer(0))
        self.assertNotEqual(peer.ctypes.data, buf.ctypes.data)
        self.assertEqual(bytes(peer[t.SRC : t.SRC + t.MSG_BYTES]), t.pattern(t.MSG_BYTES, 0))
        peer[t.REPLY : t.REPLY + t.MSG_BYTES] = np.frombuffer(t.pattern(t.MSG_BYTES, 1), np.uint8)
        comm.signal(0, t.FLAG_ACK, 1)  # release: the reply is visible first
        w.expect_line("REPLY OK")

        # Rank 0 leaves: the event iterator says so.
        left = None
        for ev in comm.events(timeout=10):
            self.assertIsInstance(ev, mc.Event)
            if ev.group == self.group() and ev.kind in (mc.EventKind.LEFT, mc.EventKind.LOST):
                left = ev
                break
        self.assertIsNotNone(left, "no LEFT event after rank 0 left")
        self.assertEqual(left.kind, mc.EventKind.LEFT)
        self.assertEqual(left.kind, "left")
        self.assertEqual(left.rank, 0)
        self.assertEqual(w.finish(), 0, w.lines)

    def test_lost_when_peer_is_killed(self):
        w = self.worker("--group", self.group(), "holder")
        comm = create(self, self.group())
        w.expect_line("READY")
        os.kill(w.proc.pid, signal.SIGKILL)
        start = time.monotonic()
        lost = None
        for ev in comm.client.events(timeout=10):
            if ev.group == self.group() and ev.kind == mc.EventKind.LOST:
                lost = ev
                break
        self.assertIsNotNone(lost, "no LOST event within 10 s of SIGKILL")
        self.assertEqual((lost.rank, lost.pid), (0, w.proc.pid))
        self.assertLess(time.monotonic() - start, 5)
        w.proc.wait(timeout=10)
        # Nothing more is queued: the iterator ends at its deadline.
        t0 = time.monotonic()
        rest = [ev for ev in comm.events(timeout=0.3) if ev.group == self.group()]
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        self.assertEqual([e.kind for e in rest if e.kind == mc.EventKind.LOST], [])

    def next_event_of(self, comm: mc.Communicator, kind: mc.EventKind) -> mc.Event:
        for ev in comm.events(timeout=10):
            if ev.group == self.group() and ev.kind == kind:
                return ev
        self.fail(f"no {kind} event of {self.group()} within 10 s")

    def test_handle_event_admits_a_replacement(self):
        # Elastic group: rank 0 dies, this rank lets it go (handle_event of
        # LOST), a new process takes rank 0 and this rank admits it
        # (handle_event of JOINED): epoch 1 -> 2.
        w = self.worker("--group", self.group(), "holder")
        comm = create(self, self.group())
        w.expect_line("READY")
        self.assertEqual((comm.epoch, comm.view.epoch), (1, 1))
        self.assertTrue(comm.peer_active(0) and comm.peer_active(1))

        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait(timeout=10)
        lost = self.next_event_of(comm, mc.EventKind.LOST)
        self.assertEqual((lost.rank, lost.pid, lost.member), (0, w.proc.pid, None))
        comm.handle_event(lost)
        self.assertFalse(comm.peer_active(0))
        self.assertTrue(comm.peer_active(1))
        self.assertEqual(comm.epoch, 1)

        # The replacement is an ordinary create of rank 0; it is ready once
        # this rank admitted it and reported ready again.
        w2 = self.worker("--group", self.group(), "holder")
        joined = self.next_event_of(comm, mc.EventKind.JOINED)
        self.assertEqual((joined.rank, joined.pid, joined.epoch), (0, w2.proc.pid, 2))
        self.assertIsInstance(joined.member, mc.GroupMember)
        self.assertEqual((joined.member.rank, joined.member.pid), (0, w2.proc.pid))
        self.assertEqual(joined.member.handle_kind, "memfd")
        comm.handle_event(joined)
        w2.expect_line("READY")
        self.assertEqual((comm.epoch, comm.view.epoch), (2, 2))
        self.assertTrue(comm.peer_active(0))
        self.assertEqual(comm.view.members[0].pid, w2.proc.pid)
        # The replacement's buffer is mapped here: write into it.
        peer = np.asarray(comm.peer_buffer(0))
        peer[t.SLOT : t.SLOT + t.MSG_BYTES] = np.frombuffer(t.pattern(t.MSG_BYTES, 2), np.uint8)
        self.assertEqual(bytes(peer[t.SLOT : t.SLOT + t.MSG_BYTES]), t.pattern(t.MSG_BYTES, 2))

        # An event of another group, or of this rank, changes nothing.
        comm.handle_event(dataclasses.replace(lost, group=self.group() + "-other"))
        comm.handle_event(dataclasses.replace(lost, rank=1))
        self.assertTrue(comm.peer_active(0))
        # A JOINED made by hand carries no replacement's handle.
        with self.assertRaises(mc.InvalidArgumentError):
            comm.handle_event(mc.Event(kind=mc.EventKind.JOINED, group=self.group(), rank=0, pid=1, detail=""))
        with self.assertRaises(TypeError):
            comm.handle_event({"kind": "lost", "group": self.group(), "rank": 0})
        w2.kill()


class OneRankTest(t.DaemonTestCase):
    def test_dlpack_capsule_round_trip(self):
        comm = create(self, self.group(), rank=0, world_size=1)
        b = comm.buffer
        self.assertEqual(b.__dlpack_device__(), (1, 0))
        self.assertEqual(b.device, "cpu")
        self.assertFalse(b.is_cuda)
        self.assertFalse(hasattr(b, "__cuda_array_interface__"))
        a = np.from_dlpack(b)
        self.assertEqual((a.dtype, a.shape), (np.uint8, (t.BUFFER_BYTES,)))
        self.assertEqual(a.ctypes.data, b.address)
        host = np.asarray(b)
        host[100:108] = np.arange(8, dtype=np.uint8)
        self.assertEqual(list(a[100:108]), list(range(8)))

        # The capsules themselves, read through the DLPack ABI.
        api = ctypes.pythonapi
        api.PyCapsule_IsValid.restype = ctypes.c_int
        api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

        class DLTensor(ctypes.Structure):
            _fields_ = [
                ("data", ctypes.c_void_p),
                ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8),
                ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64),
            ]

        class Versioned(ctypes.Structure):
            _fields_ = [
                ("major", ctypes.c_uint32),
                ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64),
                ("dl_tensor", DLTensor),
            ]

        def check(tensor: DLTensor):
            self.assertEqual(tensor.data, b.address)
            self.assertEqual((tensor.device_type, tensor.device_id), (1, 0))
            self.assertEqual((tensor.ndim, tensor.code, tensor.bits, tensor.lanes), (1, 1, 8, 1))
            self.assertEqual((tensor.shape[0], tensor.strides[0]), (t.BUFFER_BYTES, 1))
            self.assertEqual(tensor.byte_offset, 0)

        legacy = b.__dlpack__()
        self.assertEqual(api.PyCapsule_IsValid(legacy, b"dltensor"), 1)
        check(DLTensor.from_address(api.PyCapsule_GetPointer(legacy, b"dltensor")))
        versioned = b.__dlpack__(max_version=(1, 0))
        self.assertEqual(api.PyCapsule_IsValid(versioned, b"dltensor_versioned"), 1)
        v = Versioned.from_address(api.PyCapsule_GetPointer(versioned, b"dltensor_versioned"))
        self.assertEqual((v.major, v.minor, v.flags), (1, 0, 0))
        check(v.dl_tensor)
        self.assertEqual(b.__dlpack__(max_version=(0, 8)).__class__.__name__, "PyCapsule")
        with self.assertRaises(BufferError):
            b.__dlpack__(copy=True)
        with self.assertRaises(BufferError):
            b.__dlpack__(dl_device=(2, 0))
        # Unconsumed capsules free themselves (their deleters run here).
        del legacy, versioned, v
        gc.collect()

    def test_views_outlive_close(self):
        comm = create(self, self.group(), rank=0, world_size=1)
        a = np.asarray(comm.buffer)
        d = np.from_dlpack(comm.buffer)
        capsule = comm.buffer.__dlpack__()
        comm.close()
        self.assertTrue(comm.closed)
        comm.close()  # idempotent
        with self.assertRaises(mc.FailedPreconditionError):
            comm.buffer
        del comm
        gc.collect()
        a[:16] = 7  # still mapped: the views hold the communicator
        self.assertEqual(int(d[15]), 7)
        del capsule
        # The session went away with close(): a new one can take the same group.
        again = create(self, self.group(), rank=0, world_size=1)
        self.assertEqual(again.rank, 0)

    def test_close_while_another_thread_waits(self):
        comm = create(self, self.group(), rank=0, world_size=1)
        client = comm.client
        results = {}

        def wait_signal():
            try:
                results["wait"] = comm.wait_signal(512, 1, timeout=1.0)
            except mc.MooncakeError as e:
                results["wait"] = e

        def next_event():
            results["event"] = client.next_event(timeout=1.0)

        threads = [threading.Thread(target=wait_signal), threading.Thread(target=next_event)]
        for th in threads:
            th.start()
        time.sleep(0.2)  # both are blocked, without the GIL
        comm.close()
        client.close()
        for th in threads:
            th.join(timeout=10)
            self.assertFalse(th.is_alive())
        # The calls in flight kept what they used alive and ended normally.
        self.assertIsInstance(results["wait"], mc.DeadlineExceededError)
        self.assertIn("event", results)

    def test_ctx_and_testing_aids(self):
        comm = create(self, self.group(), rank=0, world_size=1)
        ctx = comm.ctx
        self.assertIsInstance(ctx, mc.CommCtx)
        self.assertGreater(ctx.address, 0)
        self.assertEqual(ctx.nbytes, len(ctx.to_bytes()))
        self.assertEqual((ctx.rank, ctx.num_ranks), (0, 1))
        self.assertEqual(int(ctx), ctx.address)
        # CommCtx starts with P2PContext {available, peer_ptrs, local_base}.
        words = np.frombuffer(ctx.to_bytes(), dtype=np.uint64)
        self.assertEqual(int(words[2]), comm.buffer.address)

        buf = np.asarray(comm.buffer)
        buf[0:64] = np.arange(64, dtype=np.uint8)
        comm.put(0, 1000, 0, 64)  # to self
        comm.quiet()
        self.assertEqual(list(buf[1000:1064]), list(range(64)))
        comm.red_add(0, 2048, 5)
        comm.red_add(0, 2048, 6)
        self.assertEqual(comm.wait_signal(2048, 11, timeout=1), 11)
        with self.assertRaises(mc.DeadlineExceededError):
            comm.wait_signal(2048, 12, timeout=0.2)
        with self.assertRaises(mc.InvalidArgumentError) as cm:
            comm.put(0, t.BUFFER_BYTES - 8, 0, 16)
        self.assertEqual(cm.exception.code, "OUT_OF_RANGE")
        with self.assertRaises(mc.InvalidArgumentError) as cm:
            comm.signal(0, 4, 1)
        self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(mc.InvalidArgumentError):
            comm.put(3, 0, 0, 8)  # no rank 3
        with self.assertRaises(mc.InvalidArgumentError):
            comm.peer_buffer(1)


if __name__ == "__main__":
    unittest.main()
