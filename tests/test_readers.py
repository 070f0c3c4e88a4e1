"""Readers: every format, gzip, stdin, chunking, malformed rows, missing columns."""
import gzip
import io
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from prism.ingest.readers import FlowReader, detect_format, read_flows
from prism.ingest.records import FlowFormatError, RejectCounter
from synthetic.generator import write_flows

FORMATS = ["csv", "csv.gz", "parquet", "jsonl", "jsonl.gz"]


def _canon(df):
    out = df[["start_ns", "duration_ns", "src", "dst", "size", "switches"]].copy()
    for c in ("src", "dst", "switches"):
        out[c] = out[c].astype(str)
    return out.reset_index(drop=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_every_format(sample, tmp_path, fmt):
    path = tmp_path / f"flows.{fmt}"
    write_flows(sample, path)
    rejects = RejectCounter()
    got = pd.concat(list(FlowReader(str(path), rejects=rejects)), ignore_index=True)
    assert rejects.total == 0
    pd.testing.assert_frame_equal(_canon(got), _canon(sample))
    assert got["start_ns"].dtype == np.int64


@pytest.mark.parametrize("fmt", FORMATS)
def test_chunking_streams_in_pieces(sample, tmp_path, fmt):
    path = tmp_path / f"flows.{fmt}"
    write_flows(sample, path)
    reader = FlowReader(str(path), chunk_rows=257)
    chunks = list(reader)
    assert len(chunks) >= len(sample) // 257  # really in pieces
    assert max(len(c) for c in chunks) <= 257
    assert reader.rows_read == len(sample)
    pd.testing.assert_frame_equal(_canon(pd.concat(chunks, ignore_index=True)), _canon(sample))


def test_gzipped_parquet(sample, tmp_path):
    path = tmp_path / "flows.parquet"
    write_flows(sample, path)
    with open(path, "rb") as f, gzip.open(tmp_path / "flows.parquet.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    got = pd.concat(list(FlowReader(str(tmp_path / "flows.parquet.gz"))), ignore_index=True)
    pd.testing.assert_frame_equal(_canon(got), _canon(sample))


def test_stdin_jsonl(sample, tmp_path):
    path = tmp_path / "flows.jsonl"
    write_flows(sample, path)
    got = pd.concat(list(FlowReader("-", chunk_rows=500, stdin=io.BytesIO(path.read_bytes()))), ignore_index=True)
    pd.testing.assert_frame_equal(_canon(got), _canon(sample))


def test_stdin_through_the_cli(sample, tmp_path, data_dir):
    path = tmp_path / "flows.jsonl"
    write_flows(sample, path)
    topo = tmp_path / "topology.csv"
    from synthetic import preset

    pd.DataFrame(preset("tiny").fabric.topology_rows()).to_csv(topo, index=False)
    out = tmp_path / "out"
    with open(path, "rb") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "prism", "replay", "-", "--topology", str(topo), "--out", str(out), "--no-progress"],
            stdin=f, capture_output=True, text=True, timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    assert f"read {len(sample):,} rows" in proc.stdout
    assert (out / "jobs.csv").read_text().startswith("job_id,ip\n")


def test_nanosecond_precision_survives(tmp_path):
    t = 1767225600123456789
    (tmp_path / "f.csv").write_text(f"start_ns,duration_ns,src,dst,size,switches\n{t},1,10.0.0.1,10.0.0.2,1,\n")
    (tmp_path / "f.jsonl").write_text(f'{{"start_ns": {t}, "duration_ns": 1, "src": "10.0.0.1", "dst": "10.0.0.2", "size": 1, "switches": ""}}\n')
    for name in ("f.csv", "f.jsonl"):
        (df,) = list(FlowReader(str(tmp_path / name)))
        assert int(df["start_ns"].iloc[0]) == t


def test_malformed_csv_counted_per_reason_with_lines(data_dir):
    rejects = RejectCounter()
    reader = FlowReader(str(data_dir / "malformed.csv"), rejects=rejects)
    good = pd.concat(list(reader), ignore_index=True)
    assert len(good) == 4
    assert reader.rows_read == 10
    assert rejects.as_dict() == {
        "malformed_row": 1,
        "bad_number": 1,
        "negative_duration": 1,
        "negative_size": 1,
        "empty_address": 1,
        "bad_address": 1,
    }
    ex = {k: v[0] for k, v in rejects.examples.items()}
    assert "malformed.csv:line 4" in ex["malformed_row"]
    assert "malformed.csv:line 5: size='4k'" in ex["bad_number"]
    assert "line 6: duration_ns='-7'" in ex["negative_duration"]
    assert "line 7: size='-1'" in ex["negative_size"]
    assert "line 8: src=''" in ex["empty_address"]
    assert "line 9: src='gpu-seven'" in ex["bad_address"]
    assert good["start_ns"].tolist() == [1767225600000000001, 1767225600000000002, 1767225600000000009, 1767225600000000010]


def test_malformed_jsonl_counted_per_reason_with_lines(data_dir):
    rejects = RejectCounter()
    reader = FlowReader(str(data_dir / "malformed.jsonl"), rejects=rejects)
    good = pd.concat(list(reader), ignore_index=True)
    assert good["start_ns"].tolist() == [1767225600000000001, 1767225600000000006, 1767225600000000008]
    assert rejects.as_dict() == {"malformed_row": 2, "bad_number": 1, "empty_address": 1}
    assert [e.rsplit(":", 1)[1] for e in rejects.examples["malformed_row"]] == ["line 2"]
    assert "malformed.jsonl:line 5: start_ns='12x'" in rejects.examples["bad_number"][0]
    assert "malformed.jsonl:line 7: dst=None" in rejects.examples["empty_address"][0]
    assert good["src_qp"].isna().tolist() == [True, True, False]


def test_malformed_rows_in_a_clean_stream_only_cost_their_block(sample, tmp_path):
    """A bad line among thousands: the rest of its block is still read."""
    path = tmp_path / "flows.jsonl"
    write_flows(sample, path)
    lines = path.read_text().splitlines()
    lines.insert(1500, "\x00\x01 binary garbage")
    path.write_text("\n".join(lines) + "\n")
    rejects = RejectCounter()
    got = pd.concat(list(FlowReader(str(path), rejects=rejects, chunk_rows=1000)), ignore_index=True)
    assert rejects.as_dict() == {"malformed_row": 1}
    assert rejects.examples["malformed_row"][0].endswith(":line 1501")
    pd.testing.assert_frame_equal(_canon(got), _canon(sample))


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_missing_column_names_file_and_column(sample, tmp_path, fmt):
    path = tmp_path / f"flows.{fmt}"
    write_flows(sample.drop(columns=["size"]), path)
    with pytest.raises(FlowFormatError) as err:
        list(FlowReader(str(path)))
    msg = str(err.value)
    assert str(path) in msg and "'size'" in msg


def test_unknown_extension_is_a_clear_error(tmp_path):
    with pytest.raises(FlowFormatError, match="cannot tell the format"):
        detect_format(str(tmp_path / "flows.txt"))


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="no such file"):
        FlowReader("/nonexistent/flows.csv")


def test_ipv6_spellings_are_one_address(tmp_path):
    (tmp_path / "f.csv").write_text(
        "start_ns,duration_ns,src,dst,size,switches\n1,1,FE80:0:0::1,fe80::2,1,\n2,1,fe80::1,fe80:0::2,1,\n"
    )
    (df,) = list(read_flows([str(tmp_path / "f.csv")]))
    assert df["src"].astype(str).tolist() == ["fe80::1", "fe80::1"]
    assert df["dst"].astype(str).tolist() == ["fe80::2", "fe80::2"]


def test_ipv4_mapped_addresses_match_the_topology(tmp_path):
    """``::ffff:10.0.0.1`` (a dual-stack socket's spelling) is 10.0.0.1, in flows and in the topology."""
    from prism.ingest.topology import Topology

    (tmp_path / "f.csv").write_text("start_ns,duration_ns,src,dst,size,switches\n1,1,::ffff:10.0.0.1,10.0.0.2,1,\n2,1,10.0.0.1,::FFFF:a00:2,1,\n")
    (df,) = list(read_flows([str(tmp_path / "f.csv")]))
    assert df["src"].astype(str).tolist() == ["10.0.0.1", "10.0.0.1"] and df["dst"].astype(str).tolist() == ["10.0.0.2", "10.0.0.2"]
    (tmp_path / "t.csv").write_text("ip,server\n::ffff:10.0.0.1,s0\n10.0.0.2,s1\n")
    topo = Topology.from_csv(tmp_path / "t.csv")
    assert set(topo.nics["ip"]) == {"10.0.0.1", "10.0.0.2"}


def test_parquet_with_wrong_types_is_validated(tmp_path):
    df = pd.DataFrame({"start_ns": ["1", "x"], "duration_ns": [1.0, 2.5], "src": ["10.0.0.1"] * 2, "dst": ["10.0.0.2"] * 2, "size": [1, 2], "switches": ["", ""]})
    df.to_parquet(tmp_path / "f.parquet")
    rejects = RejectCounter()
    (got,) = list(FlowReader(str(tmp_path / "f.parquet"), rejects=rejects))
    assert len(got) == 1 and rejects.as_dict() == {"bad_number": 1}
    assert "f.parquet:row 2: start_ns='x'" in rejects.examples["bad_number"][0]


def _lines(n=10):
    return ["start_ns,duration_ns,src,dst,size,switches"] + [f"{1000 + i},5,10.0.0.1,10.0.0.2,64,leaf-a" for i in range(n)]


@pytest.mark.parametrize("case", ["latin-1 byte", "10 MB field", "wrong field count"])
def test_one_bad_csv_row_costs_only_itself(tmp_path, case):
    """A row pyarrow's block parser cannot take is counted with its line; the file's other rows are kept."""
    lines = [x.encode() for x in _lines()]
    if case == "latin-1 byte":
        lines[4] = lines[4].replace(b"leaf-a", "leaf-\xe9".encode("latin-1"))
    elif case == "10 MB field":
        lines[4] = lines[4].replace(b"leaf-a", b"x" * (10 << 20))
    else:
        lines[4] = lines[4] + b",extra"
    (tmp_path / "f.csv").write_bytes(b"\n".join(lines) + b"\n")
    rejects = RejectCounter()
    reader = FlowReader(str(tmp_path / "f.csv"), rejects=rejects)
    got = pd.concat(list(reader), ignore_index=True)
    assert len(got) == 9 and reader.rows_read == 10 and rejects.as_dict() == {"malformed_row": 1}
    assert "f.csv:line 5" in rejects.examples["malformed_row"][0]
    assert 1003 not in got["start_ns"].tolist()


def test_a_line_too_long_for_memory_is_skipped_in_json_lines(tmp_path):
    from prism.ingest.formats.common import MAX_LINE_BYTES

    good = '{"start_ns":%d,"duration_ns":5,"src":"10.0.0.1","dst":"10.0.0.2","size":64,"switches":"l"}'
    body = [good % i for i in range(5)] + ['{"start_ns":' + "9" * (2 * MAX_LINE_BYTES)] + [good % i for i in range(5, 10)]
    (tmp_path / "f.jsonl").write_text("\n".join(body) + "\n")
    rejects = RejectCounter()
    reader = FlowReader(str(tmp_path / "f.jsonl"), rejects=rejects, chunk_rows=1000)
    got = pd.concat(list(reader), ignore_index=True)
    assert got["start_ns"].tolist() == list(range(10)) and reader.rows_read == 11
    assert rejects.as_dict() == {"malformed_row": 1} and "line 6: longer than" in rejects.examples["malformed_row"][0]


def test_long_lines_within_the_limit_stay_on_the_fast_path(tmp_path, monkeypatch):
    from prism.ingest.formats.common import MAX_LINE_BYTES
    from prism.ingest.formats.jsonl import JsonLinesReader

    def no_slow_path(*_):
        raise AssertionError("a block of valid lines went to the per-line parser")

    monkeypatch.setattr(JsonLinesReader, "_json_lines_slow", no_slow_path)
    good = '{"start_ns":%d,"duration_ns":5,"src":"10.0.0.1","dst":"10.0.0.2","size":64,"switches":"l","note":"%s"}'
    pad = "x" * (MAX_LINE_BYTES - len(good) - 10)  # just under the limit, with an ignored field
    # three lines at the limit between ordinary ones: a block of 7 MiB, parsed in pieces
    body = [good % (i, pad if i in (5_000, 15_000, 25_000) else "") for i in range(40_000)]
    (tmp_path / "f.jsonl").write_text("\n".join(body) + "\n")
    rejects = RejectCounter()
    got = pd.concat(list(FlowReader(str(tmp_path / "f.jsonl"), rejects=rejects, chunk_rows=100_000)), ignore_index=True)
    assert got["start_ns"].tolist() == list(range(40_000)) and rejects.as_dict() == {}


@pytest.mark.parametrize("content, match", [
    (b"\n" + "\n".join(_lines()).encode() + b"\n", "the first line is blank"),
    (b'{"START_NS":1,"DURATION_NS":2,"SRC":"10.0.0.1","DST":"10.0.0.2","SIZE":3,"SWITCHES":"l"}\n', "names are lowercase"),
])
def test_header_mistakes_are_named(tmp_path, content, match):
    path = tmp_path / ("f.jsonl" if content.startswith(b"{") else "f.csv")
    path.write_bytes(content)
    with pytest.raises(FlowFormatError, match=match):
        list(FlowReader(str(path)))


def test_a_header_without_newline_is_an_empty_dump(tmp_path):
    (tmp_path / "f.csv").write_text(_lines()[0])
    reader = FlowReader(str(tmp_path / "f.csv"))
    assert sum(map(len, reader)) == 0 and reader.rows_read == 0


def test_trailing_garbage_after_gzip_names_the_rows_read(tmp_path):
    (tmp_path / "f.csv.gz").write_bytes(gzip.compress(("\n".join(_lines()) + "\n").encode()) + b"garbage!")
    reader = FlowReader(str(tmp_path / "f.csv.gz"))
    with pytest.raises(FlowFormatError, match="unreadable after 10 rows"):
        list(reader)


def test_bad_rows_across_blocks_cost_only_themselves_and_the_block_parser_resumes(tmp_path):
    """Bad rows in several blocks, and a long row straddling two: exact rows kept, each bad one named by its line."""
    n = 20_000
    lines = [x.encode() for x in _lines(n)]
    lines[100] = lines[100].replace(b"leaf-a", "leaf-\xe9".encode("latin-1"))  # line 101
    lines[5000] = lines[5000] + b",extra"  # line 5001
    lines[15000] = b"1,2,3"  # line 15001: too few fields
    lines[10000] = lines[10000].replace(b"leaf-a", b"x" * 200_000)  # line 10001: valid, longer than a block
    (tmp_path / "f.csv").write_bytes(b"\n".join(lines) + b"\n")
    rejects = RejectCounter()
    reader = FlowReader(str(tmp_path / "f.csv"), rejects=rejects, chunk_rows=1000)  # blocks of 80 KB
    got = pd.concat(list(reader), ignore_index=True)
    want = [1000 + i for i in range(n) if i + 1 not in (100, 5000, 15000)]
    assert got["start_ns"].tolist() == want and reader.rows_read == n
    assert rejects.total == 3
    assert sorted(int(e.split(":line ")[1].split(":")[0]) for e in rejects.examples["malformed_row"]) == [101, 5001, 15001]


@pytest.mark.parametrize("chunk_rows", [7, 1 << 18])
def test_blank_lines_keep_json_lines_on_the_fast_path_and_the_line_numbers(sample, tmp_path, chunk_rows, monkeypatch):
    """Blank lines between records (one per message, from some producers) are skipped without the per-line parser.

    The rows, and the line numbers that examples of rejected rows name, are
    those of the same lines without the blanks' shift.
    """
    flows = sample.head(40).copy()
    flows.loc[13, "size"] = -5  # a rejected row: its example names its line
    lines = flows.to_json(orient="records", lines=True).strip().split("\n")
    text = ""
    for i, line in enumerate(lines):
        text += line + "\n" + ("\n" if i % 3 == 0 else "") + ("\r\n" if i == 20 else "")
    path = tmp_path / "blank.jsonl"
    path.write_text("\n" + text)
    want_line = 1 + 13 + len([i for i in range(13) if i % 3 == 0]) + 1  # the leading blank, rows 0-12 and their blanks, then row 13

    from prism.ingest.formats.jsonl import JsonLinesReader

    def no_slow_path(self, block):
        raise AssertionError("the per-line parser ran")

    monkeypatch.setattr(JsonLinesReader, "_json_lines_slow", no_slow_path)
    rejects = RejectCounter()
    got = pd.concat(list(FlowReader(str(path), rejects=rejects, chunk_rows=chunk_rows)), ignore_index=True)
    assert dict(rejects.counts) == {"negative_size": 1}
    assert rejects.examples["negative_size"][0].startswith(f"{path}:line {want_line}:")
    pd.testing.assert_frame_equal(_canon(got), _canon(flows.drop(index=13)))


def test_messages_end_in_one_newline(sample):
    from prism.ingest.messages import encode_jsonl

    m = encode_jsonl(sample.head(5))
    assert m.endswith(b"}\n") and m.count(b"\n") == 5


def test_read_ahead_keeps_order_raises_in_place_and_stops_its_thread():
    """The Parquet reader's read-ahead: items in order, the source's error after the items before it, and closing
    early stops the thread even while the queue is full."""
    import threading

    from prism.ingest.formats.parquet import _read_ahead

    def source(n, fail_at=None):
        for i in range(n):
            if i == fail_at:
                raise ValueError(f"bad row group {i}")
            yield i

    assert list(_read_ahead(source(10), depth=2)) == list(range(10))
    got = []
    with pytest.raises(ValueError, match="bad row group 4"):
        for x in _read_ahead(source(10, fail_at=4)):
            got.append(x)
    assert got == [0, 1, 2, 3]
    it = _read_ahead(source(1000), depth=1)
    assert next(it) == 0
    it.close()  # the producer is blocked on the full queue: it must see the stop and end
    assert not any(t.name == "prism-read-ahead" and t.is_alive() for t in threading.enumerate())
