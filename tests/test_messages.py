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

import prism.ingest.messages as messages
from prism.ingest.messages import DEFAULT_MAX_MESSAGE_BYTES, decode_messages, encode_arrow, encode_jsonl
from prism.ingest.records import RejectCounter


def good(n=100, offset=0):
    return pd.DataFrame({
        "start_ns": np.arange(offset, offset + n, dtype=np.int64) * 1000 + 1, "duration_ns": 5,
        "src": "10.0.0.1", "dst": "10.0.0.2", "size": 64, "switches": "leaf-a|spine-b",
    })


def ipc_stream(table: pa.Table, compression=None, chunk=None, times: int = 1) -> bytes:
    """Arrow IPC stream bytes of ``table`` written ``times`` times (record batches of at most ``chunk`` rows)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        for _ in range(times):
            w.write_table(table, max_chunksize=chunk)
    return sink.getvalue().to_pybytes()


def arrow_message(columns: dict) -> bytes:
    return ipc_stream(pa.table(columns))


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
        if any(9_000_001 in t["start_ns"].to_pylist() for t in tables):  # the 7-record message, alone or joined
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
    batch = [(encode_jsonl(good(100, 0)), [], "t[0]@0"), (ipc_stream(t, times=3), [], "t[0]@1"),  # 300 records in three batches
             (encode_arrow(good(100, 100)), [], "t[0]@2")]
    rc = RejectCounter()
    assert sum(map(len, decode_messages(batch, rc, "t[0]@0-2"))) == 200
    assert rc.as_dict() == {"oversized_message": 1} and "more than 150 records" in rc.examples["oversized_message"][0]


def test_a_compressed_bomb_is_refused_from_its_headers(monkeypatch):
    """A few MB of zstd declaring 2M records: refused before pyarrow decompresses anything."""
    n = 2_000_000
    one = pa.Table.from_pandas(good(1, 0), preserve_index=False)
    t = one.take(np.zeros(n, dtype=np.int64))  # the same valid record 2M times
    t = pa.table({c: t[c].dictionary_encode() if pa.types.is_large_string(t[c].type) else t[c] for c in t.column_names})
    bomb = ipc_stream(t, compression="zstd")
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


def _per_message(values, rejects, sources):
    """The reference for :func:`messages.read_arrows`: each message read on its own."""
    return [t for v, s in zip(values, sources) if (t := messages.read_arrow(v, rejects, s)) is not None]


def _arrow_batch(rng) -> list:
    """A poll's worth of Arrow messages: mostly one schema, with the shapes that must not be joined in between."""
    out = []
    for i in range(40):
        t = pa.Table.from_pandas(good(int(rng.integers(0, 60)), 1000 * i), preserve_index=False)
        kind = rng.integers(0, 8)
        if kind == 0:  # dictionaries: read on its own
            t = pa.table({c: t[c].dictionary_encode() if pa.types.is_string(t[c].type) else t[c] for c in t.column_names})
        elif kind == 1:  # another schema: a run of its own
            t = t.drop_columns(["switches"])
        value = ipc_stream(t, compression="zstd" if kind == 2 else None, chunk=7 if kind == 3 else None)
        damaged = bytearray(value)
        if kind == 4:
            damaged = damaged[: rng.integers(1, len(value))]  # cut short
        elif kind == 5:
            for at in rng.integers(0, len(value), 2):  # bytes overwritten (headers, schema or body)
                damaged[at] = rng.integers(0, 256)
        out.append((bytes(damaged), [], f"t[0]@{i}"))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_messages_read_together_decode_as_read_one_by_one(seed, monkeypatch):
    """Joining a poll's Arrow streams changes nothing: the same records, the same counts, each bad message named."""
    rng = np.random.default_rng(seed)
    batch = _arrow_batch(rng)
    if seed % 4 == 0:
        monkeypatch.setattr(messages, "MAX_MESSAGE_ROWS", 30)  # some messages oversized among joinable ones
    joined_rc, alone_rc = RejectCounter(), RejectCounter()
    joined = decode_messages(batch, joined_rc, "t[0]@0-39")
    monkeypatch.setattr(messages, "read_arrows", _per_message)
    alone = decode_messages(batch, alone_rc, "t[0]@0-39")
    assert len(joined) == len(alone)
    for j, a in zip(joined, alone):
        pd.testing.assert_frame_equal(j, a)
    assert joined_rc.as_dict() == alone_rc.as_dict()
    assert joined_rc.examples == alone_rc.examples


def test_a_poll_of_plain_messages_is_read_as_one_stream(monkeypatch):
    """The point of joining: one reader for a run of plain messages, not one per message."""
    opened = []
    open_stream = pa.ipc.open_stream
    monkeypatch.setattr(pa.ipc, "open_stream", lambda *a, **k: opened.append(1) or open_stream(*a, **k))
    batch = [(encode_arrow(good(50, 100 * i)), [], f"t[0]@{i}") for i in range(30)]
    rc = RejectCounter()
    (frame,) = decode_messages(batch, rc, "t[0]@0-29")
    assert len(frame) == 1500 and rc.as_dict() == {} and len(opened) == 1
    assert frame["start_ns"].tolist() == sorted(frame["start_ns"])  # in message order


def test_a_message_with_damaged_offsets_is_counted_not_followed():
    """String offsets past the data pass the IPC reader's checks; reading them would crash the daemon."""
    g = good(2, 7000)
    columns = {c: pa.array(g[c].tolist()) for c in g.columns}
    offsets = pa.py_buffer(np.array([0, 1 << 30, 16], dtype=np.int32).tobytes())  # the first address ends a GiB past the data
    columns["src"] = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"10.0.0.110.0.0.1")])
    damaged = arrow_message(columns)
    for batch in ([(damaged, [], "t[0]@1")],  # alone, and among neighbours read with it
                  [(encode_arrow(good(10, 0)), [], "t[0]@0"), (damaged, [], "t[0]@1"), (encode_arrow(good(10, 100)), [], "t[0]@2")]):
        rc = RejectCounter()
        frames = decode_messages(batch, rc, "t[0]@0-2")
        assert sum(map(len, frames)) == 10 * (len(batch) - 1)
        assert rc.as_dict() == {"malformed_message": 1}
        assert rc.examples["malformed_message"][0].startswith("t[0]@1: ") and "column 'src' is damaged" in rc.examples["malformed_message"][0]


def test_a_message_declaring_a_petabyte_buffer_is_counted_not_raised():
    """A damaged compressed buffer's length prefix makes pyarrow's allocation fail: an error to count, not to raise.

    Raised, it would have ended the whole poll (its other messages never
    ingested, nor counted).
    """
    import struct

    value = ipc_stream(pa.Table.from_pandas(good(5, 8000), preserve_index=False), compression="zstd")
    for at in range(0, len(value) - 8, 8):  # some buffer's uncompressed length, set to a petabyte
        damaged = value[:at] + struct.pack("<q", 1 << 50) + value[at + 8:]
        try:
            pa.ipc.open_stream(damaged).read_all()
        except pa.ArrowMemoryError:
            break
        except (pa.ArrowException, OSError):
            pass
    else:
        pytest.fail("no length prefix found to damage")
    for batch in ([(damaged, [], "t[0]@1")], [(encode_arrow(good(10, 0)), [], "t[0]@0"), (damaged, [], "t[0]@1"), (encode_arrow(good(10, 100)), [], "t[0]@2")]):
        rc = RejectCounter()
        assert sum(map(len, decode_messages(batch, rc, "t[0]@0-2"))) == 10 * (len(batch) - 1)
        assert rc.as_dict() == {"malformed_message": 1} and rc.examples["malformed_message"][0].startswith("t[0]@1: ")


def test_paths_as_text_and_as_lists_in_one_poll_validate_together(caplog):
    """Two producers' ways of writing a path meet in one poll: no fallback, no warning, every record kept."""
    g = good(20, 500)
    listed = {c: g[c].tolist() for c in g}
    listed["switches"] = pa.array([p.split("|") for p in g["switches"]], pa.list_(pa.string()))
    batch = [(encode_arrow(good(20, 0)), [], "t[0]@0"), (arrow_message(listed), [], "t[0]@1"), (encode_arrow(good(20, 900)), [], "t[0]@2")]
    rc = RejectCounter()
    with caplog.at_level("WARNING", logger="prism.messages"):
        frames = decode_messages(batch, rc, "t[0]@0-2")
    assert sum(map(len, frames)) == 60 and rc.as_dict() == {}
    assert set(pd.concat(frames)["switches"].astype(str)) == {"leaf-a|spine-b"}
    assert not caplog.records


def test_a_path_list_with_invalid_utf8_costs_its_row_not_its_message(caplog):
    """The example kept for the count shows the bytes: showing them must not fail the poll's validation."""
    g = good(10, 700)
    listed = {c: g[c].tolist() for c in g}
    names = pa.array([b"leaf-a", b"spine-\xd2"] + [b"leaf-a", b"spine-b"] * 9, pa.binary()).view(pa.string())
    listed["switches"] = pa.ListArray.from_arrays(pa.array(np.arange(0, 21, 2), pa.int32()), names)
    batch = [(arrow_message(listed), [], "t[0]@0"), (encode_arrow(good(10, 0)), [], "t[0]@1")]
    rc = RejectCounter()
    with caplog.at_level("WARNING", logger="prism.messages"):
        frames = decode_messages(batch, rc, "t[0]@0-1")
    assert sum(map(len, frames)) == 19 and rc.as_dict() == {"bad_switches": 1}
    assert "spine-\\xd2" in rc.examples["bad_switches"][0]
    assert not caplog.records


def test_damaged_messages_never_raise_nor_cost_their_poll(caplog):
    """A fuzz over the shapes producers send (text, dictionaries, path lists, zstd), a few bytes overwritten in each.

    It found a crash (offsets out of range), a raise that lost a whole
    poll (a petabyte allocation) and a valid row that cost its message
    (the example of a bad path list).
    """
    rng = np.random.default_rng(11)

    def variant(i):
        g = good(int(rng.integers(1, 40)), 100 * i)
        t = pa.Table.from_pandas(g, preserve_index=False)
        kind = rng.integers(0, 4)
        if kind == 1:
            t = pa.table({c: t[c].dictionary_encode() if pa.types.is_string(t[c].type) else t[c] for c in t.column_names})
        elif kind == 2:
            t = t.set_column(t.column_names.index("switches"), "switches", pa.array([p.split("|") for p in g["switches"]]))
        value = bytearray(ipc_stream(t, compression="zstd" if kind == 3 else None))
        for at in rng.integers(0, len(value), int(rng.integers(1, 4))):
            value[at] = rng.integers(0, 256)
        return bytes(value)

    with caplog.at_level("WARNING", logger="prism.messages"):
        for _ in range(60):
            batch = [(variant(i), [], f"t[0]@{i}") for i in range(8)]
            rc = RejectCounter()
            decode_messages(batch, rc, "t[0]@0-7")
            assert rc.counts.get("malformed_message", 0) <= len(batch)
    assert not caplog.records  # every poll validated together: no message needed the one-by-one fallback
