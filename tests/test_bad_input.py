"""Hostile and mistaken input: each is a clear error (exit 2, naming the flag, file, line or field) or,
for one bad record, a row skipped and counted by reason. Never a traceback, never accepted silently.

One test per class of case found by an attacker / new-user sweep (each failed before its fix), then a
property test over the flow readers' input: random bytes and mutated valid files of every format.
"""
import gzip
import io
import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from prism.cli import main
from prism.ingest.formats import parquet as parquet_format
from prism.ingest.readers import FlowReader
from prism.ingest.records import MAX_DURATION_NS, MAX_SIZE, MAX_START_NS, FlowFormatError, RejectCounter, validate_flows
from prism.ingest.topology import Topology

INT64_MAX = 2**63 - 1
GOOD = {"start_ns": 1767225600000000001, "duration_ns": 1000, "src": "10.0.0.1", "dst": "10.0.0.2", "size": 4096, "switches": "leaf-a"}


def good_line(**changes) -> str:
    return json.dumps({**GOOD, **changes})


def read_all(path, **kw) -> tuple[int, RejectCounter, FlowReader]:
    rejects = RejectCounter()
    reader = FlowReader(str(path), rejects=rejects, **kw)
    kept = sum(len(c) for c in reader)
    return kept, rejects, reader


@pytest.fixture
def topology_csv(tmp_path):
    p = tmp_path / "topology.csv"
    p.write_text("ip,server\n10.0.0.1,s0\n10.0.0.2,s1\n")
    return p


# ---------------------------------------------------------------- JSON Lines: one bad line, one count


@pytest.mark.parametrize("first", [False, True], ids=["after-a-good-line", "first-line"])
def test_a_json_line_nested_100k_deep_is_one_malformed_row(tmp_path, first):
    """json.loads raised RecursionError out of the slow path (exit 1, a traceback)."""
    deep = "[" * 100_000 + "]" * 100_000
    lines = [deep, good_line()] if first else [good_line(), deep, good_line()]
    p = tmp_path / "deep.jsonl"
    p.write_text("\n".join(lines) + "\n")
    kept, rejects, reader = read_all(p)
    assert (kept, rejects.as_dict()) == (len(lines) - 1, {"malformed_row": 1})
    assert reader.rows_read == len(lines)
    assert rejects.examples["malformed_row"] == [f"{p}:line {1 if first else 2}"]


@pytest.mark.parametrize("field, value, reason", [
    ("src", "\\ud800", "bad_address"),
    ("dst", "10.0.0.\\udfff", "bad_address"),
    ("size", "\\ud800", "bad_number"),
    ("switches", "leaf-\\ud800", "bad_switches"),
    ("switches", ["leaf-a", "\\ud800"], "bad_switches"),
])
def test_a_lone_surrogate_costs_its_row_not_the_file(tmp_path, field, value, reason):
    """"\\ud800" is valid JSON but no Unicode text: the whole file failed with UnicodeEncodeError (exit 2)."""
    bad = good_line(**{field: value}).replace("\\\\ud800", "\\ud800").replace("\\\\udfff", "\\udfff")
    p = tmp_path / "surrogate.jsonl"
    p.write_text("\n".join([good_line(), bad, good_line()]) + "\n")
    kept, rejects, _ = read_all(p)
    assert (kept, rejects.as_dict()) == (2, {reason: 1})
    assert rejects.examples[reason][0].startswith(f"{p}:line 2: {field}=")


@pytest.mark.parametrize("text", ["null\n", " null\n" + good_line() + "\n", "nullx\n"])
def test_a_null_line_is_a_malformed_row_not_a_crash(tmp_path, text):
    """pyarrow's JSON reader crashed the process (SIGSEGV) on a block whose first row is `null`: one Kafka message killed the daemon."""
    from prism.ingest.messages import decode_messages

    rejects = RejectCounter()
    frames = decode_messages([(text.encode(), [], "t[0]@0"), (good_line().encode(), [], "t[0]@1")], rejects, "t[0]@0-1")
    assert sum(map(len, frames)) == 1 + text.count("start_ns") and rejects.as_dict() == {"malformed_row": 1}
    p = tmp_path / "null.jsonl"
    p.write_text(good_line() + "\n" + text)
    kept, rejects, _ = read_all(p)
    assert (kept, rejects.as_dict()) == (1 + text.count("start_ns"), {"malformed_row": 1})


# ---------------------------------------------------------------- rows no physical flow can be


def frame(**cols) -> pd.DataFrame:
    n = max([len(v) for v in cols.values() if isinstance(v, list)] + [1])
    return pd.DataFrame({k: v if isinstance(v, list) else [v] * n for k, v in {**GOOD, **cols}.items()})


@pytest.mark.parametrize("cols, field", [
    ({"start_ns": INT64_MAX, "duration_ns": INT64_MAX, "size": INT64_MAX}, "start_ns"),
    ({"start_ns": MAX_START_NS + 1}, "start_ns"),
    ({"duration_ns": MAX_DURATION_NS + 1}, "duration_ns"),
    ({"duration_ns": INT64_MAX - GOOD["start_ns"] + 1}, "duration_ns"),  # end = start + duration would overflow int64
    ({"size": MAX_SIZE + 1}, "size"),
    ({"size": INT64_MAX}, "size"),
])
def test_a_flow_past_physical_bounds_is_rejected_with_the_field(cols, field):
    """Such a row was valid (exit 0) and overflowed what was computed from it later."""
    rejects = RejectCounter()
    assert len(validate_flows(frame(**cols), rejects, "f.csv", first_line=2)) == 0
    assert rejects.as_dict() == {"out_of_range": 1}
    assert rejects.examples["out_of_range"][0].startswith(f"f.csv:line 2: {field}=")


def test_the_bounds_themselves_are_valid_and_so_is_every_synthetic_flow(tiny_cluster):
    edge = frame(start_ns=[MAX_START_NS, 0], duration_ns=[MAX_DURATION_NS, 0], size=[MAX_SIZE, 0])
    assert len(validate_flows(edge, RejectCounter())) == 2
    rejects = RejectCounter()
    assert len(validate_flows(tiny_cluster.flows, rejects)) == len(tiny_cluster.flows) and rejects.total == 0


def test_the_int64_max_row_is_counted_in_a_replay(tmp_path, topology_csv, capsys):
    p = tmp_path / "big.csv"
    p.write_text(f"start_ns,duration_ns,src,dst,size,switches\n{INT64_MAX},{INT64_MAX},10.0.0.1,10.0.0.2,{INT64_MAX},leaf-a\n")
    assert main(["replay", str(p), "--topology", str(topology_csv), "--out", str(tmp_path / "o"), "--no-progress", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["rejected_by_reason"] == {"out_of_range": 1}


# ---------------------------------------------------------------- flags: a bound and a clear error, before any work


@pytest.fixture
def a_file(tmp_path):
    p = tmp_path / "a-file"
    p.write_text("x")
    return p


@pytest.mark.parametrize("argv, match", [
    (["replay", "F", "--topology", "T", "--out", "O", "--chunk-rows", "99999999999999999999"], "--chunk-rows: must be <="),
    (["replay", "F", "--topology", "T", "--out", "{file}"], "--out: '{file}' is a file, not a directory"),
    (["replay", "F", "--topology", "T", "--out", "{file}/sub"], "--out: '{file}/sub' cannot be made"),
    (["replay", "F", "--topology", "T", "--out", ""], "--out: expected a directory, got ''"),
    (["replay", "F", "--topology", "T", "--out", "O", "--switch-window", "1e300"], "--switch-window: must be <= 604800 (7 days)"),
    (["synth", "--out", "O", "--seed", "-1"], "--seed: must be >= 0"),
    (["synth", "--out", "{file}"], "--out: '{file}' is a file, not a directory"),
    (["synth", "--out", ""], "--out: expected a directory"),
    (["synth", "--out", "O", "--duration", "1e300"], "--duration: must be <= 604800"),
    (["demo", "--out", "{file}"], "--out: '{file}' is a file"),
    (["demo", "--seed", "-1"], "--seed: must be >= 0"),
    (["whatif", "R", "--out", ""], "--out: expected a directory"),
    (["alerts", "--out", "{file}"], "--out: '{file}' is a file"),
])
def test_a_bad_flag_is_a_usage_error_naming_it(argv, match, a_file, capsys):
    """Each raised (OverflowError, FileExistsError, ValueError, NotADirectoryError: exit 1) or was accepted."""
    argv = [a.replace("{file}", str(a_file)) for a in argv]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert match.replace("{file}", str(a_file)) in capsys.readouterr().err


@pytest.mark.parametrize("flags, match", [
    (["--window", "9999999999h"], "--window: at most 7 days"),
    (["--jobs.ttl", "99999999999999999999999h"], "--jobs.ttl: at most 7 days"),
    (["--window.max-flows", "1e99"], "--window.max-flows: at most 4,294,967,296"),
    (["--window.max-flows", "inf"], "--window.max-flows: expected a whole number"),
    (["--kafka.max-message-bytes", "99999999999999999999"], "--kafka.max-message-bytes: at most 2,147,483,647"),
    (["--kafka.topic", ""], "--kafka.topic: '' is not a Kafka topic name"),
    (["--kafka.topic", "a topic"], "--kafka.topic: 'a topic' is not a Kafka topic name"),
    (["--kafka.summary-topic", ".."], "--kafka.summary-topic: '..' is not a Kafka topic name"),
    (["--kafka.group-id", ""], "--kafka.group-id: must not be empty"),
])
def test_daemon_settings_have_sane_bounds(tmp_path, topology_csv, capsys, flags, match):
    assert main(["daemon", "--topology", str(topology_csv), "--source", str(tmp_path), *flags]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("servers, match", [
    ("::::", "'::::' is not HOST:PORT (IPv6 addresses go in brackets"),
    ("kafka:", "'kafka:': the port must be a number from 1 to 65535"),
    ("kafka:99999", "'kafka:99999': the port must be"),
    (":9092", "':9092' has no host"),
    ("a:9092,,b:9092", "an empty entry"),
    ("[::1:9092", "is not [IPV6]:PORT"),
    ("[nope]:9092", "'nope' is not an IPv6 address"),
])
def test_bootstrap_servers_are_checked_before_connecting(topology_csv, capsys, servers, match):
    """'::::' reached the Kafka client: exit 1 with "invalid literal for int()"."""
    assert main(["daemon", "--topology", str(topology_csv), "--kafka.bootstrap-servers", servers]) == 2
    err = capsys.readouterr().err
    assert "--kafka.bootstrap-servers" in err and match in err


@pytest.mark.parametrize("url, match", [
    ("kafka://::::/flows", "'::::' is not HOST:PORT (IPv6 addresses go in brackets"),
    ("kafka://kafka:99999/flows", "the port must be a number from 1 to 65535"),
    ("kafka://kafka:9092/a topic", "'a topic' is not a Kafka topic name"),
])
def test_collect_checks_its_kafka_url_before_connecting(a_file, capsys, url, match):
    """kafka://::::/flows reached the Kafka client: exit 1 with "invalid literal for int()"."""
    assert main(["collect", str(a_file), "--out", url]) == 2
    err = capsys.readouterr().err
    assert f"--out {url}" in err and match in err


def test_good_bootstrap_servers_still_parse():
    from prism.serve.settings import parse_bootstrap_servers

    assert parse_bootstrap_servers("k1:9092,[::1]:9093, k2 ,[fe80::1]") == [("k1", 9092), ("::1", 9093), ("k2", 9092), ("fe80::1", 9092)]


# ---------------------------------------------------------------- demo: checked first, and its broker never orphaned


def test_demo_checks_the_listen_address_before_generating_the_cluster(monkeypatch, capsys):
    import synthetic

    def no_generation(*a, **kw):
        raise AssertionError("the cluster was generated before the flags were checked")

    monkeypatch.setattr(synthetic, "preset", no_generation)
    assert main(["demo", "--web.listen-address", "1.2.3.4:99999"]) == 2
    assert "--web.listen-address: port 99999 is out of range" in capsys.readouterr().err
    assert main(["demo", "--kafka.bootstrap-servers", "::::"]) == 2
    assert "--kafka.bootstrap-servers" in capsys.readouterr().err


@pytest.mark.parametrize("fails_in", ["start", "topic"])
def test_the_demo_stops_its_broker_on_every_error(monkeypatch, fails_in):
    """A failure while the broker starts (Ctrl-C) or right after it: the broker process is stopped either way."""
    import prism.serve.broker
    import prism.serve.live as live

    events = []

    class Broker:
        bootstrap = "127.0.0.1:1"

        def start(self):
            events.append("start")
            if fails_in == "start":
                raise KeyboardInterrupt
            return self

        def stop(self, kill=False):
            events.append("stop")

    def no_topic(*a, **kw):
        raise ValueError("no topic")

    monkeypatch.setattr(prism.serve.broker, "LocalBroker", Broker)
    monkeypatch.setattr(live, "ensure_topic", no_topic)
    demo = live.LiveDemo(cluster=None, printer=lambda t: None)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt if fails_in == "start" else ValueError):
        demo.run()
    assert events == ["start", "stop"]


# ---------------------------------------------------------------- files: their name in the error


@pytest.mark.parametrize("flag", ["--config.file", "--switch-map", "--meta"])
def test_a_binary_yaml_file_is_named_in_the_error(tmp_path, topology_csv, capsys, flag):
    """"'utf-8' codec can't decode byte 0xc5" said neither the flag nor the file."""
    p = tmp_path / "binary.yaml"
    p.write_bytes(b"\xc5\xff\x00\x01binary")
    if flag == "--config.file":
        rc = main(["daemon", "--topology", str(topology_csv), "--source", str(tmp_path), "--config.file", str(p)])
    elif flag == "--switch-map":
        cap = tmp_path / "c.pcap"
        cap.write_bytes(b"")
        rc = main(["collect", str(cap), "--out", str(tmp_path / "o.csv"), "--switch-map", str(p)])
    else:
        ops = tmp_path / "ops.parquet"
        ops.write_bytes(b"x")
        rc = main(["whatif", "--ops", str(ops), "--meta", str(p), "--out", str(tmp_path / "o")])
    assert rc == 2
    assert f"{flag} {p}: not UTF-8 text (byte 0xc5 at offset 0)" in capsys.readouterr().err


def test_a_topology_with_a_byte_order_mark_reads_as_without(tmp_path):
    """The flow CSV reader took a BOM; the topology reader refused it ("found: \\ufeffip")."""
    text = "ip,server,rail\n10.0.0.1,s0,0\n10.0.0.2,s1,1\n"
    plain, bom, bom_gz = tmp_path / "t.csv", tmp_path / "bom.csv", tmp_path / "bom.csv.gz"
    plain.write_text(text)
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    bom_gz.write_bytes(gzip.compress(b"\xef\xbb\xbf" + text.encode()))
    want = Topology.from_csv(str(plain)).nics
    for p in (bom, bom_gz):
        pd.testing.assert_frame_equal(Topology.from_csv(str(p)).nics, want)


# ---------------------------------------------------------------- a gzipped Parquet file: bounded, and where --spill-dir says


def flows_frame(n=50) -> pd.DataFrame:
    return pd.DataFrame({"start_ns": np.arange(n, dtype=np.int64) * 1000 + GOOD["start_ns"], "duration_ns": 1000, "src": "10.0.0.1",
                         "dst": "10.0.0.2", "size": 4096, "switches": "leaf-a"})


def test_a_gzip_bomb_named_parquet_is_refused_past_the_bound(tmp_path, monkeypatch):
    """6.5 MB unpacked to 1.5 GB in the system's temp directory, unbounded."""
    monkeypatch.setattr(parquet_format, "MIN_GUNZIP_LIMIT", 1 << 20)
    p = tmp_path / "bomb.parquet.gz"
    p.write_bytes(gzip.compress(bytes(8 << 20)))  # 8 MiB of zeros in ~8 KB: ratio ~1000
    spill = tmp_path / "spill"
    spill.mkdir()
    with pytest.raises(FlowFormatError, match=r"bomb.parquet.gz: decompresses to more than 1,048,576 bytes \(32x its"):
        read_all(p, temp_dir=str(spill))
    assert not any(spill.iterdir())  # the partial copy is gone


def test_a_gzipped_parquet_unpacks_in_the_spill_dir(tmp_path, topology_csv, monkeypatch):
    p = tmp_path / "flows.parquet.gz"
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(flows_frame()), buf)
    p.write_bytes(gzip.compress(buf.getvalue()))
    spill = tmp_path / "spill"
    spill.mkdir()
    reader = FlowReader(str(p), temp_dir=str(spill))
    chunks = iter(reader)
    assert len(next(chunks)) == 50
    assert [f.name for f in spill.iterdir() if f.name.startswith("prism-gunzip-")]  # unpacked there while it is read
    assert sum(len(c) for c in chunks) == 0 and not any(spill.iterdir())

    made = []
    real = parquet_format.tempfile.NamedTemporaryFile

    def spy(*a, **kw):
        made.append(kw.get("dir"))
        return real(*a, **kw)

    monkeypatch.setattr(parquet_format.tempfile, "NamedTemporaryFile", spy)
    assert main(["replay", str(p), "--topology", str(topology_csv), "--out", str(tmp_path / "o"), "--quiet", "--no-progress",
                 "--spill-dir", str(spill)]) == 0
    assert made == [str(spill)]


# ---------------------------------------------------------------- property: whatever the bytes, rows or a clear error

FUZZ = settings(max_examples=int(os.environ.get("PRISM_HYPOTHESIS_EXAMPLES", 60)), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def valid_file(fmt: str) -> bytes:
    df = flows_frame(30)
    base = fmt.removesuffix(".gz")
    if base == "csv":
        data = df.to_csv(index=False).encode()
    elif base == "jsonl":
        data = "".join(json.dumps(r) + "\n" for r in df.to_dict("records")).encode()
    else:
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(df), buf, compression=["none", "zstd"][len(fmt) % 2])
        data = buf.getvalue()
    return data


# what the sweep found, and its neighbours: spliced into valid files at random places
PAYLOADS = [b"[" * 5000, b'{"a":' * 3000, b'"\\ud800"', b'"\\udfff\\ud800"', b"\xef\xbb\xbf", str(INT64_MAX).encode(),
            b"99999999999999999999999", b"-9223372036854775808", b"1e999", b"NaN", b"\x00", b"\xff\xfe", b"\r", b"\n\n", b",,,,",
            b'"', b"{}", b"[]", b"null"]
EDITS = st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["overwrite", "insert", "delete"]),
                           st.binary(min_size=1, max_size=16) | st.sampled_from(PAYLOADS)), min_size=1, max_size=6)
FORMATS = ["csv", "jsonl", "parquet", "csv.gz", "jsonl.gz", "parquet.gz"]


def mutate(data: bytes, edits) -> bytes:
    b = bytearray(data)
    for frac, kind, payload in edits:
        i = min(int(frac * len(b)), len(b))
        if kind == "overwrite":
            b[i:i + len(payload)] = payload
        elif kind == "insert":
            b[i:i] = payload
        else:
            del b[i:i + len(payload)]
    return bytes(b)


def rows_or_a_clear_error(path) -> None:
    """The property: every row read is kept or counted, or the file is refused with a FlowFormatError naming it."""
    rejects = RejectCounter()
    try:
        reader = FlowReader(str(path), rejects=rejects, chunk_rows=16)
        kept = sum(len(c) for c in reader)
    except FlowFormatError as e:
        assert str(path) in str(e)
        return
    assert reader.rows_read == kept + rejects.total


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # pyarrow's CSV handler, see test_properties
@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(edits=EDITS, gz_after=st.booleans())
@example(edits=[(0.5, "insert", b"\n" + b"[" * 100_000 + b"\n")], gz_after=True)
@example(edits=[(0.5, "insert", b'\n{"start_ns":1,"duration_ns":2,"src":"\\ud800","dst":"10.0.0.2","size":64,"switches":"l"}\n')], gz_after=True)
def test_mutated_files_give_rows_or_a_clear_error(tmp_path_factory, fmt, edits, gz_after):
    data = mutate(valid_file(fmt), edits)
    if fmt.endswith(".gz"):
        # the edits go in the compressed bytes or in the text before compression
        data = gzip.compress(data) if gz_after else mutate(gzip.compress(valid_file(fmt)), edits)
    path = tmp_path_factory.mktemp("fuzz") / f"f.{fmt}"
    path.write_bytes(data)
    rows_or_a_clear_error(path)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.binary(max_size=2048) | st.builds(lambda p, n: p * n, st.sampled_from(PAYLOADS), st.integers(1, 50)))
def test_random_bytes_give_rows_or_a_clear_error(tmp_path_factory, fmt, data):
    path = tmp_path_factory.mktemp("fuzz") / f"f.{fmt}"
    path.write_bytes(gzip.compress(data) if fmt.endswith(".gz") and data[:1] != b"\x1f" else data)
    rows_or_a_clear_error(path)


@FUZZ
@given(edits=EDITS)
def test_a_mutated_topology_reads_or_is_a_clear_error(tmp_path_factory, edits):
    path = tmp_path_factory.mktemp("fuzz") / "topology.csv"
    path.write_bytes(mutate(b"ip,server,rail,leaf\n10.0.0.1,s0,0,leaf-a\n10.0.0.2,s1,1,leaf-b\n", edits))
    try:
        Topology.from_csv(str(path))
    except FlowFormatError as e:
        assert str(path) in str(e)
