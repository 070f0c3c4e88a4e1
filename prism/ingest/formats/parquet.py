"""Parquet flow files: row groups decoded ahead on a thread, text columns kept as dictionaries.

Parquet needs random access (its footer is at the end), so a gzipped file
is first decompressed to a temporary file (in ``replay --spill-dir`` when
given), of at most :data:`MAX_GUNZIP_RATIO` times the file's size. Addresses and switch paths
repeat across a cluster: they are read as the file stores them, a
dictionary, so validation converts the distinct values only.
"""
from __future__ import annotations

import gzip
import os
import queue
import tempfile
import threading
from collections.abc import Generator, Iterator
from typing import IO

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from prism.ingest.formats.common import TEXT_COLUMNS, check_columns
from prism.ingest.formats.registry import FlowFormat, FormatReader
from prism.ingest.records import FLOW_COLUMNS, FlowFormatError, validate_flows

__all__ = ["ParquetReader", "write_parquet", "FORMAT", "MAX_GUNZIP_RATIO", "MIN_GUNZIP_LIMIT"]

#: A gzipped Parquet file is unpacked to disk up to this many times its size. Parquet compresses
#: its columns itself, so gzip gains little on it (1-1.2x; 3-8x on a file written uncompressed);
#: a file that unpacks to more is no Parquet file (6.5 MB of gzipped zeros unpack to 1.5 GB).
MAX_GUNZIP_RATIO = 32
#: ... but a small file may always unpack to this much
MIN_GUNZIP_LIMIT = 256 << 20


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


class ParquetReader(FormatReader):
    """Stream a Parquet flow file (optionally gzip) as validated chunks of ``chunk_rows`` rows."""

    def read(self) -> Iterator[pd.DataFrame]:
        """The file's row groups in chunks, decoded ahead on a thread."""
        tmp = None
        src = self.path
        batches = None
        try:
            if self.gzipped:
                # Parquet needs random access (the footer is at the end).
                tmp = tempfile.NamedTemporaryFile(suffix=".parquet", prefix="prism-gunzip-", dir=self.temp_dir, delete=False)
                with tmp, gzip.open(self.path, "rb") as g:
                    self._gunzip(g, tmp)
                src = tmp.name
            try:
                pf = pq.ParquetFile(src)
                # addresses and paths repeat: read them as the file stores them,
                # a dictionary, and validate the distinct values only
                text = [f.name for f in pf.schema_arrow if f.name in TEXT_COLUMNS and _is_text(f.type)]
                if text:
                    pf = pq.ParquetFile(src, read_dictionary=text)
            except (pa.ArrowInvalid, OSError) as e:
                raise FlowFormatError(f"{self.path}: not a readable Parquet file: {e}") from e
            names = pf.schema_arrow.names
            check_columns(self.path, names)
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


    def _gunzip(self, g: gzip.GzipFile, out: IO[bytes]) -> None:
        """Copy the decompressed file, bounded: a FlowFormatError past :data:`MAX_GUNZIP_RATIO` times its size."""
        limit = max(MIN_GUNZIP_LIMIT, MAX_GUNZIP_RATIO * self.bytes_total)
        done = 0
        while block := g.read(1 << 20):
            done += len(block)
            if done > limit:
                raise FlowFormatError(
                    f"{self.path}: decompresses to more than {limit:,} bytes ({MAX_GUNZIP_RATIO}x its {self.bytes_total:,}): "
                    "not a gzipped Parquet file; if it is one, gunzip it and replay the .parquet")
            try:
                out.write(block)
            except OSError as e:  # the disk, full: say where the copy went
                raise FlowFormatError(f"{self.path}: cannot unpack it to {out.name}: {e.strerror} "
                                      "(replay --spill-dir puts it elsewhere, or gunzip it first)") from e


def write_parquet(flows: pd.DataFrame, path: str, gzipped: bool) -> None:
    """Write a flow frame as zstd-compressed Parquet (``gzipped`` is never set: Parquet compresses inside the file)."""
    table = pa.Table.from_pandas(flows, preserve_index=False)
    pq.write_table(table, path, compression="zstd")


def _read_ahead(items: Iterator, depth: int = 2) -> Generator:
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



FORMAT = FlowFormat("parquet", "Parquet", (".parquet", ".pq"), ParquetReader, write_parquet, writes_gzip=False)
