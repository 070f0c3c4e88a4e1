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

import numpy as np
import pandas as pd

__all__ = ["RecordDeduper", "FlowWindow", "record_hashes"]

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
    cat = col.array if isinstance(col, pd.Series) and isinstance(col.dtype, pd.CategoricalDtype) else pd.Categorical(col)
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

    A sorted base array plus a few small unsorted recent batches (merged in
    when they grow past an eighth of the base), so a lookup is a binary
    search and an insert is amortised O(batch log window). Past
    ``max_records`` (16 bytes each) the oldest are forgotten: a flood
    cannot grow it without bound.

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

    def __init__(self, max_records: int = 1 << 62):
        self.max_records = int(max_records)
        self._base = np.empty(0, dtype=np.uint64)
        self._base_t = np.empty(0, dtype=np.int64)
        self._recent: list[tuple[np.ndarray, np.ndarray]] = []
        self._recent_n = 0

    def __len__(self) -> int:
        return len(self._base) + self._recent_n

    def filter(self, hashes: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Mask of the records not seen before (first of each in the batch)."""
        new = np.zeros(len(hashes), dtype=bool)
        if len(hashes) == 0:
            return new
        _, first = np.unique(hashes, return_index=True)
        new[first] = True
        if len(self._base):
            i = np.searchsorted(self._base, hashes).clip(0, len(self._base) - 1)
            new &= self._base[i] != hashes
        if self._recent_n:
            new &= ~np.isin(hashes, np.concatenate([r[0] for r in self._recent]))
        if new.any():
            self._recent.append((hashes[new], np.asarray(start)[new]))
            self._recent_n += int(new.sum())
            if self._recent_n > max(4096, len(self._base) // 8):
                self._compact()
        return new

    def _compact(self) -> None:
        h = np.concatenate([self._base] + [r[0] for r in self._recent])
        t = np.concatenate([self._base_t] + [r[1] for r in self._recent])
        if len(h) > self.max_records:
            keep = np.argpartition(t, len(t) - int(self.max_records * 0.9))[len(t) - int(self.max_records * 0.9):]
            h, t = h[keep], t[keep]
        o = np.argsort(h, kind="stable")
        self._base, self._base_t = h[o], t[o]
        self._recent, self._recent_n = [], 0

    def evict(self, before_ns: int) -> None:
        """Forget records that started before ``before_ns``."""
        self._compact()
        keep = self._base_t >= before_ns
        if not keep.all():
            self._base, self._base_t = self._base[keep], self._base_t[keep]


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
        self._n = 0
        self.shed = 0

    def __len__(self) -> int:
        return self._n

    def add(self, a, b, start, duration, size) -> None:
        if len(a) == 0:
            return
        self._parts.append((np.asarray(a, np.int32), np.asarray(b, np.int32), np.asarray(start, np.int64),
                            np.asarray(duration, np.int64), np.asarray(size, np.int64)))
        self._n += len(a)
        if self._n > self.max_flows:
            # shed to 90% so a sustained flood sheds once per 10%, not per batch
            self._shed(self._n - int(self.max_flows * 0.9))

    def columns(self) -> tuple[np.ndarray, ...]:
        """The window's columns, sorted by start time (joined once, cached)."""
        if len(self._parts) != 1:
            if not self._parts:
                return tuple(np.empty(0, dtype=np.int64) for _ in self.COLUMNS)
            cols = [np.concatenate([p[i] for p in self._parts]) for i in range(len(self.COLUMNS))]
            o = np.argsort(cols[2], kind="stable")
            self._parts = [tuple(c[o] for c in cols)]
        return self._parts[0]

    def evict(self, before_ns: int) -> int:
        """Drop flows that started before ``before_ns``; return how many."""
        cols = self.columns()
        cut = int(np.searchsorted(cols[2], before_ns, side="left"))
        if cut:
            self._parts = [tuple(c[cut:] for c in cols)]
            self._n -= cut
        return cut

    def _shed(self, n: int) -> None:
        cols = self.columns()
        self._parts = [tuple(c[n:] for c in cols)]
        self._n -= n
        self.shed += n
