"""What several flow-file formats share: the required-columns check and the limits on text input.

Kept in one place so that a missing column reads the same in every format,
and the formats that read lines of text agree on what a line too long is.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

from prism.ingest.records import REQUIRED_COLUMNS, FlowFormatError

__all__ = ["check_columns", "MAX_LINE_BYTES", "TEXT_COLUMNS", "TEXT_DICT"]

#: a flow record is ~150 bytes; a line this long is garbage, skipped (counted) rather than buffered
MAX_LINE_BYTES = 1 << 20
TEXT_DICT = pa.dictionary(pa.int32(), pa.string())
#: columns of repeated text (a cluster has thousands of addresses and paths):
#: read as dictionaries, so validation converts distinct values, not rows
TEXT_COLUMNS = ("src", "dst", "switches")


def check_columns(path: str, names: Sequence[str], keys: Iterable[object] | None = None) -> None:
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
