"""Job names operators know: an inventory of servers (or GPU NICs) to the scheduler's job names.

Prism recognises jobs from their traffic alone, so it names each by a
hash of its servers (``job-1a2b3c4d``): stable, but nothing an operator
knows. Dashboards and alerts join on the scheduler's names (the way
kube-state-metrics' info series are joined). An inventory, a CSV that the
scheduler or a CMDB exports, maps each server (column ``server``) or each
GPU NIC (column ``ip``, mapped to its server through the topology) to a
``job_name``; a recognised job takes the name that most of its servers
carry (ties: the first in alphabetical order), and none if none of its
servers is listed. The name travels beside the job id: replay's
``jobs.csv`` and summary, the daemon's ``prism_job_info``.

>>> names = JobNames({"srv0001": "llama-70b", "srv0002": "llama-70b", "srv0003": "bert"})
>>> names.name(["srv0001", "srv0002", "srv0003"]), names.name(["srv0009"])
('llama-70b', '')
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping

from prism.ingest.csvrows import read_csv_rows
from prism.ingest.records import FlowFormatError, normalise_address
from prism.ingest.topology import Topology

__all__ = ["JobNames"]

#: the longest name kept (a label value, not a document)
MAX_NAME = 200


class JobNames:
    """Server -> scheduler job name; names a recognised job by its servers' most common name."""

    def __init__(self, by_server: Mapping[str, str], path: str | None = None) -> None:
        self.by_server = dict(by_server)
        self.path = path
        self.mtime = _mtime(path) if path else None

    @classmethod
    def from_csv(cls, path: str, topology: Topology | None = None) -> "JobNames":
        """Read an inventory CSV: ``job_name`` and ``server`` (or ``ip``, with ``topology`` to find the server).

        Raises
        ------
        FlowFormatError
            On a missing column, an unknown address, an empty field, or a
            server named twice with different jobs; the message names the
            file, line and field.
        """
        rows, header = read_csv_rows(path, "job inventory", "the job inventory is a CSV file (server,job_name or ip,job_name)")
        if not rows:
            raise FlowFormatError(f"{path}: the job inventory is empty (expected a header server,job_name or ip,job_name and one row each)")
        key = "server" if "server" in header else "ip" if "ip" in header else None
        if key is None or "job_name" not in header:
            raise FlowFormatError(f"{path}: the job inventory needs columns job_name and server (or ip) (found: {', '.join(h for h in header if h)})")
        if key == "ip" and topology is None:
            raise FlowFormatError(f"{path}: an inventory by ip needs the topology to find each NIC's server")
        server_of = dict(zip(topology.nics["ip"], topology.nics["server"])) if topology is not None else {}
        out: dict[str, str] = {}
        line_of: dict[str, int] = {}
        for i, row in enumerate(rows, start=2):
            raw, name = (row.get(key) or "").strip(), (row.get("job_name") or "").strip()
            if not raw:
                raise FlowFormatError(f"{path}:line {i}: field {key} is empty")
            if not name:
                raise FlowFormatError(f"{path}:line {i}: field job_name is empty")
            if key == "ip":
                ip = normalise_address(raw)
                if ip is None:
                    raise FlowFormatError(f"{path}:line {i}: field ip: {raw!r} is not an IPv4/IPv6 address")
                if ip not in server_of:
                    raise FlowFormatError(f"{path}:line {i}: field ip: {ip} is no GPU NIC of the topology")
                server = server_of[ip]
            else:
                server = raw
            name = name[:MAX_NAME]
            if out.get(server, name) != name:
                raise FlowFormatError(f"{path}:line {i}: server {server} is job {out[server]!r} on line {line_of[server]}, here {name!r}")
            out[server], line_of[server] = name, line_of.get(server, i)
        return cls(out, path)

    def name(self, servers: Iterable[str]) -> str:
        """The name most of ``servers`` carry (ties: alphabetical first); '' if none is listed."""
        counts = Counter(self.by_server[s] for s in servers if s in self.by_server)
        if not counts:
            return ""
        top = max(counts.values())
        return min(n for n, c in counts.items() if c == top)

    def seen(self) -> None:
        """Take the file as it is now for read (a version that could not be read is then reported once, not again)."""
        self.mtime = _mtime(self.path) if self.path else None

    def changed(self) -> bool:
        """Has the file changed since it was read (the daemon then reads it again)?"""
        return self.path is not None and _mtime(self.path) != self.mtime


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None
