"""What the daemon reports, as dataclasses (frozen: they are snapshots).

``Client.node_info()`` -> NodeInfo (gpus: list[Gpu], nics: list[Nic]);
``Client.hello()`` -> Hello; ``Client.rdma_info()`` -> RdmaInfo;
``Communicator.view`` / ``Client.join_group()`` -> GroupView (members:
list[GroupMember], indexed by rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

__all__ = ["Gpu", "Nic", "NodeInfo", "Hello", "RdmaInfo", "GroupMember", "GroupView"]


@dataclass(frozen=True)
class Gpu:
    """One GPU of the node, as the daemon discovered it (CUDA driver order)."""

    index: int
    name: str
    uuid: str  # "GPU-..."
    pci_bus_id: str  # "0000:1b:00.0"
    numa_node: int = -1
    total_memory_bytes: int = 0


@dataclass(frozen=True)
class Nic:
    """One RDMA NIC of the node (its device name, e.g. "mlx5_0")."""

    name: str


@dataclass(frozen=True)
class NodeInfo:
    """The node as mooncaked sees it. gpu_note / nic_note say why a list is empty."""

    node_id: str
    hostname: str
    instance_id: str
    gpus: List[Gpu] = field(default_factory=list)
    nics: List[Nic] = field(default_factory=list)
    gpu_note: str = ""
    nic_note: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> "NodeInfo":
        return cls(
            node_id=d["node_id"],
            hostname=d["hostname"],
            instance_id=d["instance_id"],
            gpus=[Gpu(**g) for g in d["gpus"]],
            nics=[Nic(name=n) for n in d["nics"]],
            gpu_note=d["gpu_note"],
            nic_note=d["nic_note"],
        )


@dataclass(frozen=True)
class Hello:
    """The daemon's answer to Hello, with this process's identity as the kernel reports it."""

    protocol_version: int
    daemon_version: str
    instance_id: str
    node_id: str
    uid: int
    gid: int
    pid: int


@dataclass(frozen=True)
class RdmaInfo:
    """The node's RDMA provider ("softnic" where there is no RDMA NIC, or "mlx5")."""

    provider: str
    nic: str
    doorbell_mode: str
    is_roce: bool
    gid_index: int
    max_qps_per_session: int
    max_sq_wqes: int


@dataclass(frozen=True)
class GroupMember:
    """One rank of a group as the daemon published it."""

    rank: int
    node_id: str
    pid: int
    gpu_index: int  # -1: host platform
    gpu_uuid: str
    gpu_pci_bus_id: str
    handle_kind: str  # "memfd", "cuda-vmm-fd", "cuda-ipc", "" (membership only)
    handle_size: int
    same_node: bool
    p2p_reachable: bool
    native_atomics: bool
    rdma: bool  # published an RDMA endpoint


@dataclass(frozen=True)
class GroupView:
    """A formed group: this rank, the size, the epoch, and every member by rank."""

    group: str
    rank: int
    world_size: int
    epoch: int
    members: List[GroupMember] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> "GroupView":
        return cls(
            group=d["group"],
            rank=d["rank"],
            world_size=d["world_size"],
            epoch=d["epoch"],
            members=[GroupMember(**m) for m in d["members"]],
        )
