"""Connected components of a graph given as its edges: a compiled union-find.

Job recognition, the DP rings and pipelines, and the what-if's op graph
all ask the same question of a graph of a few thousand nodes: which
component is each node in. scipy's ``csgraph.connected_components`` answers
it too, but importing ``scipy.sparse`` costs every command 0.1 s at start,
more than the union-find takes on a replay's largest graphs.

>>> import numpy as np
>>> connected_components(np.array([3, 0]), np.array([4, 1]), 6).tolist()
[0, 0, 1, 2, 2, 3]
"""
from __future__ import annotations

import numba
import numpy as np

__all__ = ["connected_components"]


def connected_components(a: np.ndarray, b: np.ndarray, n_nodes: int) -> np.ndarray:
    """Component label of every node of the undirected graph with edges ``(a[i], b[i])``.

    Parameters
    ----------
    a, b : int arrays
        The edges' ends, in ``[0, n_nodes)``.
    n_nodes : int
        Nodes; a node in no edge is a component of its own.

    Returns
    -------
    int32 array
        Labels ``0..k-1``, numbered in the order of each component's
        lowest node: what ``scipy.sparse.csgraph.connected_components``
        gives (``directed=False``).

    Complexity: O(n_nodes + edges * alpha(n_nodes)): union by lower
    root, with path halving.
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if len(a) != len(b):
        raise ValueError("connected_components: a and b differ in length")
    if len(a) and (min(a.min(), b.min()) < 0 or max(a.max(), b.max()) >= n_nodes):
        raise ValueError(f"connected_components: an edge's end is outside 0..{n_nodes - 1}")
    return _label(a, b, int(n_nodes))


@numba.njit(cache=True, nogil=True)
def _root(parent, x):  # pragma: no cover - compiled
    while parent[x] != x:
        parent[x] = parent[parent[x]]  # path halving
        x = parent[x]
    return x


@numba.njit(cache=True, nogil=True)
def _label(a, b, n):  # pragma: no cover - compiled
    parent = np.arange(n)
    for i in range(len(a)):
        x, y = _root(parent, a[i]), _root(parent, b[i])
        if x < y:
            parent[y] = x
        elif y < x:
            parent[x] = y
    # the lower root wins every union, so a component's root is its lowest
    # node; nodes in increasing order meet the roots in that order too
    label = np.empty(n, np.int32)
    k = 0
    for x in range(n):
        r = _root(parent, x)
        if r == x:
            label[x] = k
            k += 1
        else:
            label[x] = label[r]
    return label
