"""Scores against ground truth (used by tests and benchmarks)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import comb

__all__ = ["adjusted_rand_index", "gpu_flow_arrays", "pair_type_truth"]


def adjusted_rand_index(labels_true, labels_pred) -> float:
    """Adjusted Rand index of two clusterings of the same items (Hubert & Arabie 1985).

    1.0 for identical partitions (up to renaming), about 0 for random ones.

    >>> adjusted_rand_index(["a", "a", "b"], [1, 1, 2])
    1.0
    """
    t = pd.factorize(pd.Series(list(labels_true)))[0]
    p = pd.factorize(pd.Series(list(labels_pred)))[0]
    if len(t) != len(p):
        raise ValueError("label arrays differ in length")
    n = len(t)
    if n < 2:
        return 1.0
    cont = pd.crosstab(t, p).to_numpy()
    sum_comb = comb(cont, 2).sum()
    a = comb(cont.sum(axis=1), 2).sum()
    b = comb(cont.sum(axis=0), 2).sum()
    expected = a * b / comb(n, 2)
    max_index = (a + b) / 2
    if max_index == expected:
        return 1.0
    return float((sum_comb - expected) / (max_index - expected))


def gpu_flow_arrays(flows: pd.DataFrame, topology) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src NIC, dst NIC, start_ns, size) of the flows between two GPU NICs."""
    a, b = topology.nic_index(flows["src"]), topology.nic_index(flows["dst"])
    g = (a >= 0) & (b >= 0)
    return a[g], b[g], flows["start_ns"].to_numpy()[g], flows["size"].to_numpy()[g]


def pair_type_truth(a: np.ndarray, b: np.ndarray, topology, truth_pairs: pd.DataFrame) -> np.ndarray:
    """The true type of each pair (NIC indices), from a ``job_id,src,dst,type`` frame.

    Pairs missing from the truth get NaN.
    """
    lo, hi = topology.pair_addresses(a, b)
    return truth_pairs.set_index(["src", "dst"])["type"].reindex(list(zip(lo, hi))).to_numpy()
