"""Job recognition (LLMPrism, Algorithm 1).

GPUs that exchange traffic belong to one job: union-find over the
communicating GPU NIC pairs gives clusters. In a rail-optimised fabric a
TP=8 job's traffic never leaves its rail, so each rail is a cluster of its
own; clusters whose server sets are identical (Jaccard similarity 1) are the
rails of one job and are merged. Jobs own whole servers, so we merge more
generally: clusters that share any server are one job (with TP < 8 the
rails of one job cover overlapping, not identical, server sets).

Functions here are plain functions of arrays; :class:`JobRecogniser` wraps
them for streaming use (``partial_fit`` per chunk, then ``predict``).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numba
import numpy as np
import pandas as pd

from prism.common.components import connected_components
from prism.common.kernels import register_warm_up
from prism.ingest.topology import Topology

__all__ = ["gpu_clusters", "merge_identical_server_sets", "merge_shared_servers", "job_id_for", "JobRecogniser", "warm_up"]


def gpu_clusters(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Connected components of the graph of GPU pairs (union-find).

    Parameters
    ----------
    a, b : int arrays
        Endpoints (NIC indices in ``0..n-1``) of communicating pairs.
    n : int
        Number of NICs.

    Returns
    -------
    numpy.ndarray
        Cluster label per NIC; NICs in no pair get label -1.

    Notes
    -----
    O(n + m), m = number of pairs (a compiled union-find).

    Examples
    --------
    >>> gpu_clusters(np.array([0, 2]), np.array([1, 3]), 5)
    array([ 0,  0,  1,  1, -1])
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    labels = connected_components(a, b, n)
    active = np.zeros(n, dtype=bool)
    active[a] = True
    active[b] = True
    # renumber active components 0..k-1 in order of first NIC
    out = np.full(n, -1, dtype=np.int64)
    if active.any():
        _, first, inv = np.unique(labels[active], return_index=True, return_inverse=True)
        order = np.argsort(np.argsort(first))
        out[active] = order[inv]
    return out


def merge_identical_server_sets(clusters: np.ndarray, server_of: np.ndarray) -> np.ndarray:
    """Merge clusters whose server sets are identical (Jaccard = 1).

    Parameters
    ----------
    clusters : int array
        Cluster label per NIC (-1 for none), from :func:`gpu_clusters`.
    server_of : int array
        Server index per NIC.

    Returns
    -------
    numpy.ndarray
        Job label per NIC (-1 for none), jobs numbered by first NIC.

    Notes
    -----
    Identical sets is an equivalence relation, so one grouping by the sorted
    server tuple suffices: O(n log n).

    Examples
    --------
    Rails 0 and 1 of servers {0, 1} are one job; servers {2, 3} another:

    >>> clusters = np.array([0, 1, 0, 1, 2, 2])
    >>> servers = np.array([0, 0, 1, 1, 2, 3])
    >>> merge_identical_server_sets(clusters, servers)
    array([0, 0, 0, 0, 1, 1])
    """
    clusters = np.asarray(clusters)
    out = np.full(len(clusters), -1, dtype=np.int64)
    active = clusters >= 0
    if not active.any():
        return out
    df = pd.DataFrame({"c": clusters[active], "s": np.asarray(server_of)[active]})
    sets = df.drop_duplicates().sort_values(["c", "s"]).groupby("c")["s"].agg(tuple)
    key_of_cluster = pd.Series(pd.factorize(sets, sort=False)[0], index=sets.index)
    job = key_of_cluster.reindex(clusters[active]).to_numpy()
    # number jobs by their first NIC for stable output
    _, first, inv = np.unique(job, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    out[active] = order[inv]
    return out


def merge_shared_servers(clusters: np.ndarray, server_of: np.ndarray) -> np.ndarray:
    """Merge clusters that share a server (transitively).

    Training jobs are given whole servers, so two clusters on one server are
    one job. This generalises the identical-set rule to layouts where a
    job's clusters cover different servers: with TP < 8 several DP replicas
    share a server, their ring edges run over NVLink there, and the rails
    that leave the server form clusters over overlapping, not identical,
    server sets.

    Parameters
    ----------
    clusters : int array
        Cluster label per NIC (-1 for none).
    server_of : int array
        Server index per NIC.

    Returns
    -------
    numpy.ndarray
        Job label per NIC (-1 for none), jobs numbered by first NIC.

    Notes
    -----
    Connected components of the bipartite cluster-server graph: O(n).

    Examples
    --------
    Rail clusters over servers {0, 1}, {1, 2} and {3}:

    >>> merge_shared_servers(np.array([0, 0, 1, 1, 2, -1]), np.array([0, 1, 1, 2, 3, 3]))
    array([ 0,  0,  0,  0,  1, -1])
    """
    clusters = np.asarray(clusters)
    out = np.full(len(clusters), -1, dtype=np.int64)
    active = clusters >= 0
    if not active.any():
        return out
    c = clusters[active].astype(np.int64)
    srv = np.asarray(server_of)[active].astype(np.int64)
    nc = int(c.max()) + 1
    ns = int(srv.max()) + 1
    comp = connected_components(c, nc + srv, nc + ns)
    job = comp[c]
    _, first, inv = np.unique(job, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    out[active] = order[inv]
    return out


def job_id_for(servers: Iterable[str]) -> str:
    """A stable job id from the job's server names.

    The same servers give the same id in every run and every window, so
    metrics and files from different runs can be joined on it.

    >>> job_id_for(["srv0002", "srv0001"]) == job_id_for(["srv0001", "srv0002"])
    True
    """
    h = hashlib.blake2b("\n".join(sorted(servers)).encode(), digest_size=4).hexdigest()
    return f"job-{h}"


#: possible GPU pairs (NICs squared) a recogniser marks in a table, one byte each (16 MiB: 4,096 NICs) ...
DENSE_PAIR_MARKS = 1 << 24
#: ... once a call brings this many flows; below it (the daemon's distinct pairs) the keys are kept sorted
DENSE_AFTER_ROWS = 1 << 16


@numba.njit(cache=True, nogil=True)
def _mark_pairs(seen, a, b, n):  # pragma: no cover - compiled
    """Mark each row's unordered pair ``min * n + max`` in ``seen``."""
    for i in range(len(a)):
        x, y = np.int64(a[i]), np.int64(b[i])
        seen[min(x, y) * n + max(x, y)] = True


@register_warm_up
def warm_up() -> None:
    """Load :func:`_mark_pairs`, which only a call of 65,536 pairs or more (a large window) reaches.

    The arguments have the types :meth:`JobRecogniser.partial_fit_pairs` passes (int64 NIC indices).
    """
    one = np.zeros(3, dtype=np.int64)
    _mark_pairs(np.zeros(4, dtype=bool), one, one, 2)


class JobRecogniser:
    """Streaming job recognition over flow chunks.

    Parameters
    ----------
    topology : Topology
        The GPU NICs; only pairs of two NICs are used.
    merge_rails : bool, default True
        Merge clusters into jobs (off gives the raw union-find clusters).
    merge : {"shared", "identical"}, default "shared"
        ``"shared"``: clusters that share a server are one job (jobs own
        whole servers; needed for TP < 8 layouts, see
        :func:`merge_shared_servers`). ``"identical"``: the paper's rule,
        only clusters with identical server sets; use it where jobs share
        servers.

    Examples
    --------
    >>> topo = Topology.from_frame(pd.DataFrame({
    ...     "ip": ["10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.1.2"],
    ...     "server": ["s0", "s0", "s1", "s1"]}))
    >>> jr = JobRecogniser(topo)
    >>> jr.partial_fit_pairs(np.array([0, 1]), np.array([2, 3])).predict().groupby("job_id").size().tolist()
    [4]
    """

    def __init__(self, topology: Topology, merge_rails: bool = True, merge: str = "shared"):
        if merge not in ("shared", "identical"):
            raise ValueError(f"merge must be 'shared' or 'identical', not {merge!r}")
        self.topology = topology
        self.merge_rails = merge_rails
        self.merge = merge
        n = len(topology)
        # adjacency seen so far as a set of pair keys a * n + b with a < b;
        # bounded by the number of distinct GPU pairs, not by flows: the
        # sorted distinct keys, or, once chunks of many flows come (a
        # replay's), a mark per possible pair (no sort per chunk), where
        # that takes at most DENSE_PAIR_MARKS bytes
        self._seen: np.ndarray | None = None
        self._pairs = np.empty(0, dtype=np.int64)
        self._n = n
        self._labels: np.ndarray | None = None  # cached until new pairs arrive

    def partial_fit_pairs(self, a: np.ndarray, b: np.ndarray) -> "JobRecogniser":
        """Add GPU pairs given as NIC indices (both >= 0)."""
        if self._seen is None and len(a) >= DENSE_AFTER_ROWS and self._n * self._n <= DENSE_PAIR_MARKS:
            self._seen = np.zeros(self._n * self._n, dtype=bool)
            self._seen[self._pairs] = True
            self._pairs = np.empty(0, dtype=np.int64)
        if self._seen is not None:
            _mark_pairs(self._seen, np.asarray(a), np.asarray(b), self._n)  # one pass, no key column
        else:
            keys = np.minimum(a, b).astype(np.int64) * self._n + np.maximum(a, b)
            self._pairs = np.union1d(self._pairs, np.unique(keys))
        self._labels = None
        return self

    @property
    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct GPU pairs seen, as (a, b) NIC indices with a < b, by (a, b)."""
        keys = np.flatnonzero(self._seen) if self._seen is not None else self._pairs
        return keys // self._n, keys % self._n

    def labels(self) -> np.ndarray:
        """Job label per NIC (-1 for NICs with no GPU traffic)."""
        if self._labels is None:
            a, b = self.pairs
            clusters = gpu_clusters(a, b, self._n)
            if not self.merge_rails:
                self._labels = clusters
            elif self.merge == "shared":
                self._labels = merge_shared_servers(clusters, self.topology.server_codes)
            else:
                self._labels = merge_identical_server_sets(clusters, self.topology.server_codes)
        return self._labels.copy()

    def predict(self) -> pd.DataFrame:
        """Jobs as a frame ``job_id, ip, server`` sorted by job and ip."""
        labels = self.labels()
        nics = self.topology.nics
        active = labels >= 0
        df = pd.DataFrame({"label": labels[active], "ip": nics["ip"].to_numpy()[active], "server": nics["server"].to_numpy()[active]})
        if df.empty:
            return pd.DataFrame({"job_id": pd.Series([], dtype=object), "ip": pd.Series([], dtype=object), "server": pd.Series([], dtype=object)})
        ids = df.groupby("label")["server"].agg(lambda s: job_id_for(s.unique()))
        df["job_id"] = ids.reindex(df["label"]).to_numpy()
        return df[["job_id", "ip", "server"]].sort_values(["job_id", "ip"], key=_ip_sort_key).reset_index(drop=True)


def _ip_sort_key(col: pd.Series) -> pd.Series:
    # sort addresses numerically within a job, not as strings
    if col.name != "ip":
        return col
    import ipaddress

    return col.map(lambda x: (ipaddress.ip_address(x).version, int(ipaddress.ip_address(x))))
