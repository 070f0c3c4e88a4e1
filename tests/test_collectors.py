"""Collectors: real captures pin each layer's decoding; SYNTHETIC RoCE-in-ERSPAN pins the flow assembly."""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from collectors.assemble import FlowAssembler, SwitchMap
from collectors.collect import Collector, FileSink
from collectors.decode import STATUS, decode_packets, packet_frame
from collectors.pcapfile import CaptureFormatError, capture_from_bytes, read_capture
from synthetic.fromtrace import shared_data_dir

SHARED = shared_data_dir()

ERSPAN = SHARED / "erspan"
ROCE = SHARED / "roce" / "pcapplusplus"
needs_shared = pytest.mark.skipif(not ERSPAN.is_dir(), reason=f"{SHARED} not present (PRISM_SHARED_DATA names the real-data directory)")


def frame(path) -> pd.DataFrame:
    return packet_frame(decode_packets(read_capture(path)))


# ----------------------------------------------------------- real captures


def tcpdump_expectations(out_file: Path) -> dict[int, dict]:
    """Per packet number: what tcpdump -v printed of GRE and ERSPAN."""
    packets, current = {}, None
    for line in out_file.read_text().splitlines():
        m = re.match(r"\s*(\d+)\s+\d{4}-\d\d-\d\d ", line)
        if m:
            current = packets.setdefault(int(m.group(1)), {"erspan": 0})
        if current is None:
            continue
        g = re.search(r"GREv0, Flags \[([^\]]*)\](?:, seq (\d+))?", line)
        if g and "gre_seq" not in current:
            current["gre_seq"] = int(g.group(2)) if g.group(2) else -1
        e = re.search(r"erspan type(\d)(?: session (\d+))?(?: (?:vlan|isl) (\d+))?(?: bso \S+)?(?: cos (\d+))?", line)
        if e:
            current["erspan"] = int(e.group(1))
            if e.group(2):
                current["session"] = int(e.group(2))
            if e.group(3):
                current["vlan"] = int(e.group(3))
            if e.group(4):
                current["cos"] = int(e.group(4))
    return packets


@needs_shared
@pytest.mark.parametrize("name", sorted(p.stem for p in (ERSPAN / "tcpdump").glob("*.pcap")))
def test_decode_matches_tcpdump(name):
    df = frame(ERSPAN / "tcpdump" / f"{name}.pcap")
    expected = tcpdump_expectations(ERSPAN / "tcpdump" / f"{name}.out")
    assert len(df) == len(expected) > 0
    checked = 0
    for number, exp in expected.items():
        row = df.iloc[number - 1]
        assert row["erspan"] == exp["erspan"], (number, exp)
        for field in ("session", "vlan", "cos", "gre_seq"):
            if field in exp:
                assert row[field] == exp[field], (number, field, row[field], exp)
                checked += 1
    if name == "various_gre":
        assert (df["erspan"] == 0).all()  # GRE, but never ERSPAN
    if name == "erspan-type-iii-pb-1":
        assert df["status"].tolist() == ["truncated"]  # tcpdump: [|erspan]
    if name == "erspan-type-iii-ft-7":
        assert (df["status"] == "erspan_unknown_frame").all()
    assert checked or name.startswith("erspan-type-i-")  # Type I has no header fields to compare


def zeek_conns(log: Path) -> pd.DataFrame:
    lines = log.read_text().splitlines()
    fields = next(ln for ln in lines if ln.startswith("#fields")).split("\t")[1:]
    rows = [ln.split("\t") for ln in lines if ln and not ln.startswith("#")]
    return pd.DataFrame(rows, columns=fields)


@needs_shared
@pytest.mark.parametrize("kind", ["I", "II", "III"])
def test_inner_packets_and_bytes_match_zeek_conn_log(kind):
    df = frame(ERSPAN / "zeek" / f"erspan{kind}.pcap")
    assert (df["erspan"] == len(kind)).all()
    conns = zeek_conns(ERSPAN / "zeek" / f"core.erspan{kind}__conn.log")
    assert len(conns) >= 1
    inner = df[df["ip_proto"] >= 0]
    pair = inner.apply(lambda r: tuple(sorted((r["src"], r["dst"]))), axis=1)
    for _, c in conns.iterrows():
        sel = inner[pair == tuple(sorted((c["id.orig_h"], c["id.resp_h"])))]
        assert len(sel) == int(c["orig_pkts"]) + int(c["resp_pkts"])
        assert sel["ip_len"].sum() == int(c["orig_ip_bytes"]) + int(c["resp_ip_bytes"])
    assert inner["src"].nunique() >= 2


@needs_shared
def test_other_real_encapsulations():
    # Zeek's "erspan.pcap" is plain GRE Ethernet bridging (0x6558): no ERSPAN
    assert (frame(ERSPAN / "zeek" / "erspan.pcap")["erspan"] == 0).all()
    dot1q = frame(ERSPAN / "zeek" / "tunnels__gre-erspan3-dot1q.pcap")
    assert (dot1q["erspan"] == 3).all() and (dot1q["inner_vlan"] == 10).all() and (dot1q["ip_proto"] == 1).all()
    ark = frame(ERSPAN / "arkime" / "gre-erspan.pcap")
    assert (ark["erspan"] == 2).all() and (ark["vlan"] == 23).all() and (ark["session"] == 100).all()
    vx = frame(ERSPAN / "arkime" / "gre-erspan-vxlan.pcap")
    assert (vx["dport"] == 4790).all() and (vx["status"] == "non_roce").all()  # VXLAN-GPE (4790) inside ERSPAN is not RoCE (4791)


@needs_shared
def test_real_soft_roce_frame_fields():
    row = frame(ROCE / "InfiniBandPacket.derived.pcap").iloc[0]
    assert row["status"] == "roce_read_request"
    assert (row["src"], row["dst"], row["sport"], row["dport"]) == ("192.168.56.129", "192.168.56.131", 57236, 4791)
    assert (row["opcode"], row["dqp"], row["psn"], row["ackreq"]) == (12, 0x11, 5557091, 1)
    assert row["reth_len"] == 65536 and row["icrc"] == 0x08C6154A
    # and the same from the .dat hex dump, through an in-memory pcap
    hexdump = "".join(re.findall(r"[0-9a-fA-F]+", (ROCE / "InfiniBandPacket.dat").read_text()))
    raw = bytes.fromhex(hexdump)
    pcap = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + struct.pack("<IIII", 1, 0, len(raw), len(raw)) + raw
    again = packet_frame(decode_packets(capture_from_bytes(pcap))).iloc[0]
    assert (again["opcode"], again["dqp"], again["psn"], again["reth_len"], again["icrc"]) == (12, 0x11, 5557091, 65536, 0x08C6154A)


# ---------------------------------------------------------- synthetic RoCE


@pytest.fixture(scope="module")
def synthetic_capture(tiny_cluster, tmp_path_factory):
    from synthetic.pcapgen import write_roce_pcap

    d = tmp_path_factory.mktemp("pcap")
    flows = tiny_cluster.flows
    # a slice with DP and PP traffic, storage flows and a few hundred messages, kept small for CI
    flows = flows.iloc[:: max(1, len(flows) // 600)].head(600)
    info = write_roce_pcap(flows, d / "roce.synthetic.pcap", seed=3, loss=0.05)
    (d / "switches.yaml").write_text(yaml.safe_dump(info["switch_map"]))
    return d, info


def _match(got: pd.DataFrame, expected: pd.DataFrame) -> pd.DataFrame:
    got = got.astype({"src": str, "dst": str, "switches": str})
    m = expected.merge(got, on=["src", "dst", "dst_qp", "start_ns"], how="outer", indicator=True, suffixes=("_exp", ""))
    return m


def test_synthetic_flows_equal_the_generators(synthetic_capture):
    d, info = synthetic_capture
    c = Collector(FileSink(d / "out.parquet"), SwitchMap.load(d / "switches.yaml"))
    c.add_file(d / "roce.synthetic.pcap")
    c.close()
    got = pd.read_parquet(d / "out.parquet")
    m = _match(got, info["expected"])
    assert (m["_merge"] == "both").all(), m["_merge"].value_counts()
    assert (m["size"] == m["size_exp"]).all()  # sizes exact, from IP/UDP lengths and RETH, through truncated mirrors
    assert (m["switches"] == m["switches_exp"]).all()  # mirror copies merged into one flow, path in order
    assert (m["start_ns"] + m["duration_ns"] == m["end_ns"]).all()  # ends exact, retransmissions included
    s = c.stats
    assert s.packets["roce_ack"] == info["acks"] and s.packets["roce_cnp"] == info["cnps"]
    assert sum(s.cnp_by_switch.values()) == info["cnps"]
    assert info["lossy_messages"] > 0 and s.counts["retransmitted_packets"] > 0
    assert s.counts["incomplete_messages"] == 0 and not s.unmapped_mirrors
    # what the collector writes, prism reads with no rejects
    from prism.ingest.records import RejectCounter, validate_flows

    rej = RejectCounter()
    valid = validate_flows(got, rej)
    assert len(valid) == len(got) and rej.total == 0


def test_batch_boundaries_do_not_change_the_flows(synthetic_capture):
    d, info = synthetic_capture
    outs = []
    for batch in (1 << 18, 4099):
        c = Collector(FileSink(d / f"b{batch}.parquet"), SwitchMap.load(d / "switches.yaml"), batch_packets=batch)
        c.add_file(d / "roce.synthetic.pcap")
        c.close()
        outs.append(pd.read_parquet(d / f"b{batch}.parquet"))
        assert c.stats.counts["incomplete_messages"] == 0
    pd.testing.assert_frame_equal(outs[0], outs[1])


def _to_pcapng(cap, big_endian=False, tsresol=9, ticks=None) -> bytes:
    """The capture as pcapng; ``ticks`` (unsigned 64-bit) replace its timestamps."""
    e = ">" if big_endian else "<"
    out = [struct.pack(e + "IIIHHq", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1) + struct.pack(e + "I", 28)]
    opt = struct.pack(e + "HHB3x", 9, 1, tsresol) + struct.pack(e + "HH", 0, 0)  # if_tsresol (9: ns), end of options
    idb_len = 20 + len(opt)
    out.append(struct.pack(e + "IIHHI", 1, idb_len, 1, 0, 0) + opt + struct.pack(e + "I", idb_len))
    buf = bytes(cap.buf)
    stamps = cap.ts_ns.tolist() if ticks is None else [int(t) for t in ticks]
    for off, cl, ol, ts in zip(cap.offset.tolist(), cap.caplen.tolist(), cap.origlen.tolist(), stamps):
        data = buf[off:off + cl]
        padded = data + b"\0" * (-len(data) % 4)
        blen = 32 + len(padded)
        out.append(struct.pack(e + "IIIIIII", 6, blen, 0, ts >> 32, ts & 0xFFFFFFFF, cl, ol) + padded + struct.pack(e + "I", blen))
    return b"".join(out)


@pytest.mark.parametrize("big_endian", [False, True])
def test_pcapng_reads_like_pcap(synthetic_capture, big_endian):
    d, _ = synthetic_capture
    cap = read_capture(d / "roce.synthetic.pcap")
    ng = capture_from_bytes(_to_pcapng(cap, big_endian))
    assert ng.fmt == "pcapng" and len(ng) == len(cap)
    assert (ng.ts_ns == cap.ts_ns).all() and (ng.caplen == cap.caplen).all() and (ng.origlen == cap.origlen).all()
    a, b = decode_packets(cap), decode_packets(ng)
    for field in ("status", "psn", "dqp", "payload", "session", "src_lo"):
        assert (a[field] == b[field]).all(), field


def test_impossible_pcapng_clocks_are_errors_or_counted(synthetic_capture, tmp_path):
    d, _ = synthetic_capture
    cap = read_capture(d / "roce.synthetic.pcap")
    # a resolution no 64-bit clock counts in: a format error naming the option, not a ZeroDivisionError
    for res in (19, 73, 127, 0x80 | 64):
        with pytest.raises(CaptureFormatError, match="if_tsresol"):
            capture_from_bytes(_to_pcapng(cap, tsresol=res))
    (tmp_path / "res.pcapng").write_bytes(_to_pcapng(cap, tsresol=73))
    c = Collector(FileSink(tmp_path / "r.jsonl"))
    assert c.add_file(tmp_path / "res.pcapng") == 0 and c.stats.counts["bad_files"] == 1
    c.close()
    # corrupt timestamps on some packets: their messages are counted and dropped, the rest kept exact
    clean = Collector(FileSink(tmp_path / "clean.parquet"))
    clean.add_file(d / "roce.synthetic.pcap")
    clean.close()
    ticks = cap.ts_ns.astype(np.uint64).copy()
    rng = np.random.default_rng(0)
    hit = rng.choice(len(ticks), 20, replace=False)
    ticks[hit[:10]] = np.uint64(0xFFFF_FFFF_0000_0000)  # reads as a negative int64: before 1970
    ticks[hit[10:]] += np.uint64(36 * 10**15)  # 10 hours later
    (tmp_path / "clock.pcapng").write_bytes(_to_pcapng(cap, ticks=ticks))
    c = Collector(FileSink(tmp_path / "clock.parquet"))
    c.add_file(tmp_path / "clock.pcapng")
    c.close()
    got, want = pd.read_parquet(tmp_path / "clock.parquet"), pd.read_parquet(tmp_path / "clean.parquet")
    bad = c.stats.counts["bad_timestamp_messages"]
    # a corrupt packet costs its own message (dated impossibly, or cut into pieces that never complete)
    # and at most the neighbour of the same connection it lands amid
    assert 0 < bad <= len(want) - len(got) <= 2 * 20 and len(got) == c.stats.counts["messages"]
    assert (got["start_ns"] >= 0).all() and (got["duration_ns"] < 60 * 10**9).all()
    assert len(got.merge(want, how="inner")) == len(got)  # the kept flows are the clean run's, unchanged


@pytest.mark.parametrize("doc, match", [({"sessions": [1, 2]}, "'sessions' must be a mapping"),
                                        ({"sources": "10.0.0.1"}, "'sources' must be a mapping"),
                                        ({"sessions": {"leaf": "x"}}, "session ids")])
def test_switch_map_shapes_are_checked(tmp_path, doc, match):
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match=match):
        SwitchMap.load(tmp_path / "m.yaml")


def test_big_endian_and_microsecond_pcap():
    pkt = bytes(14) + bytes([0x08, 0x06]) + bytes(28)  # an ARP-sized frame: not IP
    raw_le = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + struct.pack("<IIII", 10, 5, len(pkt), len(pkt)) + pkt
    raw_be = struct.pack(">IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + struct.pack(">IIII", 10, 5, len(pkt), len(pkt)) + pkt
    for raw in (raw_le, raw_be):
        cap = capture_from_bytes(raw)
        assert cap.ts_ns.tolist() == [10_000_005_000] and cap.linktype.tolist() == [1]


def test_cut_captures_keep_whole_packets_and_bad_files_are_counted(synthetic_capture, tmp_path):
    d, _ = synthetic_capture
    data = (d / "roce.synthetic.pcap").read_bytes()
    whole = read_capture(d / "roce.synthetic.pcap")
    cut = capture_from_bytes(data[: len(data) - 50])
    assert len(cut) == len(whole) - 1 and cut.truncated_at > 0
    with pytest.raises(CaptureFormatError, match="not a pcap"):
        capture_from_bytes(b"hello, world, this is text")
    (tmp_path / "notes.pcap").write_text("not a capture")
    c = Collector(FileSink(tmp_path / "o.jsonl"))
    assert c.add_file(tmp_path / "notes.pcap") == 0
    c.close()
    assert c.stats.counts["bad_files"] == 1 and "notes.pcap" in c.bad_files[0]


def test_unmapped_mirrors_are_named_and_counted(synthetic_capture):
    d, _ = synthetic_capture
    asm = FlowAssembler(SwitchMap())
    flows = pd.concat([asm.add(decode_packets(read_capture(d / "roce.synthetic.pcap"))), asm.finish()])
    assert flows["switches"].astype(str).str.startswith("mirror-10.255.").all()
    assert asm.stats.unmapped_mirrors


def test_psn_wraps_and_lost_middles_keep_sizes_exact():
    # one SEND of 5 packets with PSNs 2^24-2 .. 2, the middle one lost on every mirror
    psns = [(1 << 24) - 2, (1 << 24) - 1, 0, 1, 2]
    ops = [0, 1, 1, 1, 2]
    payloads = [4096, 4096, 4096, 4096, 1000]
    frames = [(1_000 + 10 * i, _roce_frame(op, psn, pay)) for i, (op, psn, pay) in enumerate(zip(ops, psns, payloads)) if i != 2]
    cap = capture_from_bytes(_pcap(frames))
    asm = FlowAssembler()
    flows = pd.concat([asm.add(decode_packets(cap)), asm.finish()])
    assert len(flows) == 1 and flows["size"].iloc[0] == 4 * 4096 + 1000
    assert asm.stats.counts["lost_packets"] == 1 and flows["duration_ns"].iloc[0] == 40


def _roce_frame(opcode: int, psn: int, payload: int, src="10.0.0.1", dst="10.0.0.2", qp=0x42, snap=96) -> tuple[bytes, int]:
    """A plain (host-side) RoCEv2 frame, truncated to ``snap`` bytes; returns (bytes, wire length)."""
    import ipaddress

    pad = (4 - payload % 4) % 4
    udp_len = 8 + 12 + payload + pad + 4
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0, 64, 17, 0,
                     ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed)
    udp = struct.pack(">HHHH", 50000, 4791, udp_len, 0)
    bth = struct.pack(">BBHII", opcode, pad << 4, 0xFFFF, qp, psn)
    wire = bytes(12) + b"\x08\x00" + ip + udp + bth + bytes(payload + pad + 4)
    return wire[:snap], len(wire)


def _pcap(frames) -> bytes:
    out = [struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)]
    for ts, (data, wire_len) in frames:
        out.append(struct.pack("<IIII", ts // 10**9, ts % 10**9, len(data), wire_len) + data)
    return b"".join(out)


# ------------------------------------------------------------------ fuzzing


def test_fuzz_decoder_never_crashes_on_random_or_mutated_packets(synthetic_capture):
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    d, _ = synthetic_capture
    seeds = []
    cap = read_capture(d / "roce.synthetic.pcap")
    buf = bytes(cap.buf)
    for i in range(0, len(cap), max(1, len(cap) // 20)):
        seeds.append(buf[cap.offset[i]:cap.offset[i] + cap.caplen[i]])
    for f in sorted(ERSPAN.glob("*/*.pcap")) if ERSPAN.is_dir() else []:
        c = read_capture(f)
        b = bytes(c.buf)
        seeds += [b[o:o + n] for o, n in zip(c.offset[:5].tolist(), c.caplen[:5].tolist())]

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, len(seeds) - 1), st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=8),
           st.integers(0, 300), st.sampled_from([1, 101, 113, 276, 228, 147]))
    def mutate(i, flips, cut, linktype):
        pkt = bytearray(seeds[i])
        for pos, val in flips:
            if pos < len(pkt):
                pkt[pos] = val
        pkt = bytes(pkt[: max(cut, 0)] if cut < len(pkt) else pkt)
        raw = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype) + struct.pack("<IIII", 1, 0, len(pkt), 65535) + pkt
        t = decode_packets(capture_from_bytes(raw))
        assert len(t) == 1 and 0 <= t["status"][0] < len(STATUS)
        FlowAssembler().add(t)

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.binary(max_size=600))
    def random_files(data):
        for head in (b"", struct.pack("<I", 0xA1B2C3D4), struct.pack("<I", 0x0A0D0D0A)):
            try:
                cap = capture_from_bytes(head + data)
            except CaptureFormatError:
                continue
            decode_packets(cap)

    mutate()
    random_files()
    assert hypothesis.__version__


# ----------------------------------------------------------------------- CLI


def test_prism_collect_cli_writes_jsonl_and_stats(synthetic_capture, tmp_path, capsys):
    from prism.cli import main

    d, info = synthetic_capture
    rc = main(["collect", str(d), "--out", str(tmp_path / "flows.jsonl"), "--switch-map", str(d / "switches.yaml"),
               "--stats", str(tmp_path / "stats.json")])
    assert rc == 0
    text = capsys.readouterr().out
    assert "flows to" in text and "CNPs" in text
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["flows"] == len(info["expected"]) and stats["packets_by_status"]["roce_cnp"] == info["cnps"]
    lines = (tmp_path / "flows.jsonl").read_text().splitlines()
    assert len(lines) == len(info["expected"]) and {"start_ns", "src", "dst", "size", "switches"} <= set(json.loads(lines[0]))
    assert main(["collect", str(d), "--out", str(tmp_path / "x.txt")]) == 2
    assert main(["collect", str(tmp_path / "missing.pcap"), "--out", str(tmp_path / "x.csv")]) == 2


def test_collect_to_kafka_in_the_daemons_format(synthetic_capture, tmp_path):
    from kafka import KafkaConsumer

    from prism.cli import main
    from prism.ingest.messages import decode_message
    from prism.ingest.records import RejectCounter
    from prism.serve.broker import LocalBroker

    d, info = synthetic_capture
    with LocalBroker() as broker:
        rc = main(["collect", str(d / "roce.synthetic.pcap"), "--out", f"kafka://{broker.bootstrap}/flows", "--quiet"])
        assert rc == 0
        consumer = KafkaConsumer("flows", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                                 consumer_timeout_ms=3000, enable_auto_commit=False)
        frames, rejects = [], RejectCounter()
        for msg in consumer:
            frames.append(decode_message(msg.value, rejects, headers=msg.headers))
        consumer.close()
    got = pd.concat(frames)
    assert rejects.total == 0 and len(got) == len(info["expected"])
    assert np.array_equal(np.sort(got["size"].to_numpy()), np.sort(info["expected"]["size"].to_numpy()))


def test_follow_reads_new_captures_serves_metrics_and_stops_on_sigterm(synthetic_capture, tmp_path):
    import shutil
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from prism.serve.broker import free_port

    d, info = synthetic_capture
    watch = tmp_path / "captures"
    watch.mkdir()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "collectors", "--follow", str(watch), "--settle", "0.3", "--out", str(tmp_path / "f.jsonl"),
                             "--switch-map", str(d / "switches.yaml"), "--web.listen-address", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        shutil.copy(d / "roce.synthetic.pcap", watch / "rot-0001.pcap")  # a rotated file appears
        (watch / "notes.txt").write_text("not a capture suffix: ignored")
        # until every packet of the file is counted (a wait on a condition, the deadline only for a hang): the last
        # messages stay open until the follower stops (the next file may carry more of their packets), so the
        # messages counter is whole only after SIGTERM, the packets counter as soon as the file is read
        deadline, text, total = time.time() + 120, "", {}
        while time.time() < deadline and total.get("prism_collector_packets", 0) < info["packets"]:
            time.sleep(0.2)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
            total = {f.name: sum(s.value for s in f.samples) for f in text_string_to_metric_families(text)}
        assert total.get("prism_collector_packets") == info["packets"], text
        assert f'prism_collector_packets_total{{status="roce_cnp"}} {float(info["cnps"])}' in text
        assert 0 < total["prism_collector_messages"] <= len(info["expected"])
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "rot-0001.pcap" in err
    assert len((tmp_path / "f.jsonl").read_text().splitlines()) == len(info["expected"])


def test_synth_pcap_collects_back_to_the_clusters_flows(tmp_path, capsys):
    """``prism synth --pcap`` then ``prism collect``: one flow per cluster flow, same endpoints, start, size and mirror points."""
    from prism.cli import main

    out, pcap = tmp_path / "cluster", tmp_path / "cluster" / "c.synthetic.pcap"  # the directory is made
    assert main(["synth", "--preset", "tiny", "--duration", "0.5", "--out", str(out), "--pcap", str(pcap), "--pcap.max-packets", "4"]) == 0
    err = capsys.readouterr().err
    assert "SYNTHETIC RoCEv2-in-ERSPAN" in err and "(100%)" in err  # progress on stderr
    assert main(["collect", str(pcap), "--switch-map", str(out / "switch_map.yaml"), "--out", str(tmp_path / "back.parquet"),
                 "--stats", str(tmp_path / "stats.json"), "--quiet"]) == 0
    flows = pd.read_parquet(out / "flows.parquet").astype({"src": str, "dst": str, "switches": str})
    got = pd.read_parquet(tmp_path / "back.parquet").astype({"src": str, "dst": str, "switches": str})
    assert len(got) == len(flows) > 10_000  # every flow has a switch on its path: each is one message, however many packets it lost
    m = flows.merge(got, on=["src", "dst", "start_ns"], how="outer", indicator=True, suffixes=("_exp", ""))
    assert (m["_merge"] == "both").all(), m["_merge"].value_counts()
    assert (m["size"] == m["size_exp"]).all()  # exact, though at most 4 packets of each message were written
    # the mirror points are the path's first two switches; the end is the last packet's last sighting (a mirror
    # 1 us later, a retransmission later still)
    assert (m["switches"] == m["switches_exp"].str.split("|").str[:2].str.join("|")).all()
    assert (m["duration_ns"] >= m["duration_ns_exp"]).all()
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["incomplete_messages"] == 0 and stats["lost_packets"] > 0  # the middle packets not written count as lost


@pytest.mark.parametrize("value, match", [("", "expected a file name"), (".", "is a directory"), ("f/x.pcap", "is a file, not a directory")])
def test_synth_pcap_bad_paths_exit_2_before_any_work(tmp_path, monkeypatch, capsys, value, match):
    from prism.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit) as e:
        main(["synth", "--preset", "tiny", "--out", "o", "--pcap", value])
    assert e.value.code == 2 and match in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_pcap_chunks_and_packet_cap_keep_the_flows_exact(tiny_cluster, tmp_path):
    """Small chunks (many merges of held-over frames) and a cap of 3 packets: the collector's flows are the generator's."""
    from synthetic.pcapgen import write_roce_pcap

    flows = tiny_cluster.flows.iloc[:3000]
    info = write_roce_pcap(flows, tmp_path / "c.pcap", seed=5, loss=0.05, max_packets=3, chunk_packets=777)
    assert info["capped_messages"] > 0 and info["lossy_messages"] > 0
    c = Collector(FileSink(tmp_path / "o.parquet"), SwitchMap(**info["switch_map"]))
    c.add_file(tmp_path / "c.pcap")
    c.close()
    m = _match(pd.read_parquet(tmp_path / "o.parquet"), info["expected"])
    assert (m["_merge"] == "both").all() and len(m) == len(flows)
    assert (m["size"] == m["size_exp"]).all() and (m["switches"] == m["switches_exp"]).all()
    assert (m["start_ns"] + m["duration_ns"] == m["end_ns"]).all()
    assert c.stats.counts["lost_packets"] == info["skipped_packets"] and c.stats.counts["incomplete_messages"] == 0
    assert (np.diff(read_capture(tmp_path / "c.pcap").ts_ns) >= 0).all()  # in time order across chunks
    with pytest.raises(ValueError, match="at least 2"):
        write_roce_pcap(flows, tmp_path / "d.pcap", max_packets=1)
