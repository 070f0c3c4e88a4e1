"""Switch-level diagnosis: switches and links with low effective bandwidth.

Effective bandwidth is bytes over busy time (the sum of the durations of
the flows through it), per time window, for GPU-to-GPU traffic (storage
flows have another size mix and would skew their leaf). A switch is
compared with the switches of its own tier in the same window: its tier is
read off the paths, the ends of a path being leaves and the middle spines.

Flows cross several switches, so one degraded spine also slows the flows of
every leaf it serves. Diagnosis therefore explains away: it flags one slow
switch of a window, drops the paths through it, recomputes, and stops when
nothing is significantly slow. Which one first: the one whose own traffic
(the paths avoiding the other slow candidates) is still slow; a leaf whose
every flow crosses a degraded spine has no such traffic, and is explained by
the spine however the ratios fall. Links (consecutive switches of a path,
directed) are then judged the same way over the paths left.

Accumulation is per (window, path): the number of distinct paths is small
(up to the number of leaf pairs times the spines), so memory does not grow
with the flows, and the daemon can keep it running.
"""
from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt
import pandas as pd
from pandas.api.extensions import ExtensionArray

from prism.analysis.diagnosis.anomalies import ANOMALY_COLUMNS, empty_anomalies
from prism.common.kernels import register_warm_up

__all__ = ["SwitchBandwidth", "SwitchDiagnoser", "DEFAULT_WINDOW_S", "SWITCH_COLUMNS", "warm_up"]

#: ``switches.csv``: one row per window and switch or link.
SWITCH_COLUMNS = ["window_start_ns", "kind", "name", "tier", "flows", "bytes", "busy_ns", "gbps", "tier_median_gbps", "ratio", "senders", "slow_senders"]

#: Accumulation key: per window, path and sending NIC (few: a NIC sends over few paths).
KEY = ["window", "path", "src"]

#: pandas' dtype for a column of text (``str`` from pandas 3, object before)
_TEXT = pd.Series(["text"]).dtype

#: LLMPrism averaged over an hour; five minutes finds a degraded switch
#: sooner and still averages thousands of flows per switch.
DEFAULT_WINDOW_S = 300.0


class SwitchBandwidth:
    """Streaming per-(window, path) byte and busy-time sums.

    Parameters
    ----------
    window_s : float
        Window length; windows are aligned to the epoch, so they line up
        across files and runs.
    min_bytes : int, default 262144
        Flows smaller than this are left out: a message of a few bytes (the
        grad-norm all-reduce) or kilobytes lasts its latency, not its bytes
        over the bandwidth, and would make a link that carries mostly such
        messages look slow. The count left out is kept in ``skipped_``.
    """

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, min_bytes: int = 256 << 10):
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_ns = int(window_s * 1e9)
        self.min_bytes = int(min_bytes)
        self.skipped_ = 0
        self.path_ids: dict[str, int] = {}
        self.paths: list[tuple[int, ...]] = []  # switch ids per path
        self.switch_ids: dict[str, int] = {}
        self.switch_names: list[str] = []
        self._sums = _KeySums()
        self._table: pd.DataFrame | None = None
        self._known = pd.Index([], dtype=object)  # path texts in id order

    def _path_id(self, text: str) -> int:
        pid = self.path_ids.get(text)
        if pid is None:
            ids = []
            for name in (s.strip() for s in str(text).split("|")):
                if not name:
                    continue
                if name not in self.switch_ids:
                    self.switch_ids[name] = len(self.switch_names)
                    self.switch_names.append(name)
                ids.append(self.switch_ids[name])
            pid = self.path_ids[text] = len(self.paths)
            self.paths.append(tuple(ids))
        return pid

    def partial_fit(self, start: np.ndarray, duration: npt.ArrayLike, size: npt.ArrayLike, switches: pd.Series | ExtensionArray | np.ndarray,
                    src: npt.ArrayLike | None = None) -> "SwitchBandwidth":
        """Add a chunk of flows; ``switches`` is a categorical of path strings, ``src`` the sending NIC (index)."""
        if len(start) == 0:
            return self
        cat = pd.Categorical(switches)
        # the path strings of this chunk (few) -> global path ids: one hashed
        # lookup, and Python work only for paths not seen before
        lut = self._known.get_indexer(cat.categories).astype(np.int64)
        if (lut < 0).any():
            for i in np.flatnonzero(lut < 0).tolist():
                lut[i] = self._path_id(cat.categories[i])
            self._known = pd.Index(list(self.path_ids), dtype=object)
        size = np.asarray(size, dtype=np.int64)
        sender = np.full(len(size), -1, dtype=np.int64) if src is None else np.asarray(src)
        # one compiled pass: the size floor, the path lookup and the window
        # number per flow, without a masked copy of each column
        self.skipped_ += self._sums.add_flows(np.asarray(start, dtype=np.int64), self.window_ns, cat.codes, lut, sender, size,
                                              np.asarray(duration, dtype=np.int64), self.min_bytes)
        self._table = None
        return self

    def forget_before(self, start_ns: int) -> None:
        """Drop the windows that ended before ``start_ns`` (the daemon's eviction)."""
        t = self.table()
        keep = (t["window"] + 1) * self.window_ns > start_ns
        if not keep.all():
            self._table = t[keep].reset_index(drop=True)
            self._sums = _KeySums()
            win, pid, sender, nbytes, busy = (self._table[c].to_numpy() for c in KEY + ["bytes", "busy_ns"])
            self._sums.add(win, pid, sender, nbytes, busy, flows=self._table["flows"].to_numpy())

    def table(self) -> pd.DataFrame:
        """``window, path, src, bytes, busy_ns, flows`` (``src`` -1 where senders were not given)."""
        if self._table is None:
            self._table = self._sums.table()
        return self._table


@register_warm_up
def warm_up() -> None:
    """Load the switch sums' rehash, which only a fabric with more (window, path, sender) keys than a small one reaches.

    Three rows into a table of two slots: the table grows once, as it does
    when a window brings more keys than it has room for.
    """
    one = np.zeros(3, dtype=np.int64)
    _KeySums(capacity=2).add(np.arange(3), one, one, one, one)


class _KeySums:
    """Bytes, busy time and flows per (window, path, sender), summed exactly (int64) in a compiled hash table.

    A chunk costs one compiled pass over its flows; the table grows with
    the distinct keys (a NIC sends over few paths), never with the flows.
    The per-chunk pandas groupby it replaced cost the replay of 13.6M
    flows 0.4 s.
    """

    def __init__(self, capacity: int = 1 << 12):
        self.keys = np.zeros((capacity, 3), dtype=np.int64)
        self.sums = np.zeros((capacity, 3), dtype=np.int64)  # bytes, busy_ns, flows
        self.slot_of = np.full(capacity, -1, dtype=np.int64)  # hash slot -> row
        self.n = 0

    def add(self, win: npt.ArrayLike, pid: npt.ArrayLike, sender: npt.ArrayLike, nbytes: npt.ArrayLike, busy: npt.ArrayLike,
            flows: npt.ArrayLike | None = None) -> None:
        """Add rows (``flows``: how many flows each stands for; one by default)."""
        win, pid, sender = (np.asarray(x, dtype=np.int64) for x in (win, pid, sender))
        nbytes, busy = np.asarray(nbytes, dtype=np.int64), np.asarray(busy, dtype=np.int64)
        flows = np.ones(len(win), dtype=np.int64) if flows is None else np.asarray(flows, dtype=np.int64)
        done, self.n = _accumulate(self.keys, self.sums, self.slot_of, self.n, win, pid, sender, nbytes, busy, flows, 0)
        while done < len(win):  # half the slots taken: twice the room, then on from the row it stopped at
            self._grow()
            done, self.n = _accumulate(self.keys, self.sums, self.slot_of, self.n, win, pid, sender, nbytes, busy, flows, done)

    def add_flows(self, start: np.ndarray, window_ns: int, codes: np.ndarray, lut: np.ndarray, sender: np.ndarray, size: np.ndarray,
                  duration: np.ndarray, min_bytes: int) -> int:
        """Add flows: window ``start // window_ns``, path ``lut[codes]`` (a code < 0: no path), ``sender``.

        Flows under ``min_bytes`` or with no path are left out; returns how
        many were under ``min_bytes``.
        """
        done, self.n, small = _accumulate_flows(self.keys, self.sums, self.slot_of, self.n, start, window_ns, codes, lut, sender, size, duration, min_bytes, 0)
        while done < len(start):
            self._grow()
            done, self.n, more = _accumulate_flows(self.keys, self.sums, self.slot_of, self.n, start, window_ns, codes, lut, sender, size, duration, min_bytes, done)
            small += more
        return small

    def _grow(self) -> None:
        cap = 2 * len(self.slot_of)
        keys, sums = np.zeros((cap, 3), dtype=np.int64), np.zeros((cap, 3), dtype=np.int64)
        keys[: self.n], sums[: self.n] = self.keys[: self.n], self.sums[: self.n]
        self.keys, self.sums = keys, sums
        self.slot_of = _rehash(self.keys, self.n, cap)

    def table(self) -> pd.DataFrame:
        """``window, path, src, bytes, busy_ns, flows`` by (window, path, src): what a groupby of every row sums to."""
        k, v = self.keys[: self.n], self.sums[: self.n]
        o = np.lexsort((k[:, 2], k[:, 1], k[:, 0]))
        return pd.DataFrame({"window": k[o, 0], "path": k[o, 1], "src": k[o, 2], "bytes": v[o, 0], "busy_ns": v[o, 1], "flows": v[o, 2]})


@numba.njit(cache=True, inline="always")
def _slot(w, p, s, mask):  # pragma: no cover - compiled
    h = np.uint64(w) * np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(p) * np.uint64(0xC2B2AE3D27D4EB4F) ^ np.uint64(s + 1) * np.uint64(0x165667B19E3779F9)
    h ^= h >> np.uint64(31)
    return np.int64(h & np.uint64(mask))


@numba.njit(cache=True, inline="always")
def _row(keys, slot_of, n, w, p, s):  # pragma: no cover - compiled
    """(the key's row, or -1 if it is new and half the slots are taken; the keys now), the key added if new."""
    mask = len(slot_of) - 1
    j = _slot(w, p, s, mask)
    while True:
        r = slot_of[j]
        if r < 0:
            if 2 * (n + 1) > len(slot_of):
                return -1, n
            slot_of[j] = n
            keys[n, 0], keys[n, 1], keys[n, 2] = w, p, s
            return n, n + 1
        if keys[r, 0] == w and keys[r, 1] == p and keys[r, 2] == s:
            return r, n
        j = (j + 1) & mask


@numba.njit(cache=True)
def _accumulate(keys, sums, slot_of, n, win, pid, sender, nbytes, busy, flows, start):  # pragma: no cover - compiled
    """Add rows ``start..``; (the row it stopped at: all of them, or the first new key past half the slots; the keys now)."""
    for i in range(start, len(win)):
        r, n = _row(keys, slot_of, n, win[i], pid[i], sender[i])
        if r < 0:
            return i, n
        sums[r, 0] += nbytes[i]
        sums[r, 1] += busy[i]
        sums[r, 2] += flows[i]
    return len(win), n


@numba.njit(cache=True)
def _accumulate_flows(keys, sums, slot_of, n, start, window_ns, codes, lut, sender, size, duration, min_bytes, at):  # pragma: no cover - compiled
    """As :func:`_accumulate`, for flows from ``at`` on (see :meth:`_KeySums.add_flows`); also the flows under ``min_bytes``."""
    small = 0
    for i in range(at, len(start)):
        if size[i] < min_bytes:
            small += 1
            continue
        if codes[i] < 0:
            continue
        r, n = _row(keys, slot_of, n, start[i] // window_ns, lut[codes[i]], np.int64(sender[i]))
        if r < 0:
            return i, n, small
        sums[r, 0] += size[i]
        sums[r, 1] += duration[i]
        sums[r, 2] += 1
    return len(start), n, small


@numba.njit(cache=True)
def _rehash(keys, n, cap):  # pragma: no cover - compiled
    slot_of = np.full(cap, -1, np.int64)
    mask = cap - 1
    for r in range(n):
        j = _slot(keys[r, 0], keys[r, 1], keys[r, 2], mask)
        while slot_of[j] >= 0:
            j = (j + 1) & mask
        slot_of[j] = r
    return slot_of


def _tiers(paths: list[tuple[int, ...]], n_switches: int) -> np.ndarray:
    """'leaf' for switches seen at a path's end, 'spine' for middle-only ones."""
    end = np.zeros(n_switches, dtype=bool)
    for p in paths:
        if p:
            end[p[0]] = end[p[-1]] = True
    return np.where(end, "leaf", "spine")


def _int_sums(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 sums of ``values`` per code: bincount when no partial sum can pass 2**53 (float64 is exact below it)."""
    values = np.asarray(values, dtype=np.int64)
    if len(values) == 0 or (values.min() >= 0 and int(values.sum(dtype=np.uint64)) < 2**53):
        return np.bincount(codes, weights=values, minlength=n).astype(np.int64)
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, codes, values)
    return out


class _Units:
    """Switches or links, sorted by name, with the paths that cross each.

    The (path, unit) incidence is kept both ways as CSR arrays: path ->
    units to spread a path's sums over the units it crosses, unit -> paths
    to explain a flagged unit's paths away.
    """

    def __init__(self, incidence: list[tuple[int, str, str]], n_paths: int):
        names = sorted({name for _, name, _ in incidence})
        self.index = {name: i for i, name in enumerate(names)}
        tier = {name: t for _, name, t in incidence}
        self.names = np.array(names, dtype=object)
        self.tiers = np.array([tier[x] for x in names], dtype=object)
        p = np.array([pi for pi, _, _ in incidence], dtype=np.int64)
        v = np.array([self.index[name] for _, name, _ in incidence], dtype=np.int64)
        by_path = np.argsort(p, kind="stable")
        self._path_ptr = np.searchsorted(p[by_path], np.arange(n_paths + 1))
        self._path_units = v[by_path]
        by_unit = np.argsort(v, kind="stable")
        self._unit_ptr = np.searchsorted(v[by_unit], np.arange(len(names) + 1))
        self._unit_paths = p[by_unit]

    @classmethod
    def switches(cls, paths: list[tuple[int, ...]], names: np.ndarray, tiers: np.ndarray) -> "_Units":
        return cls([(p, names[s], tiers[s]) for p, sw in enumerate(paths) for s in sw], len(paths))

    @classmethod
    def links(cls, paths: list[tuple[int, ...]], names: np.ndarray, tiers: np.ndarray) -> "_Units":
        return cls([(p, f"{names[x]}>{names[y]}", f"{tiers[x]}>{tiers[y]}") for p, sw in enumerate(paths) for x, y in zip(sw[:-1], sw[1:])],
                   len(paths))

    def expand(self, path: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, unit) for every row and every unit its path crosses."""
        lo, hi = self._path_ptr[path], self._path_ptr[path + 1]
        count = hi - lo
        row = np.repeat(np.arange(len(path)), count)
        # offsets inside each row's run of units
        within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        return row, self._path_units[np.repeat(lo, count) + within]

    def paths_through(self, unit: int) -> np.ndarray:
        return self._unit_paths[self._unit_ptr[unit]:self._unit_ptr[unit + 1]]


class SwitchDiagnoser:
    """Flag switches and links whose effective bandwidth is low against their tier.

    Parameters
    ----------
    max_ratio : float, default 0.7
        Flag below this share of the tier's median bandwidth ...
    z : float, default 5.0
        ... and this many robust spreads (1.4826 MAD) below it.
    min_rel_spread : float, default 0.02
        Floor of the spread, as a share of the median.
    min_peers : int, default 3
        Switches (links) a tier needs in a window to be compared.
    min_flows : int, default 200
        Flows a switch (link) needs in a window to be judged ...
    min_flow_share : float, default 0.25
        ... and this share of its tier's median flow count: a switch seen
        with far fewer flows than its peers (a window the daemon has only
        partly received, a leaf that carries one job's stragglers) is an
        under-sampled, biased estimate, not a slow switch.
    min_sender_flows : int, default 10
        Flows a sending NIC needs through a switch to vote.
    min_vote : float, default 0.5
        Endpoint vs network (the 007/NetBouncer idea): a switch is slow only
        if it is slow for at least this share of the senders that vote (each
        sender's own bytes over busy time through it, against the tier
        median): a slow sender makes its own flows slow on every path, a
        slow switch every sender's flows through it. With fewer than two
        voters the switch is judged on its total, as before. Needs the
        senders (``SwitchBandwidth.partial_fit(src=...)``).
    """

    def __init__(self, max_ratio: float = 0.7, z: float = 5.0, min_rel_spread: float = 0.02, min_peers: int = 3, min_flows: int = 200,
                 min_flow_share: float = 0.25, min_sender_flows: int = 10, min_vote: float = 0.5):
        self.min_flow_share = float(min_flow_share)
        self.min_sender_flows = int(min_sender_flows)
        self.min_vote = float(min_vote)
        self.max_ratio = float(max_ratio)
        self.z = float(z)
        self.min_rel_spread = float(min_rel_spread)
        self.min_peers = int(min_peers)
        self.min_flows = int(min_flows)

    def fit(self, bw: SwitchBandwidth) -> "SwitchDiagnoser":
        t = bw.table()
        names = np.array(bw.switch_names, dtype=object)
        tiers = _tiers(bw.paths, len(names))
        units = {"switch": _Units.switches(bw.paths, names, tiers), "link": _Units.links(bw.paths, names, tiers)}
        rows, tables = [], []
        path, src = t["path"].to_numpy(np.int64), t["src"].to_numpy(np.int64)
        sums = t[["flows", "bytes", "busy_ns"]].to_numpy(np.int64)
        window = t["window"].to_numpy(np.int64)
        for w in np.unique(window):
            in_w = np.flatnonzero(window == w)
            excluded = np.zeros(len(bw.paths), dtype=bool)
            flagged_sw: set[str] = set()
            for kind, u in units.items():
                first = True
                while True:
                    live = in_w[~excluded[path[in_w]]]
                    stats = self._stats(path[live], src[live], sums[live], u)
                    if first:
                        tables.append(stats.assign(window_start_ns=int(w) * bw.window_ns, kind=kind))
                        first = False
                    bad = stats[stats["slow"]]
                    if kind == "link" and len(bad):  # a link of a flagged switch is explained by it
                        ends = bad["name"].str.split(">")
                        bad = bad[[not (set(e) & flagged_sw) for e in ends]]
                    if bad.empty:
                        break
                    first_bad = self._first_to_flag(bad, in_w, excluded, path, src, sums, u)
                    rows.append(self._row(kind, first_bad, int(w) * bw.window_ns, bw.window_ns))
                    if kind == "switch":
                        flagged_sw.add(first_bad["name"])
                    excluded[u.paths_through(u.index[first_bad["name"]])] = True
        self.anomalies_ = pd.DataFrame(rows, columns=ANOMALY_COLUMNS) if rows else empty_anomalies()
        cols = SWITCH_COLUMNS
        self.bandwidth_ = pd.concat(tables, ignore_index=True)[cols] if tables else pd.DataFrame(columns=cols)
        return self

    #: slow units compared on their exclusive traffic in one round (see ``_first_to_flag``)
    MAX_CANDIDATES = 16

    def _first_to_flag(self, bad: pd.DataFrame, in_w, excluded, path, src, sums, u: "_Units") -> pd.Series:
        """Which of several slow units to flag first: the one its own traffic convicts.

        A unit whose every flow also crosses another slow unit (a leaf whose
        flows all take a degraded spine) looks as slow as that unit, so the
        lower ratio is no guide. Each candidate is judged again on its
        exclusive traffic, the paths that avoid the other candidates: slow
        there (convicted) ranks first, too few flows there to judge (no
        evidence either way) next, healthy there (acquitted) last; the lowest
        ratio breaks ties. One more pass of the statistics per candidate, for
        the ``MAX_CANDIDATES`` lowest ratios at most (the rest wait for a later
        round), so a window with many slow units stays linear in them.
        """
        if len(bad) == 1:
            return bad.iloc[0]
        bad = bad.nsmallest(self.MAX_CANDIDATES, "ratio")
        paths_of = {name: u.paths_through(u.index[name]) for name in bad["name"]}
        evidence = []
        for name in bad["name"]:
            alone = excluded.copy()
            for other, paths in paths_of.items():
                if other != name:
                    alone[paths] = True
            live = in_w[~alone[path[in_w]]]
            own = self._stats(path[live], src[live], sums[live], u)
            own = own[own["name"] == name]
            if own.empty or not bool(own["judged"].iloc[0]):
                evidence.append(1)
            else:
                evidence.append(2 if bool(own["slow"].iloc[0]) else 0)
        return bad.assign(evidence=evidence).sort_values(["evidence", "ratio"], ascending=[False, True], kind="stable").iloc[0]

    def _stats(self, path: np.ndarray, src: np.ndarray, sums: np.ndarray, u: "_Units") -> pd.DataFrame:
        """One row per unit (switch or link) some of these (path, sender) rows cross, in name order.

        ``sums`` holds the rows' flows, bytes and busy ns. O(rows x path
        length) numpy work; Python only per tier (two or three).
        """
        # every row once per unit its path crosses (the path -> units incidence)
        row, unit = u.expand(path)
        present, unit = np.unique(unit, return_inverse=True)  # units in name order
        n = len(present)
        flows, nbytes, busy = (_int_sums(unit, sums[row, k], n) for k in range(3))
        tier = u.tiers[present]
        with np.errstate(divide="ignore", invalid="ignore"):
            gbps = np.where(busy > 0, nbytes / np.where(busy > 0, busy, 1), np.nan)  # bytes per ns = GB/s
        s = pd.DataFrame({"name": pd.Series(u.names[present].tolist(), dtype=_TEXT), "tier": pd.Series(tier.tolist(), dtype=_TEXT), "flows": flows, "bytes": nbytes, "busy_ns": busy, "gbps": gbps})
        tier_names, tier_of = np.unique(tier, return_inverse=True)
        tier_flows = np.array([np.median(flows[tier_of == k]) for k in range(len(tier_names))])[tier_of]
        judged = (flows >= self.min_flows) & (flows >= self.min_flow_share * tier_flows)
        if not judged.any():  # too little traffic to compare anything
            return s.assign(tier_median_gbps=np.nan, ratio=np.nan, senders=0, slow_senders=0, slow=False, judged=False)
        med, mad, peers = (np.full(len(tier_names), np.nan) for _ in range(3))
        for k in range(len(tier_names)):
            g = gbps[judged & (tier_of == k)]
            peers[k] = len(g)
            g = g[~np.isnan(g)]
            if len(g):
                med[k] = np.median(g)
                mad[k] = np.median(np.abs(g - med[k]))
        tier_median = med[tier_of]
        spread = np.maximum(1.4826 * mad[tier_of], self.min_rel_spread * tier_median)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = gbps / tier_median
            z = (tier_median - gbps) / spread
        # each sender's own view of the unit, for the vote
        senders, slow_senders = self._votes(row, unit, src, sums, n, med[tier_of])
        voted = (senders < 2) | (slow_senders >= self.min_vote * senders)
        with np.errstate(invalid="ignore"):
            slow = judged & (np.nan_to_num(peers, nan=0)[tier_of] >= self.min_peers) & (ratio <= self.max_ratio) & (z >= self.z) & voted
        return s.assign(tier_median_gbps=tier_median, ratio=ratio, senders=senders, slow_senders=slow_senders, slow=slow, judged=judged)

    def _votes(self, row, unit, src, sums, n, unit_median):
        """Per unit: senders with enough flows through it, and those that found it slow."""
        sent = src[row] >= 0
        row, unit = row[sent], unit[sent]
        key = unit * (int(src.max()) + 1 if len(src) else 1) + src[row]
        keys, pair = np.unique(key, return_inverse=True)
        flows, nbytes, busy = (_int_sums(pair, sums[row, k], len(keys)) for k in range(3))
        enough = flows >= self.min_sender_flows
        owner = unit[np.unique(pair, return_index=True)[1]]  # the unit of each (unit, sender)
        with np.errstate(divide="ignore", invalid="ignore"):
            gbps = np.where(busy > 0, nbytes / np.where(busy > 0, busy, 1), np.nan)
            slow = gbps <= self.max_ratio * unit_median[owner]
        senders = np.bincount(owner[enough], minlength=n).astype(np.int64)
        slow_senders = np.bincount(owner[enough & slow], minlength=n).astype(np.int64)
        return senders, slow_senders

    @staticmethod
    def _row(kind, r, w0, wlen):
        return (
            f"slow_{kind}", "", -1, w0, r["name"], round(float(r["ratio"]), 4),
            f"{kind} {r['name']} ({r['tier']}): {r['gbps']:.1f} GB/s effective, {r['ratio']:.2f}x the {r['tier']} median "
            f"{r['tier_median_gbps']:.1f} GB/s, over {int(r['flows']):,} flows in the {wlen / 1e9:g} s window"
            + (f", slow for {int(r['slow_senders'])} of {int(r['senders'])} senders" if r["senders"] >= 2 else ""),
        )

    def predict(self) -> pd.DataFrame:
        """Anomaly rows (:data:`prism.analysis.diagnosis.ANOMALY_COLUMNS`)."""
        return self.anomalies_
