"""Sorting flows into runs: by a few small integer keys, then by start time.

The analyses group flows by pair, job, step or parallel group and need each
group's flows in time order: ``np.lexsort((start, *reversed(keys)))``, an
O(n log n) comparison sort, which took over 2 s per call on 13.6M flows.
Flows mostly arrive in start order already, and the keys are small
integers, so a stable counting sort on the combined key gives the same
order in O(n + K): one count, one prefix sum, one scatter.

>>> import numpy as np
>>> key = np.array([2, 0, 2, 1, 0]); start = np.array([1, 2, 3, 4, 5])
>>> order_by([key], start).tolist() == np.lexsort((start, key)).tolist()
True
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

__all__ = ["order_by", "stable_order", "group_rows", "rank_keys", "MAX_COUNTING_KEYS"]

#: largest combined key range sorted by counting (its count array takes 8 bytes a key; also at most 2 per flow)
MAX_COUNTING_KEYS = 1 << 24


def order_by(keys: list, start: np.ndarray) -> np.ndarray:
    """Indices that sort by ``keys`` (most significant first), then ``start``; exactly ``np.lexsort``'s order.

    Parameters
    ----------
    keys : list of integer arrays
        Non-negative for the fast path.
    start : int array
        The last sort key (ties keep their input order, as np.lexsort does).

    Complexity: O(n + K) when ``start`` is ascending and the combined key
    range K is at most :data:`MAX_COUNTING_KEYS`; otherwise ``np.lexsort``'s
    O(n log n).
    """
    start = np.asarray(start)
    n = len(start)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if n < 2 or bool(np.all(start[1:] >= start[:-1])):  # checked first: it is cheaper than combining the keys
        combined = _combine(keys, n)
        if combined is not None:
            return _counting_order(*combined)
    return np.lexsort((start, *reversed([np.asarray(x) for x in keys])))


def _combine(keys: list, n: int):
    """(one int64 key, its range) in mixed radix, or None if a key is negative or the range is too large."""
    key, k = np.zeros(n, dtype=np.int64), 1
    for x in keys:
        x = np.asarray(x)
        if x.dtype == bool:
            x = x.astype(np.int64)
        lo, hi = int(x.min()), int(x.max())
        if lo < 0:
            return None
        k *= hi + 1
        if k > min(MAX_COUNTING_KEYS, max(2 * n, 1 << 16)):
            return None
        key *= hi + 1
        key += x
    return key, k


def stable_order(key: np.ndarray, n_keys: int) -> np.ndarray:
    """Indices that sort by one key in ``[0, n_keys)``, rows of one key in their input order (a counting sort, O(n + n_keys)).

    >>> import numpy as np
    >>> stable_order(np.array([1, 0, 1, 0]), 2).tolist()
    [1, 3, 0, 2]
    """
    return _counting_order(np.asarray(key, dtype=np.int64), int(n_keys))


def rank_keys(key: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, its key's rank among the keys present (-1 for a negative key), and the keys present, in order.

    What ``np.unique(key, return_inverse=True)`` gives, without its sort:
    two compiled passes through a table of ``n_keys`` marks when the
    range is small (as :func:`order_by` counts: at most
    :data:`MAX_COUNTING_KEYS` and twice the rows), else ``np.unique``.

    >>> import numpy as np
    >>> [x.tolist() for x in rank_keys(np.array([7, -1, 2, 7]), 10)]
    [[1, -1, 0, 1], [2, 7]]
    """
    key = np.asarray(key, dtype=np.int64)
    if len(key) and key.max() >= n_keys:
        raise ValueError("rank_keys: a key is past n_keys")
    if n_keys <= min(MAX_COUNTING_KEYS, max(2 * len(key), 1 << 16)):
        return _rank_keys(key, int(n_keys))
    present, rank = np.unique(key, return_inverse=True)
    if len(present) and present[0] < 0:
        present, rank = present[1:], rank - 1
    return np.where(key < 0, -1, rank), present


@numba.njit(cache=True, nogil=True)
def _rank_keys(key, n_keys):  # pragma: no cover - compiled
    rank_of = np.full(n_keys, -1, np.int32)
    for x in key:
        if x >= 0:
            rank_of[x] = 0
    n = 0
    for x in range(n_keys):
        if rank_of[x] == 0:
            rank_of[x] = n
            n += 1
    present = np.empty(n, np.int64)
    rank = np.empty(len(key), np.int64)
    for i in range(len(key)):
        x = key[i]
        rank[i] = rank_of[x] if x >= 0 else -1
        if x >= 0:
            present[rank_of[x]] = x
    return rank, present


def group_rows(chunks: list[list[Any]], keys: list[np.ndarray], counts: np.ndarray, after_column: Callable[[], object] | None = None) -> list[np.ndarray]:
    """Chunked columns as whole columns, their rows grouped by a small key (a stable counting sort).

    What ``np.concatenate(column)[order_by([np.concatenate(keys)], rows)]``
    gives for each column, without the order or the joined copy: each
    row's place is found once, then each chunk's column is scattered to
    its rows' places. Rows of one key keep their chunk and row order.

    Parameters
    ----------
    chunks : list of lists of arrays
        Per chunk, its columns (the same columns in every chunk). Consumed:
        a chunk's column is dropped (set to None) once scattered, so the
        chunks go as the whole columns fill. With one chunk, its arrays are
        reordered in place and returned (its caller may still hold them).
    keys : list of int arrays
        Per chunk, each row's key, in ``[0, len(counts))``.
    counts : int array
        Rows per key, over all chunks (``np.bincount`` of the keys).
    after_column : callable, optional
        Called after each column's chunks are dropped (to hand their pages
        back, say).

    Returns
    -------
    list of arrays
        The grouped columns: key 0's rows first.

    Complexity: O(rows) in two compiled passes per column; memory: a place
    per row (8 bytes) and one whole column beyond the chunks.

    >>> import numpy as np
    >>> a, b = [np.array([10, 11, 12]), np.array([1, 2, 3])], [np.array([13, 14]), np.array([4, 5])]
    >>> keys = [np.array([1, 0, 1]), np.array([0, 1])]
    >>> [c.tolist() for c in group_rows([a, b], keys, np.array([2, 3]))]
    [[11, 13, 10, 12, 14], [2, 4, 1, 3, 5]]
    """
    counts = np.asarray(counts, dtype=np.int64)
    if sum(len(k) for k in keys) != int(counts.sum()):
        raise ValueError("group_rows: the counts do not add up to the rows")
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    places = [_places(np.asarray(k), offsets) for k in keys]  # advances offsets: chunk after chunk
    n = int(counts.sum())
    columns = []
    for i in range(len(chunks[0]) if chunks else 0):
        out = np.empty(n, dtype=chunks[0][i].dtype)
        for chunk, at in zip(chunks, places):
            _scatter(chunk[i], at, out)
            if len(chunks) > 1:
                chunk[i] = None
        if len(chunks) == 1:  # in place: the caller's arrays hold the grouped rows
            chunks[0][i][:] = out
            out = chunks[0][i]
        columns.append(out)
        if after_column is not None:
            after_column()
    return columns


@numba.njit(cache=True, nogil=True)
def _places(key, offsets):  # pragma: no cover - compiled
    out = np.empty(len(key), dtype=np.int64)
    for i in range(len(key)):
        k = key[i]
        out[i] = offsets[k]
        offsets[k] += 1
    return out


@numba.njit(cache=True, nogil=True)
def _scatter(src, at, out):  # pragma: no cover - compiled
    for i in range(len(src)):
        out[at[i]] = src[i]


@numba.njit(cache=True, nogil=True)
def _counting_order(key, k):
    offsets = np.zeros(k + 1, dtype=np.int64)
    for x in key:
        offsets[x + 1] += 1
    for i in range(k):
        offsets[i + 1] += offsets[i]
    out = np.empty(len(key), dtype=np.int64)
    for i in range(len(key)):
        x = key[i]
        out[offsets[x]] = i
        offsets[x] += 1
    return out
