"""CSV flow files: pyarrow's streaming block parser, and a line-by-line reader past what it cannot take.

A malformed row must cost one count and its exact line number, not the
block around it: pyarrow numbers the rows it skips through an invalid-row
handler, and where it gives up on a block (bad UTF-8, a field longer than a
block, corrupt compression) the lines are read one by one until the trouble
is behind, then the block parser takes over again.
"""
from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from prism.ingest.formats.common import MAX_LINE_BYTES, TEXT_COLUMNS, TEXT_DICT, check_columns
from prism.ingest.formats.registry import FlowFormat, FormatReader
from prism.ingest.records import FLOW_COLUMNS, REQUIRED_COLUMNS, FlowFormatError, validate_flows

__all__ = ["CsvReader", "write_csv", "FORMAT", "RESUME_AFTER_LINES"]

#: good lines read one by one after the last bad one before the block parser takes over again
RESUME_AFTER_LINES = 1000


class CsvReader(FormatReader):
    """Stream a CSV flow file (optionally gzip) as validated chunks; the header names the columns."""

    def read(self) -> Iterator[pd.DataFrame]:
        """The file's rows in chunks: pyarrow's block parser, line by line past what it cannot take."""
        # Every column is read as text: a typed read would fail the whole
        # block on one bad value; validation parses numbers exactly instead.
        try:
            header = self._csv_header()
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise FlowFormatError(f"{self.path}: cannot read: {e}") from e
        check_columns(self.path, header)
        # pyarrow's block parser, and where it fails (a row it cannot take: bad
        # UTF-8, a field longer than its block; corrupt compression) line by
        # line past the trouble, then the block parser again from there
        line: int | None = 2
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
                        column_types={c: TEXT_DICT if c in TEXT_COLUMNS else pa.string() for c in header},
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
            first = f.readline(MAX_LINE_BYTES + 1)  # bounded: a file of one endless line is not read whole into memory
        if not first.strip():
            what = "empty file" if not first else "the first line is blank"
            raise FlowFormatError(f"{self.path}: {what} (expected a CSV header naming {', '.join(REQUIRED_COLUMNS)} on line 1)")
        if len(first) > MAX_LINE_BYTES:
            raise FlowFormatError(f"{self.path}: the first line is longer than {MAX_LINE_BYTES:,} characters: not a CSV header")
        import csv

        if csv.field_size_limit() < MAX_LINE_BYTES:  # its default (128 KiB) is below the line limit
            csv.field_size_limit(MAX_LINE_BYTES)
        try:
            names = [h.strip() for h in next(csv.reader([first.lstrip("\ufeff")]), [])]
        except csv.Error as e:  # e.g. a NUL or a bare carriage return in the header
            raise FlowFormatError(f"{self.path}: line 1 is not a readable CSV header: {e}") from None
        twice = sorted({h for h in names if names.count(h) > 1})
        if twice:
            raise FlowFormatError(f"{self.path}: the CSV header names {', '.join(repr(h) for h in twice)} more than once")
        return names


def write_csv(flows: pd.DataFrame, path: str, gzipped: bool) -> None:
    """Write a flow frame as CSV with a header row (gzip-compressed when ``gzipped``)."""
    table = pa.Table.from_pandas(flows, preserve_index=False)
    # dictionary columns are written as their strings
    table = table.cast(pa.schema([pa.field(f.name, pa.string() if pa.types.is_dictionary(f.type) else f.type) for f in table.schema]))
    with pa.CompressedOutputStream(path, "gzip") if gzipped else pa.OSFile(path, "wb") as f:
        pacsv.write_csv(table, f)


FORMAT = FlowFormat("csv", "CSV", (".csv",), CsvReader, write_csv)
