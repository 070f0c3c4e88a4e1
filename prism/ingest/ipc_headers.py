"""Arrow IPC streams read from their message headers: the rows they declare, where their parts lie.

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

The same walk finds where each stream's schema and record batches lie
(:func:`walk_streams`), so a poll's messages that share one schema can be
read as one stream (:func:`join_streams`): opening a reader per message
cost as much as decoding its hundred records.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numba
import numpy as np

__all__ = ["Declared", "declared_rows", "Streams", "walk_streams", "join_streams"]

# MessageHeader union tags (format/Message.fbs)
_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
# field slots
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER, _MESSAGE_BODY_LENGTH = 1, 2, 3
_BATCH_LENGTH = 0
_DICTIONARY_DATA = 1
#: declared counts saturate here (sums of hostile headers must not wrap around past a bound check)
_SATURATE = 1 << 62


class Declared(NamedTuple):
    rows: int  # record batches' rows
    dictionary_entries: int  # dictionary batches' entries (a dictionary can be a bomb too)


def declared_rows(value: bytes | bytearray | memoryview) -> Declared | None:
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


class Streams(NamedTuple):
    """Several Arrow IPC streams laid end to end, and what their headers say (see :func:`walk_streams`)."""

    buf: np.ndarray  # the streams' bytes, one after the other
    ok: np.ndarray  # bool per stream: every header readable
    declared: np.ndarray  # (streams, 2): rows, dictionary entries (as declared_rows)
    plain: np.ndarray  # bool: a schema, then record batches only, nothing cut short
    same_schema: np.ndarray  # bool: byte for byte the schema of the last plain stream before it
    spans: np.ndarray  # (streams, 4): schema message [lo, hi), record batch messages [lo, hi) in buf


def walk_streams(values: Sequence[bytes | bytearray | memoryview]) -> Streams:
    """Walk the headers of several Arrow IPC streams in one compiled pass.

    Parameters
    ----------
    values : list of bytes-like
        Arrow IPC streams (one per Kafka message).

    Returns
    -------
    Streams
        Per stream, what :func:`declared_rows` reads, whether it is plain
        (one schema message, then record batches: no dictionaries, nothing
        after the end) and where its schema and its record batches lie.
        Plain streams of one schema can be read as one stream (see
        :func:`join_streams`): the reader's cost per stream, not per row,
        is what dominates messages of a hundred records. O(total header
        bytes + schema bytes), one copy of the input.

    Examples
    --------
    >>> import pyarrow as pa
    >>> def stream(t):
    ...     sink = pa.BufferOutputStream()
    ...     with pa.ipc.new_stream(sink, t.schema) as w:
    ...         w.write_table(t)
    ...     return sink.getvalue().to_pybytes()
    >>> a, b = stream(pa.table({"x": [1, 2]})), stream(pa.table({"x": [3]}))
    >>> s = walk_streams([a, b, b"junk"])
    >>> s.ok.tolist(), s.declared[:, 0].tolist(), s.plain.tolist(), s.same_schema.tolist()
    ([True, True, False], [2, 1, 0], [True, True, False], [False, True, False])
    >>> pa.ipc.open_stream(join_streams(s, [0, 1])).read_all()["x"].to_pylist()
    [1, 2, 3]
    """
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    buf = np.frombuffer(b"".join(values), dtype=np.uint8)
    ok, plain, declared, spans, same = _walk_many(buf, offsets)
    return Streams(buf, ok, declared, plain, same, spans)


def join_streams(streams: Streams, which: Sequence[int] | np.ndarray) -> np.ndarray:
    """One Arrow IPC stream of the record batches of the plain streams ``which`` (sharing one schema), in order.

    The first one's schema message, each one's record batch messages, an
    end-of-stream marker: what one writer would have written.
    """
    which = np.asarray(which, dtype=np.int64)
    first = streams.spans[which[0]]
    return _gather(streams.buf, first[0], first[1], streams.spans[which, 2], streams.spans[which, 3])


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
def _scalar(buf, lo, hi, table, i, n, signed):
    """``(ok, value)`` of a table's scalar field ``i`` of ``n`` bytes; 0 (the default) if it is not written."""
    ok, at = _field(buf, lo, hi, table, i)
    if not ok or at < 0:
        return ok, np.int64(0)
    return _int(buf, lo, hi, at, n, signed)


@numba.njit(cache=True, nogil=True)
def _subtable(buf, lo, hi, table, i):
    """``(ok, position)`` of the table field ``i`` points to; -1 if it is not written."""
    ok, at = _field(buf, lo, hi, table, i)
    if not ok or at < 0:
        return ok, np.int64(-1)
    ok, rel = _int(buf, lo, hi, at, 4, False)
    return ok, at + rel


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
def _scan(buf):
    """``(ok, rows, dictionary entries)`` of a whole stream; not ok if a header cannot be read."""
    ok, rows, entries, _, _, _, _, _ = _walk(buf, np.int64(0), np.int64(buf.shape[0]))
    return ok, rows, entries


@numba.njit(cache=True, nogil=True)
def _walk(buf, start, end):
    """The stream in ``buf[start:end]``: ``(ok, rows, dictionary entries, plain, schema lo, hi, batches lo, hi)``.

    Not ok if a header cannot be read. ``plain``: a schema message, then
    record batches only, ending at ``end`` or at an end-of-stream marker
    (no dictionaries, nothing cut short); its schema message spans
    ``[schema lo, schema hi)`` and its record batch messages
    ``[batches lo, batches hi)`` (-1, -1 without a batch).
    """
    rows = entries = np.int64(0)
    pos = start
    plain, first = True, True
    schema_lo = schema_hi = batches_lo = batches_hi = np.int64(-1)
    ended = False
    # the stream's framing (Arrow columnar format, "Encapsulated message
    # format"): [0xFFFFFFFF] int32 metadata size, the flatbuffer, the body;
    # a size of 0 ends the stream (pre-1.0 writers omit the marker)
    while pos + 4 <= end:
        msg_lo = pos
        ok, size = _int(buf, 0, end, pos, 4, True)
        pos += 4
        if size == -1:  # the continuation marker
            ok, size = _int(buf, 0, end, pos, 4, True)
            if not ok:
                return False, np.int64(0), np.int64(0), False, schema_lo, schema_hi, batches_lo, batches_hi
            pos += 4
        if size == 0:
            ended = True
            break
        if size < 0 or pos + size > end:  # a message outside the stream
            return False, np.int64(0), np.int64(0), False, schema_lo, schema_hi, batches_lo, batches_hi
        ok, kind, n, body = _message(buf, pos, pos + size)
        if not ok:
            return False, np.int64(0), np.int64(0), False, schema_lo, schema_hi, batches_lo, batches_hi
        if kind == _RECORD_BATCH:
            rows = min(rows + n, _SATURATE) if n < _SATURATE else _SATURATE
        elif kind == _DICTIONARY_BATCH:
            entries = min(entries + n, _SATURATE) if n < _SATURATE else _SATURATE
        if body > end - pos - size:
            plain = False
            break  # the body runs past the stream's end: no further header
        msg_hi = pos + size + body
        if first:
            first = False
            if kind == _SCHEMA:
                schema_lo, schema_hi = msg_lo, msg_hi
            else:
                plain = False
        elif kind == _RECORD_BATCH:
            if batches_lo < 0:
                batches_lo = msg_lo
            batches_hi = msg_hi
        else:
            plain = False
        pos = msg_hi
    plain = plain and schema_lo >= 0 and (ended or pos == end)
    return True, rows, entries, plain, schema_lo, schema_hi, batches_lo, batches_hi


@numba.njit(cache=True, nogil=True)
def _walk_many(buf, offsets):
    n = offsets.shape[0] - 1
    ok = np.zeros(n, dtype=np.bool_)
    plain = np.zeros(n, dtype=np.bool_)
    counts = np.zeros((n, 2), dtype=np.int64)
    spans = np.full((n, 4), -1, dtype=np.int64)
    same_schema = np.zeros(n, dtype=np.bool_)  # the same schema bytes as the last plain stream before it
    last = -1
    for i in range(n):
        o, r, e, p, s_lo, s_hi, b_lo, b_hi = _walk(buf, offsets[i], offsets[i + 1])
        ok[i], plain[i] = o, p
        counts[i, 0], counts[i, 1] = r, e
        spans[i, 0], spans[i, 1], spans[i, 2], spans[i, 3] = s_lo, s_hi, b_lo, b_hi
        if p:
            if last >= 0 and s_hi - s_lo == spans[last, 1] - spans[last, 0]:
                same = True
                for k in range(s_hi - s_lo):
                    if buf[s_lo + k] != buf[spans[last, 0] + k]:
                        same = False
                        break
                same_schema[i] = same
            last = i
    return ok, plain, counts, spans, same_schema


@numba.njit(cache=True, nogil=True)
def _gather(buf, schema_lo, schema_hi, lo, hi):
    """One stream: the schema message, every ``[lo, hi)`` in turn, an end-of-stream marker."""
    total = schema_hi - schema_lo + 8
    for i in range(lo.shape[0]):
        if lo[i] >= 0:
            total += hi[i] - lo[i]
    out = np.empty(total, dtype=np.uint8)
    out[: schema_hi - schema_lo] = buf[schema_lo:schema_hi]
    pos = schema_hi - schema_lo
    for i in range(lo.shape[0]):
        if lo[i] >= 0:
            out[pos : pos + hi[i] - lo[i]] = buf[lo[i] : hi[i]]
            pos += hi[i] - lo[i]
    out[pos : pos + 4] = 255  # continuation marker, then a zero length: end of stream
    out[pos + 4 :] = 0
    return out
