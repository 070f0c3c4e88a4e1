"""Kafka message decoding: poison messages cost themselves, never their neighbours.

The poison shapes are those an adversarial sweep found dropping whole poll
batches: nested JSON values, non-UTF-8 bytes, Arrow columns of list or
uint64 type.
"""
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import prism.messages as messages
from prism.messages import DEFAULT_MAX_MESSAGE_BYTES, decode_messages, encode_arrow, encode_jsonl
from prism.records import RejectCounter


def good(n=100, offset=0):
    return pd.DataFrame({
        "start_ns": np.arange(offset, offset + n, dtype=np.int64) * 1000 + 1, "duration_ns": 5,
        "src": "10.0.0.1", "dst": "10.0.0.2", "size": 64, "switches": "leaf-a|spine-b",
    })


def arrow_message(columns: dict) -> bytes:
    t = pa.table(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def poisons():
    """(name, message, valid rows in it, {reason: rejected rows}); records apart from any neighbour's (not re-deliveries)."""
    def fresh(k):
        g = good(100, offset=1_000_000 + 1000 * k)
        return g, {c: g[c].tolist() for c in g}

    g, _ = fresh(0)
    nested = [json.loads(x) for x in encode_jsonl(g).decode().splitlines() if x.strip()]
    nested[7]["src"] = {"ip": "10.0.0.1"}
    nested[8]["size"] = [64]
    g, listed = fresh(1)
    listed["size"] = pa.array([[v] for v in g["size"]], pa.list_(pa.int64()))
    g, huge = fresh(2)
    huge["size"] = pa.array([2**63 if i % 5 == 0 else 64 for i in range(100)], pa.uint64())
    g, as_list = fresh(3)
    as_list["switches"] = pa.array([["leaf-a", "spine-b"]] * 100, pa.list_(pa.string()))
    return [
        ("jsonl-nested", ("\n".join(json.dumps(r) for r in nested) + "\n").encode(), 98, {"bad_address": 1, "bad_number": 1}),
        ("arrow-list-size", arrow_message(listed), 0, {"bad_number": 100}),
        ("arrow-uint64-size", arrow_message(huge), 80, {"bad_number": 20}),
        ("jsonl-not-utf8", b'{"start_ns": 1, "duration_ns": 2, "src": "\xff\xfe", "dst": "10.0.0.2", "size": 64, "switches": "l"}', 0, {"malformed_row": 1}),
        ("arrow-switches-list", arrow_message(as_list), 100, {}),
    ]


@pytest.mark.parametrize("name,poison,valid,reasons", poisons(), ids=[p[0] for p in poisons()])
def test_poison_costs_only_itself(name, poison, valid, reasons):
    batch = [(encode_arrow(good(100, i * 100)) if i % 2 else encode_jsonl(good(100, i * 100)), [], f"t[0]@{i}") for i in range(30)]
    batch.insert(13, (poison, [], "t[0]@poison"))
    rc = RejectCounter()
    frames = decode_messages(batch, rc, "t[0]@0-30")
    assert sum(map(len, frames)) == 3000 + valid
    assert rc.as_dict() == reasons
    for f in frames:
        assert set(f["switches"].astype(str)) == {"leaf-a|spine-b"}  # a list of names is joined as a path


def test_a_message_that_raises_is_found_and_counted_once(monkeypatch):
    """Past the validation's own checks: decoding goes message by message."""
    validate = messages.validate_arrow

    def fragile(tables, rejects, source):
        if any(t.num_rows == 7 for t in tables):
            raise RuntimeError("an input nobody foresaw")
        return validate(tables, rejects, source)

    monkeypatch.setattr(messages, "validate_arrow", fragile)
    batch = [(encode_arrow(good(100, i * 100)), [], f"t[0]@{i}") for i in range(5)]
    batch.append((encode_arrow(good(7, 9000)), [], "t[0]@5"))
    batch.append((encode_jsonl(good(10, 9100)), [], "t[0]@6"))
    rc = RejectCounter()
    frames = decode_messages(batch, rc, "t[0]@0-6")
    assert sum(map(len, frames)) == 510
    assert rc.as_dict() == {"malformed_message": 1}
    assert "t[0]@5" in rc.examples["malformed_message"][0] and "RuntimeError" in rc.examples["malformed_message"][0]


def test_a_message_decoding_to_too_many_records_is_refused(monkeypatch):
    """Compressed Arrow can expand a few MB into tens of millions of rows: bounded, counted once, neighbours kept."""
    monkeypatch.setattr(messages, "MAX_MESSAGE_ROWS", 150)
    t = pa.Table.from_pandas(good(100, 5000), preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        for _ in range(3):  # 300 records in three batches
            w.write_table(t)
    batch = [(encode_jsonl(good(100, 0)), [], "t[0]@0"), (sink.getvalue().to_pybytes(), [], "t[0]@1"), (encode_arrow(good(100, 100)), [], "t[0]@2")]
    rc = RejectCounter()
    assert sum(map(len, decode_messages(batch, rc, "t[0]@0-2"))) == 200
    assert rc.as_dict() == {"oversized_message": 1} and "more than 150 records" in rc.examples["oversized_message"][0]


def test_a_compressed_bomb_is_refused_from_its_headers(monkeypatch):
    """A few MB of zstd declaring 2M records: refused before pyarrow decompresses anything."""
    n = 2_000_000
    one = pa.Table.from_pandas(good(1, 0), preserve_index=False)
    t = one.take(np.zeros(n, dtype=np.int64))  # the same valid record 2M times
    t = pa.table({c: t[c].dictionary_encode() if pa.types.is_large_string(t[c].type) else t[c] for c in t.column_names})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(t)
    bomb = sink.getvalue().to_pybytes()
    assert len(bomb) < min(DEFAULT_MAX_MESSAGE_BYTES, t.nbytes // 20)  # within the byte limit, a twentieth of what it decodes to

    def no_decoding(*a, **k):
        raise AssertionError("the bomb was opened")

    monkeypatch.setattr(pa.ipc, "open_stream", no_decoding)
    rc = RejectCounter()
    assert decode_messages([(bomb, [], "t[0]@0")], rc, "t[0]@0") == []
    assert rc.as_dict() == {"oversized_message": 1}
    assert "declares more than 1,000,000 records (2,000,000 records" in rc.examples["oversized_message"][0]


def test_arrow_columns_in_any_order_extra_or_missing_decode_as_json_lines_does():
    g = good(20)
    extra = {"vlan": np.arange(20), **{c: g[c].to_numpy() for c in reversed(g.columns)}}  # unknown column first, order reversed
    no_path = {c: g[c].to_numpy() for c in g.columns if c != "switches"}
    for columns, lines in ((extra, g), (no_path, g.drop(columns="switches"))):
        arrow_rc, jsonl_rc = RejectCounter(), RejectCounter()
        (a,) = decode_messages([(arrow_message(columns), [], "t[0]@0")], arrow_rc, "t")
        (j,) = decode_messages([(encode_jsonl(lines), [], "t[0]@0")], jsonl_rc, "t")
        assert "vlan" not in a.columns and set(a.columns) <= set(j.columns)  # JSON Lines adds the optional columns empty
        pd.testing.assert_frame_equal(a.astype(str), j[list(a.columns)].astype(str))
        assert arrow_rc.as_dict() == jsonl_rc.as_dict()
