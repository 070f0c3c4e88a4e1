"""SYNTHETIC ERSPAN-mirrored RoCEv2 captures, written from flow records, with ground truth.

No public capture of RoCE mirrored over ERSPAN exists, so the collector's
end-to-end tests use these. Each flow record becomes one RDMA message
(RDMA WRITE with a RETH, or SEND) cut into path-MTU packets with PSNs per
queue pair (some starting just below 2^24, so they wrap), spread evenly
over the flow's duration. Every packet is mirrored by up to two switches of
the flow's path: the first as ERSPAN Type II, the second as Type III (with
the platform sub-header on odd sessions), one microsecond later. Mirrors
truncate frames to ``snap`` bytes (the T bit is set), so sizes must come
from the IP/UDP lengths. Faults, per message with probability ``loss``:
the packet k is lost between the two mirror points, and the sender goes
back N: k..last are sent again ``rto_ns`` later (seen by both). ACKs and
CNPs are sprinkled in. The pcap is labelled synthetic in its file name by
the caller (``*.synthetic.pcap``; ``prism synth --pcap`` writes one).

The file is written in chunks of flows in start order, in time order
overall, so memory does not grow with the flow count; ``max_packets`` caps
the packets written per message (the collector then counts the skipped
middle packets as lost, sizes stay exact).
"""
from __future__ import annotations

import ipaddress
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["write_roce_pcap", "mirror_points"]

ETH, IP4, UDP, BTH, RETH, ICRC = 14, 20, 8, 12, 16, 4
PMTU = 4096
ERSPAN_II, ERSPAN_III = 0x88BE, 0x22EB


def _ip_int(values) -> np.ndarray:
    codes, uniq = pd.factorize(pd.Series(values).astype(str))
    ints = np.array([int(ipaddress.IPv4Address(u)) for u in uniq], np.int64)
    return ints[codes]


def mirror_points(flows: pd.DataFrame) -> tuple[dict, np.ndarray, np.ndarray]:
    """Switch -> (session id, mirror source IP) and each flow's first two path switches (codes, -1 = none)."""
    paths = flows["switches"].astype(str).str.split("|")
    first = paths.str[0].fillna("")
    second = paths.str[1].fillna("")
    names = sorted(set(first) | set(second) - {""})
    names = [n for n in names if n]
    table = {name: (i + 1, f"10.255.{(i + 1) // 256}.{(i + 1) % 256}") for i, name in enumerate(names)}
    index = {n: i for i, n in enumerate(names)}
    a = np.array([index.get(x, -1) for x in first], np.int64)
    b = np.array([index.get(x, -1) for x in second], np.int64)
    return table, a, b


def _be(arr: np.ndarray, col: int, values, nbytes: int, rows=None):
    """Write big-endian integers into columns col..col+nbytes of a (rows, width) uint8 frame array."""
    v = np.asarray(values, np.int64)
    target = arr if rows is None else arr[rows]
    for i in range(nbytes):
        target[:, col + i] = (v >> (8 * (nbytes - 1 - i))) & 0xFF
    if rows is not None:
        arr[rows] = target


def write_roce_pcap(flows: pd.DataFrame, path: str | Path, *, seed: int = 0, loss: float = 0.01, rto_ns: int = 30_000,
                    snap: int = 256, ack_every: int = 8, max_packets: int | None = None, chunk_packets: int = 1 << 16,
                    progress: Callable[[int, int], None] | None = None) -> dict:
    """Write ``flows`` as an ERSPAN-mirrored RoCEv2 pcap (nanosecond timestamps).

    Streamed: the flows are taken in start order, about ``chunk_packets``
    packets at a time; a chunk's frames up to the next chunk's first start are
    written and the rest merged into the next chunk, so the file is in time
    order and memory holds a chunk (about 300 bytes a packet) plus the packets
    of flows still going on. ``max_packets`` (at least 2) caps the packets
    written per message: FIRST, the next ``max_packets - 2`` and LAST, with
    their true PSNs, so the collector still gets the size exact (from RETH or
    the PSN span) and counts the skipped middle packets as lost.
    ``progress(flows_done, flows)`` is called after each chunk.

    Returns a dict with the switch map (``{"sessions": {id: name}}``), the
    expected flows (``expected``: start, end, size, path of each message as
    the collector should see it) and packet counts.
    """
    if max_packets is not None and max_packets < 2:
        raise ValueError(f"max_packets must be at least 2 (FIRST and LAST), got {max_packets}")
    rng = np.random.default_rng(seed)
    f = flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    n_f = len(f)
    table, m1, m2 = mirror_points(f)
    names = list(table)
    sess = np.array([table[n][0] for n in names] + [0], np.int64)
    msrc = np.array([int(ipaddress.IPv4Address(table[n][1])) for n in names] + [0], np.int64)
    src, dst = _ip_int(f["src"]), _ip_int(f["dst"])
    size = f["size"].to_numpy(np.int64)
    start = f["start_ns"].to_numpy(np.int64)
    dur = f["duration_ns"].to_numpy(np.int64)
    write = rng.random(n_f) < 0.7
    npk = np.maximum(1, -(-size // PMTU))
    nk = npk if max_packets is None else np.minimum(npk, max_packets)  # packets written per message
    # queue pairs: one per (src, dst); PSNs continue per QP, some start just below the 2^24 wrap
    pair = pd.factorize(pd.Series(src * (1 << 32) + dst))[0] if n_f else np.zeros(0, np.int64)
    dqp = 0x100 + pair
    order = np.lexsort((start, pair))
    cum = np.zeros(n_f, np.int64)
    csum = np.cumsum(npk[order]) - npk[order]
    pair_o = pair[order]
    first_of_pair = np.maximum.accumulate(np.where(np.r_[True, pair_o[1:] != pair_o[:-1]], np.arange(n_f), 0)) if n_f else order
    cum[order] = csum - csum[first_of_pair]
    n_pairs = int(pair.max()) + 1 if n_f else 0
    psn0 = np.where(rng.random(n_pairs) < 0.3, (1 << 24) - rng.integers(1, 64, n_pairs), rng.integers(0, 1 << 20, n_pairs))
    first_psn = (psn0[pair] + cum) % (1 << 24)
    # go-back-N: packet k (one of those written) lost between the mirrors, k..last resent rto later
    lossy = (rng.random(n_f) < loss) & (nk >= 3)
    lost_w = rng.integers(1, np.maximum(nk, 2))  # which written packet
    lost_k = np.where(lossy, np.where(lost_w == nk - 1, npk - 1, lost_w), -1)  # its number in the message
    last_t = start + np.where(npk > 1, dur, 0)
    # expected collector view of every message
    end = np.where(lossy, last_t + rto_ns + (npk - 1 - lost_k) * 100 + np.where(m2 >= 0, 1000, 0), last_t + np.where(m2 >= 0, 1000, 0))
    msg_path = np.array([("|".join(x for x in (names[a] if a >= 0 else "", names[b] if b >= 0 else "") if x)) for a, b in zip(m1, m2)],
                        dtype=object)
    seen = m1 >= 0
    expected = pd.DataFrame({"start_ns": start[seen], "end_ns": end[seen], "src": f["src"].astype(str)[seen].to_numpy(),
                             "dst": f["dst"].astype(str)[seen].to_numpy(), "size": size[seen], "switches": msg_path[seen],
                             "dst_qp": dqp[seen]})
    per_flow = dict(m1=m1, m2=m2, src=src, dst=dst, size=size, start=start, dur=dur, write=write, npk=npk, nk=nk, dqp=dqp,
                    first_psn=first_psn, lossy=lossy, lost_k=lost_k, last_t=last_t)
    counts = {"packets": 0, "data_sightings": 0, "acks": 0, "cnps": 0}
    # chunks of whole flows, about chunk_packets written packets each
    bounds = np.searchsorted(np.cumsum(nk), np.arange(chunk_packets, int(nk.sum()) + chunk_packets, chunk_packets), side="right")
    cuts = np.unique(np.r_[0, np.maximum(bounds, 1), n_f].clip(0, n_f))
    width = min(snap, _MAX_FRAME)
    held = _Frames.empty(width)
    with open(path, "wb") as fh:
        # nanosecond pcap, version 2.4, Ethernet
        fh.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
        for a, b in zip(cuts[:-1], cuts[1:]):
            frames = _Frames.concat(held, _chunk_frames(per_flow, a, b, rng, rto_ns, ack_every, sess, msrc, snap, width, counts))
            horizon = start[b] if b < n_f else None  # no later chunk has a packet before its first flow's start
            held = frames.write_until(fh, horizon, counts)
            if progress is not None:
                progress(int(b), n_f)
    return {"switch_map": {"sessions": {int(table[n][0]): n for n in names}}, "expected": expected,
            "packets": counts["packets"], "data_sightings": counts["data_sightings"], "acks": counts["acks"],
            "cnps": counts["cnps"], "lossy_messages": int(lossy[seen].sum()),
            "capped_messages": int((nk < npk)[seen].sum()), "skipped_packets": int((npk - nk)[seen].sum())}


_MAX_FRAME = ETH + IP4 + 8 + 20 + ETH + IP4 + UDP + BTH + RETH + PMTU + 3 + ICRC  # outer, GRE, ERSPAN III + sub-header, inner


class _Frames:
    """Encoded pcap records (header + captured bytes, padded to ``width``), their times and lengths."""

    def __init__(self, t: np.ndarray, rec: np.ndarray, cap: np.ndarray) -> None:
        self.t, self.rec, self.cap = t, rec, cap

    @classmethod
    def empty(cls, width: int) -> "_Frames":
        return cls(np.zeros(0, np.int64), np.zeros((0, 16 + width), np.uint8), np.zeros(0, np.int64))

    @classmethod
    def concat(cls, a: "_Frames", b: "_Frames") -> "_Frames":
        t = np.concatenate([a.t, b.t])
        o = np.argsort(t, kind="stable")
        return cls(t[o], np.concatenate([a.rec, b.rec])[o], np.concatenate([a.cap, b.cap])[o])

    def write_until(self, fh, horizon: int | None, counts: dict) -> "_Frames":
        """Write the records before ``horizon`` (all if None), numbering their GRE sequence; return the rest."""
        n = len(self.t) if horizon is None else int(np.searchsorted(self.t, horizon, side="left"))
        rec, cap = self.rec[:n], self.cap[:n]
        _be(rec, 16 + 38, np.arange(counts["packets"], counts["packets"] + n) & 0xFFFFFFFF, 4)
        counts["packets"] += n
        keep = np.arange(rec.shape[1])[None, :] < (16 + cap)[:, None]
        fh.write(rec[keep].tobytes())
        return _Frames(self.t[n:], self.rec[n:], self.cap[n:])


def _chunk_frames(pf: dict, a: int, b: int, rng, rto_ns: int, ack_every: int, sess, msrc, snap: int, width: int, counts: dict) -> _Frames:
    """Every packet sighting of flows a..b (data, retransmissions, ACKs, CNPs), encoded."""
    c = {k: v[a:b] for k, v in pf.items()}
    m1, m2, npk, nk = c["m1"], c["m2"], c["npk"], c["nk"]
    # written packets of every message: 0 .. nk-2, and the last
    msg = np.repeat(np.arange(b - a), nk)
    w = np.arange(len(msg)) - np.repeat(np.cumsum(nk) - nk, nk)
    n_of, nk_of = npk[msg], nk[msg]
    k = np.where(w == nk_of - 1, n_of - 1, w)
    t = c["start"][msg] + np.where(n_of > 1, c["dur"][msg] * k // np.maximum(n_of - 1, 1), 0)
    payload = np.where(k < n_of - 1, PMTU, c["size"][msg] - PMTU * (n_of - 1))
    is_w = c["write"][msg]
    op = np.where(n_of == 1, np.where(is_w, 10, 4),
                  np.where(k == 0, np.where(is_w, 6, 0), np.where(k == n_of - 1, np.where(is_w, 8, 2), np.where(is_w, 7, 1))))
    psn = (c["first_psn"][msg] + k) % (1 << 24)
    lossy, lost_k = c["lossy"][msg], c["lost_k"][msg]
    lost_here = lossy & (k == lost_k)
    resend = lossy & (k >= lost_k)
    # sightings: (packet, mirror, time)
    pk = np.arange(len(msg))
    two = (m2[msg] >= 0) & ~lost_here
    rt = pk[resend]
    t_re = c["last_t"][msg[rt]] + rto_ns + (k[rt] - lost_k[rt]) * 100
    re2 = m2[msg[rt]] >= 0
    s_pk = np.concatenate([pk, pk[two], rt, rt[re2]])
    s_mi = np.concatenate([m1[msg], m2[msg][two], m1[msg[rt]], m2[msg[rt]][re2]])
    s_t = np.concatenate([t, t[two] + 1000, t_re, t_re[re2] + 1000])
    # control packets: an ACK from the receiver every ack_every data packets, a CNP now and then
    ack = pk[(k % ack_every == ack_every - 1) | (k == n_of - 1)]
    cnp = pk[rng.random(len(pk)) < 0.002]
    kind = np.concatenate([np.zeros(len(s_pk), np.int8), np.ones(len(ack), np.int8), np.full(len(cnp), 2, np.int8)])
    c_pk = np.concatenate([s_pk, ack, cnp])
    c_mi = np.concatenate([s_mi, m1[msg[ack]], m1[msg[cnp]]])
    c_t = np.concatenate([s_t, t[ack] + 2000, t[cnp] + 3000])
    ok = c_mi >= 0
    c_pk, c_mi, c_t, kind = c_pk[ok], c_mi[ok], c_t[ok], kind[ok]
    counts["data_sightings"] += int((kind == 0).sum())
    counts["acks"] += int((kind == 1).sum())
    counts["cnps"] += int((kind == 2).sum())
    m = msg[c_pk]
    rec, cap = _encode(kind, c_mi, c_t, c["src"][m], c["dst"][m], c["dqp"][m], c["size"][m], op[c_pk], psn[c_pk], payload[c_pk],
                       sess, msrc, snap, width)
    return _Frames(c_t, rec, cap)


def _encode(kind, mi, t, src, dst, dqp, sz, op, psn, payload, sess, msrc, snap, width):
    """pcap records (16-byte header + frame cut to ``snap``) of the sightings, one row each; the GRE sequence is left 0."""
    n = len(kind)
    data = kind == 0
    ack = kind == 1
    cnp = kind == 2
    the_op = np.where(data, op, np.where(ack, 17, 0x81))
    reth = data & np.isin(the_op, (6, 10))
    pay = np.where(data, payload, 0)
    pad = np.where(data, (4 - pay % 4) % 4, 0)
    ext = np.where(reth, RETH, 0) + np.where(ack, 4, 0) + np.where(cnp, 16, 0)
    udp_len = UDP + BTH + ext + pay + pad + ICRC
    inner_len = IP4 + udp_len
    type3 = (mi % 2) == 1  # alternate mirror types by switch
    sub = type3 & ((sess[mi] % 2) == 1)  # platform sub-header on odd sessions
    erspan_len = np.where(type3, 12 + 8 * sub, 8)
    gre_len = 8  # with a sequence number
    outer_hdr = ETH + IP4 + gre_len
    frame_len = outer_hdr + erspan_len + ETH + inner_len
    cap = np.minimum(frame_len, snap)
    rec = np.zeros((n, 16 + width), np.uint8)
    fr = rec[:, 16:]  # a view: the frame bytes
    # outer Ethernet + IPv4 + GRE(S) from the mirror's address to the collector
    _be(fr, 12, np.full(n, 0x0800), 2)
    fr[:, 14] = 0x45
    _be(fr, 16, frame_len - ETH, 2)
    fr[:, 22] = 64
    fr[:, 23] = 47
    _be(fr, 26, msrc[mi], 4)
    _be(fr, 30, np.full(n, 0x0AFFFFFE), 4)
    _be(fr, 34, np.full(n, 0x1000), 2)
    _be(fr, 36, np.where(type3, 0x22EB, 0x88BE), 2)
    e = 42
    cos_trunc = (3 << 5) | np.where(cap < frame_len, 1 << 2, 0)
    _be(fr, e, np.where(type3, 0x2000, 0x1000) | 0, 2)  # version, VLAN 0
    fr[:, e + 2] = cos_trunc | ((sess[mi] >> 8) & 3)
    fr[:, e + 3] = sess[mi] & 0xFF
    # Type II: index; Type III: timestamp, SGT, frame type 0 (Ethernet), O bit
    _be(fr, e + 4, np.where(type3, (t // 1000) & 0xFFFFFFFF, 7), 4)
    fr[:, e + 11] = np.where(sub, 1, 0)
    i = e + erspan_len  # inner Ethernet starts here (per row)
    rows = np.arange(n)

    def put(off, values, nbytes):
        v = np.asarray(values, np.int64)
        col = i + off
        for b in range(nbytes):
            c = col + b
            ok = c < cap
            fr[rows[ok], c[ok]] = (v[ok] >> (8 * (nbytes - 1 - b))) & 0xFF

    put(12, np.full(n, 0x0800), 2)
    ip = ETH
    put(ip, np.full(n, 0x45), 1)
    put(ip + 2, inner_len, 2)
    put(ip + 8, np.full(n, 64), 1)
    put(ip + 9, np.full(n, 17), 1)
    fwd = ~ack  # ACKs go back from the receiver
    put(ip + 12, np.where(fwd, src, dst), 4)
    put(ip + 16, np.where(fwd, dst, src), 4)
    u = ip + IP4
    put(u, np.full(n, 49152) + (dqp & 0x3FFF), 2)
    put(u + 2, np.full(n, 4791), 2)
    put(u + 4, udp_len, 2)
    b = u + UDP
    put(b, the_op, 1)
    put(b + 1, pad << 4, 1)
    put(b + 2, np.full(n, 0xFFFF), 2)
    put(b + 4, np.where(fwd, dqp, dqp + 0x8000), 4)
    put(b + 8, psn & 0xFFFFFF, 4)
    r = b + BTH
    put(r + 12, np.where(reth, sz, 0), 4)
    # pcap record header: seconds, nanoseconds, captured and original length (little-endian)
    sec, nsec = t // 1_000_000_000, t % 1_000_000_000
    for j, v in enumerate((sec, nsec, cap, frame_len)):
        for bb in range(4):
            rec[:, 4 * j + bb] = (v >> (8 * bb)) & 0xFF
    return rec, cap
