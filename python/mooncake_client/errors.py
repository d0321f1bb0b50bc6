"""Exceptions: every failed call raises a MooncakeError carrying the status.

``MooncakeError(code, message)``: ``code`` is the canonical status name
(``"INVALID_ARGUMENT"``, ``"UNAVAILABLE"``, ... as absl and gRPC spell it),
``code_value`` its number, ``message`` what failed and what to do. One
subclass per family of codes, so callers can catch what they handle::

    try:
        comm = Communicator.create(group="g", rank=0, world_size=2, buffer_bytes=1 << 20)
    except UnavailableError:          # no mooncaked on the socket
        ...
    except DeadlineExceededError:     # the other ranks did not come
        ...

Families: InvalidArgumentError (INVALID_ARGUMENT, OUT_OF_RANGE; also a
ValueError), FailedPreconditionError (FAILED_PRECONDITION, ABORTED),
NotFoundError, AlreadyExistsError, PermissionDeniedError (PERMISSION_DENIED,
UNAUTHENTICATED), ResourceExhaustedError, DeadlineExceededError,
UnavailableError, CancelledError, UnimplementedError, InternalError
(INTERNAL, UNKNOWN, DATA_LOSS).
"""

from __future__ import annotations

import enum

__all__ = [
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
    "from_status",
]


class StatusCode(enum.IntEnum):
    """The canonical status codes (absl::StatusCode, grpc::StatusCode)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def _code_of(code) -> StatusCode:
    if isinstance(code, StatusCode):
        return code
    if isinstance(code, str):
        try:
            return StatusCode[code.upper()]
        except KeyError:
            return StatusCode.UNKNOWN
    try:
        return StatusCode(int(code))
    except ValueError:
        return StatusCode.UNKNOWN


class MooncakeError(Exception):
    """A failed call: ``code`` (canonical name), ``code_value``, ``message``."""

    def __init__(self, code, message: str = ""):
        status = _code_of(code)
        super().__init__(status.name, message)
        self.code: str = status.name
        self.code_value: int = int(status)
        self.message: str = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"

    def __reduce__(self):
        # Picklable (multiprocessing hands exceptions between processes).
        return (type(self), (self.code, self.message))


class CancelledError(MooncakeError):
    """CANCELLED."""


class InvalidArgumentError(MooncakeError, ValueError):
    """INVALID_ARGUMENT, OUT_OF_RANGE: bad input (also a ValueError)."""


class DeadlineExceededError(MooncakeError):
    """DEADLINE_EXCEEDED: a rendezvous or wait timed out."""


class NotFoundError(MooncakeError):
    """NOT_FOUND."""


class AlreadyExistsError(MooncakeError):
    """ALREADY_EXISTS: e.g. the rank is taken in that group."""


class PermissionDeniedError(MooncakeError):
    """PERMISSION_DENIED, UNAUTHENTICATED: e.g. not in the socket's group."""


class ResourceExhaustedError(MooncakeError):
    """RESOURCE_EXHAUSTED: a limit of the daemon or of the node."""


class FailedPreconditionError(MooncakeError):
    """FAILED_PRECONDITION, ABORTED: wrong state (closed, peer gone, daemon restarted)."""


class UnimplementedError(MooncakeError):
    """UNIMPLEMENTED."""


class InternalError(MooncakeError):
    """INTERNAL, UNKNOWN, DATA_LOSS."""


class UnavailableError(MooncakeError):
    """UNAVAILABLE: the daemon (or a peer) is not there."""


_FAMILY = {
    StatusCode.CANCELLED: CancelledError,
    StatusCode.UNKNOWN: InternalError,
    StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    StatusCode.NOT_FOUND: NotFoundError,
    StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    StatusCode.ABORTED: FailedPreconditionError,
    StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    StatusCode.UNIMPLEMENTED: UnimplementedError,
    StatusCode.INTERNAL: InternalError,
    StatusCode.UNAVAILABLE: UnavailableError,
    StatusCode.DATA_LOSS: InternalError,
    StatusCode.UNAUTHENTICATED: PermissionDeniedError,
}


def from_status(code_name: str, code_value: int, message: str) -> MooncakeError:
    """The exception for a failed status (the extension calls this)."""
    status = _code_of(code_value)
    if status.name != code_name:
        status = _code_of(code_name)
    return _FAMILY.get(status, MooncakeError)(status, message)
