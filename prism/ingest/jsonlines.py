"""Flow records from JSON Lines in one compiled pass over the bytes.

A collector writes one flat JSON object per flow::

    {"start_ns":1767225600000328107,"duration_ns":21773,"src":"10.1.0.1","dst":"10.1.0.2","size":709351,"switches":"leaf-1"}

:func:`read_flow_lines` parses a block of such lines straight into the
Arrow table that ``pyarrow.json.read_json`` gives with the flow schema
(:data:`SCHEMA`), or returns None when some line is outside the plain form
below, for the caller to parse the block with pyarrow instead. Nothing
outside that form is interpreted here, so every table is pyarrow's.

The plain form: each line one JSON object of keys without escapes, whose
values are integers without fraction or exponent (within int64), ASCII
strings without escapes or control characters, or ``null``; a key of the
flow schema at most once; other keys (ignored, as pyarrow is told to) with
such values too; spaces and tabs between tokens, a ``\\r`` before the
newline. Blank lines are skipped. Not a number where the schema has text,
nor text where it has a number.

Why hand-written: pyarrow's reader is general (any nesting, type
inference, a chunker and a thread pool) and spends about 1.7 CPU seconds on
the 293 MB of the demo's records, 5.7 us a record, most of what a daemon
fed JSON Lines does. This pass takes about 0.35 s on one core and releases
the GIL. Polars' NDJSON reader measured no faster here; orjson and
msgspec make a Python object per record. (Numbering the text in the same
pass, with a hash table per column, cost as much as the copy and the
dictionary encoding it would have saved.)
"""
from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
import pyarrow as pa

__all__ = ["SCHEMA", "FlowLines", "read_flow_lines"]

#: The flow columns as pyarrow's JSON reader is told to parse them.
SCHEMA = pa.schema(
    [
        ("start_ns", pa.int64()),
        ("duration_ns", pa.int64()),
        ("src", pa.string()),
        ("dst", pa.string()),
        ("size", pa.int64()),
        ("switches", pa.string()),
        ("src_qp", pa.int64()),
        ("dst_qp", pa.int64()),
    ]
)

_KEYS = [f.name.encode() for f in SCHEMA]
_KEY_BYTES = np.frombuffer(b"".join(_KEYS), dtype=np.uint8)
_KEY_LEN = np.array([len(k) for k in _KEYS], dtype=np.int64)
_KEY_START = np.concatenate([[0], np.cumsum(_KEY_LEN)[:-1]]).astype(np.int64)
_IS_TEXT = np.array([pa.types.is_string(f.type) for f in SCHEMA], dtype=np.bool_)
# each key's row in the integer or the text output
_SLOT = np.array([int((_IS_TEXT[:k] == _IS_TEXT[k]).sum()) for k in range(len(_KEYS))], dtype=np.int64)

_QUOTE, _BACKSLASH, _COLON, _COMMA, _OPEN, _CLOSE, _MINUS, _ZERO, _NINE = 34, 92, 58, 44, 123, 125, 45, 48, 57
_NEWLINE, _RETURN, _SPACE, _TAB = 10, 13, 32, 9
_INT64_MAX = 9223372036854775807


class FlowLines(NamedTuple):
    """A block's flow records as :func:`read_flow_lines` read them."""

    table: pa.Table
    """Columns of :data:`SCHEMA`."""
    row_lines: np.ndarray | None
    """Each row's line (from 0) where blank lines sit between rows, else None."""
    lines: int
    """Lines in the block, blank ones included."""


@numba.njit(cache=True, nogil=True, inline="always")
def _blank(buf, i, n):  # pragma: no cover - compiled
    """The first index from ``i`` that is not a space or a tab."""
    while i < n and (buf[i] == _SPACE or buf[i] == _TAB):
        i += 1
    return i


@numba.njit(cache=True, nogil=True, inline="always")
def _string_end(buf, i, n):  # pragma: no cover - compiled
    """Index of the closing quote of a plain string whose text starts at ``i``; -1 if not plain or not closed."""
    while i < n:
        c = buf[i]
        if c == _QUOTE:
            return i
        if c == _BACKSLASH or c < 32 or c >= 128:
            return -1
        i += 1
    return -1


@numba.njit(cache=True, nogil=True, inline="always")
def _is_key(buf, start, length, key_bytes, key_start, key_len, k):  # pragma: no cover - compiled
    """Whether the ``length`` bytes at ``start`` are schema key ``k``."""
    if key_len[k] != length:
        return False
    for m in range(length):
        if buf[start + m] != key_bytes[key_start[k] + m]:
            return False
    return True


# what _scan stopped for
_DONE, _NOT_PLAIN, _ROWS_FULL = 0, 1, 2


@numba.njit(cache=True, nogil=True)
def _scan(buf, i, row, lines, ints, text_start, text_end, present, row_line, key_bytes, key_start, key_len, is_text, slot):  # pragma: no cover - compiled
    """Read plain flow objects from byte ``i`` (a line's start) on, blank lines skipped.

    Fills, per schema key in its slot, ``ints`` or the byte range of each
    row's text; ``present`` (not null, not absent); each row's line.
    Returns (what it stopped for, the byte offset, rows, lines): at the
    end, at a line that is not plain (the caller falls back to pyarrow), or
    at the start of a line when the rows are full: the caller grows them
    and calls again from there. (Growing here would reassign arrays inside
    the loop, which numba compiles to a much slower one.)
    """
    n = len(buf)
    nk = len(is_text)
    capacity = row_line.shape[0]
    while i < n:
        if row == capacity:
            return _ROWS_FULL, i, row, lines
        i = _blank(buf, i, n)
        if i >= n:  # the last line, blank
            lines += 1
            break
        if buf[i] != _OPEN:  # a blank line, or not an object
            if buf[i] == _RETURN:
                i += 1
            if i < n and buf[i] != _NEWLINE:
                return _NOT_PLAIN, i, row, lines
            lines += 1
            i += 1
            continue
        i = _blank(buf, i + 1, n)
        seen = 0
        if i < n and buf[i] == _CLOSE:
            i += 1
        else:
            while True:
                if i >= n or buf[i] != _QUOTE:
                    return _NOT_PLAIN, i, row, lines
                end = _string_end(buf, i + 1, n)
                if end < 0:
                    return _NOT_PLAIN, i, row, lines
                k = -1
                for j in range(nk):
                    if _is_key(buf, i + 1, end - i - 1, key_bytes, key_start, key_len, j):
                        k = j
                        break
                if k >= 0:
                    if seen & (1 << k):  # a key twice: pyarrow decides
                        return _NOT_PLAIN, i, row, lines
                    seen |= 1 << k
                i = _blank(buf, end + 1, n)
                if i >= n or buf[i] != _COLON:
                    return _NOT_PLAIN, i, row, lines
                i = _blank(buf, i + 1, n)
                if i >= n:
                    return _NOT_PLAIN, i, row, lines
                c = buf[i]
                if c == _QUOTE:
                    end = _string_end(buf, i + 1, n)
                    if end < 0 or (k >= 0 and not is_text[k]):
                        return _NOT_PLAIN, i, row, lines
                    if k >= 0:
                        text_start[slot[k], row] = i + 1
                        text_end[slot[k], row] = end
                        present[k, row] = True
                    i = end + 1
                elif c == _MINUS or (c >= _ZERO and c <= _NINE):
                    negative = c == _MINUS
                    first = i + 1 if negative else i
                    i = first
                    v = np.uint64(0)
                    while i < n and buf[i] >= _ZERO and buf[i] <= _NINE and i - first < 20:
                        v = v * np.uint64(10) + np.uint64(buf[i] - _ZERO)
                        i += 1
                    digits = i - first
                    if (digits == 0 or digits > 19 or (digits > 1 and buf[first] == _ZERO) or v > np.uint64(_INT64_MAX)
                            or (k >= 0 and is_text[k])):
                        return _NOT_PLAIN, i, row, lines
                    if k >= 0:
                        ints[slot[k], row] = -np.int64(v) if negative else np.int64(v)
                        present[k, row] = True
                elif c == 110 and i + 3 < n and buf[i + 1] == 117 and buf[i + 2] == 108 and buf[i + 3] == 108:  # null
                    i += 4
                else:  # true, false, an object, an array, not JSON: pyarrow decides
                    return _NOT_PLAIN, i, row, lines
                i = _blank(buf, i, n)
                if i >= n:
                    return _NOT_PLAIN, i, row, lines
                if buf[i] == _COMMA:
                    i = _blank(buf, i + 1, n)
                    continue
                if buf[i] != _CLOSE:  # a fraction, an exponent, a letter after a value
                    return _NOT_PLAIN, i, row, lines
                i += 1
                break
        i = _blank(buf, i, n)
        if i < n and buf[i] == _RETURN:
            i += 1
        if i < n:
            if buf[i] != _NEWLINE:
                return _NOT_PLAIN, i, row, lines
            i += 1
        row_line[row] = lines
        lines += 1
        row += 1
    return _DONE, i, row, lines


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` with its last axis grown to ``size``, the new part zeros."""
    out = np.zeros(a.shape[:-1] + (size,), dtype=a.dtype)
    out[..., : a.shape[-1]] = a
    return out


@numba.njit(cache=True, nogil=True)
def _gather(buf, start, end, present):  # pragma: no cover - compiled
    """Arrow string offsets and data of the byte ranges of present rows (absent rows are empty)."""
    n = len(start)
    offsets = np.empty(n + 1, dtype=np.int32)
    total = 0
    for r in range(n):
        offsets[r] = total
        if present[r]:
            total += end[r] - start[r]
    offsets[n] = total
    data = np.empty(total, dtype=np.uint8)
    p = 0
    for r in range(n):
        if present[r]:
            for j in range(start[r], end[r]):
                data[p] = buf[j]
                p += 1
    return offsets, data


def _validity(present: np.ndarray) -> tuple[pa.Buffer | None, int]:
    """An Arrow validity bitmap of ``present`` (None when every row is) and the null count."""
    nulls = len(present) - int(np.count_nonzero(present))
    return (pa.py_buffer(np.packbits(present, bitorder="little")) if nulls else None), nulls


def read_flow_lines(block: bytes) -> FlowLines | None:
    """The flow records of a block of JSON Lines, when every line is plain or blank.

    Parameters
    ----------
    block : bytes
        Whole lines, each ended by a newline (the last may end the block
        instead).

    Returns
    -------
    FlowLines or None
        The block's non-blank lines as ``pyarrow.json.read_json`` parses
        them with :data:`SCHEMA` and other keys ignored. None when a line
        is neither blank nor in the plain form (see the module docstring),
        or no line holds a row: the caller's to parse with pyarrow.

    Notes
    -----
    One compiled pass over the bytes, then one over each text column's
    values: O(bytes). Its text is ASCII, so valid UTF-8.

    Examples
    --------
    >>> got = read_flow_lines(b'{"start_ns":1,"duration_ns":2,"src":"10.0.0.1","dst":"10.0.0.2","size":64,"switches":null}\\n')
    >>> got.table.column("src").to_pylist(), got.table.column("switches").to_pylist(), got.table.column("src_qp").null_count, got.lines
    (['10.0.0.1'], [None], 1, 1)
    >>> read_flow_lines(b'{"size":1.5}\\n') is None  # a fraction: pyarrow's to parse
    True
    >>> read_flow_lines(b'\\n{"size":2}\\n').row_lines  # a blank line first
    array([1])
    """
    if not block or len(block) >= 1 << 31:  # Arrow string offsets are int32
        return None
    buf = np.frombuffer(block, dtype=np.uint8)
    n_int, n_text = int((~_IS_TEXT).sum()), int(_IS_TEXT.sum())
    capacity = len(block) // 64 + 16  # rows (a flow record takes 80 bytes or more); doubled when short
    ints = np.zeros((n_int, capacity), dtype=np.int64)  # zeros: a null's slot holds 0, not what memory held
    text_start = np.empty((n_text, capacity), dtype=np.int64)  # read only where present
    text_end = np.empty((n_text, capacity), dtype=np.int64)
    present = np.zeros((len(SCHEMA), capacity), dtype=np.bool_)
    row_line = np.empty(capacity, dtype=np.int64)
    i = rows = lines = 0
    while True:
        stop, i, rows, lines = _scan(buf, i, rows, lines, ints, text_start, text_end, present, row_line,
                                     _KEY_BYTES, _KEY_START, _KEY_LEN, _IS_TEXT, _SLOT)
        if stop == _DONE:
            break
        if stop == _NOT_PLAIN:
            return None
        capacity *= 2  # _ROWS_FULL
        ints, text_start, text_end, present, row_line = (_grown(a, capacity) for a in (ints, text_start, text_end, present, row_line))
    if rows == 0:
        return None
    columns = []
    for k, field in enumerate(SCHEMA):
        has = present[k, :rows]
        validity, nulls = _validity(has)
        s = _SLOT[k]
        if _IS_TEXT[k]:
            offsets, data = _gather(buf, text_start[s, :rows], text_end[s, :rows], has)
            columns.append(pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(data), validity, nulls))
        elif nulls == rows:
            columns.append(pa.nulls(rows, field.type))
        else:
            columns.append(pa.Array.from_buffers(field.type, rows, [validity, pa.py_buffer(ints[s, :rows])], nulls))
    table = pa.Table.from_arrays(columns, schema=SCHEMA)
    return FlowLines(table, None if rows == lines else row_line[:rows].copy(), lines)
