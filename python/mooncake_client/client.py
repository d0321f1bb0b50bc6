"""Client: this process's session with its node's mooncaked."""

from __future__ import annotations

from typing import Optional

from . import _mooncake_client as _native
from .events import Event, EventIterator
from .info import GroupView, Hello, NodeInfo, RdmaInfo

__all__ = ["Client"]


class Client:
    """A session with mooncaked.

    ::

        with Client.connect() as c:               # $MOONCAKE_SOCKET or /run/mooncake/mooncaked.sock
            print(c.hello().daemon_version)
            for gpu in c.node_info().gpus:
                print(gpu.index, gpu.name, gpu.uuid)

    The daemon knows the caller's uid/pid from the socket; everything the
    session owns (group ranks, exported fds) is released when the client is
    closed or the process dies, and the other members of its groups get a
    LOST event. Every call has a deadline (``call_timeout``) and raises
    UnavailableError when the daemon is gone; after a daemon restart the
    next call raises FailedPreconditionError once (rejoin), then works.

    Thread-safety: every method may be called from several threads (blocking
    calls release the GIL).
    """

    def __init__(self, native: "_native.Client"):
        # Use Client.connect(), or Communicator.client.
        self._native = native

    @classmethod
    def connect(
        cls,
        socket: Optional[str] = None,
        *,
        client_name: str = "",
        call_timeout: Optional[float] = None,
    ) -> "Client":
        """Connects and opens a session (UnavailableError when no daemon answers).

        socket: the daemon's UNIX socket; None: $MOONCAKE_SOCKET, else
        /run/mooncake/mooncaked.sock. client_name: shown by `mcctl sessions`.
        call_timeout: seconds each call may take (default 10).
        """
        return cls(
            _native.Client.connect(
                socket=socket, client_name=client_name, call_timeout=call_timeout or 0.0
            )
        )

    # ---- session ---------------------------------------------------------------
    @property
    def socket_path(self) -> str:
        return self._native.socket_path

    @property
    def instance_id(self) -> str:
        """The daemon instance this session belongs to (changes when it restarts)."""
        return self._native.instance_id

    @property
    def session_id(self) -> int:
        return self._native.session_id

    @property
    def node_id(self) -> str:
        return self._native.node_id

    @property
    def connected(self) -> bool:
        """False after the daemon went away (until a call reconnects)."""
        return self._native.connected

    @property
    def closed(self) -> bool:
        return self._native.closed

    def close(self) -> None:
        """Ends the session (for a Communicator's client: only this handle). Idempotent."""
        self._native.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- queries ---------------------------------------------------------------
    def hello(self) -> Hello:
        return Hello(**self._native.hello())

    def node_info(self) -> NodeInfo:
        """GPUs, RDMA NICs and topology notes of the node."""
        return NodeInfo.from_dict(self._native.node_info())

    def rdma_info(self) -> RdmaInfo:
        return RdmaInfo(**self._native.rdma_info())

    # ---- groups ----------------------------------------------------------------
    def join_group(
        self, group: str, rank: int, world_size: int, *, timeout: Optional[float] = None
    ) -> GroupView:
        """Joins `group` as `rank` of `world_size` without a buffer (membership only).

        Blocks until every rank has joined; DeadlineExceededError after
        `timeout` seconds (None: the daemon's default, 30 s) naming the ranks
        missing. InvalidArgumentError for a rank outside the world size.
        """
        return GroupView.from_dict(
            self._native.join_group(group, rank, world_size, timeout=timeout or 0.0)
        )

    def leave_group(self, group: str, rank: int) -> None:
        self._native.leave_group(group, rank)

    # ---- events ----------------------------------------------------------------
    def next_event(self, timeout: float = 0.0) -> Optional[Event]:
        """The next membership event, or None after `timeout` seconds."""
        d = self._native.next_event(max(0.0, timeout))
        return None if d is None else Event.from_dict(d)

    def events(self, timeout: Optional[float] = None) -> EventIterator:
        """Membership events as they come, for `timeout` seconds (None: forever)."""
        return EventIterator(self._native.next_event, timeout)

    def __repr__(self) -> str:
        if self.closed:
            return "<mooncake_client.Client closed>"
        return f"<mooncake_client.Client {self.socket_path} session {self.session_id}>"
