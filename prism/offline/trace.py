"""``timeline.json``: the reconstructed timelines in Chrome Trace Event format.

Opens in Perfetto (ui.perfetto.dev) and chrome://tracing. Layout:

- one process per job (named by its job id), with tracks ``steps`` (a slice
  per whole step), ``DP collective`` and ``PP traffic`` (their spans per
  step), then one track per server and traffic kind (``srv0003 PP``);
- instant events on the job's ``steps`` track for its anomalies;
- a ``fabric`` process with a track per flagged switch or link, a slice
  over each window it was slow in.

Timestamps are microseconds from the first flow (``otherData.epoch_ns``
holds that instant): absolute epoch nanoseconds do not survive a JSON
double, microseconds with three decimals keep nanosecond precision.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from prism.offline.replay import ReplayResult

__all__ = ["chrome_trace", "MAX_SERVER_EVENTS"]

#: Above this many per-server slices the server tracks are left out (the
#: file would be too big to open); ``otherData.server_tracks`` says so.
MAX_SERVER_EVENTS = 500_000

_TRACKS = {"steps": 1, "DP collective": 2, "PP traffic": 3}


def _us(ns, t0):
    return round((int(ns) - t0) / 1e3, 3)


def chrome_trace(res: ReplayResult) -> dict:
    """The trace of a :class:`prism.offline.replay.ReplayResult`, as a JSON-ready dict."""
    events: list[dict] = []
    t0 = int(res.first_ns or 0)
    an = res.analysis
    spans = res.job_spans if res.job_spans is not None else pd.DataFrame(columns=["job_id", "first_ns", "last_ns", "flows"])
    pids = {}
    for pid, row in enumerate(spans.sort_values("job_id").itertuples(index=False), start=1):
        pids[row.job_id] = pid
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": row.job_id}})
        events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
        for name, tid in _TRACKS.items():
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    server_tracks = True
    if an is not None and an.steps is not None and len(an.steps):
        r: Any  # a row: the stubs type its fields as any scalar
        for r in an.steps.itertuples(index=False):
            pid = pids[r.job_id]
            events.append({"ph": "X", "pid": pid, "tid": 1, "name": f"step {r.step}", "cat": "step", "ts": _us(r.start_ns, t0), "dur": round(r.duration_ns / 1e3, 3),
                           "args": {"step": int(r.step), "duration_ms": round(r.duration_ns / 1e6, 3), "flows": int(r.flows), "bytes": int(r.bytes)}})
            for kind, tid, s, e in (("DP", 2, r.dp_start_ns, r.dp_end_ns), ("PP", 3, r.pp_start_ns, r.pp_end_ns)):
                if pd.notna(s):
                    events.append({"ph": "X", "pid": pid, "tid": tid, "name": f"{kind} step {r.step}", "cat": kind, "ts": _us(s, t0), "dur": round((int(e) - int(s)) / 1e3, 3)})
        server_tracks = _server_slices(an.phases, pids, t0, events)
    if an is not None and an.anomalies is not None and len(an.anomalies):
        _anomaly_events(an.anomalies, pids, t0, events, res)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "prism replay", "epoch_ns": t0, "server_tracks": server_tracks},
    }


def _server_slices(phases: pd.DataFrame | None, pids: dict, t0: int, events: list) -> bool:
    """Per (job, step, server, kind): the span of the server's traffic."""
    if phases is None or phases.empty:
        return True
    # one split per distinct server list (a group's), not per phase row
    codes, lists = pd.factorize(phases["servers"])
    servers = [str(x).split("|") for x in lists]
    per_row: list[Any] = [servers[c] if c >= 0 else np.nan for c in codes]  # a list of servers per row, exploded next
    ph = phases.assign(server=per_row).explode("server")
    per = ph.groupby(["job_id", "step", "server", "kind"], sort=True).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), flows=("flows", "sum")).reset_index()
    if len(per) > MAX_SERVER_EVENTS:
        return False
    tids = {}
    for job_id, g in per.groupby("job_id"):
        pid = pids[job_id]
        for i, (server, kind) in enumerate(sorted(set(zip(g["server"], g["kind"])))):
            tid = 10 + i
            tids[(job_id, server, kind)] = tid
            label = f"{server} {'DP' if kind == 'dp_collective' else 'PP'}"
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": label}})
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    ts = ((per["start_ns"].to_numpy() - t0) / 1e3).round(3)
    dur = ((per["end_ns"].to_numpy() - per["start_ns"].to_numpy()) / 1e3).round(3)
    # from the columns as Python lists: tens of thousands of rows, no row objects
    short = {"dp_collective": "DP"}
    events.extend(
        {"ph": "X", "pid": pids[job], "tid": tids[(job, server, kind)], "name": f"{short.get(kind, 'PP')} step {step}", "cat": short.get(kind, "PP"),
         "ts": t, "dur": d, "args": {"flows": flows}}
        for job, step, server, kind, flows, t, d in zip(*(per[c].tolist() for c in ("job_id", "step", "server", "kind", "flows")), ts.tolist(), dur.tolist())
    )
    return True


def _anomaly_events(anomalies: pd.DataFrame, pids: dict, t0: int, events: list, res) -> None:
    fabric = anomalies[anomalies["job_id"].fillna("") == ""]
    for r in anomalies[anomalies["job_id"].fillna("") != ""].itertuples(index=False):
        events.append({"ph": "i", "s": "t", "pid": pids.get(r.job_id, 0), "tid": 1, "name": r.kind, "cat": "anomaly", "ts": _us(max(r.start_ns, t0), t0),
                       "args": {"subject": r.subject, "score": float(r.score), "explanation": r.explanation}})
    if fabric.empty:
        return
    pid = max(pids.values(), default=0) + 1
    events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": "fabric"}})
    events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
    end_cap = int(res.last_ns or t0)
    window = getattr(res, "switch_window_ns", None)
    for i, subject in enumerate(sorted(fabric["subject"].unique()), start=1):
        events.append({"ph": "M", "pid": pid, "tid": i, "name": "thread_name", "args": {"name": subject}})
        for r in fabric[fabric["subject"] == subject].itertuples(index=False):
            s = max(int(r.start_ns), t0)
            e = min(int(r.start_ns) + window, end_cap) if window else end_cap
            events.append({"ph": "X", "pid": pid, "tid": i, "name": r.kind, "cat": "anomaly", "ts": _us(s, t0), "dur": round(max(e - s, 0) / 1e3, 3),
                           "args": {"score": float(r.score), "explanation": r.explanation}})
