"""A rail-optimised leaf/spine fabric (SYNTHETIC).

Servers are grouped; within a group, NIC ``r`` of every server connects to
the rail-``r`` leaf of that group. Every leaf connects to every spine. A flow
between two NICs on the same rail leaf crosses that leaf only; any other
flow goes leaf -> spine -> leaf, the spine chosen by an ECMP hash of the
ordered pair. Storage hosts hang off their own leaf.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Fabric"]


@dataclass(frozen=True)
class Fabric:
    """Shape and speed of the fabric.

    Parameters
    ----------
    servers : int
        Number of GPU servers.
    gpus_per_server : int
        GPUs (= RDMA NICs, one per GPU) per server.
    servers_per_group : int
        Servers under one set of rail leaves.
    spines : int
        Spine switches (ECMP width).
    link_gbps : float
        NIC and link speed.
    nvlink_gbps : float
        Intra-server GPU-to-GPU speed (traffic there is not on the network).
    latency_ns : int
        Per-message fixed cost.
    storage_hosts : int
        Non-GPU hosts that exchange storage traffic with GPUs.
    """

    servers: int
    gpus_per_server: int = 8
    servers_per_group: int = 16
    spines: int = 8
    link_gbps: float = 400.0
    nvlink_gbps: float = 3200.0
    latency_ns: int = 4_000
    storage_hosts: int = 4

    @property
    def n_gpus(self) -> int:
        return self.servers * self.gpus_per_server

    @property
    def groups(self) -> int:
        return -(-self.servers // self.servers_per_group)

    @property
    def bytes_per_ns(self) -> float:
        return self.link_gbps / 8.0

    @property
    def nvlink_bytes_per_ns(self) -> float:
        return self.nvlink_gbps / 8.0

    # --- names ------------------------------------------------------------
    def server_name(self, s: int) -> str:
        return f"srv{s:04d}"

    def gpu_ip(self, g: int | np.integer) -> str:
        s, r = divmod(int(g), self.gpus_per_server)
        return f"10.{1 + s // 256}.{s % 256}.{10 + r}"

    def storage_ip(self, i: int) -> str:
        return f"10.200.0.{1 + i}"

    def switch_names(self) -> list[str]:
        """All switches: leaves (group-major, rail-minor), spines, storage leaf."""
        leaves = [f"leaf-g{g:02d}-r{r}" for g in range(self.groups) for r in range(self.gpus_per_server)]
        spines = [f"spine-{k:02d}" for k in range(self.spines)]
        return leaves + spines + ["leaf-storage"]

    @property
    def storage_leaf(self) -> int:
        return self.groups * self.gpus_per_server + self.spines

    # --- paths ------------------------------------------------------------
    def leaf_of(self, gpu: np.ndarray) -> np.ndarray:
        s = gpu // self.gpus_per_server
        r = gpu % self.gpus_per_server
        return (s // self.servers_per_group) * self.gpus_per_server + r

    def spine_of(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """ECMP: a fixed hash of the ordered (src, dst) pair picks the spine."""
        h = (a.astype(np.uint64) * np.uint64(2654435761) + b.astype(np.uint64) * np.uint64(40503)) >> np.uint64(7)
        return self.groups * self.gpus_per_server + (h % np.uint64(self.spines)).astype(np.int64)

    def paths(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Switch indices on the path of each ordered GPU pair, shape (n, 3).

        Unused hops are -1. Pairs on one server are not on the network and
        get an all -1 path.
        """
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        la, lb = self.leaf_of(a), self.leaf_of(b)
        out = np.full((len(a), 3), -1, dtype=np.int64)
        same_server = (a // self.gpus_per_server) == (b // self.gpus_per_server)
        one_leaf = (la == lb) & ~same_server
        via_spine = (la != lb) & ~same_server
        out[one_leaf, 0] = la[one_leaf]
        out[via_spine, 0] = la[via_spine]
        out[via_spine, 1] = self.spine_of(a[via_spine], b[via_spine])
        out[via_spine, 2] = lb[via_spine]
        return out

    def storage_paths(self, gpu: np.ndarray, to_storage: np.ndarray, host: np.ndarray) -> np.ndarray:
        gpu = np.asarray(gpu, dtype=np.int64)
        leaf = self.leaf_of(gpu)
        spine = self.spine_of(gpu, host + self.n_gpus)
        out = np.empty((len(gpu), 3), dtype=np.int64)
        out[:, 1] = spine
        out[:, 0] = np.where(to_storage, leaf, self.storage_leaf)
        out[:, 2] = np.where(to_storage, self.storage_leaf, leaf)
        return out

    def topology_rows(self) -> dict:
        """Columns of the topology CSV: ``ip, server, rail, leaf``."""
        g = np.arange(self.n_gpus)
        names = self.switch_names()
        return {
            "ip": [self.gpu_ip(x) for x in g],
            "server": [self.server_name(x // self.gpus_per_server) for x in g],
            "rail": (g % self.gpus_per_server).tolist(),
            "leaf": [names[x] for x in self.leaf_of(g)],
        }
