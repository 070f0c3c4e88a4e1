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

Flows of different kinds (the pair types: all-to-all, ring, pipeline) run
at different rates whatever the fabric: an all-to-all's flows share their
NIC with the group's other transfers, a ring's have it alone. ECMP gives
each switch its own mix of kinds, so pooled over every flow, healthy
switches differ by their mix, and a degraded one need not stand out (a
0.2x spine under MoE traffic was 0.41x the spine median but 3.6 spreads
below it). Given the pair types, each kind's flows are judged as a table
of their own, where healthy switches are alike, and a switch (link) is
slow if it is slow for one kind, with that kind's flows, peers and votes.

Before any switch is judged, the hosts are (host or link): a slow NIC or
host makes all its flows slow, as sender and as receiver, on every switch
and link it uses, while a slow switch or link makes every host's flows slow
there only. A host is ``slow_host`` when its flows are slow against the
other hosts' (ratio and robust z, as for a switch), on most of the switches
and links it uses (breadth), with the units that are slow for the other
hosts' flows too (the network's doing) left out of its evidence. Its flows
are then explained away: the switches and links are judged without them,
so the links a slow host's flows cross are not blamed for it.

Accumulation is per (window, path, NIC pair): the number of distinct keys
is small (a NIC talks to few peers over few paths), so memory does not
grow with the flows, and the daemon can keep it running.
"""
from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt
import pandas as pd
from pandas.api.extensions import ExtensionArray

from prism.analysis.diagnosis.anomalies import ANOMALY_COLUMNS, ANOMALY_KINDS, empty_anomalies
from prism.common.kernels import register_warm_up

__all__ = ["SwitchBandwidth", "SwitchDiagnoser", "DEFAULT_WINDOW_S", "SWITCH_COLUMNS", "HOST_KIND", "warm_up"]

#: the anomaly kind of a host (server) whose flows are slow on every switch and link it uses
HOST_KIND = "slow_host"
assert HOST_KIND in ANOMALY_KINDS

#: ``switches.csv``: one row per window and switch or link.
SWITCH_COLUMNS = ["window_start_ns", "kind", "name", "tier", "flows", "bytes", "busy_ns", "gbps", "tier_median_gbps", "ratio", "senders", "slow_senders"]

#: Accumulation key: per window, path and NIC pair (few: a NIC talks to few peers, over few paths).
#: The pair is one int64 in the hash table (:func:`_pair_code`).
KEY = ["window", "path", "src", "dst"]

#: pandas' dtype for a column of text (``str`` from pandas 3, object before)
_TEXT = pd.Series(["text"]).dtype

#: LLMPrism averaged over an hour; five minutes finds a degraded switch
#: sooner and still averages thousands of flows per switch.
DEFAULT_WINDOW_S = 300.0

#: what a slow unit is shown by (:meth:`SwitchDiagnoser._stats`): the figures of the kind of flow it is slowest in
_SHOWN = ("flows", "gbps", "tier_median_gbps", "ratio", "senders", "slow_senders")


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

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, min_bytes: int = 256 << 10, hosts: npt.ArrayLike | None = None):
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_ns = int(window_s * 1e9)
        #: host (server) name per NIC index, for the host-or-link test; None: each NIC is its own host
        self.hosts = None if hosts is None else np.asarray(hosts, dtype=object)
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
                    src: npt.ArrayLike | None = None, dst: npt.ArrayLike | None = None) -> "SwitchBandwidth":
        """Add a chunk of flows; ``switches`` is a categorical of path strings, ``src`` and ``dst`` the NICs (indices)."""
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
        sender = _pair_code(src, dst, len(size))
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
            win, pid, src, dst, nbytes, busy = (self._table[c].to_numpy() for c in KEY + ["bytes", "busy_ns"])
            self._sums.add(win, pid, _pair_code(src, dst, len(win)), nbytes, busy, flows=self._table["flows"].to_numpy())

    def take_before(self, end_ns: int | None) -> pd.DataFrame:
        """Remove and return the sums of the windows that end by ``end_ns`` (all, for None), with the paths as text:
        ``window_start_ns, path, src, dst, bytes, busy_ns, flows`` (for :meth:`add_rows` of another instance).

        The daemon sums flows into short windows as they come and moves each
        into the diagnosis's windows once the analysis has passed its end, so
        the diagnosis sees the flows up to a window boundary whatever was read
        ahead of the analysis (and a replica can forward them to another).
        """
        t = self.table()
        done = np.ones(len(t), dtype=bool) if end_ns is None else ((t["window"].to_numpy() + 1) * self.window_ns <= end_ns)
        texts = np.array(list(self.path_ids), dtype=object)
        out = pd.DataFrame({"window_start_ns": t["window"].to_numpy()[done] * self.window_ns,
                            "path": pd.Series(texts[t["path"].to_numpy()[done]], dtype=_TEXT),
                            **{c: t[c].to_numpy()[done] for c in ("src", "dst", "bytes", "busy_ns", "flows")}})
        if done.any():
            self._table = t[~done].reset_index(drop=True)
            self._sums = _KeySums()
            win, pid, src, dst, nbytes, busy = (self._table[c].to_numpy() for c in KEY + ["bytes", "busy_ns"])
            self._sums.add(win, pid, _pair_code(src, dst, len(win)), nbytes, busy, flows=self._table["flows"].to_numpy())
        return out

    def add_rows(self, rows: pd.DataFrame) -> "SwitchBandwidth":
        """Add sums taken by :meth:`take_before` (of this instance or another, of windows as long or shorter and
        aligned within these), each into the window that holds its start."""
        if not len(rows):
            return self
        texts = pd.Categorical(rows["path"])
        lut = np.array([self._path_id(str(x)) for x in texts.categories], dtype=np.int64)
        self._known = pd.Index(list(self.path_ids), dtype=object)
        src, dst = rows["src"].to_numpy(np.int64), rows["dst"].to_numpy(np.int64)
        self._sums.add(rows["window_start_ns"].to_numpy(np.int64) // self.window_ns, lut[texts.codes], _pair_code(src, dst, len(rows)),
                       rows["bytes"].to_numpy(), rows["busy_ns"].to_numpy(), flows=rows["flows"].to_numpy())
        self._table = None
        return self

    def table(self) -> pd.DataFrame:
        """``window, path, src, dst, bytes, busy_ns, flows`` (``src``, ``dst`` -1 where the NICs were not given)."""
        if self._table is None:
            t = self._sums.table()
            src, dst = _pair_decode(t.pop("pair").to_numpy())
            t.insert(2, "src", src)
            t.insert(3, "dst", dst)
            self._table = t
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
        """``window, path, pair, bytes, busy_ns, flows`` by (window, path, pair): what a groupby of every row sums to."""
        k, v = self.keys[: self.n], self.sums[: self.n]
        o = np.lexsort((k[:, 2], k[:, 1], k[:, 0]))
        return pd.DataFrame({"window": k[o, 0], "path": k[o, 1], "pair": k[o, 2], "bytes": v[o, 0], "busy_ns": v[o, 1], "flows": v[o, 2]})


def _pair_code(src: npt.ArrayLike | None, dst: npt.ArrayLike | None, n: int) -> np.ndarray:
    """One int64 per flow for its (src, dst) NICs: ``(src + 1) << 32 | (dst + 1)``, -1 when neither is known.

    NIC indices are below 2**31 - 1; a missing side is -1 (code 0 in its half).
    """
    if src is None and dst is None:
        return np.full(n, -1, dtype=np.int64)
    s = np.full(n, -1, dtype=np.int64) if src is None else np.asarray(src, dtype=np.int64)
    d = np.full(n, -1, dtype=np.int64) if dst is None else np.asarray(dst, dtype=np.int64)
    code = ((s + 1) << 32) | (d + 1)
    return np.where((s < 0) & (d < 0), -1, code)


def _pair_decode(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of :func:`_pair_code`'s codes."""
    code = np.asarray(code, dtype=np.int64)
    known = code >= 0
    return np.where(known, (code >> 32) - 1, -1), np.where(known, (code & 0xFFFFFFFF) - 1, -1)


@numba.njit(cache=True, nogil=True, inline="always")
def _slot(w, p, s, mask):  # pragma: no cover - compiled
    h = np.uint64(w) * np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(p) * np.uint64(0xC2B2AE3D27D4EB4F) ^ np.uint64(s + 1) * np.uint64(0x165667B19E3779F9)
    h ^= h >> np.uint64(31)
    return np.int64(h & np.uint64(mask))


@numba.njit(cache=True, nogil=True, inline="always")
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


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
def _rehash(keys, n, cap):  # pragma: no cover - compiled
    slot_of = np.full(cap, -1, np.int64)
    mask = cap - 1
    for r in range(n):
        j = _slot(keys[r, 0], keys[r, 1], keys[r, 2], mask)
        while slot_of[j] >= 0:
            j = (j + 1) & mask
        slot_of[j] = r
    return slot_of


def _row_kinds(src: np.ndarray, dst: np.ndarray, pair_kinds) -> tuple[list[str], np.ndarray | None]:
    """(kind names, each row's kind code) for :meth:`SwitchDiagnoser.fit`: a row whose pair has no kind gets the
    last code, ``untyped``; None without ``pair_kinds``."""
    if pair_kinds is None:
        return [], None
    a, b, k = (np.asarray(x) for x in pair_kinds)
    a, b = a.astype(np.int64), b.astype(np.int64)
    names, code = np.unique(k.astype(str), return_inverse=True)
    n = int(max(a.max(initial=-1), b.max(initial=-1), src.max(initial=-1), dst.max(initial=-1))) + 1
    key = np.minimum(a, b) * n + np.maximum(a, b)
    if not len(key):
        return ["untyped"], np.zeros(len(src), dtype=np.int64)
    o = np.argsort(key, kind="stable")
    key, code = key[o], code[o]
    rk = np.minimum(src, dst) * n + np.maximum(src, dst)
    at = np.minimum(np.searchsorted(key, rk), len(key) - 1)
    found = (key[at] == rk) & (src >= 0) & (dst >= 0)
    return names.tolist() + ["untyped"], np.where(found, code[at], len(names)).astype(np.int64)


def _tiers(paths: list[tuple[int, ...]], n_switches: int) -> np.ndarray:
    """'leaf' for switches seen at a path's end, 'spine' for middle-only ones."""
    end = np.zeros(n_switches, dtype=bool)
    for p in paths:
        if p:
            end[p[0]] = end[p[-1]] = True
    return np.where(end, "leaf", "spine")


def _host_codes(bw: "SwitchBandwidth", src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(host names, host code of each row's sender, of its receiver): -1 where the NIC is not known.

    A host is the server of the NIC (``SwitchBandwidth(hosts=...)``), or the NIC itself without them.
    """
    nics = np.union1d(src[src >= 0], dst[dst >= 0])
    if bw.hosts is not None and len(nics) and nics.max() < len(bw.hosts):
        names, code = np.unique(bw.hosts[nics].astype(str), return_inverse=True)
    else:
        names, code = np.array([f"nic{i}" for i in nics.tolist()], dtype=object), np.arange(len(nics))
    lut = np.full(int(nics.max()) + 2 if len(nics) else 1, -1, dtype=np.int64)
    lut[nics] = code
    return names.astype(object), lut[src], lut[dst]


def _unit_rows(path: np.ndarray, units: dict) -> tuple[np.ndarray, np.ndarray, int]:
    """(row, unit) for every row and every switch and link its path crosses; links numbered after the switches."""
    sw, ln = units["switch"], units["link"]
    r1, u1 = sw.expand(path)
    r2, u2 = ln.expand(path)
    return np.concatenate([r1, r2]), np.concatenate([u1, u2 + len(sw.names)]), len(sw.names) + len(ln.names)


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
    min_host_breadth : float, default 0.75
        Host or link: a host (the NICs of one server, as sender and
        receiver) is ``slow_host`` when its flows, apart from those through
        units slow for the other hosts' flows too, are slow against the
        host median (``max_ratio``, ``z``, ``min_flows``, ``min_peers`` as
        for a switch) through at least this share of the switches and links
        it sends ``min_sender_flows`` through, and at least
        ``min_host_units`` of them. Its flows are then left out of the
        switch and link diagnosis. Needs the NICs (``partial_fit(src=...,
        dst=...)``); 1.1 turns the test off.
    min_host_units : int, default 2
        Units (switches and links) a host's slowness must be seen through:
        slow through one unit only, the unit is as good an explanation.
    """

    def __init__(self, max_ratio: float = 0.7, z: float = 5.0, min_rel_spread: float = 0.02, min_peers: int = 3, min_flows: int = 200,
                 min_flow_share: float = 0.25, min_sender_flows: int = 10, min_vote: float = 0.5, min_host_breadth: float = 0.75,
                 min_host_units: int = 2):
        self.min_host_breadth = float(min_host_breadth)
        self.min_host_units = int(min_host_units)
        self.min_flow_share = float(min_flow_share)
        self.min_sender_flows = int(min_sender_flows)
        self.min_vote = float(min_vote)
        self.max_ratio = float(max_ratio)
        self.z = float(z)
        self.min_rel_spread = float(min_rel_spread)
        self.min_peers = int(min_peers)
        self.min_flows = int(min_flows)

    def fit(self, bw: SwitchBandwidth, pair_kinds: tuple[npt.ArrayLike, npt.ArrayLike, npt.ArrayLike] | None = None) -> "SwitchDiagnoser":
        """Diagnose ``bw``'s windows; ``pair_kinds`` is ``(a, b, kind)``: the flow kind (pair type, ``"EP"``, ``"DP"``,
        ...) of each unordered NIC pair, from the pair typing.

        With the kinds, each kind's flows are judged on their own, and a unit
        is slow if it is slow for one kind's flows (that kind's ``min_flows``,
        peers, ratio, z and vote all met). Flows of different kinds run at
        different rates whatever the fabric: an all-to-all's share the NIC
        with the group's other transfers, a ring's or pipeline's have it to
        themselves. ECMP gives each switch its own mix of them, so pooled,
        healthy switches differ by the mix (a 0.2x spine under MoE traffic
        was 0.41x the spine median but only 3.6 spreads below it), while
        each kind alone is tight. The pairs no kind is given for are one
        more kind. Without ``pair_kinds`` every flow is one kind.
        """
        t = bw.table()
        names = np.array(bw.switch_names, dtype=object)
        tiers = _tiers(bw.paths, len(names))
        units = {"switch": _Units.switches(bw.paths, names, tiers), "link": _Units.links(bw.paths, names, tiers)}
        rows, tables = [], []
        path, src = t["path"].to_numpy(np.int64), t["src"].to_numpy(np.int64)
        sums = t[["flows", "bytes", "busy_ns"]].to_numpy(np.int64)
        window = t["window"].to_numpy(np.int64)
        host_names, hs, hd = _host_codes(bw, src, t["dst"].to_numpy(np.int64))
        kind_names, kind = _row_kinds(src, t["dst"].to_numpy(np.int64), pair_kinds)
        for w in np.unique(window):
            in_w = np.flatnonzero(window == w)
            if self.min_host_breadth <= 1.0:
                slow_hosts, in_w = self._hosts(in_w, path, hs, hd, sums, units, len(host_names))
                rows += self._host_rows(slow_hosts, host_names, int(w) * bw.window_ns, bw.window_ns)
            excluded = np.zeros(len(bw.paths), dtype=bool)
            flagged_sw: set[str] = set()
            for unit_kind, u in units.items():
                first = True
                while True:
                    live = in_w[~excluded[path[in_w]]]
                    stats = self._stats(path[live], src[live], sums[live], u, None if kind is None else kind[live])
                    if first:
                        tables.append(stats.assign(window_start_ns=int(w) * bw.window_ns, kind=unit_kind))
                        first = False
                    bad = stats[stats["slow"]]
                    if unit_kind == "link" and len(bad):  # a link of a flagged switch is explained by it
                        ends = bad["name"].str.split(">")
                        bad = bad[[not (set(e) & flagged_sw) for e in ends]]
                    if bad.empty:
                        break
                    first_bad = self._first_to_flag(bad, in_w, excluded, path, src, sums, u, kind)
                    rows.append(self._row(unit_kind, first_bad, int(w) * bw.window_ns, bw.window_ns, kind_names))
                    if unit_kind == "switch":
                        flagged_sw.add(first_bad["name"])
                    excluded[u.paths_through(u.index[first_bad["name"]])] = True
        self.anomalies_ = pd.DataFrame(rows, columns=ANOMALY_COLUMNS) if rows else empty_anomalies()
        cols = SWITCH_COLUMNS
        self.bandwidth_ = pd.concat(tables, ignore_index=True)[cols] if tables else pd.DataFrame(columns=cols)
        return self

    #: slow units compared on their exclusive traffic in one round (see ``_first_to_flag``)
    MAX_CANDIDATES = 16

    def _host_stats(self, hs: np.ndarray, hd: np.ndarray, sums: np.ndarray, n_hosts: int) -> dict[str, np.ndarray]:
        """Per endpoint (code): flows over its rows, its GB/s and ratio to the endpoints' median; the median and robust spread.

        ``hs``/``hd``: each row's sending and receiving endpoint (a host as
        sender, ``2 * host``, and as receiver, ``2 * host + 1``; -1 unknown).
        """
        host = np.concatenate([hs, hd])
        rows = np.concatenate([np.arange(len(hs)), np.arange(len(hd))])
        keep = host >= 0
        host, rows = host[keep], rows[keep]
        flows, nbytes, busy = (_int_sums(host, sums[rows, k], n_hosts) for k in range(3))
        with np.errstate(divide="ignore", invalid="ignore"):
            gbps = np.where(busy > 0, nbytes / np.where(busy > 0, busy, 1), np.nan)
        judged = (flows >= self.min_flows) & ~np.isnan(gbps)
        med = spread = np.nan
        if judged.sum() >= self.min_peers:
            g = gbps[judged]
            med = float(np.median(g))
            spread = max(1.4826 * float(np.median(np.abs(g - med))), self.min_rel_spread * med)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = gbps / med
        return {"flows": flows, "gbps": gbps, "ratio": ratio, "judged": judged, "median": np.float64(med), "spread": np.float64(spread)}

    def _hosts(self, in_w, path, hs, hd, sums, units, n_hosts: int) -> tuple[list[dict], np.ndarray]:
        """Host or link, in one window: the slow endpoints (evidence dicts) and the window's rows left for the switches.

        An endpoint is a host as sender or as receiver (a NIC pacing its
        sends is slow one way only). Candidates are the endpoints whose
        flows are slow against the endpoints' median; each is judged on its
        flows that involve no other candidate (a host sending only to a
        slow receiver looks slow too), against the median and spread of the
        endpoints without its host's flows, and against the units (switches and
        links) slow for the flows of no candidate (the network's doing:
        those flows of the host are no evidence). The lowest ratio of the
        convicted is flagged, its rows are dropped, and the statistics
        recomputed, until none is convicted.
        """
        found: list[dict] = []
        if n_hosts == 0 or not len(in_w) or (hs[in_w] < 0).all() and (hd[in_w] < 0).all():
            return found, in_w
        ep_s, ep_d = np.where(hs >= 0, 2 * hs, -1), np.where(hd >= 0, 2 * hd + 1, -1)
        n_hosts = 2 * n_hosts
        while True:
            h_s, h_d, s_w = ep_s[in_w], ep_d[in_w], sums[in_w]
            st = self._host_stats(h_s, h_d, s_w, n_hosts)
            first = np.flatnonzero(st["judged"] & (st["ratio"] <= self.max_ratio))
            first = first[np.argsort(st["ratio"][first], kind="stable")][: self.MAX_CANDIDATES]
            # each against the endpoints without its host's flows: a slow host slows its peers' flows too,
            # which would widen the spread it is judged against (and make its peers look slow)
            refs = {}
            ref_stats = {}  # each candidate's endpoints without its host's flows: its reference, then its peers' test below
            for h in first.tolist():
                rest = (h_s // 2 != h // 2) & (h_d // 2 != h // 2)
                ref = self._host_stats(h_s[rest], h_d[rest], s_w[rest], n_hosts)
                med, spread = float(ref["median"]), float(ref["spread"])
                if np.isfinite(med) and med > 0 and st["gbps"][h] <= self.max_ratio * med and med - st["gbps"][h] >= self.z * spread:
                    refs[h] = (med, spread)
                    ref_stats[h] = ref
            if not refs:
                break
            cands = np.array(list(refs), dtype=np.int64)
            is_cand = np.zeros(n_hosts + 1, dtype=bool)  # the last slot stands for "no host" (-1)
            is_cand[cands] = True
            touches = is_cand[h_s] | is_cand[h_d]  # rows of some candidate
            # every row once per switch and link its path crosses
            row_u, unit_u, n_units = _unit_rows(path[in_w], units)
            best = None
            for h, (med, spread) in refs.items():
                net_slow = self._slow_units(~touches, row_u, unit_u, s_w, n_units, med)
                via_net = np.bincount(row_u[net_slow[unit_u]], minlength=len(in_w)) > 0
                # the other candidates that stay slow without this host's flows: a slow host's
                # peers look slow through their flows with it, and are no evidence against it
                ref = ref_stats[h]
                cand_others = np.zeros(n_hosts + 1, dtype=bool)
                cand_others[:n_hosts] = is_cand[:n_hosts] & ref["judged"] & (ref["ratio"] <= self.max_ratio)
                cand_others[h] = False
                own = ((h_s == h) | (h_d == h)) & ~cand_others[h_s] & ~cand_others[h_d]
                best = self._host_evidence(h, own, via_net, row_u, unit_u, s_w, n_units, med, spread, ~touches)
                if best is not None:
                    best.update(median=med)
                    break
            if best is None:
                break
            found.append(best)
            in_w = in_w[(h_s != best["host"]) & (h_d != best["host"])]
        return found, in_w

    def _slow_units(self, rows: np.ndarray, row_u, unit_u, s_w, n_units: int, med: float) -> np.ndarray:
        """Units slow for the flows of ``rows`` (a mask): ``min_sender_flows`` of them there, at most ``max_ratio`` of ``med``."""
        pick = rows[row_u]
        flows, nbytes, busy = (_int_sums(unit_u[pick], s_w[row_u[pick], k], n_units) for k in range(3))
        with np.errstate(invalid="ignore"):
            return (flows >= self.min_sender_flows) & (busy > 0) & (nbytes <= self.max_ratio * med * busy)

    def _host_evidence(self, h: int, own, via_net, row_u, unit_u, s_w, n_units, med, spread, others) -> dict | None:
        """Host ``h`` convicted on its own rows (``own``) avoiding the network's slow units: its evidence, or None."""
        clean = own & ~via_net
        flows, nbytes, busy = (int(s_w[clean, k].sum()) for k in range(3))
        if flows < self.min_flows or busy <= 0:
            return None
        gbps = nbytes / busy
        ratio, z = gbps / med, (med - gbps) / spread
        if not (ratio <= self.max_ratio and z >= self.z):
            return None
        # breadth: the units its clean flows cross, each judged on its own flows there
        pick = clean[row_u]
        u_flows, u_bytes, u_busy = (_int_sums(unit_u[pick], s_w[row_u[pick], k], n_units) for k in range(3))
        judged = (u_flows >= self.min_sender_flows) & (u_busy > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            u_ratio = np.where(judged, u_bytes / np.where(u_busy > 0, u_busy, 1) / med, np.nan)
        slow_u = judged & (u_ratio <= self.max_ratio)
        n_judged, n_slow = int(judged.sum()), int(slow_u.sum())
        if n_judged < self.min_host_units or n_slow < self.min_host_breadth * n_judged:
            return None
        # the other hosts' flows through the same units: normal (else the unit would be the network's doing)
        through = np.bincount(row_u[others[row_u] & judged[unit_u]], minlength=len(others)) > 0  # each row once
        o_flows, o_bytes, o_busy = (int(s_w[through, k].sum()) for k in range(3))
        return {"host": h, "flows": flows, "gbps": gbps, "ratio": ratio, "z": z, "units": n_judged, "slow_units": n_slow,
                "unit_ratio": float(np.median(u_ratio[slow_u])) if n_slow else float("nan"), "other_flows": o_flows,
                "other_ratio": o_bytes / o_busy / med if o_busy > 0 else float("nan")}

    def _host_rows(self, found: list[dict], host_names: np.ndarray, w0: int, wlen: int) -> list[tuple]:
        """One anomaly per slow host of a window, its evidence as sender and as receiver in the text."""
        by_host: dict[int, list[dict]] = {}
        for e in found:
            by_host.setdefault(e["host"] // 2, []).append(e)
        out = []
        for h in sorted(by_host, key=lambda k: str(host_names[k])):
            parts = []
            for e in sorted(by_host[h], key=lambda e: e["host"] % 2):
                others = (f"the other hosts' {e['other_flows']:,} flows through them {e['other_ratio']:.2f}x" if e["other_flows"]
                          else "no other host's flows through them")
                parts.append(f"as {'receiver' if e['host'] % 2 else 'sender'} {e['gbps']:.1f} GB/s effective, {e['ratio']:.2f}x the median "
                             f"{e['median']:.1f} GB/s (z {e['z']:.1f}) over {e['flows']:,} flows, slow through {e['slow_units']} of the "
                             f"{e['units']} switches and links it uses (median {e['unit_ratio']:.2f}x), {others}")
            name = str(host_names[h])
            out.append((HOST_KIND, "", -1, w0, name, round(min(float(e["ratio"]) for e in by_host[h]), 4),
                        f"host {name}: its flows are slow wherever they go, in the {wlen / 1e9:g} s window: " + "; ".join(parts)
                        + ": the host (NIC), not the network"))
        return out

    def _first_to_flag(self, bad: pd.DataFrame, in_w, excluded, path, src, sums, u: "_Units", kind: np.ndarray | None = None) -> pd.Series:
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
        bad = bad.nsmallest(self.MAX_CANDIDATES, "kind_ratio")  # the ratio of the kind it is slow in
        paths_of = {name: u.paths_through(u.index[name]) for name in bad["name"]}
        evidence = []
        for name in bad["name"]:
            alone = excluded.copy()
            for other, paths in paths_of.items():
                if other != name:
                    alone[paths] = True
            live = in_w[~alone[path[in_w]]]
            own = self._stats(path[live], src[live], sums[live], u, None if kind is None else kind[live])
            own = own[own["name"] == name]
            if own.empty or not bool(own["judged"].iloc[0]):
                evidence.append(1)
            else:
                evidence.append(2 if bool(own["slow"].iloc[0]) else 0)
        return bad.assign(evidence=evidence).sort_values(["evidence", "kind_ratio"], ascending=[False, True], kind="stable").iloc[0]

    def _stats(self, path: np.ndarray, src: np.ndarray, sums: np.ndarray, u: "_Units", kind: np.ndarray | None = None) -> pd.DataFrame:
        """One row per unit (switch or link) some of these (path, sender) rows cross, in name order.

        ``sums`` holds the rows' flows, bytes and busy ns; ``kind`` each
        row's flow kind (:meth:`fit`'s ``pair_kinds``). The columns of
        :data:`SWITCH_COLUMNS` are over every flow; ``slow`` and the
        ``kind_*`` figures are the kinds' (see :meth:`fit`). O(rows x path
        length) numpy work; Python only per tier (two or three) and kind.
        """
        # every row once per unit its path crosses (the path -> units incidence)
        row, unit = u.expand(path)
        present, unit = np.unique(unit, return_inverse=True)  # units in name order
        n = len(present)
        tier = u.tiers[present]
        tier_names, tier_of = np.unique(tier, return_inverse=True)
        pooled = self._judge(row, unit, src, sums, n, tier_of, len(tier_names))
        s = pd.DataFrame({"name": pd.Series(u.names[present].tolist(), dtype=_TEXT), "tier": pd.Series(tier.tolist(), dtype=_TEXT),
                          **{c: pooled[c] for c in ("flows", "bytes", "busy_ns", "gbps", "tier_median_gbps", "ratio", "senders", "slow_senders")}})
        row_kind = kind[row] if kind is not None else np.zeros(len(row), dtype=np.int64)
        kinds = np.unique(row_kind)
        if len(kinds) <= 1:  # one kind of flow: the pooled test is that kind's
            shown, slow, judged, flow_kind = pooled, pooled["slow"], pooled["judged"], np.full(n, -2, dtype=np.int64)
        else:
            per = [self._judge(row[m], unit[m], src, sums, n, tier_of, len(tier_names)) for m in (row_kind == k for k in kinds.tolist())]
            slow = np.any([p["slow"] for p in per], axis=0)
            judged = np.any([p["judged"] for p in per], axis=0)
            # a slow unit is shown by the kind it is slowest in; any other by its pooled figures
            by = np.argmin(np.stack([np.where(p["slow"], p["ratio"], np.inf) for p in per]), axis=0)
            shown = {c: np.where(slow, np.stack([p[c] for p in per])[by, np.arange(n)], pooled[c]) for c in _SHOWN}
            flow_kind = np.where(slow, kinds[by], -2)
        return s.assign(slow=slow, judged=judged, flow_kind=flow_kind, **{f"kind_{c}": shown[c] for c in _SHOWN})

    def _judge(self, row: np.ndarray, unit: np.ndarray, src: np.ndarray, sums: np.ndarray, n: int, tier_of: np.ndarray,
               n_tiers: int) -> dict[str, np.ndarray]:
        """The test of one table of flows (``row``, once per ``unit`` it crosses): per unit its sums, ratio to its tier's
        median, votes, and whether it is ``judged`` and ``slow``."""
        flows, nbytes, busy = (_int_sums(unit, sums[row, k], n) for k in range(3))
        with np.errstate(divide="ignore", invalid="ignore"):
            gbps = np.where(busy > 0, nbytes / np.where(busy > 0, busy, 1), np.nan)  # bytes per ns = GB/s
        out = {"flows": flows, "bytes": nbytes, "busy_ns": busy, "gbps": gbps}
        seen = flows > 0  # units these rows cross (a kind's table leaves the others out)
        tier_flows = np.array([np.median(flows[seen & (tier_of == k)]) if (seen & (tier_of == k)).any() else 0.0 for k in range(n_tiers)])[tier_of]
        judged = seen & (flows >= self.min_flows) & (flows >= self.min_flow_share * tier_flows)
        if not judged.any():  # too little traffic to compare anything
            nan = np.full(n, np.nan)
            zero = np.zeros(n, dtype=np.int64)
            return out | {"tier_median_gbps": nan, "ratio": nan, "senders": zero, "slow_senders": zero, "slow": np.zeros(n, dtype=bool), "judged": judged}
        med, mad, peers = (np.full(n_tiers, np.nan) for _ in range(3))
        for k in range(n_tiers):
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
        senders, slow_senders = self._votes(row, unit, src, sums, n, tier_median)
        voted = (senders < 2) | (slow_senders >= self.min_vote * senders)
        with np.errstate(invalid="ignore"):
            slow = judged & (np.nan_to_num(peers, nan=0)[tier_of] >= self.min_peers) & (ratio <= self.max_ratio) & (z >= self.z) & voted
        return out | {"tier_median_gbps": tier_median, "ratio": ratio, "senders": senders, "slow_senders": slow_senders, "slow": slow, "judged": judged}

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
    def _row(kind, r, w0, wlen, kind_names=()):
        """The anomaly of a slow unit: the figures of the kind of flow it is slowest in (its ratio the score), and the
        pooled ratio beside them when the kinds were judged apart."""
        fk = int(r["flow_kind"])
        return (
            f"slow_{kind}", "", -1, w0, r["name"], round(float(r["kind_ratio"]), 4),
            f"{kind} {r['name']} ({r['tier']}): {kind_names[fk] + ' flows ' if fk > -2 else ''}{r['kind_gbps']:.1f} GB/s effective, "
            f"{r['kind_ratio']:.2f}x the {r['tier']} median {r['kind_tier_median_gbps']:.1f} GB/s, over {int(r['kind_flows']):,} flows "
            f"in the {wlen / 1e9:g} s window"
            + (f", slow for {int(r['kind_slow_senders'])} of {int(r['kind_senders'])} senders" if r["kind_senders"] >= 2 else "")
            + (f" (all {int(r['flows']):,} flows: {r['ratio']:.2f}x)" if fk > -2 else ""),
        )

    def predict(self) -> pd.DataFrame:
        """Anomaly rows (:data:`prism.analysis.diagnosis.ANOMALY_COLUMNS`)."""
        return self.anomalies_
