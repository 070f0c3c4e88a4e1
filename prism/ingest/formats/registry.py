"""The flow-file format registry: what a format is, and the table of those prism knows.

Every place that names formats (the readers' suffix detection,
``write_flows``, the collectors' ``--out`` check, ``prism synth --format``,
help texts) asks this table, so a format added here is read, written and
offered everywhere at once. A format is a :class:`FlowFormat`: a name, the
file suffixes it reads, a :class:`FormatReader` subclass that streams a file
as validated chunks, and a writer. :mod:`prism.ingest.formats` registers the
built-in ones.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import pandas as pd

from prism.ingest.records import RejectCounter

__all__ = [
    "FlowFormat", "FormatReader", "FlowWriter", "register", "by_name", "by_suffix", "formats", "names", "suffixes",
    "written_suffixes",
]

#: ``write(flows, path, gzipped)``: write a flow frame to ``path`` (gzip-compressed when ``gzipped``)
FlowWriter = Callable[[pd.DataFrame, str, bool], None]


class FormatReader(ABC):
    """One file's reading state, and the format's way of reading it (:meth:`read`).

    :class:`~prism.ingest.readers.FlowReader` makes one per file and reports
    its counters; a format subclasses this and implements :meth:`read`.

    Parameters
    ----------
    path : str
        The file, or ``-`` for standard input (formats that read a stream).
    gzipped : bool
        The file is gzip-compressed (its name ends in ``.gz``).
    chunk_rows : int
        Rows per chunk yielded (approximate where the format reads blocks of bytes).
    rejects : RejectCounter
        Where rejected rows are counted.
    stdin : binary file, optional
        Read this instead of standard input when ``path`` is ``-``.
    name : str, optional
        Source name in reject examples (default: the path, ``<stdin>``).
    check_columns : bool
        Raise when a required column is absent rather than reject rows one by one.
    bytes_total : int
        The file's size on disk (0 when unknown), for progress.
    temp_dir : str, optional
        Where a format that needs a temporary copy (a gzipped Parquet file, unpacked for random
        access) makes it; default the system's temporary directory.

    Attributes
    ----------
    rows_read : int
        Data rows seen (accepted + rejected).
    bytes_done : int
        On-disk bytes read so far, for progress.
    """

    def __init__(
        self,
        path: str,
        gzipped: bool,
        chunk_rows: int,
        rejects: RejectCounter,
        stdin: BinaryIO | None = None,
        name: str | None = None,
        check_columns: bool = True,
        bytes_total: int = 0,
        temp_dir: str | None = None,
    ) -> None:
        self.path = path
        self.gzipped = gzipped
        self.chunk_rows = chunk_rows
        self.rejects = rejects
        self._stdin = stdin
        self.name = name
        self.check_columns = check_columns
        self.rows_read = 0
        self.bytes_total = bytes_total
        self.bytes_done = 0
        self.temp_dir = temp_dir

    @abstractmethod
    def read(self) -> Iterator[pd.DataFrame]:
        """Validated chunks of the file (:func:`prism.ingest.records.validate_flows`), in order."""

    @property
    def _name(self) -> str:
        if self.name is not None:
            return self.name
        return "<stdin>" if self.path == "-" else self.path


@dataclass(frozen=True)
class FlowFormat:
    """A flow-file format: how it is named, recognised, read and written.

    Attributes
    ----------
    name : str
        Short name (``csv``), as :func:`~prism.ingest.readers.detect_format` reports it.
    title : str
        Its name in prose (``CSV``), for help texts.
    suffixes : tuple of str
        Lower-case file suffixes read as this format, each optionally
        followed by ``.gz``; the first is the one written.
    reader : type of FormatReader
        Streams one file.
    write : FlowWriter
        Writes a flow frame.
    writes_gzip : bool
        The writer also writes ``<suffix>.gz`` (Parquet compresses inside the file instead).
    """

    name: str
    title: str
    suffixes: tuple[str, ...]
    reader: type[FormatReader]
    write: FlowWriter
    writes_gzip: bool = True

    @property
    def written_suffixes(self) -> tuple[str, ...]:
        """The suffixes :func:`~prism.ingest.readers.write_flows` writes this format under."""
        first = self.suffixes[0]
        return (first, first + ".gz") if self.writes_gzip else (first,)


_BY_NAME: dict[str, FlowFormat] = {}
_BY_SUFFIX: dict[str, FlowFormat] = {}


def register(fmt: FlowFormat) -> FlowFormat:
    """Add ``fmt`` to the table (help texts list formats in the order they were registered).

    A format must come with a reader and a writer, and claim a name and
    suffixes no other format has:

    >>> register(FlowFormat("csv2", "CSV", (".csv",), FormatReader, print))
    Traceback (most recent call last):
    ...
    ValueError: format 'csv2': the suffix .csv is csv's
    """
    if not isinstance(fmt, FlowFormat):
        raise TypeError(f"register() takes a FlowFormat, not {type(fmt).__name__}")
    if not (isinstance(fmt.reader, type) and issubclass(fmt.reader, FormatReader)):
        raise TypeError(f"format {fmt.name!r}: its reader must be a FormatReader subclass, not {fmt.reader!r}")
    if not callable(fmt.write):
        raise TypeError(f"format {fmt.name!r}: its writer must be callable, not {fmt.write!r}")
    if not fmt.name or fmt.name in _BY_NAME:
        raise ValueError(f"format {fmt.name!r}: {'a name is needed' if not fmt.name else 'that name is taken'}")
    if not fmt.suffixes:
        raise ValueError(f"format {fmt.name!r}: no suffixes")
    for s in fmt.suffixes:
        if not s.startswith(".") or s != s.lower() or s == ".gz":
            raise ValueError(f"format {fmt.name!r}: a suffix is '.' and lower case, not .gz: {s!r}")
        if s in _BY_SUFFIX:
            raise ValueError(f"format {fmt.name!r}: the suffix {s} is {_BY_SUFFIX[s].name}'s")
    _BY_NAME[fmt.name] = fmt
    for s in fmt.suffixes:
        _BY_SUFFIX[s] = fmt
    return fmt


def by_name(name: str) -> FlowFormat:
    """The format called ``name``; KeyError names the known ones."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no flow format {name!r}; known: {', '.join(_BY_NAME)}") from None


def by_suffix(suffix: str) -> FlowFormat | None:
    """The format that reads files ending in ``suffix`` (``.csv``, any case, without ``.gz``), or None."""
    return _BY_SUFFIX.get(suffix.lower())


def formats() -> tuple[FlowFormat, ...]:
    """Every registered format, in registration order."""
    return tuple(_BY_NAME.values())


def names() -> tuple[str, ...]:
    """The registered formats' names, in registration order."""
    return tuple(_BY_NAME)


def suffixes() -> tuple[str, ...]:
    """Every suffix read (each optionally followed by ``.gz``), in registration order."""
    return tuple(_BY_SUFFIX)


def written_suffixes() -> tuple[str, ...]:
    """Every suffix written, ``.gz`` included where the writer compresses, in registration order."""
    return tuple(s for f in _BY_NAME.values() for s in f.written_suffixes)
