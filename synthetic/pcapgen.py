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
the caller (``*.synthetic.pcap``).
"""
from __future__ import annotations

import ipaddress
import struct
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
                    snap: int = 256, ack_every: int = 8) -> dict:
    """Write ``flows`` as an ERSPAN-mirrored RoCEv2 pcap (nanosecond timestamps).

    Returns a dict with the switch map (``{"sessions": {id: name}}``), the
    expected flows (``expected``: start, end, size, path of each message as
    the collector should see it) and packet counts.
    """
    rng = np.random.default_rng(seed)
    f = flows.reset_index(drop=True)
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
    # queue pairs: one per (src, dst); PSNs continue per QP, some start just below the 2^24 wrap
    pair = pd.factorize(pd.Series(src * (1 << 32) + dst))[0]
    dqp = 0x100 + pair
    order = np.lexsort((start, pair))
    cum = np.zeros(n_f, np.int64)
    csum = np.cumsum(npk[order]) - npk[order]
    pair_o = pair[order]
    first_of_pair = np.maximum.accumulate(np.where(np.r_[True, pair_o[1:] != pair_o[:-1]], np.arange(n_f), 0))
    cum[order] = csum - csum[first_of_pair]
    n_pairs = pair.max() + 1
    psn0 = np.where(rng.random(n_pairs) < 0.3, (1 << 24) - rng.integers(1, 64, n_pairs), rng.integers(0, 1 << 20, n_pairs))
    first_psn = (psn0[pair] + cum) % (1 << 24)
    # packets of every message
    msg = np.repeat(np.arange(n_f), npk)
    k = np.arange(len(msg)) - np.repeat(np.cumsum(npk) - npk, npk)
    n_of = npk[msg]
    t = start[msg] + np.where(n_of > 1, dur[msg] * k // np.maximum(n_of - 1, 1), 0)
    payload = np.where(k < n_of - 1, PMTU, size[msg] - PMTU * (n_of - 1))
    is_w = write[msg]
    op = np.where(n_of == 1, np.where(is_w, 10, 4),
                  np.where(k == 0, np.where(is_w, 6, 0), np.where(k == n_of - 1, np.where(is_w, 8, 2), np.where(is_w, 7, 1))))
    psn = (first_psn[msg] + k) % (1 << 24)
    # go-back-N: packet k lost between the mirrors, k..last resent rto later
    lossy = (rng.random(n_f) < loss) & (npk >= 3)
    lost_k = np.where(lossy, rng.integers(1, np.maximum(npk, 2)), -1)
    lost_here = lossy[msg] & (k == lost_k[msg])
    resend = lossy[msg] & (k >= lost_k[msg])
    last_t = start + np.where(npk > 1, dur, 0)
    # sightings: (packet, mirror, time)
    pk = np.arange(len(msg))
    rows_pk = [pk, pk[(m2[msg] >= 0) & ~lost_here]]
    rows_mirror = [m1[msg], m2[msg][(m2[msg] >= 0) & ~lost_here]]
    rows_t = [t, t[(m2[msg] >= 0) & ~lost_here] + 1000]
    rt = pk[resend]
    t_re = last_t[msg[rt]] + rto_ns + (k[rt] - lost_k[msg[rt]]) * 100
    rows_pk += [rt, rt[m2[msg[rt]] >= 0]]
    rows_mirror += [m1[msg[rt]], m2[msg[rt]][m2[msg[rt]] >= 0]]
    rows_t += [t_re, t_re[m2[msg[rt]] >= 0] + 1000]
    s_pk = np.concatenate(rows_pk)
    s_mi = np.concatenate(rows_mirror)
    s_t = np.concatenate(rows_t)
    keep = s_mi >= 0
    s_pk, s_mi, s_t = s_pk[keep], s_mi[keep], s_t[keep]
    # expected collector view of every message
    end = np.where(lossy, last_t + rto_ns + (npk - 1 - lost_k) * 100 + np.where(m2 >= 0, 1000, 0), last_t + np.where(m2 >= 0, 1000, 0))
    end = np.where(m1 >= 0, end, -1)
    msg_path = [("|".join(x for x in (names[a] if a >= 0 else "", names[b] if b >= 0 else "") if x)) for a, b in zip(m1, m2)]
    expected = pd.DataFrame({"start_ns": start, "end_ns": end, "src": f["src"].astype(str), "dst": f["dst"].astype(str),
                             "size": size, "switches": msg_path, "dst_qp": dqp})
    expected = expected[m1 >= 0].reset_index(drop=True)
    # control packets: an ACK from the receiver every ack_every data packets, a CNP now and then
    ack = pk[(k % ack_every == ack_every - 1) | (k == n_of - 1)]
    cnp = pk[rng.random(len(pk)) < 0.002]
    data_rows = len(s_pk)
    c_pk = np.concatenate([s_pk, ack, cnp])
    c_mi = np.concatenate([s_mi, m1[msg[ack]], m1[msg[cnp]]])
    c_t = np.concatenate([s_t, t[ack] + 2000, t[cnp] + 3000])
    kind = np.concatenate([np.zeros(data_rows, np.int8), np.ones(len(ack), np.int8), np.full(len(cnp), 2, np.int8)])
    ok = c_mi >= 0
    c_pk, c_mi, c_t, kind = c_pk[ok], c_mi[ok], c_t[ok], kind[ok]
    o = np.argsort(c_t, kind="stable")
    c_pk, c_mi, c_t, kind = c_pk[o], c_mi[o], c_t[o], kind[o]
    _write(path, c_pk, c_mi, c_t, kind, msg, op, psn, payload, size, src, dst, dqp, sess, msrc, snap, is_w)
    return {"switch_map": {"sessions": {int(table[n][0]): n for n in names}}, "expected": expected,
            "packets": int(len(c_t)), "data_sightings": int((kind == 0).sum()), "acks": int((kind == 1).sum()),
            "cnps": int((kind == 2).sum()), "lossy_messages": int(lossy[m1 >= 0].sum())}


def _write(path, pk, mi, t, kind, msg, op, psn, payload, size, src, dst, dqp, sess, msrc, snap, is_w):
    n = len(pk)
    m = msg[pk]
    data = kind == 0
    ack = kind == 1
    cnp = kind == 2
    the_op = np.where(data, op[pk], np.where(ack, 17, 0x81))
    reth = data & np.isin(the_op, (6, 10))
    pay = np.where(data, payload[pk], 0)
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
    W = int(cap.max())
    fr = np.zeros((n, W), np.uint8)
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
    _be(fr, 38, np.arange(n), 4)
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
    put(ip + 12, np.where(fwd, src[m], dst[m]), 4)
    put(ip + 16, np.where(fwd, dst[m], src[m]), 4)
    u = ip + IP4
    put(u, np.full(n, 49152) + (dqp[m] & 0x3FFF), 2)
    put(u + 2, np.full(n, 4791), 2)
    put(u + 4, udp_len, 2)
    b = u + UDP
    put(b, the_op, 1)
    put(b + 1, pad << 4, 1)
    put(b + 2, np.full(n, 0xFFFF), 2)
    put(b + 4, np.where(fwd, dqp[m], dqp[m] + 0x8000), 4)
    put(b + 8, psn[pk] & 0xFFFFFF, 4)
    r = b + BTH
    sz = size[m]
    put(r + 12, np.where(reth, sz, 0), 4)
    # pcap records: 16-byte header + captured bytes
    rec = np.zeros((n, 16 + W), np.uint8)
    sec, nsec = t // 1_000_000_000, t % 1_000_000_000
    for j, v in enumerate((sec, nsec, cap, frame_len)):
        for bb in range(4):
            rec[:, 4 * j + bb] = (v >> (8 * bb)) & 0xFF
    rec[:, 16:] = fr
    keep = np.arange(16 + W)[None, :] < (16 + cap)[:, None]
    body = rec[keep]
    with open(path, "wb") as fh:
        # nanosecond pcap, version 2.4, Ethernet
        fh.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
        fh.write(body.tobytes())
