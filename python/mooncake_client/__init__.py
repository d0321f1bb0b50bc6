"""mooncake_client: Python bindings of the Mooncake client library.

A process talks to its node's mooncaked through a Client (session, node info,
membership events) and forms groups of ranks through a Communicator (a
symmetric buffer every rank can reach, and the CommCtx kernels use)::

    import numpy as np
    from mooncake_client import Client, Communicator

    with Client.connect() as c:
        print(c.node_info().gpus)

    with Communicator.create(group="g", rank=r, world_size=2, buffer_bytes=1 << 20) as comm:
        buf = np.asarray(comm.buffer)        # host platform: a uint8 view, no copy
        for ev in comm.events(timeout=10):   # LEFT / LOST / ...
            print(ev)

Errors raise MooncakeError subclasses with the status code (``.code``, e.g.
"UNAVAILABLE") and message. See python/README.md.
"""

from . import _mooncake_client
from .client import Client
from .communicator import Buffer, CommCtx, Communicator
from .errors import (
    AlreadyExistsError,
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    MooncakeError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    StatusCode,
    UnavailableError,
    UnimplementedError,
    from_status,
)
from .events import Event, EventIterator, EventKind
from .info import Gpu, GroupMember, GroupView, Hello, Nic, NodeInfo, RdmaInfo

# Every failed status the extension reports becomes one of errors.py's classes.
_mooncake_client._set_error_factory(from_status)

__all__ = [
    "Client",
    "Communicator",
    "Buffer",
    "CommCtx",
    "Event",
    "EventIterator",
    "EventKind",
    "Gpu",
    "Nic",
    "NodeInfo",
    "Hello",
    "RdmaInfo",
    "GroupMember",
    "GroupView",
    "StatusCode",
    "MooncakeError",
    "CancelledError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
]
