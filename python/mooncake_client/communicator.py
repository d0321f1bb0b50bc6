"""Communicator: "rank r of n in group G" -> a symmetric buffer and a ready CommCtx."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from . import _mooncake_client as _native
from .client import Client
from .errors import InvalidArgumentError
from .events import Event, EventIterator, EventKind
from .info import GroupView

__all__ = ["Communicator"]

Buffer = _native.Buffer
CommCtx = _native.CommCtx


class Communicator:
    """One rank of a group with a symmetric buffer every other rank can reach.

    ::

        with Communicator.create(group="moe0", rank=r, world_size=n,
                                 buffer_bytes=64 << 20, platform="cuda") as comm:
            t = torch.from_dlpack(comm.buffer)      # uint8 tensor over the buffer, no copy
            my_kernel_launcher(comm.ctx.address, ...)   # the CommCtx, passed by value

    ``create`` connects to mooncaked, allocates the buffer (shared memory on
    the ``host`` platform; GPU memory on ``cuda``, on the current device),
    joins the group, maps every peer, verifies each one and waits until all
    ranks are ready. It blocks for the rendezvous (up to ``timeout``); the
    GIL is released meanwhile.

    ``buffer`` is zero-copy: ``numpy.asarray(comm.buffer)`` (host),
    ``torch.from_dlpack(comm.buffer)`` (host or CUDA),
    ``__cuda_array_interface__`` (CUDA). Views keep the memory alive after
    ``close()``.

    ``ctx`` is the device::CommCtx that kernels receive by value: ``.address``
    is the address of the struct the communicator owns, ``.nbytes`` its size.

    Testing aids, host platform only (``put``, ``signal``, ``red_add``,
    ``quiet``, ``wait_signal``): the Device API called from this thread as a
    CPU "kernel" would call it (mc_put_thread, mc_signal, mc_red_add,
    mc_quiet, mc_wait_until). They exist so the package can be tested end
    to end without a GPU; on CUDA they raise FailedPreconditionError (pass
    ``ctx`` to a kernel instead).

    Thread-safety: use one communicator from one thread at a time.
    """

    def __init__(self, native: "_native.Communicator"):
        # Use Communicator.create().
        self._native = native
        self._buffer = None

    @classmethod
    def create(
        cls,
        *,
        group: str,
        rank: int,
        world_size: int,
        buffer_bytes: int,
        platform: str = "host",
        route: str = "auto",
        socket: Optional[str] = None,
        timeout: float = 30.0,
        rdma_peers: Sequence[int] = (),
        qps_per_peer: int = 1,
        wait_all_ready: bool = True,
        client_name: str = "",
        device: Optional[int] = None,
        gpu_uuid: str = "",
        cuda_handle: str = "auto",
        rdma_nics: Sequence[str] = (),
        rdma_ring_memory: str = "auto",
        atomics_route: str = "auto",
    ) -> "Communicator":
        """Joins `group` as `rank` of `world_size` with a `buffer_bytes` buffer (same on every rank).

        platform: "host" (CPU threads over shared memory) or "cuda".
        route: "auto" (load/store where the daemon says a peer is reachable,
        RDMA to `rdma_peers`), "p2p" (load/store only) or "rdma" (every peer
        over RDMA: softnic in the daemon where there is no RDMA NIC).
        socket: None: $MOONCAKE_SOCKET, else /run/mooncake/mooncaked.sock.
        timeout: seconds for the rendezvous and the ready wait.
        device (cuda): the CUDA device of the buffer. The buffer goes on the
        device current in this thread; when torch is imported and `device`
        is given, torch.cuda.set_device(device) makes it current first.
        None: torch's current device if torch is imported, else the daemon's
        index of this rank's GPU.
        cuda_handle (cuda): "auto", "vmm" (cuMem POSIX fd), "ipc" (legacy IPC)
        or "fabric" (cuMem fabric handle, MNNVL: needs an IMEX channel; "auto"
        tries it first and falls back to "vmm" with a logged reason).
        rdma_nics: the NICs this rank's RDMA queue pairs may go on ("mlx5_0",
        "softnic0"); empty: any the daemon serves, the closest to the GPU.
        rdma_ring_memory: where the queue pairs' rings live (cuda): "auto"
        (GPU memory when kernels ring the NIC themselves, else host memory,
        falling back to host memory when refused), "host", or "gpu" (an
        error saying why when refused). See `rdma_ring_memory` after create.
        atomics_route: where red_add runs (docs/rdma.md "Atomics across
        routes"): "nic" (every add through the target's NIC, from every
        rank), "device" (SM/CPU atomics toward P2P peers and self), "auto"
        ("nic" on a rank with RDMA peers). Every rank must agree, else
        FailedPreconditionError naming the ranks on each side.

        Raises InvalidArgumentError for bad arguments, UnavailableError when
        no daemon answers, DeadlineExceededError when the other ranks do not
        come in time, FailedPreconditionError when a peer cannot be reached.
        """
        cuda_device = -1
        if platform == "cuda":
            torch = sys.modules.get("torch")
            if torch is not None:
                if device is not None:
                    torch.cuda.set_device(device)
                else:
                    device = torch.cuda.current_device()
            cuda_device = -1 if device is None else int(device)
        native = _native.Communicator.create(
            group=group,
            rank=rank,
            world_size=world_size,
            buffer_bytes=buffer_bytes,
            platform=platform,
            route=route,
            socket=socket,
            timeout=timeout,
            rdma_peers=list(rdma_peers),
            qps_per_peer=qps_per_peer,
            wait_all_ready=wait_all_ready,
            client_name=client_name,
            gpu_uuid=gpu_uuid,
            cuda_handle=cuda_handle,
            cuda_device=cuda_device,
            rdma_nics=list(rdma_nics),
            rdma_ring_memory=rdma_ring_memory,
            atomics_route=atomics_route,
        )
        return cls(native)

    # ---- what the communicator is ---------------------------------------------
    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def world_size(self) -> int:
        return self._native.world_size

    @property
    def nic_atomics(self) -> bool:
        """Whether every red_add goes through the target's NIC (atomics_route)."""
        return self._native.nic_atomics

    @property
    def rdma_ring_memory(self) -> Optional[str]:
        """Where the RDMA queue pairs' rings are ("host" or "gpu").

        None without queue pairs: no RDMA peers and no NIC atomics.
        """
        return self._native.rdma_ring_memory

    @property
    def platform(self) -> str:
        """Either "host" or "cuda"."""
        return self._native.platform

    @property
    def handle_kind(self) -> str:
        """How the buffer was shared: "memfd", "cuda-vmm-fd" or "cuda-ipc"."""
        return self._native.handle_kind

    @property
    def setup_time(self) -> float:
        """Seconds create() took, connect to ready."""
        return self._native.setup_time

    @property
    def buffer(self) -> Buffer:
        """This rank's symmetric buffer (zero-copy; see the class docstring)."""
        if self._buffer is None:
            self._buffer = self._native.buffer
        return self._buffer

    @property
    def ctx(self) -> CommCtx:
        """The device::CommCtx for kernels: ``.address`` (int), ``.nbytes``, ``.to_bytes()``."""
        return self._native.ctx

    @property
    def view(self) -> GroupView:
        """The group as this rank knows it: every member by rank (replacements included)."""
        return GroupView.from_dict(self._native.view)

    @property
    def epoch(self) -> int:
        """The group's epoch as this rank knows it.

        1 at formation, + 1 for each replacement admitted by ``handle_event``
        (a replacement starts at the epoch it joined).
        """
        return self._native.epoch

    @property
    def client(self) -> Client:
        """The communicator's session with the daemon (events, node info)."""
        return Client(self._native.client)

    @property
    def closed(self) -> bool:
        return self._native.closed

    def rdma_peer(self, rank: int) -> bool:
        """True when `rank` is reached over RDMA."""
        return self._native.rdma_peer(rank)

    def peer_buffer(self, rank: int) -> Buffer:
        """Rank `rank`'s buffer as mapped into this process (host platform, P2P peers only).

        FailedPreconditionError for a peer reached over RDMA and on CUDA
        (where the peer mappings are known to the device only).
        """
        return self._native.peer_buffer(rank)

    def peer_active(self, rank: int) -> bool:
        """Whether `rank` is part of the group now (self: True).

        False between its LOST/LEFT and its replacement's JOINED, once
        ``handle_event`` saw them.
        """
        return self._native.peer_active(rank)

    def events(self, timeout: Optional[float] = None) -> EventIterator:
        """Membership events of this communicator's session (see Client.events)."""
        return EventIterator(self._native.client.next_event, timeout)

    def handle_event(self, event: Event) -> None:
        """Lets this rank follow its elastic group through `event` (from ``events()``).

        ::

            for ev in comm.events(timeout=60):
                comm.handle_event(ev)

        LOST / LEFT of rank r: r is marked unavailable in ``ctx``'s tables (a
        kernel gets no route to it), this rank's queue pairs toward r are
        replaced by fresh ones, and the daemon is told r is released here.
        JOINED of rank r: a replacement process (an ordinary ``create`` with
        the same group, rank and world size) took r; its buffer is mapped
        and verified, or the fresh queue pairs connected to its own, and
        readiness is reported again; ``epoch`` becomes the event's. Events of
        other groups, of this rank and of other kinds are ignored. Node-local
        groups only. The GIL is released meanwhile.

        The event's fields are what this acts on (``dataclasses.replace``
        works as expected). A JOINED also needs what only an event read from
        a session carries (the replacement's handle, fd ticket and RDMA
        endpoint): InvalidArgumentError for a JOINED made by hand.
        FailedPreconditionError after ``leave()``, for a rank that was not
        reported LOST or LEFT, or when the replacement cannot be reached;
        otherwise the error of the step that failed, naming the rank.
        """
        if not isinstance(event, Event):
            raise TypeError(f"handle_event takes a mooncake_client.Event, not {type(event).__name__}")
        if event.kind == EventKind.JOINED and event._native is None:
            raise InvalidArgumentError(
                "INVALID_ARGUMENT",
                f"handle_event: this JOINED of rank {event.rank} was not read from a session "
                "(Communicator.events() or Client.events()), so it carries no replacement's handle",
            )
        self._native.handle_event(
            str(event.kind), event.group, event.rank, event.pid, event.epoch, event._native
        )

    # ---- lifetime --------------------------------------------------------------
    def leave(self) -> None:
        """Leaves the group now (peers see LEFT); the buffer stays valid. Idempotent."""
        self._native.leave()

    def close(self) -> None:
        """Leaves and lets go of the communicator. Idempotent.

        The buffer and the session are freed when the last view made from
        ``buffer`` (numpy array, tensor, DLPack capsule) is gone.
        """
        self._buffer = None
        self._native.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- testing aids (host platform) ------------------------------------------
    def put(self, peer: int, dst_offset: int, src_offset: int, nbytes: int) -> None:
        """Copies `nbytes` from this rank's buffer at `src_offset` to `peer`'s at `dst_offset`.

        Host platform only (a testing aid; mc_put_thread). Weak stores: the
        peer is guaranteed to see them once it sees a later ``signal``. Over
        RDMA the put is posted: ``quiet()`` completes it.
        """
        self._native.put(peer, dst_offset, src_offset, nbytes)

    def signal(self, peer: int, offset: int, value: int) -> None:
        """Release-stores the uint64 `value` at byte `offset` (8-aligned) of `peer`'s buffer.

        Host platform only (mc_signal): a peer whose ``wait_signal`` sees the
        value also sees every earlier ``put`` of this rank.
        """
        self._native.signal(peer, offset, value)

    def red_add(self, peer: int, offset: int, value: int) -> None:
        """Atomically adds `value` to the uint64 at `offset` of `peer`'s buffer (host only)."""
        self._native.red_add(peer, offset, value)

    def quiet(self) -> None:
        """Completes this rank's outstanding puts (host only; mc_quiet)."""
        self._native.quiet()

    def wait_signal(self, offset: int, value: int, timeout: Optional[float] = None) -> int:
        """Waits until the uint64 at `offset` of this rank's buffer is >= `value`; returns it.

        Host platform only (mc_wait_until, acquire). DeadlineExceededError
        after `timeout` seconds (None: no limit); Ctrl-C interrupts it.
        """
        return self._native.wait_signal(offset, value, -1.0 if timeout is None else timeout)

    def __repr__(self) -> str:
        if self.closed:
            return "<mooncake_client.Communicator closed>"
        return (
            f"<mooncake_client.Communicator rank {self.rank}/{self.world_size} "
            f"{self.platform} {self.handle_kind}>"
        )
