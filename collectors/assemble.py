"""RDMA data packets into flow records (one RDMA message each).

A message is keyed by (source IP, destination IP, destination QP). It is
either one ONLY packet or FIRST, MIDDLE..., LAST with PSNs rising by one
(modulo 2^24). The assembler works on whole batches with numpy:

1. PSNs are unwrapped per key in time order (a step is the signed
   difference modulo 2^24), so wrap-around and go-back-N rewinds are plain
   integer order.
2. Copies of one packet (key, PSN) are merged: copies from different mirror
   points give the path, copies from the same mirror point are go-back-N
   retransmissions (counted). A message starts at the first time any copy
   of its first packet was seen and ends at the last time any copy of its
   last packet was seen.
3. Messages are cut at FIRST/ONLY and after LAST/ONLY. The size is RETH's
   DMA length where present (RDMA WRITE), else (PSN span - 1) x the FIRST
   packet's payload + the LAST's: MIDDLE packets always carry a full path
   MTU, so the size stays exact when a middle packet was lost on every
   mirror. ONLY: its payload.
4. A message whose end has not been seen at the end of a batch is carried
   into the next batch (rotated capture files); one that can never complete
   (its FIRST was lost everywhere) is counted as ``incomplete_messages``.
5. A message dated before 1970 or whose packets lie over
   ``MAX_MESSAGE_NS`` apart comes from a corrupt capture clock: counted as
   ``bad_timestamp_messages`` and dropped.

``switches`` is the path: the mirror points that saw the message, ordered
by when each first saw it, named through a :class:`SwitchMap`.
"""
from __future__ import annotations

import ipaddress
import os
from collections import Counter

import numpy as np
import pandas as pd

from prism.ingest.records import empty_flows

from .decode import K_FIRST, K_LAST, K_ONLY, OP_CLASS, STATUS, STATUS_NAMES, PacketTable, address_strings, opcode_kind

__all__ = ["SwitchMap", "FlowAssembler", "CollectStats"]

PSN_MOD = 1 << 24
MAX_PATH = 3  # switches kept per message path (16 bits each in a path code)
MAX_MESSAGE_NS = 60 * 10**9  # an RDMA message spanning longer is a clock error (largest real ones take well under a second)


class SwitchMap:
    """ERSPAN session id and/or mirror source address -> switch name.

    A session id mapping wins over a source address mapping; an unmapped
    mirror is named ``mirror-<source>`` (with ``/s<session>`` for ERSPAN II
    and III) and counted. Host-side captures (no ERSPAN) have no switch.

    >>> m = SwitchMap(sessions={17: "leaf-03"}, sources={"10.0.0.9": "spine-01"})
    >>> m.name(17, "10.0.0.3"), m.name(5, "10.0.0.9"), m.name(5, "10.0.0.7")
    ('leaf-03', 'spine-01', 'mirror-10.0.0.7/s5')
    """

    def __init__(self, sessions: dict | None = None, sources: dict | None = None):
        for name, value in (("sessions", sessions), ("sources", sources)):
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"'{name}' must be a mapping ({'17: leaf-03' if name == 'sessions' else '10.0.0.3: leaf-03'}), got {type(value).__name__}")
        try:
            self.sessions = {int(k): str(v) for k, v in (sessions or {}).items()}
        except (TypeError, ValueError):
            raise ValueError(f"'sessions' keys must be ERSPAN session ids (integers), got {sorted(map(str, sessions or {}))}") from None
        self.sources = {str(ipaddress.ip_address(str(k))): str(v) for k, v in (sources or {}).items()}

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SwitchMap":
        """From YAML: ``{sessions: {17: leaf-03}, sources: {10.0.0.3: leaf-03}}``."""
        from prism.common.yamlfile import read_yaml

        doc = read_yaml(path, "--switch-map")
        if not isinstance(doc, dict) or set(doc) - {"sessions", "sources"}:
            raise ValueError(f"--switch-map {path}: expected a mapping with 'sessions' and/or 'sources'")
        try:
            return cls(doc.get("sessions"), doc.get("sources"))
        except ValueError as e:
            raise ValueError(f"--switch-map {path}: {e}") from e

    def name(self, session: int, source: str) -> str:
        if session in self.sessions:
            return self.sessions[session]
        if source in self.sources:
            return self.sources[source]
        if not source:
            return ""
        return f"mirror-{source}" + (f"/s{session}" if session >= 0 else "")

    def mapped(self, session: int, source: str) -> bool:
        return session in self.sessions or source in self.sources or not source


class CollectStats:
    """What the collector saw: packets by status, message outcomes, CNPs per switch."""

    def __init__(self) -> None:
        self.packets: Counter[str] = Counter()
        self.cnp_by_switch: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.unmapped_mirrors: set[str] = set()

    def as_dict(self) -> dict:
        return {"packets_by_status": dict(self.packets), "cnp_by_switch": dict(self.cnp_by_switch), **dict(self.counts),
                "unmapped_mirrors": sorted(self.unmapped_mirrors)}


def factorize_rows(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes of equal rows across int64 columns, and the index of each code's first row (hash-based, no sort)."""
    codes = np.zeros(len(cols[0]), np.int64)
    for col in cols:
        c, u = pd.factorize(col)
        codes = codes * max(len(u), 1) + c
        codes, _ = pd.factorize(codes)
    codes = codes.astype(np.int64)
    first = np.full(codes.max() + 1 if len(codes) else 0, len(codes), np.int64)
    np.minimum.at(first, codes, np.arange(len(codes)))
    return codes, first


def _seg_starts(key: np.ndarray) -> np.ndarray:
    start = np.ones(len(key), bool)
    start[1:] = key[1:] != key[:-1]
    return start


class FlowAssembler:
    """Feed :class:`PacketTable` batches with :meth:`add`; each call returns the messages completed.

    Parameters
    ----------
    switch_map : SwitchMap, optional
    carry : bool
        Keep messages still open at the end of a batch for the next one
        (default True); :meth:`finish` counts what is left as incomplete.
    settle_ns : int
        Messages whose last sighting is this close to a batch's newest packet
        wait for the next batch, so late mirror copies and retransmissions
        straddling a batch boundary still merge (default 2 ms: mirror copies
        arrive within microseconds, go-back-N within a round trip).
    open_timeout_ns : int
        An open message (FIRST seen, LAST not) is given up as incomplete
        after this long (default 1 s).
    """

    def __init__(self, switch_map: SwitchMap | None = None, carry: bool = True, settle_ns: int = 2_000_000,
                 open_timeout_ns: int = 1_000_000_000):
        self.switch_map = switch_map or SwitchMap()
        self.carry = carry
        self.settle_ns, self.open_timeout_ns = int(settle_ns), int(open_timeout_ns)
        self.stats = CollectStats()
        self._switch_ids: dict[str, int] = {"": 0}
        self._switch_names: list[str] = [""]
        self._pending: dict | None = None

    # -- switches
    def _switches(self, t: PacketTable, sel: np.ndarray) -> np.ndarray:
        if len(sel) == 0:
            return np.zeros(0, np.int64)
        session, hi, lo = t["session"][sel], t["mirror_src_hi"][sel], t["mirror_src_lo"][sel]
        inv, first = factorize_rows(session, hi, lo)
        sources = address_strings(hi[first], lo[first])
        ids = np.empty(len(first), np.int64)
        for i, (ses, src) in enumerate(zip(session[first].tolist(), sources)):
            name = self.switch_map.name(ses, src)
            if not self.switch_map.mapped(ses, src):
                self.stats.unmapped_mirrors.add(name)
            if name not in self._switch_ids:
                self._switch_ids[name] = len(self._switch_names)
                self._switch_names.append(name)
            ids[i] = self._switch_ids[name]
        return ids[inv]

    # -- batches
    def add(self, table: PacketTable) -> pd.DataFrame:
        st = table["status"]
        for code, k in enumerate(np.bincount(st, minlength=len(STATUS_NAMES)).tolist()):
            if k:
                self.stats.packets[STATUS_NAMES[code]] += k
        cnp = np.flatnonzero(st == STATUS["roce_cnp"])
        if len(cnp):
            sw = self._switches(table, cnp)
            ids, k = np.unique(sw, return_counts=True)
            for i, n in zip(ids, k):
                self.stats.cnp_by_switch[self._switch_names[i]] += int(n)
        data = np.flatnonzero(st == STATUS["roce_data"])
        cols = {name: table[name][data] for name in ("ts_ns", "opcode", "psn", "dqp", "payload", "reth_len",
                                                      "src_hi", "src_lo", "dst_hi", "dst_lo")}
        cols["switch"] = self._switches(table, data)
        if self._pending is not None:
            cols = {k: np.concatenate([self._pending[k], v]) for k, v in cols.items()}
            self._pending = None
        return self._assemble(cols, final=False)

    def finish(self) -> pd.DataFrame:
        """Count messages still open as incomplete; returns an empty frame (nothing completes)."""
        if self._pending is not None and len(self._pending["ts_ns"]):
            out = self._assemble(self._pending, final=True)
            self._pending = None
            return out
        return self._empty()

    def _empty(self) -> pd.DataFrame:
        return empty_flows().assign(dst_qp=np.zeros(0, np.int64))

    def _assemble(self, c: dict, final: bool) -> pd.DataFrame:
        n = len(c["ts_ns"])
        if n == 0:
            return self._empty()
        # key per (src, dst, dest QP)
        key, key_row = factorize_rows(c["src_hi"], c["src_lo"], c["dst_hi"], c["dst_lo"], c["dqp"])
        ukeys = np.stack([c[k][key_row] for k in ("src_hi", "src_lo", "dst_hi", "dst_lo", "dqp")], axis=1)
        # (key, time) order; captures are nearly time-sorted, so a stable sort on time then key is cheap
        by_time = np.argsort(c["ts_ns"], kind="stable")
        order = by_time[np.argsort(key[by_time], kind="stable")]
        key = key[order]
        raw = c  # batch order, for what is carried to the next batch
        c = {k: c[k][order] for k in ("ts_ns", "psn", "switch", "opcode", "payload", "reth_len")}
        # 1. unwrap PSNs per key, in time order
        step = (np.diff(c["psn"], prepend=c["psn"][:1]) + PSN_MOD // 2) % PSN_MOD - PSN_MOD // 2
        kstart = _seg_starts(key)
        step[kstart] = 0
        upsn = np.cumsum(step)
        first_of_key = np.maximum.accumulate(np.where(kstart, np.arange(n), 0))
        upsn = upsn - upsn[first_of_key] + c["psn"][first_of_key]
        # 2. copies of one packet (key, upsn): earliest and latest sighting, mirror points
        # (key, PSN, time) order: a stable sort of the (key, time) order on key and PSN packed together
        rel = upsn - np.minimum.reduceat(upsn, np.flatnonzero(kstart))[np.cumsum(kstart) - 1]
        o2 = np.argsort((key << 32) | rel, kind="stable")
        k2, p2, ts2, sw2 = key[o2], upsn[o2], c["ts_ns"][o2], c["switch"][o2]
        newpkt = np.ones(n, bool)
        newpkt[1:] = (k2[1:] != k2[:-1]) | (p2[1:] != p2[:-1])
        pkt_id = np.cumsum(newpkt) - 1
        first = np.flatnonzero(newpkt)
        t_first = ts2[first]
        t_last = np.maximum.reduceat(ts2, first)
        # same packet, same mirror point, seen again: a retransmission
        pk_key, pk_psn = k2[first], p2[first]
        src_rows = o2[first]
        op = c["opcode"][src_rows]
        kind = opcode_kind(op)
        cls = OP_CLASS[op & 31]
        payload = c["payload"][src_rows]
        reth = c["reth_len"][src_rows]
        # 3. messages: cut at FIRST/ONLY, after LAST/ONLY, at a new key
        m = len(first)
        cut = np.ones(m, bool)
        ended = (kind == K_LAST) | (kind == K_ONLY)
        cut[1:] = (pk_key[1:] != pk_key[:-1]) | (kind[1:] == K_FIRST) | (kind[1:] == K_ONLY) | ended[:-1] | (cls[1:] != cls[:-1])
        seg_first = np.flatnonzero(cut)
        seg_last = np.append(seg_first[1:], m) - 1
        seg_n = seg_last - seg_first + 1
        fk, lk = kind[seg_first], kind[seg_last]
        span = pk_psn[seg_last] - pk_psn[seg_first] + 1
        complete = (((fk == K_FIRST) & (lk == K_LAST) & (seg_n >= 2)) | ((fk == K_ONLY) & (seg_n == 1))) & (span >= seg_n)
        seg_tmax_all = np.maximum.reduceat(t_last, seg_first)
        newest = int(c["ts_ns"].max())
        # wait for the next batch: anything seen lately (late copies may follow), and open messages
        # (the key's last one, FIRST seen and not ended) until they time out
        key_last = np.append(pk_key[seg_first][1:] != pk_key[seg_first][:-1], True)
        open_ = ~complete & key_last & (fk == K_FIRST) & (lk != K_LAST) & (lk != K_ONLY) & (seg_tmax_all > newest - self.open_timeout_ns)
        carry = (open_ | (seg_tmax_all > newest - self.settle_ns)) & (not final) & self.carry
        self.stats.counts["incomplete_messages"] += int((~complete & ~carry).sum())
        if carry.any():
            keep_pkts = carry[np.cumsum(cut) - 1]
            # every sighting of those packets goes to the next batch
            rows = order[o2[keep_pkts[pkt_id]]]
            self._pending = {k: v[rows] for k, v in raw.items()}
        complete &= ~carry
        # copies of the packets settled now (carried ones are counted when they settle)
        settled = ~carry[np.cumsum(cut) - 1][pkt_id]
        sightings = len(pd.unique((pkt_id * len(self._switch_names) + sw2)[settled]))  # distinct (packet, mirror point)
        self.stats.counts["retransmitted_packets"] += int(settled.sum() - sightings)
        self.stats.counts["mirror_copies"] += int(sightings - (newpkt & settled).sum())
        span_c = span[complete]
        first_c, last_c = seg_first[complete], seg_last[complete]
        size = np.where(reth[first_c] >= 0, reth[first_c],
                        np.where(kind[first_c] == K_ONLY, payload[first_c], (span_c - 1) * payload[first_c] + payload[last_c]))
        self.stats.counts["lost_packets"] += int((span_c - seg_n[complete]).sum())
        # start: first sighting of any packet of the message; end: last sighting of its last packet
        seg_tmin = np.minimum.reduceat(t_first, seg_first)[complete]
        seg_tmax = np.maximum.reduceat(t_last, seg_first)[complete]
        self.stats.counts["messages"] += int(complete.sum())
        # paths: mirror points of each complete message, by first sighting
        seg_of_pkt = np.cumsum(cut) - 1
        msg_index = np.full(len(seg_first), -1, np.int64)
        msg_index[complete] = np.arange(int(complete.sum()))
        row_msg = msg_index[seg_of_pkt[pkt_id]]
        sel = row_msg >= 0
        path = self._paths(row_msg[sel], sw2[sel], ts2[sel], int(complete.sum()))
        keys_c = pk_key[first_c]
        src = address_strings(ukeys[:, 0], ukeys[:, 1])
        dst = address_strings(ukeys[:, 2], ukeys[:, 3])
        df = pd.DataFrame({
            "start_ns": seg_tmin,
            "duration_ns": seg_tmax - seg_tmin,
            "src": pd.Categorical(src[keys_c]),
            "dst": pd.Categorical(dst[keys_c]),
            "size": size.astype(np.int64),
            "switches": path,
            "dst_qp": ukeys[keys_c, 4],
        })
        # a message before 1970 or whose packets lie minutes apart comes from a
        # corrupt capture clock, not the network: counted, not turned into a flow
        bad_time = (seg_tmin < 0) | (seg_tmax - seg_tmin > MAX_MESSAGE_NS)
        if bad_time.any():
            self.stats.counts["bad_timestamp_messages"] += int(bad_time.sum())
            self.stats.counts["messages"] -= int(bad_time.sum())
            df = df[~bad_time]
        return df.sort_values("start_ns", kind="stable").reset_index(drop=True)

    def _paths(self, msg: np.ndarray, sw: np.ndarray, ts: np.ndarray, n_msgs: int) -> pd.Categorical:
        """Per message, its mirror points joined with '|' in order of first sighting."""
        code = np.zeros(n_msgs, np.int64)
        # first sighting of each (message, mirror point); host captures (switch 0) name none
        named = sw != 0
        msg, sw, ts = msg[named], sw[named], ts[named]
        pair = msg * len(self._switch_names) + sw
        first_ts = pd.Series(ts).groupby(pair).min()
        pair = first_ts.index.to_numpy()
        msg, sw, ts = pair // len(self._switch_names), pair % len(self._switch_names), first_ts.to_numpy()
        o = np.lexsort((ts, msg))
        msg, sw = msg[o], sw[o]
        if len(msg):
            starts = np.ones(len(msg), bool)
            starts[1:] = msg[1:] != msg[:-1]
            rank = np.arange(len(msg)) - np.maximum.accumulate(np.where(starts, np.arange(len(msg)), 0))
            ok = rank < MAX_PATH
            np.bitwise_or.at(code, msg[ok], sw[ok] << (16 * rank[ok]))
        uniq, inv = np.unique(code, return_inverse=True)
        names = []
        for u in uniq.tolist():
            parts = []
            while u:
                parts.append(self._switch_names[u & 0xFFFF])
                u >>= 16
            names.append("|".join(parts))
        # distinct codes are distinct paths, so the names are unique categories
        return pd.Categorical.from_codes(inv.ravel(), pd.Index(names, dtype=object))
