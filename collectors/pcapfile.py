"""Capture files (pcap and pcapng) into per-packet index arrays.

:func:`read_capture` loads a file into one numpy byte buffer and scans its
record headers (a numba loop: records have variable length, so the scan is
the one sequential step) into arrays of data offset, captured length,
original length, timestamp (ns) and link type. Nothing is copied per
packet: the decoders gather header fields straight from the buffer.

Supported: pcap (both byte orders, microsecond and nanosecond magic) and
pcapng (sections in either byte order, several interfaces with their own
link type and ``if_tsresol``; Enhanced, Simple and obsolete Packet blocks).
A file cut short mid-record keeps every whole record before the cut and
reports the cut (``Capture.truncated_at``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numba
import numpy as np

__all__ = ["Capture", "CaptureFormatError", "read_capture", "capture_from_bytes"]

PCAP_MAGIC = {  # magic as read little-endian -> (byte-swapped, nanosecond)
    0xA1B2C3D4: (False, False), 0xD4C3B2A1: (True, False),
    0xA1B23C4D: (False, True), 0x4D3CB2A1: (True, True),
}
PCAPNG_SHB = 0x0A0D0D0A


class CaptureFormatError(ValueError):
    """The file is not a capture we can read; the message names the file and offset."""


@dataclass
class Capture:
    """Packets of one capture, as index arrays into ``buf``."""

    path: str
    buf: np.ndarray  # uint8, the whole file (memory-mapped)
    offset: np.ndarray  # int64, first byte of each packet's data
    caplen: np.ndarray  # int64, bytes captured
    origlen: np.ndarray  # int64, bytes on the wire
    ts_ns: np.ndarray  # int64, ns since the Unix epoch
    linktype: np.ndarray  # int32, LINKTYPE_* per packet
    truncated_at: int = -1  # file offset of a record cut short, or -1
    fmt: str = "pcap"

    def __len__(self) -> int:
        return len(self.offset)


@numba.njit(cache=True, nogil=True, inline="always")
def _u16(buf, p, swap):
    if swap:
        return (np.int64(buf[p]) << 8) | np.int64(buf[p + 1])
    return np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8)


@numba.njit(cache=True, nogil=True, inline="always")
def _u32(buf, p, swap):
    if swap:
        return (np.int64(buf[p]) << 24) | (np.int64(buf[p + 1]) << 16) | (np.int64(buf[p + 2]) << 8) | np.int64(buf[p + 3])
    return np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8) | (np.int64(buf[p + 2]) << 16) | (np.int64(buf[p + 3]) << 24)


@numba.njit(cache=True, nogil=True)
def _scan_pcap(buf, end, swap, nano):
    """Record headers from byte 24 to ``end``: (offset, caplen, origlen, ts_ns, n, cut_at)."""
    n_max = (end - 24) // 16 + 1
    off = np.empty(n_max, np.int64)
    cap = np.empty(n_max, np.int64)
    orig = np.empty(n_max, np.int64)
    ts = np.empty(n_max, np.int64)
    mult = 1 if nano else 1000
    pos = 24
    n = 0
    cut = -1
    while pos < end:
        if pos + 16 > end:
            cut = pos
            break
        sec = _u32(buf, pos, swap)
        frac = _u32(buf, pos + 4, swap)
        incl = _u32(buf, pos + 8, swap)
        ol = _u32(buf, pos + 12, swap)
        if incl > 0x4000000 or pos + 16 + incl > end:  # > 64 MiB is corrupt; past the end is a cut
            cut = pos
            break
        off[n] = pos + 16
        cap[n] = incl
        orig[n] = max(ol, incl)
        ts[n] = sec * 1_000_000_000 + frac * mult
        n += 1
        pos += 16 + incl
    return off[:n], cap[:n], orig[:n], ts[:n], cut


@numba.njit(cache=True, nogil=True)
def _scan_pcapng(buf, end):
    """Blocks from byte 0: (offset, caplen, origlen, ts_ns, linktype, cut_at, error)."""
    n_max = end // 28 + 1
    off = np.empty(n_max, np.int64)
    cap = np.empty(n_max, np.int64)
    orig = np.empty(n_max, np.int64)
    ts = np.empty(n_max, np.int64)
    lt = np.empty(n_max, np.int32)
    if_lt = np.full(256, -1, np.int32)
    if_snap = np.zeros(256, np.int64)
    if_res = np.full(256, 6, np.int64)  # tsresol exponent
    if_pow2 = np.zeros(256, np.bool_)
    n_if = 0
    swap = False
    pos = 0
    n = 0
    cut = -1
    err = 0
    while pos < end:
        if pos + 12 > end:
            cut = pos
            break
        btype = _u32(buf, pos, False)
        if btype == 0x0A0D0D0A:  # section header: learn the byte order from its magic
            magic = _u32(buf, pos + 8, False)
            if magic == 0x1A2B3C4D:
                swap = False
            elif magic == 0x4D3C2B1A:
                swap = True
            else:
                err = 1
                cut = pos
                break
            n_if = 0
        else:
            btype = _u32(buf, pos, swap)
        blen = _u32(buf, pos + 4, swap)
        if blen < 12 or blen % 4 != 0:
            err = 2
            cut = pos
            break
        if pos + blen > end:
            cut = pos
            break
        body = pos + 8
        if (btype == 1 and blen < 20) or ((btype == 6 or btype == 2) and blen < 32) or (btype == 3 and blen < 16):
            err = 5
            cut = pos
            break
        if btype == 1:  # interface description
            if n_if < 256:
                if_lt[n_if] = _u16(buf, body, swap)
                if_snap[n_if] = _u32(buf, body + 4, swap)
                o = body + 8
                while o + 4 <= pos + blen - 4:
                    code = _u16(buf, o, swap)
                    olen = _u16(buf, o + 2, swap)
                    if code == 0:
                        break
                    if code == 9 and olen >= 1:
                        r = np.int64(buf[o + 4])
                        if_pow2[n_if] = (r & 0x80) != 0
                        if_res[n_if] = r & 0x7F
                        # finer than 2^-63 s or 10^-18 s: no 64-bit clock counts in it
                        if if_res[n_if] > (63 if if_pow2[n_if] else 18):
                            err = 6
                    o += 4 + ((olen + 3) // 4) * 4
            if err:
                cut = pos
                break
            n_if += 1
        elif btype == 6 or btype == 2 or btype == 3:
            if btype == 3:
                iface = 0
                ol = _u32(buf, body, swap)
                cl = min(ol, pos + blen - 4 - (body + 4))
                if if_snap[0] > 0:
                    cl = min(cl, if_snap[0])
                data = body + 4
                ticks = np.int64(-1)
            else:
                if btype == 6:
                    iface = _u32(buf, body, swap)
                else:
                    iface = _u16(buf, body, swap)
                hi = _u32(buf, body + 4, swap)
                lo = _u32(buf, body + 8, swap)
                cl = _u32(buf, body + 12, swap)
                ol = _u32(buf, body + 16, swap)
                data = body + 20
                ticks = (hi << 32) | lo
                if data + cl > pos + blen - 4:
                    err = 3
                    cut = pos
                    break
            if iface >= n_if or iface >= 256:
                err = 4
                cut = pos
                break
            off[n] = data
            cap[n] = cl
            orig[n] = max(ol, cl)
            lt[n] = if_lt[iface]
            if ticks < 0:
                ts[n] = 0
            elif if_pow2[iface]:
                ts[n] = np.int64(ticks * (1e9 / (2.0 ** if_res[iface])))
            elif if_res[iface] <= 9:
                ts[n] = ticks * np.int64(10 ** (9 - if_res[iface]))
            else:
                ts[n] = ticks // np.int64(10 ** (if_res[iface] - 9))
            n += 1
        pos += blen
    return off[:n], cap[:n], orig[:n], ts[:n], lt[:n], cut, err


_PCAPNG_ERRORS = {1: "bad section header byte-order magic", 2: "block length not a multiple of 4",
                  3: "packet data overruns its block", 4: "packet names an interface never described", 5: "block shorter than its fixed fields",
                  6: "interface timestamp resolution (if_tsresol) finer than 10^-18 s or 2^-63 s"}


def capture_from_bytes(data: bytes | bytearray | memoryview, path: str = "<bytes>") -> Capture:
    """Parse a capture held in memory (``bytes``/``bytearray``/``memoryview``)."""
    buf = np.frombuffer(data, np.uint8)
    return _parse(buf, len(buf), path)


def read_capture(path: str | os.PathLike) -> Capture:
    """Read a pcap or pcapng file.

    Raises
    ------
    CaptureFormatError
        Not a pcap/pcapng file, or a pcapng structure error (the message names
        the file and byte offset). A file merely cut short is not an error.
    """
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size == 0:
        raise CaptureFormatError(f"{path}: empty file")
    # mapped, not read: the OS pages the capture in as the scan walks it, and nothing is copied
    buf = np.memmap(path, np.uint8, mode="r")
    return _parse(buf, size, path)


def _parse(buf: np.ndarray, n: int, path: str) -> Capture:
    if n < 4:
        raise CaptureFormatError(f"{path}: {n} bytes, too short for a capture file header")
    magic = int.from_bytes(bytes(buf[:4]), "little")
    if magic in PCAP_MAGIC:
        if n < 24:
            raise CaptureFormatError(f"{path}: pcap global header cut short ({n} of 24 bytes)")
        swap, nano = PCAP_MAGIC[magic]
        link = int.from_bytes(bytes(buf[20:24]), "big" if swap else "little") & 0x0FFFFFFF
        off, cap, orig, ts, cut = _scan_pcap(buf, n, swap, nano)
        lt = np.full(len(off), link, np.int32)
        return Capture(path, buf, off, cap, orig, ts, lt, int(cut), "pcap")
    if magic == PCAPNG_SHB:
        off, cap, orig, ts, lt, cut, err = _scan_pcapng(buf, n)
        if err:
            raise CaptureFormatError(f"{path}: pcapng block at byte {cut}: {_PCAPNG_ERRORS[err]}")
        return Capture(path, buf, off, cap, orig, ts, lt, int(cut), "pcapng")
    raise CaptureFormatError(f"{path}: not a pcap or pcapng file (magic {bytes(buf[:4]).hex()})")
