"""Sliding event-time windows over the flow stream, with de-duplication.

The daemon keeps the last ``window`` of GPU flows (32 bytes each, columnar)
and forgets what is older; a re-delivered record (Kafka is at-least-once)
is recognised by a 64-bit hash of ``(src, dst, start_ns, size)`` and not
counted twice.

Everything here is vectorised over a batch; Python work is per batch and per
distinct address, never per record.
"""
from __future__ import annotations

import hashlib
from typing import cast

import numba
import numpy as np
import pandas as pd

from prism.common.kernels import register_warm_up

__all__ = ["RecordDeduper", "FlowWindow", "record_hashes", "span_into", "server_silences", "warm_up"]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_ADDR_HASH: dict[str, int] = {}


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64 finaliser: every input bit moves every output bit
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _address_hashes(col) -> np.ndarray:
    """A stable 64-bit hash per row of an address column (via its categories)."""
    cat = cast(pd.Categorical, col.array) if isinstance(col, pd.Series) and isinstance(col.dtype, pd.CategoricalDtype) else pd.Categorical(col)
    lut = np.empty(len(cat.categories), dtype=np.uint64)
    for i, text in enumerate(cat.categories):
        h = _ADDR_HASH.get(text)
        if h is None:
            h = int.from_bytes(hashlib.blake2b(str(text).encode(), digest_size=8).digest(), "little")
            if len(_ADDR_HASH) < 1 << 20:
                _ADDR_HASH[text] = h
        lut[i] = h
    return lut[np.asarray(cat.codes)]


def record_hashes(flows: pd.DataFrame) -> np.ndarray:
    """64-bit identity hash of each record's ``(src, dst, start_ns, size)``.

    >>> f = pd.DataFrame({"src": ["a", "a"], "dst": ["b", "b"], "start_ns": [1, 1], "size": [8, 8]})
    >>> h = record_hashes(f); bool(h[0] == h[1])
    True
    """
    with np.errstate(over="ignore"):
        h = _mix(_address_hashes(flows["src"]))
        h = _mix(h ^ _address_hashes(flows["dst"]))
        h = _mix(h ^ flows["start_ns"].to_numpy().astype(np.uint64))
        return _mix(h ^ flows["size"].to_numpy().astype(np.uint64))


class RecordDeduper:
    """Remembers record hashes with their start times, for a sliding horizon.

    An open-addressing hash table (linear probing, compiled with numba):
    a lookup and an insert are O(1) per record, with no sort. :meth:`evict`
    (once per window) deletes in place, one pass over the table; the table
    is rebuilt when it fills past 70% and shrunk after a burst. Past
    ``max_records`` the oldest are forgotten, so a flood cannot grow it
    without bound: 16 bytes a slot, 23 to 46 bytes a record.

    Examples
    --------
    >>> d = RecordDeduper()
    >>> d.filter(np.array([1, 2, 2], np.uint64), np.array([10, 11, 11])).tolist()
    [True, True, False]
    >>> d.filter(np.array([2, 3], np.uint64), np.array([11, 12])).tolist()
    [False, True]
    >>> d.evict(12); len(d)
    1
    """

    MIN_SLOTS = 1 << 12
    MAX_LOAD = 0.7

    def __init__(self, max_records: int = 1 << 62):
        self.max_records = int(max_records)
        self._keys = np.zeros(self.MIN_SLOTS, dtype=np.uint64)  # 0: an empty slot
        self._times = np.zeros(self.MIN_SLOTS, dtype=np.int64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def filter(self, hashes: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Mask of the records not seen before (first of each in the batch)."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        new = np.zeros(len(hashes), dtype=bool)
        if len(hashes) == 0:
            return new
        if self._n + len(hashes) > self.MAX_LOAD * len(self._keys):
            self._rebuild(self._slots_for(self._n + len(hashes)))
        self._n += _insert(self._keys, self._times, hashes, np.asarray(start, dtype=np.int64), new)
        if self._n > self.max_records:
            self._forget_oldest(int(self.max_records * 0.9))
        return new

    def evict(self, before_ns: int) -> None:
        """Forget records that started before ``before_ns``."""
        keep = (self._keys != 0) & (self._times >= before_ns)
        n = int(keep.sum())
        if len(self._keys) > 4 * self._slots_for(n):  # shrink after a burst
            self._rebuild(self._slots_for(n), keep)
        elif n < self._n:
            # in place: a window step forgets a fifth of the table, and
            # re-inserting the rest into a new one cost the daemon 30 ms a window
            self._n -= _delete_before(self._keys, self._times, np.int64(before_ns))

    def _slots_for(self, n: int) -> int:
        need = int(n / (self.MAX_LOAD / 2)) + 1  # room to grow before the next rebuild
        return max(self.MIN_SLOTS, 1 << (need - 1).bit_length())

    def _rebuild(self, slots: int, keep: np.ndarray | None = None) -> None:
        if keep is None:
            keep = self._keys != 0
        keys, times = self._keys[keep], self._times[keep]
        self._keys, self._times = np.zeros(slots, dtype=np.uint64), np.zeros(slots, dtype=np.int64)
        self._n = _insert(self._keys, self._times, keys, times, np.zeros(len(keys), dtype=bool))

    def _forget_oldest(self, keep_n: int) -> None:
        used = np.flatnonzero(self._keys != 0)
        newest = used[np.argpartition(self._times[used], len(used) - keep_n)[len(used) - keep_n:]]
        keep = np.zeros(len(self._keys), dtype=bool)
        keep[newest] = True
        self._rebuild(self._slots_for(keep_n), keep)


@numba.njit(cache=True, nogil=True)
def _delete_before(keys, times, before):  # pragma: no cover - compiled
    """Delete the entries that started before ``before``, in place; return how many.

    Linear probing's deletion by backward shift (Knuth's Algorithm R): the
    slot is emptied and later members of its run move back into it unless
    that would put them before their home slot, so every lookup still finds
    its key without tombstones. A slot is looked at again after a deletion
    (a member moved into it may be old too); members only move backwards
    within their run, so none is skipped.
    """
    size = len(keys)
    mask = np.uint64(size - 1)
    removed = 0
    j = 0
    while j < size:
        if keys[j] == 0 or times[j] >= before:
            j += 1
            continue
        i, k = j, j
        while True:
            k = (k + 1) & (size - 1)
            h = keys[k]
            if h == 0:
                break
            home = np.int64(h & mask)
            # the member at k stays if its home is cyclically in (i, k]
            stays = (i < home <= k) if i <= k else (home > i or home <= k)
            if not stays:
                keys[i] = h
                times[i] = times[k]
                i = k
        keys[i] = 0
        times[i] = 0
        removed += 1
    return removed


@numba.njit(cache=True, nogil=True)
def _insert(keys, times, hashes, start, new):  # pragma: no cover - compiled
    """Insert each hash not yet in the table (linear probing); mark it in ``new``; return how many.

    Hash 0 marks an empty slot, so a record hashing to 0 is stored as 1
    (one in 2**64: a negligible chance of taking one record for another).
    """
    mask = np.uint64(len(keys) - 1)
    added = 0
    for i in range(len(hashes)):
        h = hashes[i]
        if h == 0:
            h = np.uint64(1)
        j = h & mask
        while True:
            cur = keys[j]
            if cur == 0:
                keys[j] = h
                times[j] = start[i]
                new[i] = True
                added += 1
                break
            if cur == h:
                break
            j = (j + np.uint64(1)) & mask
    return added


@numba.njit(cache=True, nogil=True)
def span_into(keys: np.ndarray, first: np.ndarray, last: np.ndarray, key: np.ndarray, start: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Raise ``last`` and lower ``first`` to each row's ``start`` where its ``key`` is among ``keys``; return the rows
    whose key is not.

    ``keys`` is sorted and unique, ``first`` and ``last`` its earliest and
    latest start per key (updated in place). A binary search per row:
    O(rows log keys), no sort of the rows, which a batch of records mostly
    of known pairs does not need.
    """
    unseen = np.zeros(len(key), dtype=np.bool_)
    for i in range(len(key)):
        j = np.searchsorted(keys, key[i])
        if j < len(keys) and keys[j] == key[i]:
            if start[i] > last[j]:
                last[j] = start[i]
            if start[i] < first[j]:
                first[j] = start[i]
        else:
            unseen[i] = True
    return unseen


@numba.njit(cache=True, nogil=True)
def server_silences(server_of: np.ndarray, a: np.ndarray, b: np.ndarray, start: np.ndarray, last: np.ndarray, gap_from: np.ndarray,
                    gap_to: np.ndarray, min_gap: np.int64) -> None:  # pragma: no cover - compiled
    """Each server's latest flow start (``last``) and its latest silence of ``min_gap`` or more (``gap_from`` to
    ``gap_to``), raised in place with flows ``a, b`` (NIC indices) sorted by ``start``: one pass, per flow.

    ``last`` is -1 for a server not seen yet (no silence before its first flow).
    """
    for i in range(len(start)):
        t = start[i]
        for nic in (a[i], b[i]):
            s = server_of[nic]
            if last[s] >= 0 and t - last[s] >= min_gap:
                gap_from[s], gap_to[s] = last[s], t
            if t > last[s]:
                last[s] = t


@numba.njit(cache=True, nogil=True)
def _merge_sorted(a, b, start, duration, size, na, nb, nstart, nduration, nsize, order):  # pragma: no cover - compiled
    """The columns of sorted rows and of new rows (``order``: the new rows by start, stably) merged by start.

    On equal starts the sorted rows come first, as in a stable sort of the
    sorted rows followed by the new ones.
    """
    h, m = len(start), len(order)
    oa, ob = np.empty(h + m, a.dtype), np.empty(h + m, b.dtype)
    os_, od, oz = np.empty(h + m, start.dtype), np.empty(h + m, duration.dtype), np.empty(h + m, size.dtype)
    i = j = 0
    for k in range(h + m):
        if j == m or (i < h and start[i] <= nstart[order[j]]):
            oa[k], ob[k], os_[k], od[k], oz[k] = a[i], b[i], start[i], duration[i], size[i]
            i += 1
        else:
            r = order[j]
            oa[k], ob[k], os_[k], od[k], oz[k] = na[r], nb[r], nstart[r], nduration[r], nsize[r]
            j += 1
    return oa, ob, os_, od, oz


class FlowWindow:
    """The GPU flows of the last window, as compact columns.

    Columns: ``a, b`` (NIC indices, int32), ``start, duration, size``
    (int64): 32 bytes a flow. ``max_flows`` bounds memory whatever the
    rate: past it, the oldest flows are shed, and :attr:`shed` counts them.
    """

    COLUMNS = ("a", "b", "start", "duration", "size")

    def __init__(self, max_flows: int = 20_000_000):
        self.max_flows = int(max_flows)
        self._parts: list[tuple] = []
        self._sorted_head = False  # the first part is sorted by start (columns()' result, or a slice of it)
        self._n = 0
        self.shed = 0

    def __len__(self) -> int:
        return self._n

    def add(self, a: np.ndarray, b: np.ndarray, start: np.ndarray, duration: np.ndarray, size: np.ndarray) -> None:
        if len(a) == 0:
            return
        self._parts.append((np.asarray(a, np.int32), np.asarray(b, np.int32), np.asarray(start, np.int64),
                            np.asarray(duration, np.int64), np.asarray(size, np.int64)))
        self._n += len(a)
        if self._n > self.max_flows:
            # shed to 90% so a sustained flood sheds once per 10%, not per batch
            self._shed(self._n - int(self.max_flows * 0.9))

    def columns(self) -> tuple[np.ndarray, ...]:
        """The window's columns, sorted by start time (joined once, cached).

        What a stable sort of all the parts, in the order they came, gives.
        The first part is mostly the last call's result, already sorted: only
        the parts added since are sorted, then merged into it in one compiled
        pass that writes every column (a sort of the whole window and a
        gather per column cost the daemon a third of each window's analysis).
        """
        if not self._parts:
            return tuple(np.empty(0, dtype=np.int64) for _ in self.COLUMNS)
        if self._sorted_head and len(self._parts) > 1:
            new = [np.concatenate([p[i] for p in self._parts[1:]]) for i in range(len(self.COLUMNS))]
            a, b, start, duration, size = self._parts[0]
            na, nb, nstart, nduration, nsize = new
            self._parts = [_merge_sorted(a, b, start, duration, size, na, nb, nstart, nduration, nsize, np.argsort(nstart, kind="stable"))]
        elif not self._sorted_head:  # (a single batch added is no more sorted than several)
            cols = [np.concatenate([p[i] for p in self._parts]) for i in range(len(self.COLUMNS))]
            o = np.argsort(cols[2], kind="stable")
            self._parts = [tuple(c[o] for c in cols)]
        self._sorted_head = True
        return self._parts[0]

    def evict(self, before_ns: int) -> int:
        """Drop flows that started before ``before_ns``; return how many."""
        cols = self.columns()
        cut = int(np.searchsorted(cols[2], before_ns, side="left"))
        if cut:
            self._parts = [tuple(c[cut:] for c in cols)]
            self._n -= cut
        return cut

    def keep(self, mask: np.ndarray) -> int:
        """Keep only the flows where ``mask`` holds (one per flow, in :meth:`columns`' order); return how many went.

        For a job's flows forgotten mid-window (its id moved to another
        replica): what stays is still sorted.
        """
        cols = self.columns()
        mask = np.asarray(mask, dtype=bool)
        if len(mask) != len(cols[0]):
            raise ValueError(f"keep: a mask of {len(mask)} for {len(cols[0])} flows")
        gone = len(mask) - int(mask.sum())
        if gone:
            self._parts = [tuple(c[mask] for c in cols)]
            self._n -= gone
        return gone

    def _shed(self, n: int) -> None:
        cols = self.columns()
        self._parts = [tuple(c[n:] for c in cols)]
        self._n -= n
        self.shed += n


@register_warm_up
def warm_up() -> None:
    """Load the hash table's rebuild, which the daemon's start-up fixture does not reach (see :mod:`prism.common.kernels`).

    A window's table of record hashes grows (a rebuild) past ``MAX_LOAD`` of its slots: more records than the
    fixture brings. The start times are read-only, as decoded columns are (the type the rebuild is called with).
    """
    n = int(RecordDeduper.MAX_LOAD * RecordDeduper.MIN_SLOTS) + 1
    start = np.zeros(n, dtype=np.int64)
    start.flags.writeable = False
    RecordDeduper().filter(np.arange(1, n + 1, dtype=np.uint64), start)
