"""The collector pipeline: capture files -> packets -> RDMA messages -> flow records -> a sink.

:class:`Collector` reads each capture (memory-mapped), decodes it in
slices of ``batch_packets`` into a reused field matrix, and feeds the
:class:`~collectors.assemble.FlowAssembler`, whose completed messages go to
the sink as they appear. Sinks: a flow file (any format
:mod:`prism.ingest.formats` writes) or a Kafka topic in the daemon's message format (one
message per GPU pair, keyed by the unordered pair).
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pandas as pd

from prism.ingest.formats import written_suffixes
from prism.ingest.readers import write_flows
from prism.ingest.records import empty_flows
from prism.serve.settings import TOPIC_RE, parse_bootstrap_servers

from .assemble import CollectStats, FlowAssembler, SwitchMap
from .decode import decode_packets, scratch_for
from .pcapfile import CaptureFormatError, read_capture

if TYPE_CHECKING:
    from prism.serve.kafkaconf import KafkaSecurity

__all__ = ["Collector", "FileSink", "KafkaSink", "open_sink", "CAPTURE_SUFFIXES"]

CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap")


class _Sink(Protocol):
    """Where a :class:`Collector`'s flows go (:class:`FileSink`, :class:`KafkaSink`, or anything alike)."""

    def send(self, flows: pd.DataFrame) -> None: ...

    def close(self) -> None: ...


class FileSink:
    """Collect flows and write them to one file at :meth:`close` (format from the extension)."""

    def __init__(self, path: str | os.PathLike) -> None:
        name = str(path)
        written = written_suffixes()
        if not name.endswith(written):
            raise ValueError(f"--out {name}: unknown flow format; use {', '.join(written[:-1])} or {written[-1]}, or kafka://HOST:PORT/TOPIC")
        self.path = Path(name)
        self.parts: list[pd.DataFrame] = []
        self.records = 0

    def send(self, flows: pd.DataFrame) -> None:
        if len(flows):
            self.parts.append(flows)
            self.records += len(flows)

    def close(self) -> None:
        flows = pd.concat(self.parts, ignore_index=True) if self.parts else empty_flows()
        flows = flows.astype({"src": str, "dst": str, "switches": str}).sort_values("start_ns", kind="stable")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_flows(flows.reset_index(drop=True), self.path)


class KafkaSink:
    """Send flows to a topic as the daemon reads them (Arrow IPC, one message per GPU pair)."""

    def __init__(self, bootstrap: str, topic: str, fmt: str = "arrow", security: KafkaSecurity | None = None) -> None:
        from prism.serve.produce import FlowProducer

        self.producer = FlowProducer(bootstrap, topic, fmt, security=security)
        self.records = 0

    def send(self, flows: pd.DataFrame) -> None:
        if len(flows):
            self.producer.send(flows.astype({"src": str, "dst": str, "switches": str}))
            self.records += len(flows)

    def close(self) -> None:
        self.producer.close()


def open_sink(out: str, security: KafkaSecurity | None = None,
              check: Callable[[str, KafkaSecurity | None], object] | None = None) -> FileSink | KafkaSink:
    """``kafka://HOST:PORT/TOPIC`` (with ``security``, a KafkaSecurity) or a flow file path.

    ``check(bootstrap, security)`` runs before a Kafka producer is made (it
    raises with the reason a broker cannot be reached).
    """
    if out.startswith("kafka://"):
        rest = out[len("kafka://"):]
        host, _, topic = rest.partition("/")
        if not host or not topic:
            raise ValueError(f"--out {out}: expected kafka://HOST:PORT/TOPIC")
        # checked before connecting: kafka://::::/t reached the client and failed with "invalid literal for int()"
        parse_bootstrap_servers(host, flag=f"--out {out}")
        if not re.fullmatch(TOPIC_RE, topic) or topic in (".", ".."):
            raise ValueError(f"--out {out}: {topic!r} is not a Kafka topic name (1-249 letters, digits, '.', '_', '-')")
        if check is not None:
            check(host, security)
        return KafkaSink(host, topic, security=security)
    return FileSink(out)


class Collector:
    """Capture files in, flow records out.

    Parameters
    ----------
    sink : FileSink or KafkaSink (anything with ``send(frame)``)
    switch_map : SwitchMap, optional
    batch_packets : int
        Packets decoded per slice (memory: about 250 bytes each).
    """

    def __init__(self, sink: _Sink, switch_map: SwitchMap | None = None, batch_packets: int = 1 << 18,
                 progress: Callable[[int], object] | None = None) -> None:
        self.sink = sink
        self.assembler = FlowAssembler(switch_map)
        self.batch_packets = int(batch_packets)
        self._scratch = scratch_for(self.batch_packets)
        self.progress = progress
        self.files = 0
        self.bad_files: list[str] = []
        self.truncated_files: list[str] = []
        self.packets = 0
        self.seconds = 0.0

    @property
    def stats(self) -> CollectStats:
        return self.assembler.stats

    def add_file(self, path: str | os.PathLike) -> int:
        """Decode one capture; returns its packets. A file that is not a capture is counted and skipped."""
        t0 = time.perf_counter()
        try:
            cap = read_capture(path)
        except (CaptureFormatError, OSError) as e:
            self.bad_files.append(f"{e}")
            self.stats.counts["bad_files"] += 1
            return 0
        if cap.truncated_at >= 0:
            self.truncated_files.append(f"{path}: cut short at byte {cap.truncated_at}")
            self.stats.counts["truncated_files"] += 1
        n = len(cap)
        for start in range(0, n, self.batch_packets):
            table = decode_packets(cap, start, start + self.batch_packets, self._scratch)
            self.sink.send(self.assembler.add(table))
            if self.progress is not None:
                self.progress(min(self.batch_packets, n - start))
        self.files += 1
        self.packets += n
        self.seconds += time.perf_counter() - t0
        del cap
        return n

    def close(self) -> None:
        """Flush messages still held back and close the sink."""
        self.sink.send(self.assembler.finish())
        self.sink.close()

    def summary(self) -> dict:
        return {"files": self.files, "packets": self.packets, "flows": int(self.stats.counts["messages"]),
                "seconds": round(self.seconds, 3), "packets_per_second": round(self.packets / self.seconds) if self.seconds else None,
                **self.stats.as_dict(), "bad_files": self.bad_files, "truncated_files": self.truncated_files}


def capture_files(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Files to read: every path given, directories expanded to their capture files in name order."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            out += sorted(str(q) for q in Path(p).iterdir() if q.suffix in CAPTURE_SUFFIXES and q.is_file())
        else:
            out.append(str(p))
    return out


def packets_hint(paths: Iterable[str | os.PathLike]) -> int:
    """Rough packet count for a progress bar (file bytes / 150)."""
    return int(sum(os.path.getsize(p) for p in paths if os.path.exists(p)) / 150) or 1

