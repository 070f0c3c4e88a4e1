"""Kafka message codec: flow records in, flow records out.

A message's value holds one or many flow records, in one of two formats:

* **JSON Lines**: newline-separated JSON objects with the flow-record
  columns (:data:`prism.ingest.records.FLOW_COLUMNS`).
* **Arrow IPC stream**: one or more record batches with those columns.

The format is chosen per message: a ``content-type`` header
(``application/x-ndjson`` or ``application/vnd.apache.arrow.stream``) wins;
without one, a value starting with the Arrow IPC continuation marker
``FF FF FF FF`` is Arrow and anything else is JSON Lines.

The key is the unordered GPU pair (``"ipA|ipB"``, addresses sorted), so the
per-pair state of the analyses stays on one partition. A message may carry
flows of several pairs; only scale-out relies on the key.

Decoding never raises on bad input: bad rows are counted by reason in the
:class:`~prism.ingest.records.RejectCounter` (as in the file readers) and their
neighbours kept; a message that cannot be decoded at all counts once as
``malformed_message``, and one over the size limit once as
``oversized_message``.
"""
from __future__ import annotations

import io
import logging
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from prism.ingest.ipc_headers import declared_rows, join_streams, walk_streams
from prism.ingest.readers import FlowReader
from prism.ingest.records import FLOW_COLUMNS, REQUIRED_COLUMNS, RejectCounter, bytes_type, empty_flows, validate_flows

__all__ = [
    "ARROW_CONTENT_TYPE",
    "JSONL_CONTENT_TYPE",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_MESSAGE_ROWS",
    "decode_message",
    "decode_messages",
    "read_arrow",
    "read_arrows",
    "validate_arrow",
    "encode_jsonl",
    "encode_arrow",
    "arrow_ipc",
    "pair_keys",
]

ARROW_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
JSONL_CONTENT_TYPE = "application/x-ndjson"
DEFAULT_MAX_MESSAGE_BYTES = 8 << 20
#: records one message may decode to: compressed Arrow can expand a few MB into
#: tens of millions of rows (a JSON Lines message within the byte limit holds < 100k)
MAX_MESSAGE_ROWS = 1_000_000
_ARROW_MARKER = b"\xff\xff\xff\xff"

log = logging.getLogger("prism.messages")


#: Kafka headers: (key, value) pairs
Headers = Iterable[tuple[str, "bytes | str"]]


def message_format(value: bytes, headers: Headers | None = None) -> str:
    """``"arrow"`` or ``"jsonl"`` for a message (see the module docstring).

    >>> message_format(b'{"start_ns": 1}')
    'jsonl'
    >>> message_format(b"\\xff\\xff\\xff\\xff...")
    'arrow'
    >>> message_format(b"x", [("content-type", b"application/vnd.apache.arrow.stream")])
    'arrow'
    """
    for k, v in headers or ():
        if k.lower() == "content-type":
            ct = (v.decode("latin-1") if isinstance(v, bytes) else str(v)).split(";")[0].strip().lower()
            if ct == ARROW_CONTENT_TYPE:
                return "arrow"
            if ct in (JSONL_CONTENT_TYPE, "application/jsonl", "application/json"):
                return "jsonl"
    return "arrow" if value[:4] == _ARROW_MARKER else "jsonl"


def decode_message(
    value: bytes | None,
    rejects: RejectCounter,
    source: str = "<message>",
    headers: Headers | None = None,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> pd.DataFrame:
    """Validated flow records of one message (possibly zero rows).

    Parameters
    ----------
    value : bytes
        The message value.
    rejects : RejectCounter
        Updated with every rejected row (or message) by reason.
    source : str
        Where the message came from (``topic[partition]@offset``), for the
        examples kept with the counts.
    headers : list of (str, bytes), optional
        Kafka headers; ``content-type`` picks the format.
    max_bytes : int
        Larger messages are not decoded (``oversized_message``).

    Examples
    --------
    >>> rc = RejectCounter()
    >>> v = b'{"start_ns":1,"duration_ns":2,"src":"10.0.0.1","dst":"10.0.0.2","size":64,"switches":"l1"}\\nnot json\\n'
    >>> len(decode_message(v, rc)), rc.as_dict()
    (1, {'malformed_row': 1})
    """
    if value is None or len(value) == 0:
        rejects.add("malformed_message", 1, f"{source}: empty message")
        return empty_flows()
    if len(value) > max_bytes:
        rejects.add("oversized_message", 1, f"{source}: {len(value):,} bytes > limit {max_bytes:,}")
        return empty_flows()
    if message_format(value, headers) == "arrow":
        return _decode_arrow(value, rejects, source)
    reader = FlowReader("-", stdin=io.BytesIO(value), rejects=rejects, name=source, check_columns=False)
    parts = [c for c in reader if len(c)]
    if not parts:
        return empty_flows()
    return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)


def decode_messages(messages: Iterable[tuple[bytes | None, Headers | None, str]], rejects: RejectCounter, source: str,
                    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[pd.DataFrame]:
    """Validated flow records of a poll's messages from one partition.

    Parameters
    ----------
    messages : iterable of (value, headers, where)
        ``where`` names the message (``topic[partition]@offset``).
    rejects : RejectCounter
    source : str
        Names the whole batch in examples.
    max_bytes : int
        Larger messages count once as ``oversized_message``.

    Returns
    -------
    list of pandas.DataFrame
        Zero, one or two frames (JSON Lines, Arrow).

    Notes
    -----
    The messages of one format are read and validated together (the
    per-call cost would otherwise dominate small messages). If that raises, which
    only an input the validation does not foresee can make it do, every
    message is decoded on its own: the one that raises counts once as
    ``malformed_message`` and its neighbours are kept. Never raises.
    """
    messages = list(messages)
    jsonl: list[bytes] = []
    arrow_values, arrow_sources = [], []
    for value, headers, where in messages:  # per message, not per record
        if value is None or len(value) == 0 or len(value) > max_bytes:
            decode_message(value, rejects, where, headers, max_bytes)  # counts it
        elif message_format(value, headers) == "jsonl":
            jsonl.append(value if value.endswith(b"\n") else value + b"\n")
        else:
            arrow_values.append(value)
            arrow_sources.append(where)
    trial = RejectCounter()  # merged only if the batch validates
    try:
        arrow = [t for t in read_arrows(arrow_values, trial, arrow_sources) if t.num_rows]
        out = []
        if jsonl:
            out.append(decode_message(b"".join(jsonl), trial, source, max_bytes=1 << 62))
        if arrow:
            out.append(validate_arrow(arrow, trial, source))
    except Exception as e:  # noqa: BLE001 - an unforeseen input: find the message, keep the others
        log.warning("%s: a message could not be validated with its neighbours (%s: %s); decoding one by one", source, type(e).__name__, e)
    else:
        rejects.merge(trial)
        return out
    out = []
    for value, headers, where in messages:
        if value is None or len(value) == 0 or len(value) > max_bytes:
            continue  # counted above
        one = RejectCounter()
        try:
            out.append(decode_message(value, one, where, headers, max_bytes))
        except Exception as e:  # noqa: BLE001
            rejects.add("malformed_message", 1, f"{where}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        else:
            rejects.merge(one)
    return out


def _decode_arrow(value: bytes, rejects: RejectCounter, source: str) -> pd.DataFrame:
    table = read_arrow(value, rejects, source)
    if table is None or table.num_rows == 0:
        return empty_flows()
    return validate_arrow([table], rejects, source)


#: what reading an untrusted stream can raise: any Arrow error (a damaged header
#: can also declare a buffer of petabytes: ArrowMemoryError), bad framing
_UNREADABLE = (pa.ArrowException, OSError, ValueError)


def read_arrow(value: bytes, rejects: RejectCounter, source: str) -> pa.Table | None:
    """The table of an Arrow IPC stream message, or None (counted) if unreadable or too large."""
    declared = declared_rows(value)  # from the headers: nothing decompressed yet
    if declared is not None and max(declared) > MAX_MESSAGE_ROWS:
        rejects.add("oversized_message", 1, f"{source}: declares more than {MAX_MESSAGE_ROWS:,} records "
                    f"({declared.rows:,} records, {declared.dictionary_entries:,} dictionary entries)")
        return None
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(value))
        batches, rows = [], 0
        for batch in reader:  # headers the check above could not read: stop at the bound, one batch at a time
            rows += batch.num_rows
            if rows > MAX_MESSAGE_ROWS:
                rejects.add("oversized_message", 1, f"{source}: decodes to more than {MAX_MESSAGE_ROWS:,} records")
                return None
            batches.append(batch)
        table = pa.Table.from_batches(batches, schema=reader.schema)
        _check_structure(table)
    except _UNREADABLE as e:
        rejects.add("malformed_message", 1, f"{source}: not an Arrow IPC stream ({str(e).splitlines()[0][:120]})")
        return None
    return _flow_columns(table)


def read_arrows(values: list, rejects: RejectCounter, sources: list[str]) -> list[pa.Table]:
    """The tables of several Arrow IPC stream messages, in order; as :func:`read_arrow` on each.

    Consecutive messages that are plain streams of one schema (byte for
    byte; see :func:`prism.ingest.ipc_headers.walk_streams`) and within
    :data:`MAX_MESSAGE_ROWS` are read as one stream: opening a reader costs
    tens of microseconds, as much as decoding a message of a hundred
    records. Every other message is read on its own, and so is every
    message of a joined read that fails, so a bad one is counted once
    (under its own ``sources`` entry) and its neighbours are kept.
    O(bytes) plus O(runs) reader calls.
    """
    if len(values) < 2:
        return [t for v, where in zip(values, sources) if (t := read_arrow(v, rejects, where)) is not None]
    streams = walk_streams(values)
    joinable = streams.ok & streams.plain & (streams.declared.max(axis=1) <= MAX_MESSAGE_ROWS)
    # a joinable message extends its predecessor's run if that one is joinable too, with the same schema
    extends = joinable & streams.same_schema & np.r_[False, joinable[:-1]]
    starts = np.flatnonzero(~extends)
    out = []
    for lo, hi in zip(starts.tolist(), np.r_[starts[1:], len(values)].tolist()):
        if hi - lo > 1:
            try:
                table = pa.ipc.open_stream(pa.py_buffer(join_streams(streams, np.arange(lo, hi)))).read_all()
                _check_structure(table)
            except _UNREADABLE:
                pass  # some message's body is bad: read each below, to count that one alone
            else:
                out.append(_flow_columns(table))
                continue
        out.extend(t for i in range(lo, hi) if (t := read_arrow(values[i], rejects, sources[i])) is not None)
    return out


def _check_structure(table: pa.Table) -> None:
    """Raise ArrowInvalid if a column's buffers are damaged (offsets or indices out of range).

    The IPC reader checks only that the buffers are as long as the headers
    say; a damaged offset or dictionary index would then be followed out of
    bounds by the first kernel that reads the values (a crash, not an
    error). Invalid UTF-8 is not damage: validation rejects those rows.
    One C pass in the common case; per chunk only when something fails.
    """
    try:
        table.validate(full=True)
        return
    except pa.ArrowInvalid:
        pass
    for name, column in zip(table.column_names, table.columns):
        as_bytes = bytes_type(column.type)
        for chunk in column.chunks:
            try:
                (chunk.view(as_bytes) if as_bytes != chunk.type else chunk).validate(full=True)
            except pa.ArrowInvalid as e:
                raise pa.ArrowInvalid(f"column {name!r} is damaged: {str(e).splitlines()[0][:100]}") from None


def _flow_columns(table: pa.Table) -> pa.Table:
    """The flow-record columns of a decoded table; a required one that is missing becomes nulls."""
    names = table.schema.names  # built anew at each access: once per message, not per column
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    for c in missing:
        # a missing column is a missing field in every row: validation
        # counts each row under the reason the field implies
        table = table.append_column(c, pa.nulls(table.num_rows, pa.string()))
    if missing or not _FLOW_COLUMN_SET.issuperset(names):
        table = table.select([c for c in table.schema.names if c in _FLOW_COLUMN_SET])
    return table


_FLOW_COLUMN_SET = frozenset(FLOW_COLUMNS)


def validate_arrow(tables: list, rejects: RejectCounter, source: str) -> pd.DataFrame:
    """Validate several messages' tables in one call (types unified first)."""
    try:
        table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        # columns of clashing types across messages (a path as text in one, a
        # list of names in another): validate one by one
        parts = [validate_flows(t, rejects, source, first_line=0, line_step="row") for t in tables]
        return pd.concat(parts, ignore_index=True)
    # one chunk a column, in one C call: each column's own combine would first
    # wrap every message's chunk in a Python object
    return validate_flows(table.combine_chunks(), rejects, source, first_line=0, line_step="row")


def pair_keys(src: Sequence[str] | np.ndarray | pd.Series, dst: Sequence[str] | np.ndarray | pd.Series) -> np.ndarray:
    """Kafka keys: the unordered pair ``"lo|hi"`` per record (bytes).

    >>> pair_keys(["10.0.0.2"], ["10.0.0.1"]).tolist()
    [b'10.0.0.1|10.0.0.2']
    """
    s = np.asarray(src, dtype=object).astype(str)
    d = np.asarray(dst, dtype=object).astype(str)
    lo, hi = np.where(s <= d, s, d), np.where(s <= d, d, s)
    return np.char.encode(np.char.add(np.char.add(lo, "|"), hi), "ascii").astype(object)


def encode_jsonl(flows: pd.DataFrame) -> bytes:
    """JSON Lines bytes of a flow frame (the columns it has)."""
    if len(flows) == 0:
        return b""
    text = flows.to_json(orient="records", lines=True).encode()
    # pandas >= 2 ends the last line itself: a second newline would be a
    # blank line in every message
    return text if text.endswith(b"\n") else text + b"\n"


def encode_arrow(flows: pd.DataFrame) -> bytes:
    """Arrow IPC stream bytes of a flow frame (one record batch)."""
    return arrow_ipc(pa.Table.from_pandas(flows, preserve_index=False))


def arrow_ipc(table: pa.Table) -> bytes:
    """Arrow IPC stream bytes of a table (:class:`prism.serve.produce.FlowProducer` slices one)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()
