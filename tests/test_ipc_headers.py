"""Rows declared by Arrow IPC headers, read without decompressing: equal to what pyarrow decodes, never raising."""
import numpy as np
import pyarrow as pa
import pytest
from reference_ipc_headers import declared_rows as reference_rows

from prism.ingest.ipc_headers import Declared, declared_rows


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


def _same_as_reference(value: bytes) -> None:
    got, want = declared_rows(value), reference_rows(value)
    if want is None:
        assert got is None
    else:  # the compiled walk saturates its sums (hostile headers must not wrap past the bound check)
        assert got == Declared(min(want.rows, 2**62), min(want.dictionary_entries, 2**62))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_the_compiled_walk_reads_what_the_python_walk_reads(compression):
    """Same counts on whole streams, and the same verdict on every damaged one (cut short, bytes overwritten, garbage)."""
    rng = np.random.default_rng(1)
    words = rng.choice(["10.0.0.1", "fe80::1", "x" * 40], 700)
    value = _stream([pa.table({"start_ns": rng.integers(0, 10**18, 700), "src": pa.array(words).dictionary_encode()})], compression)
    _same_as_reference(value)
    for _ in range(2_000):
        damaged = bytearray(value)
        if rng.random() < 0.3:
            damaged = damaged[: rng.integers(0, len(value))]
        for at in rng.integers(0, max(len(damaged), 1), rng.integers(1, 6)):
            if at < len(damaged):
                damaged[at] = rng.integers(0, 256)
        _same_as_reference(bytes(damaged))
    for n in range(0, 64):
        _same_as_reference(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    _same_as_reference(b"\xff\xff\xff\xff")  # a continuation marker and nothing after it
