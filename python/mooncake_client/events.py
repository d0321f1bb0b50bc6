"""Group membership events as an iterator.

::

    for ev in client.events(timeout=30):      # or comm.events(...)
        if ev.kind in (EventKind.LOST, EventKind.LEFT):
            print(f"rank {ev.rank} of {ev.group} is gone: {ev.detail}")
            break

The daemon tells every session about the groups it is in: a peer joined,
left, was lost (its process died: within about 100 ms), the group became
ready or failed, the daemon is shutting down, or the connection dropped.
A communicator of an elastic group passes each event to
``Communicator.handle_event``, which lets a lost rank go and admits its
replacement (a JOINED event, with the group's new ``epoch``).
``timeout`` bounds the whole iteration (None: no bound); once it has passed,
the iterator yields only events already queued, then ends (``timeout=0``:
drain the queue without waiting). Waiting happens in short slices with the GIL released,
so other threads run and Ctrl-C interrupts it.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from .info import GroupMember

__all__ = ["EventKind", "Event", "EventIterator"]


class EventKind(str, enum.Enum):
    """What happened (a str: ``ev.kind == "lost"`` works too)."""

    JOINED = "joined"
    LEFT = "left"
    LOST = "lost"
    READY = "ready"
    FAILED = "failed"
    DAEMON_SHUTDOWN = "daemon-shutdown"
    DISCONNECTED = "disconnected"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Event:
    """One membership event: which group, which rank (and its pid), and the daemon's detail.

    ``epoch``: for JOINED (a replacement took ``rank`` of an elastic group),
    the group's new epoch; 0 for the other kinds. ``member``: for JOINED,
    the replacement as the group's view now holds it; None otherwise.
    """

    kind: Union[EventKind, str]  # a plain str only for a kind this package does not know
    group: str
    rank: int
    pid: int
    detail: str
    epoch: int = 0
    member: Optional[GroupMember] = None
    # The client library's event, for Communicator.handle_event (None for an
    # Event made here rather than read from a session).
    _native: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict) -> "Event":
        try:
            kind: Union[EventKind, str] = EventKind(d["kind"])
        except ValueError:
            kind = d["kind"]
        member = d.get("member")
        return cls(
            kind=kind,
            group=d["group"],
            rank=d["rank"],
            pid=d["pid"],
            detail=d["detail"],
            epoch=d.get("epoch", 0),
            member=None if member is None else GroupMember(**member),
            _native=d.get("native"),
        )

    def __str__(self) -> str:
        return f"{self.kind} {self.group} rank {self.rank} (pid {self.pid}): {self.detail}"


class EventIterator:
    """Iterates over events until ``timeout`` seconds have passed (None: forever)."""

    # The longest one native wait lasts before Python checks for signals.
    _SLICE = 0.1

    def __init__(self, next_event: Callable[[float], Optional[dict]], timeout: Optional[float]):
        self._next_event = next_event
        self._deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)

    def __iter__(self) -> "EventIterator":
        return self

    def __next__(self) -> Event:
        while True:
            wait = self._SLICE
            if self._deadline is not None:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    # Past the deadline: only what is already queued.
                    d = self._next_event(0.0)
                    if d is None:
                        raise StopIteration
                    return Event.from_dict(d)
                wait = min(wait, left)
            d = self._next_event(wait)
            if d is not None:
                return Event.from_dict(d)
