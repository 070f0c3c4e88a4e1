"""Readers (and the writer) for flow dumps: CSV, Parquet and JSON Lines, each optionally gzip.

The format is picked by extension (``.csv``, ``.parquet``/``.pq``,
``.jsonl``/``.ndjson``/``.json``, each optionally followed by ``.gz``); ``-``
reads JSON Lines from standard input. Every reader is a generator of
validated chunks (:func:`prism.ingest.records.validate_flows`), so a dump larger
than memory streams through in ``chunk_rows`` pieces.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from prism.ingest.jsonlines import SCHEMA as JSON_SCHEMA, read_flow_lines
from prism.ingest.records import (
    FLOW_COLUMNS,
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    FlowFormatError,
    RejectCounter,
    validate_flows,
)

__all__ = ["FlowReader", "detect_format", "read_flows", "write_flows", "DEFAULT_CHUNK_ROWS"]

DEFAULT_CHUNK_ROWS = 1 << 18
#: a flow record is ~150 bytes; a line this long is garbage, skipped (counted) rather than buffered
MAX_LINE_BYTES = 1 << 20
#: good lines read one by one after the last bad one before the block parser takes over again
RESUME_AFTER_LINES = 1000
_DICT = pa.dictionary(pa.int32(), pa.string())
#: columns of repeated text (a cluster has thousands of addresses and paths):
#: read as dictionaries, so validation converts distinct values, not rows
_TEXT_COLUMNS = ("src", "dst", "switches")
_FORMATS = {
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
}
def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def detect_format(path: str) -> tuple[str, bool]:
    """Return (format, gzipped) for a path, from its extension.

    >>> detect_format("flows.csv.gz")
    ('csv', True)
    >>> detect_format("-")
    ('jsonl', False)
    """
    if path == "-":
        return "jsonl", False
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    if gz:
        suffixes = suffixes[:-1]
    if suffixes and suffixes[-1] in _FORMATS:
        return _FORMATS[suffixes[-1]], gz
    raise FlowFormatError(
        f"{path}: cannot tell the format from the extension; use one of "
        + ", ".join(sorted(_FORMATS))
        + " (optionally followed by .gz), or - for JSON Lines on stdin"
    )


def _check_columns(path: str, names, keys=None) -> None:
    """Raise naming the missing columns; ``keys``: what the input has instead (e.g. a JSON record's keys)."""
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        found = ", ".join(map(str, names)) or "none"
        if not names and keys:
            found = f"none; the first record's keys are {', '.join(map(str, list(keys)[:10]))}"
        lower = {str(k).lower() for k in (keys if keys is not None else names)}
        hint = "; names are lowercase" if any(c in lower for c in missing) else ""
        raise FlowFormatError(
            f"{path}: missing required column{'s' if len(missing) > 1 else ''} "
            + ", ".join(repr(c) for c in missing)
            + f" (found: {found}; required: {', '.join(REQUIRED_COLUMNS)}{hint})"
        )


def _first_record_keys(block: bytes) -> list:
    """The keys of a block's first JSON object line (for an error message)."""
    for line in block.split(b"\n"):
        if line.strip():
            try:
                obj = json.loads(line)
            except ValueError:
                return []
            return list(obj) if isinstance(obj, dict) else []
    return []


class FlowReader:
    """Stream validated flow chunks from one file.

    Parameters
    ----------
    path : str
        File path or ``-`` for JSON Lines on stdin.
    chunk_rows : int
        Rows per chunk (approximate for CSV and JSON Lines, which are read
        in blocks of bytes).
    rejects : RejectCounter, optional
        Shared counter for rejected rows; a new one is made if omitted.
    stdin : binary file, optional
        Read this instead of standard input when ``path`` is ``-``.
    name : str, optional
        Source name in reject examples (default: the path, ``<stdin>``).
    check_columns : bool, default True
        Raise :class:`FlowFormatError` when a required column is absent
        from the input; when False, rows missing a field are rejected one by
        one instead (JSON Lines only).

    Attributes
    ----------
    rows_read : int
        Data rows seen (accepted + rejected).
    bytes_total, bytes_done : int
        For progress reporting (on-disk bytes; 0 total when unknown).
    """

    def __init__(
        self,
        path: str,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        rejects: RejectCounter | None = None,
        stdin=None,
        name: str | None = None,
        check_columns: bool = True,
    ):
        self.path = str(path)
        self.name = name
        # a file missing a column is unreadable; a Kafka message missing one
        # is a batch of bad rows, counted like any other
        self.check_columns = check_columns
        self.format, self.gzipped = detect_format(self.path)
        self.chunk_rows = int(chunk_rows)
        if self.chunk_rows < 1:
            raise ValueError("chunk_rows must be >= 1")
        self.rejects = rejects if rejects is not None else RejectCounter()
        self.rows_read = 0
        self._stdin = stdin
        self.bytes_total = 0
        self.bytes_done = 0
        if self.path != "-":
            if not os.path.exists(self.path):
                raise FileNotFoundError(f"{self.path}: no such file")
            self.bytes_total = os.path.getsize(self.path)

    def __iter__(self) -> Iterator[pd.DataFrame]:
        reader = {"csv": self._csv, "parquet": self._parquet, "jsonl": self._jsonl}[self.format]
        try:
            yield from reader()
        except FlowFormatError:
            raise
        except (OSError, EOFError, zlib.error, UnicodeError, pa.ArrowException, KeyError, TypeError, ValueError) as e:
            # truncated or corrupt compression, a column of a type no flow
            # field has, a header that names a column twice: the file is
            # unreadable from here on, which the user must hear with its name
            # (the rows before it were read and validated)
            raise FlowFormatError(f"{self.path}: unreadable after {self.rows_read:,} rows ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from e

    # -- CSV ---------------------------------------------------------------
    def _csv(self):
        # Every column is read as text: a typed read would fail the whole
        # block on one bad value; validation parses numbers exactly instead.
        try:
            header = self._csv_header()
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise FlowFormatError(f"{self.path}: cannot read: {e}") from e
        _check_columns(self.path, header)
        # pyarrow's block parser, and where it fails (a row it cannot take: bad
        # UTF-8, a field longer than its block; corrupt compression) line by
        # line past the trouble, then the block parser again from there
        line = 2
        while line is not None:
            failed_at = yield from self._csv_blocks(header, line)
            line = None if failed_at is None else (yield from self._csv_lines(header, failed_at))
        self.bytes_done = self.bytes_total

    def _block_size(self) -> int:
        # small blocks: the reader buffers several ahead, so the block size, not the chunk size, sets its memory
        return min(4 << 20, max(1 << 16, self.chunk_rows * 80))

    def _csv_blocks(self, header: list[str], first: int):
        """Rows from line ``first`` on with pyarrow's block parser; returns None at the end of the
        file, or the first line of the block it could not parse (the rows before it are yielded)."""
        invalid: list[tuple[int | None, str]] = []

        def on_invalid(row):
            invalid.append((row.number, row.text))
            return "skip"

        # A Python file object, not pyarrow's OSFile: after a failure the reader's read-ahead may still
        # be in flight; on a closed Python file it fails, where on a closed OSFile it would read (and
        # move) whatever file next got the same descriptor, such as the line-by-line reader's.
        raw = open(self.path, "rb")
        stream = gzip.GzipFile(fileobj=raw) if self.gzipped else raw
        if first == 2:  # the whole file, its header row skipped by pyarrow
            skip, offset = 1, 0
        else:  # resuming: moved to the line; pyarrow numbers rows from there
            for _ in range(first - 1):
                stream.readline()
            skip, offset = 0, first - 1
        try:
            try:
                rd = pacsv.open_csv(
                    stream,
                    # single-threaded so that pyarrow numbers the rows it skips
                    read_options=pacsv.ReadOptions(block_size=self._block_size(), use_threads=False,
                                                   column_names=header, skip_rows=skip),  # the header as cleaned (no BOM, no spaces)
                    parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid),
                    convert_options=pacsv.ConvertOptions(
                        # addresses and paths repeat: dictionary-encode while parsing
                        column_types={c: _DICT if c in _TEXT_COLUMNS else pa.string() for c in header},
                        include_columns=[c for c in header if c in FLOW_COLUMNS],
                        strings_can_be_null=False,
                        quoted_strings_can_be_null=False,
                    ),
                )
            except (pa.ArrowInvalid, OSError) as e:
                if isinstance(e, OSError) and not self.gzipped:
                    raise
                # the first block already holds the trouble (or the file is the header alone)
                return first
            row = first  # the line of the next row
            pending: list[pa.RecordBatch] = []
            pending_lines: list[np.ndarray] = []
            # rows pyarrow skipped, by line, until the numbering passes them: it parses ahead,
            # so a skipped row can be reported while an earlier batch is handed out
            skipped: dict[int, str] = {}

            def take_invalid():
                for n, text in invalid:
                    if n is None:  # no place to give it: counted now
                        self.rejects.add("malformed_row", 1, f"{self.path}:line ?: {text[:80]!r}")
                        self.rows_read += 1
                    else:
                        skipped[n + offset] = text
                invalid.clear()

            def count_skipped(before: int):
                for ln in sorted(k for k in skipped if k < before):
                    self.rejects.add("malformed_row", 1, f"{self.path}:line {ln}: {skipped.pop(ln)[:80]!r}")
                    self.rows_read += 1

            try:
                for batch in rd:
                    # number the batch's rows around the skipped ones, so examples point at the right line
                    take_invalid()
                    lines = np.arange(row, row + batch.num_rows + len(skipped))
                    if skipped:
                        lines = lines[~np.isin(lines, list(skipped))]
                    numbers = lines[: batch.num_rows]
                    row = int(numbers[-1]) + 1 if len(numbers) else row
                    count_skipped(row)
                    pending.append(batch)
                    pending_lines.append(numbers)
                    if sum(b.num_rows for b in pending) >= self.chunk_rows:
                        self.bytes_done = raw.tell()
                        yield from self._csv_flush(pending, pending_lines)
            except (pa.ArrowInvalid, OSError) as e:
                if isinstance(e, OSError) and not self.gzipped:
                    raise
                # rows skipped in the failing block are read again line by line (and counted there)
                yield from self._csv_flush(pending, pending_lines)
                return row
            take_invalid()
            count_skipped(1 << 62)
            yield from self._csv_flush(pending, pending_lines)
            return None
        finally:
            stream.close()
            if stream is not raw:
                raw.close()

    def _csv_flush(self, pending, pending_lines):
        """Validate the gathered batches in chunks of ``chunk_rows``; empties the lists."""
        if not pending:
            return
        table = pa.Table.from_batches(pending)
        numbers = np.concatenate(pending_lines)
        pending.clear()
        pending_lines.clear()
        for off in range(0, table.num_rows, self.chunk_rows):
            sub = table.slice(off, self.chunk_rows)
            self.rows_read += sub.num_rows
            yield validate_flows(sub, self.rejects, self.path, line_numbers=numbers[off : off + sub.num_rows])

    def _csv_lines(self, header: list[str], first: int):
        """Rows from line ``first`` on, one line at a time (the block pyarrow could not parse).

        Each line is decoded and split on its own: one that is not UTF-8, is
        longer than ``MAX_LINE_BYTES`` or has the wrong number of fields is
        counted as ``malformed_row`` with its line number, and the rest go
        through the same validation as the fast path. Lines are numbered as
        lines (a quoted field spanning lines is not expected in flow dumps).

        Returns the line to hand back to the block parser once
        ``RESUME_AFTER_LINES`` good lines have followed the last bad one, and
        either a bad line was found or the block the parser failed on is
        behind (a line it could not take but this reader can: one straddling
        its blocks); or None at the end of the file. Every return is past at
        least one bad line or one block, so the two readers always progress.
        """
        import csv

        # the csv module's default field limit (128 KiB) is below the line limit this reader applies
        if csv.field_size_limit() < MAX_LINE_BYTES:
            csv.field_size_limit(MAX_LINE_BYTES)
        keep = [i for i, c in enumerate(header) if c in FLOW_COLUMNS]
        opener = gzip.open if self.gzipped else open
        rows: list[list[str]] = []
        numbers: list[int] = []

        def flush():
            if rows:
                cols = list(zip(*rows))
                table = pa.table({header[i]: pa.array(cols[k], pa.string()) for k, i in enumerate(keep)})
                self.rows_read += len(rows)
                yield validate_flows(table, self.rejects, self.path, line_numbers=np.array(numbers, dtype=np.int64))
                rows.clear()
                numbers.clear()

        def bad(n, why):
            nonlocal good_since_bad, found
            self.rejects.add("malformed_row", 1, f"{self.path}:line {n}: {why}")
            self.rows_read += 1
            good_since_bad, found = 0, True

        span = self._block_size() + MAX_LINE_BYTES  # the failed block, and a line straddling its end
        with opener(self.path, "rb") as f:
            n = 0
            done = 0  # bytes from line ``first`` on
            good_since_bad = 0
            found = False
            while True:
                if n >= first and (found or done >= span) and good_since_bad >= RESUME_AFTER_LINES:
                    yield from flush()
                    return n + 1
                try:
                    raw = f.readline(MAX_LINE_BYTES + 1)
                except (OSError, EOFError, zlib.error):
                    yield from flush()  # the rows before corrupt compression count as read
                    raise
                if not raw:
                    break
                n += 1
                if n >= first:
                    done += len(raw)
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    while raw and not raw.endswith(b"\n"):  # drop the rest of the line, unbuffered
                        raw = f.readline(MAX_LINE_BYTES + 1)
                        done += len(raw)
                    if n >= first:
                        bad(n, f"longer than {MAX_LINE_BYTES:,} bytes")
                    continue
                if n < first or not raw.strip():
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    bad(n, f"not UTF-8 ({e.reason} at byte {e.start})")
                    continue
                try:
                    fields = next(csv.reader([text.rstrip("\r\n")]), [])
                except csv.Error as e:  # e.g. a bare carriage return inside the line
                    bad(n, f"{e}: {text[:80]!r}")
                    continue
                if len(fields) != len(header):
                    bad(n, f"{len(fields)} fields, the header has {len(header)}: {text[:80]!r}")
                    continue
                rows.append([fields[i] for i in keep])
                numbers.append(n)
                good_since_bad += 1
                if len(rows) >= self.chunk_rows:
                    yield from flush()
        yield from flush()
        return None

    def _csv_header(self) -> list[str]:
        opener = gzip.open if self.gzipped else open
        with opener(self.path, "rt", encoding="utf-8", errors="replace", newline="") as f:
            first = f.readline()
        if not first.strip():
            what = "empty file" if not first else "the first line is blank"
            raise FlowFormatError(f"{self.path}: {what} (expected a CSV header naming {', '.join(REQUIRED_COLUMNS)} on line 1)")
        import csv

        names = [h.strip() for h in next(csv.reader([first.lstrip("\ufeff")]))]
        twice = sorted({h for h in names if names.count(h) > 1})
        if twice:
            raise FlowFormatError(f"{self.path}: the CSV header names {', '.join(repr(h) for h in twice)} more than once")
        return names

    # -- Parquet -----------------------------------------------------------
    def _parquet(self):
        tmp = None
        src = self.path
        batches = None
        try:
            if self.gzipped:
                # Parquet needs random access (the footer is at the end).
                tmp = tempfile.NamedTemporaryFile(suffix=".parquet", delete=False)
                with tmp, gzip.open(self.path, "rb") as g:
                    shutil.copyfileobj(g, tmp)
                src = tmp.name
            try:
                pf = pq.ParquetFile(src)
                # addresses and paths repeat: read them as the file stores them,
                # a dictionary, and validate the distinct values only
                text = [f.name for f in pf.schema_arrow if f.name in _TEXT_COLUMNS and _is_text(f.type)]
                if text:
                    pf = pq.ParquetFile(src, read_dictionary=text)
            except (pa.ArrowInvalid, OSError) as e:
                raise FlowFormatError(f"{self.path}: not a readable Parquet file: {e}") from e
            names = pf.schema_arrow.names
            _check_columns(self.path, names)
            cols = [c for c in FLOW_COLUMNS if c in names]
            total = pf.metadata.num_rows
            row = 1
            batches = _read_ahead(pf.iter_batches(batch_size=self.chunk_rows, columns=cols))
            for batch in batches:
                table = pa.Table.from_batches([batch])
                self.rows_read += table.num_rows
                self.bytes_done = int(self.bytes_total * self.rows_read / max(total, 1))
                yield validate_flows(table, self.rejects, self.path, first_line=row, line_step="row")
                row += table.num_rows
        finally:
            if batches is not None:
                batches.close()  # the reading thread stops before its file goes
            if tmp is not None:
                os.unlink(tmp.name)

    # -- JSON Lines --------------------------------------------------------
    def _jsonl(self):
        if self.path == "-":
            f = self._stdin if self._stdin is not None else sys.stdin.buffer
            raw = None
        else:
            raw = open(self.path, "rb")
            f = gzip.GzipFile(fileobj=raw) if self.gzipped else raw
        try:
            line = 1
            block_bytes = max(1 << 16, self.chunk_rows * 160)
            pending = b""
            seen_columns = False
            skipping = False  # inside a line longer than MAX_LINE_BYTES: dropped up to its newline
            while True:
                data = f.read(block_bytes)
                if skipping:
                    cut = data.find(b"\n")
                    if data and cut < 0:
                        continue
                    self.rejects.add("malformed_row", 1, f"{self._name}:line {line}: longer than {MAX_LINE_BYTES:,} bytes")
                    self.rows_read += 1
                    line += 1
                    skipping = False
                    if data:  # the rest after the long line's newline (at the end of the file, nothing)
                        data = data[cut + 1:]
                        if not data:
                            continue
                if not data:
                    block, pending = pending, b""
                else:
                    data = pending + data
                    cut = data.rfind(b"\n")
                    if cut < 0:
                        if len(data) > MAX_LINE_BYTES:
                            skipping, pending = True, b""
                        else:
                            pending = data
                        continue
                    block, pending = data[: cut + 1], data[cut + 1 :]
                if block and not block.isspace():  # strip() would copy the block
                    for table, malformed, offsets, nlines in self._json_block(block):
                        if len(table):
                            if not seen_columns and self.check_columns:
                                _check_columns(self._name, _present_columns(table), _first_record_keys(block))
                                seen_columns = True
                            self.rows_read += len(table)
                            yield validate_flows(
                                table, self.rejects, self._name, first_line=line, malformed_rows=malformed,
                                line_numbers=None if offsets is None else line + offsets,
                            )
                        line += nlines
                if raw is not None:
                    self.bytes_done = raw.tell()
                if not data:
                    break
        finally:
            if raw is not None:
                f.close()
                raw.close()

    @property
    def _name(self) -> str:
        if self.name is not None:
            return self.name
        return "<stdin>" if self.path == "-" else self.path

    def _json_block(self, block: bytes):
        """Parse a block of whole lines.

        Yields (table, malformed_mask, line_offsets, lines_consumed).
        """
        plain = read_flow_lines(block)  # one compiled pass; None: some line is for pyarrow's reader
        if plain is not None:
            yield from self._json_slices(plain.table, plain.row_lines, plain.lines)
            return
        nlines = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
        has_blank = b"\n\n" in block or block.startswith(b"\n") or b"\n\r\n" in block
        kept = None  # line index of each row, where blank lines sit between rows
        clean = block
        if has_blank:
            # blank lines are not rows: parse the others on the fast path too
            # (a producer that ends each message with an empty line sends one per message)
            lines = block.split(b"\n")
            kept = np.array([i for i, text in enumerate(lines) if text.strip()], dtype=np.int64)
            clean = b"\n".join(lines[i] for i in kept) + b"\n"
        try:
            t = pajson.read_json(
                io.BytesIO(clean),
                parse_options=pajson.ParseOptions(explicit_schema=JSON_SCHEMA, unexpected_field_behavior="ignore"),
                # blocks pyarrow parses on its threads (1.3x on two cores); a line kept (at most
                # MAX_LINE_BYTES) always fits in one, so none is sent to the per-line parser for its length
                read_options=pajson.ReadOptions(block_size=2 * MAX_LINE_BYTES),
            ) if kept is None or len(kept) else None
            if t is not None:
                t.validate(full=True)  # JSON is UTF-8: a line that is not goes to the slow path (malformed_row)
            if t is not None and t.num_rows == (nlines if kept is None else len(kept)):
                yield from self._json_slices(t, kept, nlines)
                return
        except pa.ArrowInvalid:
            pass  # some line is not clean: parse line by line below
        yield (*self._json_lines_slow(block), nlines)

    def _json_slices(self, t: pa.Table, kept: np.ndarray | None, nlines: int):
        """``_json_block``'s items of a block's table: ``kept``, each row's line where blank lines sit between rows."""
        t = _without_absent_options(t)
        done = 0  # lines consumed so far
        for lo, sub in _offset_slices(t, self.chunk_rows):
            if kept is None:
                yield sub, None, None, sub.num_rows
                continue
            last = lo + sub.num_rows == t.num_rows
            upto = nlines if last else int(kept[lo + sub.num_rows - 1]) + 1
            yield sub, None, kept[lo:lo + sub.num_rows] - done, upto - done
            done = upto

    def _json_lines_slow(self, block: bytes):
        """Line-by-line fallback for a block that holds a bad line.

        Only blocks with a problem come here; clean input stays on the
        vectorised path above. Blank lines are skipped (not rows).
        """
        rows = {c: [] for c in FLOW_COLUMNS}
        malformed = []
        lines = []
        for i, raw_line in enumerate(block.split(b"\n")):
            if not raw_line.strip():
                continue
            lines.append(i)
            try:
                obj = json.loads(raw_line)
                ok = isinstance(obj, dict)
            except (ValueError, UnicodeDecodeError):
                obj, ok = None, False
            for c in FLOW_COLUMNS:
                rows[c].append(obj.get(c) if ok else None)
            malformed.append(not ok)
        df = _without_absent_options(pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in rows.items()}))
        return df, np.array(malformed, dtype=bool), np.array(lines, dtype=np.int64)


def _present_columns(table) -> list[str]:
    """Columns with at least one value (JSON rows may omit keys)."""
    if isinstance(table, pa.Table):
        return [c for c in table.column_names if table.column(c).null_count < table.num_rows]
    return [c for c in table.columns if table[c].notna().any()]


def _without_absent_options(table):
    """A JSON block's table (Arrow or pandas) without the optional columns no row of it has.

    JSON rows may omit keys; a column of nulls only would be carried
    through every window for nothing.
    """
    present = set(_present_columns(table))
    names = table.column_names if isinstance(table, pa.Table) else list(table.columns)
    absent = [c for c in OPTIONAL_COLUMNS if c in names and c not in present]
    if not absent:
        return table
    return table.drop_columns(absent) if isinstance(table, pa.Table) else table.drop(columns=absent)


def _offset_slices(table: pa.Table, n: int):
    """(first row, slice) of at most ``n`` rows each."""
    for lo in range(0, table.num_rows, max(n, 1)):
        yield lo, table.slice(lo, n)


def read_flows(paths, chunk_rows: int = DEFAULT_CHUNK_ROWS, rejects: RejectCounter | None = None) -> Iterator[pd.DataFrame]:
    """Stream validated chunks from several files in order.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "f.csv")
    >>> _ = open(p, "w").write("start_ns,duration_ns,src,dst,size,switches\\n1,2,10.0.0.1,10.0.0.2,64,leaf1\\n")
    >>> sum(len(c) for c in read_flows([p]))
    1
    """
    rejects = rejects if rejects is not None else RejectCounter()
    for p in paths:
        yield from FlowReader(p, chunk_rows=chunk_rows, rejects=rejects)


def write_flows(flows: pd.DataFrame, path: Path) -> None:
    """Write a flow frame as Parquet, CSV or JSON Lines (by extension, .gz ok)."""
    name = str(path)
    table = pa.Table.from_pandas(flows, preserve_index=False)
    if name.endswith(".parquet"):
        pq.write_table(table, name, compression="zstd")
    elif name.endswith(".csv") or name.endswith(".csv.gz"):
        # dictionary columns are written as their strings
        table = table.cast(pa.schema([pa.field(f.name, pa.string() if pa.types.is_dictionary(f.type) else f.type) for f in table.schema]))
        with pa.CompressedOutputStream(name, "gzip") if name.endswith(".gz") else pa.OSFile(name, "wb") as f:
            pacsv.write_csv(table, f)
    elif name.endswith(".jsonl") or name.endswith(".jsonl.gz"):
        df = flows.astype({c: str for c in ("src", "dst", "switches")})
        opener = gzip.open if name.endswith(".gz") else open
        with opener(name, "wt") as f:
            df.to_json(f, orient="records", lines=True)
    else:
        raise ValueError(f"{name}: unknown flow format (parquet, csv, csv.gz, jsonl, jsonl.gz)")


def _read_ahead(items: Iterator, depth: int = 2) -> Iterator:
    """``items``, each produced ahead in a thread while the one before is used.

    pyarrow decodes a Parquet batch without holding the GIL, so the next
    batches are decoded while this one is validated and analysed (a
    tenth of a replay's reading time). Whatever ``items`` raises is
    raised here, in order. Closing this generator stops the thread (it
    checks every tenth of a second while the queue is full) and waits
    for it.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for x in items:
                if not put((True, x)):
                    return
            put((False, None))
        except BaseException as e:  # handed to the reader, raised there
            put((False, e))

    worker = threading.Thread(target=produce, name="prism-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            more, x = q.get()
            if not more:
                if x is not None:
                    raise x
                return
            yield x
    finally:
        stop.set()
        worker.join()
