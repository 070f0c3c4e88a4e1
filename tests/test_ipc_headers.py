"""Rows declared by Arrow IPC headers, read without decompressing: equal to what pyarrow decodes, never raising."""
import numpy as np
import pyarrow as pa
import pytest

from prism.ipc_headers import Declared, declared_rows


def _stream(batches, compression=None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        for b in batches:
            w.write_table(b, max_chunksize=max(1, len(b) // 3 + 1))  # several record batches a table
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
@pytest.mark.parametrize("seed", range(3))
def test_declared_rows_are_the_decoded_rows(compression, seed):
    rng = np.random.default_rng(seed)
    tables = []
    for n in rng.integers(0, 5_000, 3):
        words = rng.choice(["10.0.0.1", "10.0.0.2", "fe80::1", "x" * 40], n)
        tables.append(pa.table({"start_ns": rng.integers(0, 10**18, n), "src": pa.array(words).dictionary_encode(), "dst": pa.array(words)}))
    value = _stream(tables, compression)
    table = pa.ipc.open_stream(value).read_all()
    entries = sum(len(c.chunk(0).dictionary) for c in [table.column("src")] if c.num_chunks)
    got = declared_rows(value)
    assert got.rows == table.num_rows == sum(map(len, tables))
    assert got.dictionary_entries >= entries  # one dictionary message per distinct dictionary (or delta)


def test_damaged_streams_never_raise():
    value = _stream([pa.table({"x": np.arange(1000)})], "zstd")
    rng = np.random.default_rng(0)
    for _ in range(300):
        damaged = bytearray(value)
        if rng.random() < 0.5:
            damaged = damaged[: rng.integers(0, len(value))]
        else:
            for at in rng.integers(0, len(value), 3):
                damaged[at] = rng.integers(0, 256)
        got = declared_rows(bytes(damaged))
        assert got is None or isinstance(got, Declared)
    assert declared_rows(b"") == Declared(0, 0)  # no message: nothing declared (the reader then finds no schema)
