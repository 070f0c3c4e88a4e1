"""The flow-file formats prism reads and writes: one module each, listed once, below.

:class:`~prism.ingest.readers.FlowReader`, ``write_flows``, the collectors'
``--out``, ``prism synth --format`` and the help texts all ask the registry
(:mod:`prism.ingest.formats.registry`) which formats exist, so adding one is
a module here (a :class:`FormatReader` subclass, a writer and a
:class:`FlowFormat` named ``FORMAT``) and its line in :data:`BUILTIN_FORMATS`.

>>> names()
('parquet', 'csv', 'jsonl')
>>> by_suffix(".NDJSON").name
'jsonl'
>>> written_suffixes()
('.parquet', '.csv', '.csv.gz', '.jsonl', '.jsonl.gz')
"""
from __future__ import annotations

from importlib import import_module

from prism.ingest.formats.registry import (
    FlowFormat,
    FlowWriter,
    FormatReader,
    by_name,
    by_suffix,
    formats,
    names,
    register,
    suffixes,
    written_suffixes,
)

__all__ = [
    "FlowFormat", "FlowWriter", "FormatReader", "BUILTIN_FORMATS", "register", "by_name", "by_suffix", "formats",
    "names", "suffixes", "written_suffixes",
]

#: the built-in formats' modules, one line each, in the order help texts and
#: error messages list them; each module's ``FORMAT`` is registered
BUILTIN_FORMATS = (
    "prism.ingest.formats.parquet",
    "prism.ingest.formats.csv",
    "prism.ingest.formats.jsonl",
)

for _module in BUILTIN_FORMATS:
    register(import_module(_module).FORMAT)
