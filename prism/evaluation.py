"""Scores against ground truth (used by tests and benchmarks)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import comb

__all__ = ["adjusted_rand_index"]


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
