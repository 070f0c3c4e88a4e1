"""The rows an Arrow IPC stream declares, as first written: a Python walk of the headers.

Kept as the reference the compiled :func:`prism.ingest.ipc_headers.declared_rows`
is tested against (tests/test_ipc_headers.py): the same counts, and None
for the same damaged streams. The format and
the fields read are described in :mod:`prism.ingest.ipc_headers`.
"""
from __future__ import annotations

import struct

from prism.ingest.ipc_headers import Declared

__all__ = ["declared_rows"]

# MessageHeader union tags (format/Message.fbs)
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3
# field slots
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER, _MESSAGE_BODY_LENGTH = 1, 2, 3
_BATCH_LENGTH = 0
_DICTIONARY_DATA = 1


class _Table:
    """A flatbuffer table at ``pos`` of ``buf``: field ``i`` by its vtable slot."""

    def __init__(self, buf: bytes, pos: int):
        self.buf, self.pos = buf, pos
        vtable = pos - _unpack("<i", buf, pos)
        self.vt_len = _unpack("<H", buf, vtable)
        self.vtable = vtable

    def _field(self, i: int) -> int | None:
        slot = 4 + 2 * i
        if slot + 2 > self.vt_len:
            return None  # an older writer's table: the field has its default
        off = _unpack("<H", self.buf, self.vtable + slot)
        return self.pos + off if off else None

    def scalar(self, i: int, fmt: str, default: int = 0) -> int:
        at = self._field(i)
        return default if at is None else _unpack(fmt, self.buf, at)

    def table(self, i: int) -> _Table | None:
        at = self._field(i)
        return None if at is None else _Table(self.buf, at + _unpack("<I", self.buf, at))


_STRUCTS = {fmt: struct.Struct(fmt) for fmt in ("<i", "<I", "<H", "<B", "<q")}


def _unpack(fmt: str, buf: bytes, at: int) -> int:
    s = _STRUCTS[fmt]
    if at < 0 or at + s.size > len(buf):
        raise ValueError("offset outside the header")
    return s.unpack_from(buf, at)[0]


def _message(metadata: bytes) -> tuple[int, int, int]:
    """``(header type, declared length, body bytes)`` of one message's flatbuffer."""
    message = _Table(metadata, _unpack("<I", metadata, 0))
    kind = message.scalar(_MESSAGE_HEADER_TYPE, "<B")
    body = message.scalar(_MESSAGE_BODY_LENGTH, "<q")
    if body < 0:
        raise ValueError("negative body length")
    if kind not in (_RECORD_BATCH, _DICTIONARY_BATCH):
        return kind, 0, body  # a schema (or a tensor, which the reader refuses)
    header = message.table(_MESSAGE_HEADER)
    if header is not None and kind == _DICTIONARY_BATCH:
        header = header.table(_DICTIONARY_DATA)
    return kind, (0 if header is None else max(header.scalar(_BATCH_LENGTH, "<q"), 0)), body


def declared_rows(value) -> Declared | None:
    """The reference walk: :func:`prism.ingest.ipc_headers.declared_rows` without saturation."""
    buf = bytes(value)
    rows = entries = pos = 0
    try:
        # the stream's framing (Arrow columnar format, "Encapsulated message
        # format"): [0xFFFFFFFF] int32 metadata size, the flatbuffer, the body;
        # a size of 0 ends the stream (pre-1.0 writers omit the marker)
        while pos + 4 <= len(buf):
            size = _unpack("<i", buf, pos)
            pos += 4
            if size == -1:  # the continuation marker
                size = _unpack("<i", buf, pos)
                pos += 4
            if size == 0:
                break
            if size < 0 or pos + size > len(buf):
                raise ValueError("message outside the stream")
            kind, n, body = _message(buf[pos:pos + size])
            if kind == _RECORD_BATCH:
                rows += n
            elif kind == _DICTIONARY_BATCH:
                entries += n
            pos += size + body
    except ValueError:
        return None
    return Declared(rows, entries)
