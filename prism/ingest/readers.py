"""The front door to flow files: ``FlowReader`` (and ``write_flows``), whatever the format.

The format is picked by extension from the registry,
:mod:`prism.ingest.formats` (``.csv``, ``.parquet``/``.pq``,
``.jsonl``/``.ndjson``/``.json``, each optionally followed by ``.gz``); ``-``
reads JSON Lines from standard input. Every reader is a generator of
validated chunks (:func:`prism.ingest.records.validate_flows`), so a dump larger
than memory streams through in ``chunk_rows`` pieces. How each format is read
and written lives in its own module there; this one picks the format and
turns a reader's failure into an error that names the file.
"""
from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import pandas as pd
import pyarrow as pa

from prism.ingest import formats
from prism.ingest.records import FlowFormatError, RejectCounter

__all__ = ["FlowReader", "detect_format", "read_flows", "write_flows", "DEFAULT_CHUNK_ROWS", "STDIN_FORMAT"]

DEFAULT_CHUNK_ROWS = 1 << 18
#: what ``-`` is read as: standard input, and each Kafka message (prism.ingest.messages)
STDIN_FORMAT = "jsonl"


def detect_format(path: str) -> tuple[str, bool]:
    """Return (format, gzipped) for a path, from its extension.

    >>> detect_format("flows.csv.gz")
    ('csv', True)
    >>> detect_format("-")
    ('jsonl', False)
    """
    if path == "-":
        return STDIN_FORMAT, False
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    if gz:
        suffixes = suffixes[:-1]
    fmt = formats.by_suffix(suffixes[-1]) if suffixes else None
    if fmt is not None:
        return fmt.name, gz
    raise FlowFormatError(
        f"{path}: cannot tell the format from the extension; use one of "
        + ", ".join(sorted(formats.suffixes()))
        + f" (optionally followed by .gz), or - for {formats.by_name(STDIN_FORMAT).title} on stdin"
    )


class FlowReader:
    """Stream validated flow chunks from one file.

    The reading itself is the format's (:mod:`prism.ingest.formats`): this
    class picks it by extension and names the file in any error.

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
    temp_dir : str, optional
        Where a gzipped Parquet file is unpacked (``replay --spill-dir``);
        default the system's temporary directory.

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
        stdin: BinaryIO | None = None,
        name: str | None = None,
        check_columns: bool = True,
        temp_dir: str | None = None,
    ) -> None:
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
        bytes_total = 0
        if self.path != "-":
            if not os.path.exists(self.path):
                raise FileNotFoundError(f"{self.path}: no such file")
            bytes_total = os.path.getsize(self.path)
        # the format's reader holds the counters (rows, bytes) it moves as it reads
        self._reader = formats.by_name(self.format).reader(
            self.path, self.gzipped, self.chunk_rows, self.rejects, stdin=stdin, name=name,
            check_columns=check_columns, bytes_total=bytes_total, temp_dir=temp_dir,
        )

    @property
    def rows_read(self) -> int:
        """Data rows seen (accepted + rejected)."""
        return self._reader.rows_read

    @property
    def bytes_total(self) -> int:
        """The file's size on disk (0 when unknown: stdin)."""
        return self._reader.bytes_total

    @property
    def bytes_done(self) -> int:
        """On-disk bytes read so far."""
        return self._reader.bytes_done

    def __iter__(self) -> Iterator[pd.DataFrame]:
        try:
            yield from self._reader.read()
        except FlowFormatError:
            raise
        except (OSError, EOFError, zlib.error, UnicodeError, pa.ArrowException, KeyError, TypeError, ValueError) as e:
            # truncated or corrupt compression, a column of a type no flow
            # field has, a header that names a column twice: the file is
            # unreadable from here on, which the user must hear with its name
            # (the rows before it were read and validated)
            raise FlowFormatError(f"{self.path}: unreadable after {self.rows_read:,} rows ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from e


def read_flows(paths: Iterable[str], chunk_rows: int = DEFAULT_CHUNK_ROWS, rejects: RejectCounter | None = None) -> Iterator[pd.DataFrame]:
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


def write_flows(flows: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write a flow frame in the format its extension names (any of :func:`prism.ingest.formats.written_suffixes`).

    >>> write_flows(pd.DataFrame(), "flows.txt")
    Traceback (most recent call last):
    ...
    ValueError: flows.txt: unknown flow format (parquet, csv, csv.gz, jsonl, jsonl.gz)
    """
    name = str(path)
    gz = name.endswith(".gz")
    for fmt in formats.formats():
        if name.endswith(fmt.suffixes[0] + (".gz" if gz else "")) and (fmt.writes_gzip or not gz):
            fmt.write(flows, name, gz)
            return
    raise ValueError(f"{name}: unknown flow format ({', '.join(s.lstrip('.') for s in formats.written_suffixes())})")
