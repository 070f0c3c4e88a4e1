"""Which valid flow records are GPU-to-GPU training traffic, and why the others are ignored.

The replay counts the records it skips in ``summary.json``
(``ignored_by_reason``), the daemon in ``prism_flows_ignored_total{reason}``,
and the daemon's topology check reads the ``non_gpu_address`` count. The
rule and the reasons live here once, so that the two programs count the
same thing under the same names.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from prism.ingest.topology import Topology

__all__ = ["IGNORE_REASONS", "NON_GPU_ADDRESS", "SELF_FLOW", "LATE", "GpuTraffic", "gpu_traffic"]

#: src or dst is not a GPU NIC of the topology (storage, management traffic)
NON_GPU_ADDRESS = "non_gpu_address"
#: src == dst: no network between the two ends
SELF_FLOW = "self_flow"
#: started before the daemon's window reaches (its time was analysed already); the replay has no window
LATE = "late"
#: Why a valid record is not analysed, in the order the metrics list them.
IGNORE_REASONS = (NON_GPU_ADDRESS, SELF_FLOW, LATE)


@dataclass(frozen=True)
class GpuTraffic:
    """The records' GPU NIC indices, which of them are training traffic, and the rest counted by reason."""

    a: np.ndarray  # NIC index of each record's src (-1: not a GPU NIC)
    b: np.ndarray  # NIC index of each record's dst
    gpu: np.ndarray  # bool: GPU-to-GPU training traffic (analysed)
    ignored: dict[str, int]  # reason -> records, in the order the reasons apply


def gpu_traffic(topology: Topology, src: pd.Series, dst: pd.Series) -> GpuTraffic:
    """Split records into GPU-to-GPU training traffic and the ignored, by reason.

    A record counts under the first reason that applies, in the order
    non_gpu_address, self_flow. (``late`` is the daemon's, for GPU flows
    older than the window that takes them in reaches: see
    :class:`prism.serve.monitor.Monitor`.)

    Parameters
    ----------
    topology : Topology
        The GPU NICs.
    src, dst : pandas.Series
        The records' addresses.

    Examples
    --------
    >>> topo = Topology.from_frame(pd.DataFrame({"ip": ["10.0.0.1", "10.0.0.2"], "server": ["s0", "s1"]}))
    >>> t = gpu_traffic(topo, pd.Series(["10.0.0.1", "10.0.0.1", "10.9.9.9"]), pd.Series(["10.0.0.2", "10.0.0.1", "10.0.0.2"]))
    >>> t.gpu.tolist(), t.ignored
    ([True, False, False], {'non_gpu_address': 1, 'self_flow': 1})
    """
    a = topology.nic_index(src)
    b = topology.nic_index(dst)
    non_gpu = (a < 0) | (b < 0)
    self_flow = ~non_gpu & (a == b)
    gpu = ~(non_gpu | self_flow)
    return GpuTraffic(a, b, gpu, {NON_GPU_ADDRESS: int(non_gpu.sum()), SELF_FLOW: int(self_flow.sum())})
