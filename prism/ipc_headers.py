"""The rows an Arrow IPC stream declares, read from its message headers.

A compressed Arrow message of a few megabytes can decode to tens of
millions of rows, and pyarrow decompresses a whole record batch before its
rows can be counted: a bound checked after decoding comes too late for
memory. Each IPC message's header (a flatbuffer, ``format/Message.fbs`` in
the Arrow repository) states its batch's length, so the rows can be summed
before anything is decompressed::

    table Message         { version: short; header: MessageHeader (union); bodyLength: long; ... }
    table RecordBatch     { length: long; nodes; buffers; compression; ... }
    table DictionaryBatch { id: long; data: RecordBatch; isDelta: bool }

Only those fields are read, with every offset bounds-checked; a header
that cannot be read is left to pyarrow's reader, which validates it. The
walk is compiled (numba): the daemon runs it once per Kafka message, and
in Python it was a third of decoding a message of a hundred records.
"""
from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

__all__ = ["Declared", "declared_rows"]

# MessageHeader union tags (format/Message.fbs)
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3
# field slots
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER, _MESSAGE_BODY_LENGTH = 1, 2, 3
_BATCH_LENGTH = 0
_DICTIONARY_DATA = 1
#: declared counts saturate here (sums of hostile headers must not wrap around past a bound check)
_SATURATE = 1 << 62


class Declared(NamedTuple):
    rows: int  # record batches' rows
    dictionary_entries: int  # dictionary batches' entries (a dictionary can be a bomb too)


def declared_rows(value) -> Declared | None:
    """What an Arrow IPC stream's headers declare: its rows and its dictionaries' entries.

    Parameters
    ----------
    value : bytes-like
        An Arrow IPC stream.

    Returns
    -------
    Declared or None
        None if the headers cannot be read (the stream is malformed:
        pyarrow's reader says how). Bodies are skipped, not read.
        O(messages), compiled: a few hundred nanoseconds a message (the
        daemon reads one stream per Kafka message, so this runs per
        message, not per record). Counts saturate at 2**62.

    Examples
    --------
    >>> import pyarrow as pa
    >>> t = pa.table({"x": list(range(5)), "s": pa.array(["a", "b"] * 2 + ["a"]).dictionary_encode()})
    >>> sink = pa.BufferOutputStream()
    >>> with pa.ipc.new_stream(sink, t.schema) as w:
    ...     w.write_table(t); w.write_table(t)
    >>> declared_rows(sink.getvalue())
    Declared(rows=10, dictionary_entries=2)
    """
    ok, rows, entries = _scan(np.frombuffer(value, dtype=np.uint8))
    return Declared(int(rows), int(entries)) if ok else None


@numba.njit(cache=True)
def _int(buf, lo, hi, at, n, signed):
    """``(ok, value)``: the little-endian integer of ``n`` bytes at ``lo + at``, if it lies within ``[lo, hi)``."""
    p = lo + at
    if at < 0 or p + n > hi:
        return False, np.int64(0)
    v = np.uint64(0)
    for k in range(n):
        v |= np.uint64(buf[p + k]) << np.uint64(8 * k)
    x = np.int64(v)  # 8 bytes: the two's complement int64 itself
    if signed and n < 8 and x >= (np.int64(1) << (8 * n - 1)):
        x -= np.int64(1) << (8 * n)
    return True, x


@numba.njit(cache=True)
def _field(buf, lo, hi, table, i):
    """``(ok, at)`` of a flatbuffer table's field ``i`` (by its vtable slot); ``at`` is -1 for a field not written."""
    ok, soff = _int(buf, lo, hi, table, 4, True)
    if not ok:
        return False, np.int64(-1)
    vtable = table - soff
    ok, vt_len = _int(buf, lo, hi, vtable, 2, False)
    if not ok:
        return False, np.int64(-1)
    slot = 4 + 2 * i
    if slot + 2 > vt_len:
        return True, np.int64(-1)  # an older writer's table: the field has its default
    ok, off = _int(buf, lo, hi, vtable + slot, 2, False)
    if not ok:
        return False, np.int64(-1)
    return True, (table + off if off else np.int64(-1))


@numba.njit(cache=True)
def _scalar(buf, lo, hi, table, i, n, signed):
    """``(ok, value)`` of a table's scalar field ``i`` of ``n`` bytes; 0 (the default) if it is not written."""
    ok, at = _field(buf, lo, hi, table, i)
    if not ok or at < 0:
        return ok, np.int64(0)
    return _int(buf, lo, hi, at, n, signed)


@numba.njit(cache=True)
def _subtable(buf, lo, hi, table, i):
    """``(ok, position)`` of the table field ``i`` points to; -1 if it is not written."""
    ok, at = _field(buf, lo, hi, table, i)
    if not ok or at < 0:
        return ok, np.int64(-1)
    ok, rel = _int(buf, lo, hi, at, 4, False)
    return ok, at + rel


@numba.njit(cache=True)
def _message(buf, lo, hi):
    """``(ok, header type, declared length, body bytes)`` of the message flatbuffer in ``buf[lo:hi]``."""
    ok, root = _int(buf, lo, hi, 0, 4, False)
    if not ok:
        return False, 0, np.int64(0), np.int64(0)
    ok, kind = _scalar(buf, lo, hi, root, _MESSAGE_HEADER_TYPE, 1, False)
    if not ok:
        return False, 0, np.int64(0), np.int64(0)
    ok, body = _scalar(buf, lo, hi, root, _MESSAGE_BODY_LENGTH, 8, True)
    if not ok or body < 0:  # a negative body length
        return False, 0, np.int64(0), np.int64(0)
    if kind != _RECORD_BATCH and kind != _DICTIONARY_BATCH:
        return True, kind, np.int64(0), body  # a schema (or a tensor, which the reader refuses)
    ok, header = _subtable(buf, lo, hi, root, _MESSAGE_HEADER)
    if ok and header >= 0 and kind == _DICTIONARY_BATCH:
        ok, header = _subtable(buf, lo, hi, header, _DICTIONARY_DATA)
    if not ok:
        return False, 0, np.int64(0), np.int64(0)
    n = np.int64(0)
    if header >= 0:
        ok, n = _scalar(buf, lo, hi, header, _BATCH_LENGTH, 8, True)
        if not ok:
            return False, 0, np.int64(0), np.int64(0)
    return True, kind, max(n, np.int64(0)), body


@numba.njit(cache=True)
def _scan(buf):
    """``(ok, rows, dictionary entries)`` of a whole stream; not ok if a header cannot be read."""
    size_of = buf.shape[0]
    rows = entries = pos = np.int64(0)
    # the stream's framing (Arrow columnar format, "Encapsulated message
    # format"): [0xFFFFFFFF] int32 metadata size, the flatbuffer, the body;
    # a size of 0 ends the stream (pre-1.0 writers omit the marker)
    while pos + 4 <= size_of:
        ok, size = _int(buf, 0, size_of, pos, 4, True)
        pos += 4
        if size == -1:  # the continuation marker
            ok, size = _int(buf, 0, size_of, pos, 4, True)
            if not ok:
                return False, np.int64(0), np.int64(0)
            pos += 4
        if size == 0:
            break
        if size < 0 or pos + size > size_of:
            return False, np.int64(0), np.int64(0)  # a message outside the stream
        ok, kind, n, body = _message(buf, pos, pos + size)
        if not ok:
            return False, np.int64(0), np.int64(0)
        if kind == _RECORD_BATCH:
            rows = min(rows + n, _SATURATE) if n < _SATURATE else _SATURATE
        elif kind == _DICTIONARY_BATCH:
            entries = min(entries + n, _SATURATE) if n < _SATURATE else _SATURATE
        if body > size_of - pos - size:
            break  # the body runs past the stream's end: no further header
        pos += size + body
    return True, rows, entries
