"""JSON Lines flow files (and standard input): one flat flow object per line.

Each block of whole lines goes to the fastest pass that takes it: the
compiled pass of :mod:`prism.ingest.jsonlines` (what collectors write),
else pyarrow's JSON reader, else, for a block holding a bad line, a
line-by-line parse that counts that line as ``malformed_row``. Kafka
messages are read through here too (``-`` with a message as stdin).
"""
from __future__ import annotations

import gzip
import io
import json
import sys
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pajson

from prism.ingest.formats.common import MAX_LINE_BYTES, check_columns
from prism.ingest.formats.registry import FlowFormat, FormatReader
from prism.ingest.jsonlines import SCHEMA as JSON_SCHEMA
from prism.ingest.jsonlines import read_flow_lines
from prism.ingest.records import FLOW_COLUMNS, OPTIONAL_COLUMNS, validate_flows

__all__ = ["JsonLinesReader", "write_jsonl", "FORMAT"]


def _first_record_keys(block: bytes) -> list:
    """The keys of a block's first JSON object line (for an error message)."""
    for line in block.split(b"\n"):
        if line.strip():
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
                return []
            return list(obj) if isinstance(obj, dict) else []
    return []


class JsonLinesReader(FormatReader):
    """Stream a JSON Lines flow file (optionally gzip) or standard input (``-``) as validated chunks."""

    def read(self) -> Iterator[pd.DataFrame]:
        """The file's (or stdin's) lines in blocks of whole lines, each parsed by the fastest pass that takes it."""
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
                                check_columns(self._name, _present_columns(table), _first_record_keys(block))
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

    def _json_block(self, block: bytes):
        """Parse a block of whole lines.

        Yields (table, malformed_mask, line_offsets, lines_consumed).
        """
        plain = read_flow_lines(block)  # one compiled pass; None: some line is for pyarrow's reader
        if plain is not None:
            yield from self._json_slices(plain.table, plain.row_lines, plain.lines)
            return
        nlines = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
        if _has_a_line_not_an_object(block):
            # pyarrow 26's JSON reader crashes the process (SIGSEGV) on a block whose first row is
            # `null`, and fails on any other non-object line: such a block goes line by line instead
            yield (*self._json_lines_slow(block), nlines)
            return
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
        rows: dict[str, list] = {c: [] for c in FLOW_COLUMNS}
        malformed = []
        lines = []
        for i, raw_line in enumerate(block.split(b"\n")):
            if not raw_line.strip():
                continue
            lines.append(i)
            try:
                obj = json.loads(raw_line)
                ok = isinstance(obj, dict)
            except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested deeper than the parser's stack
                obj, ok = None, False
            for c in FLOW_COLUMNS:
                rows[c].append(_encodable(obj.get(c)) if ok else None)
            malformed.append(not ok)
        df = _without_absent_options(pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in rows.items()}))
        return df, np.array(malformed, dtype=bool), np.array(lines, dtype=np.int64)



_OPEN_BRACE, _NEWLINE = ord("{"), ord("\n")


def _has_a_line_not_an_object(block: bytes) -> bool:
    """Whether some line that is not blank starts (after blanks) with anything but ``{``: a JSON value no flow can be.

    One vectorised pass over the block's newlines; the few lines that start with a blank are looked at one by one.
    """
    arr = np.frombuffer(block, dtype=np.uint8)
    starts = np.flatnonzero(arr == _NEWLINE) + 1
    starts = np.concatenate(([0], starts[starts < len(arr)]))
    first = arr[starts]
    odd = (first != _OPEN_BRACE) & (first != _NEWLINE)
    for s in starts[odd]:
        end = block.find(b"\n", s)
        line = block[s:] if end < 0 else block[s:end]
        text = line.lstrip()
        if text and not text.startswith(b"{"):
            return True
    return False


def _encodable(v):
    """A JSON value as validation can take it: a string with a lone surrogate (``"\\ud800"``, valid JSON
    but no Unicode text) becomes its bytes, which are no address, number or path, so its row is rejected
    under that field's reason instead of failing every string kernel of the block."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return v.encode("utf-8", "surrogatepass")
    elif isinstance(v, list):
        return [_encodable(x) for x in v]
    return v


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


def write_jsonl(flows: pd.DataFrame, path: str, gzipped: bool) -> None:
    """Write a flow frame as JSON Lines, one object per flow (gzip-compressed when ``gzipped``)."""
    df = flows.astype({c: str for c in ("src", "dst", "switches")})
    opener = gzip.open if gzipped else open
    with opener(path, "wt") as f:
        df.to_json(f, orient="records", lines=True)


FORMAT = FlowFormat("jsonl", "JSON Lines", (".jsonl", ".ndjson", ".json"), JsonLinesReader, write_jsonl)
