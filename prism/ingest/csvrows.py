"""Reading the small CSV files an operator hands Prism (the topology, the job inventory), with one set of errors.

Both files are read whole into rows before their own checks, and what can
go wrong with the file itself is the same for each: missing, a directory,
not UTF-8, a truncated gzip, not CSV. One reader gives every such file
the same errors, naming the file (and the line where the CSV reader
stopped), so a fix to one is a fix to all; the callers keep the checks
that are theirs (columns, fields, duplicates).
"""
from __future__ import annotations

import csv
import gzip

from prism.ingest.formats.common import MAX_LINE_BYTES
from prism.ingest.records import FlowFormatError

__all__ = ["read_csv_rows"]


def read_csv_rows(path: str, what: str, expected: str) -> tuple[list[dict], list[str]]:
    """The rows of a CSV file (``.gz``: gzip) as dicts, and its header.

    ``what`` names the file in the errors (``"topology"``); ``expected``
    says what it should be, for a directory given instead
    (``"--topology takes a CSV file (ip,server[,rail,leaf])"``). A byte-order
    mark (as spreadsheet programs write) is no part of the first column's
    name. An empty file gives no rows and no header: the caller says what it
    expected.

    Raises
    ------
    FileNotFoundError
        No such file (``<path>: no such <what> file``).
    FlowFormatError
        A directory, not UTF-8 (the byte), unreadable (a truncated or
        corrupt gzip, an I/O error), or not CSV (the line): each names the file.
    """
    gz = str(path).endswith(".gz")
    opener = gzip.open if gz else open
    reader = None
    # the csv module's field limit is one per process, and the flow CSV reader raises it to the line limit: the
    # same here, so a long field fails at the same length whichever file was read first
    if csv.field_size_limit() != MAX_LINE_BYTES:
        csv.field_size_limit(MAX_LINE_BYTES)
    try:
        with opener(path, "rt", newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = list(rows[0].keys()) if rows else []
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise FlowFormatError(f"{path}: is a directory; {expected}") from None
    except UnicodeDecodeError as e:
        raise FlowFormatError(f"{path}: not UTF-8 text (byte {e.start} of the {'decompressed ' if gz else ''}file)") from None
    except (OSError, EOFError) as e:  # truncated or corrupt gzip, unreadable file
        raise FlowFormatError(f"{path}: cannot read the {what}: {e}") from None
    except csv.Error as e:
        line = reader.reader.line_num if reader is not None else 0  # the csv reader's: the line it stopped on (the DictReader's lags a row)
        where = f":line {line}" if line else ""
        raise FlowFormatError(f"{path}{where}: not a readable CSV file: {e}") from None
    return rows, header
