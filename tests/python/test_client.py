"""mooncake_client.Client against a real private mooncaked; status -> exception mapping."""

from __future__ import annotations

import os
import pickle
import tempfile
import unittest

import mc_testing as t
import mooncake_client as mc
from mooncake_client import _mooncake_client as native


class ClientTest(t.DaemonTestCase):
    def test_connect_hello(self):
        with mc.Client.connect(self.daemon.socket, client_name="python test") as c:
            self.assertEqual(c.socket_path, self.daemon.socket)
            self.assertTrue(c.connected)
            h = c.hello()
            self.assertIsInstance(h, mc.Hello)
            self.assertEqual(h.pid, os.getpid())  # SO_PEERCRED, not the message
            self.assertEqual(h.uid, os.getuid())
            self.assertEqual(h.node_id, "pytest-node")
            self.assertEqual(h.instance_id, c.instance_id)
            self.assertGreaterEqual(h.protocol_version, 1)
        self.assertTrue(c.closed)
        with self.assertRaises(mc.FailedPreconditionError) as cm:
            c.hello()
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")

    def test_socket_from_environment(self):
        old = os.environ.get("MOONCAKE_SOCKET")
        os.environ["MOONCAKE_SOCKET"] = self.daemon.socket
        try:
            with mc.Client.connect() as c:
                self.assertEqual(c.hello().node_id, "pytest-node")
        finally:
            if old is None:
                del os.environ["MOONCAKE_SOCKET"]
            else:
                os.environ["MOONCAKE_SOCKET"] = old

    def test_node_info_dataclasses(self):
        with mc.Client.connect(self.daemon.socket) as c:
            n = c.node_info()
            self.assertIsInstance(n, mc.NodeInfo)
            self.assertEqual(n.node_id, "pytest-node")
            self.assertEqual(n.instance_id, c.instance_id)
            self.assertTrue(n.hostname)
            self.assertIsInstance(n.gpus, list)
            self.assertIsInstance(n.nics, list)
            for g in n.gpus:
                self.assertIsInstance(g, mc.Gpu)
                self.assertTrue(g.uuid.startswith("GPU-"))
            for nic in n.nics:
                self.assertIsInstance(nic, mc.Nic)
                self.assertTrue(nic.name)
            if not n.gpus:
                self.assertTrue(n.gpu_note, "no GPUs and no note saying why")
            with self.assertRaises(Exception):  # frozen: a snapshot
                n.node_id = "x"
            r = c.rdma_info()
            self.assertIsInstance(r, mc.RdmaInfo)
            self.assertTrue(r.provider)

    def test_join_group_membership_only(self):
        with mc.Client.connect(self.daemon.socket) as c:
            v = c.join_group(self.group(), 0, 1, timeout=5)
            self.assertIsInstance(v, mc.GroupView)
            self.assertEqual((v.rank, v.world_size, len(v.members)), (0, 1, 1))
            self.assertIsInstance(v.members[0], mc.GroupMember)
            self.assertEqual(v.members[0].pid, os.getpid())
            c.leave_group(self.group(), 0)

    def test_join_with_bad_arguments_is_invalid_argument(self):
        with mc.Client.connect(self.daemon.socket) as c:
            # Checked by the daemon: the code crosses gRPC intact.
            with self.assertRaises(mc.InvalidArgumentError) as cm:
                c.join_group(self.group(), 5, 2, timeout=5)
            e = cm.exception
            self.assertIsInstance(e, mc.MooncakeError)
            self.assertIsInstance(e, ValueError)
            self.assertEqual(e.code, "INVALID_ARGUMENT")
            self.assertEqual(e.code_value, 3)
            self.assertIn("rank 5", e.message)
            self.assertTrue(str(e).startswith("INVALID_ARGUMENT: "))
        # Checked by the client library before any call.
        for kwargs in (
            dict(rank=2, world_size=2),
            dict(rank=0, world_size=2, platform="tpu"),
            dict(rank=0, world_size=2, route="carrier-pigeon"),
            dict(rank=-1, world_size=2),
            dict(rank=0, world_size=2, buffer_bytes=0),
        ):
            args = dict(group=self.group(), buffer_bytes=4096, socket=self.daemon.socket)
            args.update(kwargs)
            with self.subTest(**kwargs):
                with self.assertRaises(mc.InvalidArgumentError) as cm:
                    mc.Communicator.create(**args)
                self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")

    def test_rendezvous_timeout_is_deadline_exceeded(self):
        with self.assertRaises(mc.DeadlineExceededError) as cm:
            mc.Communicator.create(
                group=self.group(),
                rank=0,
                world_size=2,
                buffer_bytes=4096,
                socket=self.daemon.socket,
                timeout=0.5,
            )
        self.assertEqual(cm.exception.code, "DEADLINE_EXCEEDED")
        self.assertIn("1", cm.exception.message)  # names the missing rank


class NoDaemonTest(unittest.TestCase):
    def test_missing_daemon_is_unavailable(self):
        with tempfile.TemporaryDirectory(prefix="mcpytest-") as d:
            sock = os.path.join(d, "nobody-home.sock")
            with self.assertRaises(mc.UnavailableError) as cm:
                mc.Client.connect(sock, call_timeout=2)
            self.assertEqual(cm.exception.code, "UNAVAILABLE")
            self.assertIn(sock, cm.exception.message)
            with self.assertRaises(mc.UnavailableError):
                mc.Communicator.create(
                    group="g", rank=0, world_size=1, buffer_bytes=4096, socket=sock, timeout=2
                )


class ErrorMappingTest(unittest.TestCase):
    def test_every_code_maps_to_its_family(self):
        family = {
            "CANCELLED": mc.CancelledError,
            "UNKNOWN": mc.InternalError,
            "INVALID_ARGUMENT": mc.InvalidArgumentError,
            "DEADLINE_EXCEEDED": mc.DeadlineExceededError,
            "NOT_FOUND": mc.NotFoundError,
            "ALREADY_EXISTS": mc.AlreadyExistsError,
            "PERMISSION_DENIED": mc.PermissionDeniedError,
            "RESOURCE_EXHAUSTED": mc.ResourceExhaustedError,
            "FAILED_PRECONDITION": mc.FailedPreconditionError,
            "ABORTED": mc.FailedPreconditionError,
            "OUT_OF_RANGE": mc.InvalidArgumentError,
            "UNIMPLEMENTED": mc.UnimplementedError,
            "INTERNAL": mc.InternalError,
            "UNAVAILABLE": mc.UnavailableError,
            "DATA_LOSS": mc.InternalError,
            "UNAUTHENTICATED": mc.PermissionDeniedError,
        }
        for name, cls in family.items():
            with self.subTest(code=name):
                with self.assertRaises(cls) as cm:
                    native._raise_status(int(mc.StatusCode[name]), f"message of {name} \xff")
                e = cm.exception
                self.assertIs(type(e), cls)
                self.assertEqual(e.code, name)
                self.assertEqual(e.code_value, int(mc.StatusCode[name]))
                self.assertEqual(e.message, f"message of {name} \xff")
                again = pickle.loads(pickle.dumps(e))
                self.assertIs(type(again), cls)
                self.assertEqual((again.code, again.message), (e.code, e.message))

    def test_constructible_by_users(self):
        e = mc.MooncakeError("NOT_FOUND", "no such group")
        self.assertEqual((e.code, e.code_value, e.message), ("NOT_FOUND", 5, "no such group"))
        self.assertEqual(str(e), "NOT_FOUND: no such group")
        self.assertEqual(mc.MooncakeError(14, "x").code, "UNAVAILABLE")


if __name__ == "__main__":
    unittest.main()
