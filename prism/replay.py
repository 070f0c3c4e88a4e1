"""``prism replay``: the offline pipeline over captured flow dumps.

source (files) -> records (validated chunks) -> analyzers -> sinks (files)

Output contract (names and columns are fixed; later stages fill them in):

=================  ==========================================================
``jobs.csv``       ``job_id,ip``
``pairs.csv``      ``job_id,src,dst,type`` (unordered pair, src < dst, DP/PP)
``steps.csv``      ``job_id,step,start_ns,end_ns``
``anomalies.csv``  ``kind,job_id,step,start_ns,subject,score``
``timeline.json``  Chrome Trace Event format (Perfetto, chrome://tracing)
``summary.json``   counts, rejects by reason, ignored by reason, jobs
=================  ==========================================================
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .jobs import JobRecognizer
from .parallelism import ParallelismClassifier
from .readers import DEFAULT_CHUNK_ROWS, FlowReader
from .records import RejectCounter
from .topology import Topology

__all__ = ["ReplayResult", "replay", "OUTPUT_COLUMNS"]

OUTPUT_COLUMNS = {
    "jobs.csv": ["job_id", "ip"],
    "pairs.csv": ["job_id", "src", "dst", "type"],
    "steps.csv": ["job_id", "step", "start_ns", "end_ns"],
    "anomalies.csv": ["kind", "job_id", "step", "start_ns", "subject", "score"],
}

#: Why a valid record is not training traffic.
IGNORE_REASONS = (
    "non_gpu_address",  # src or dst is not a GPU NIC of the topology (storage, management)
    "self_flow",  # src == dst
)


@dataclass
class ReplayResult:
    """What one replay found; ``summary()`` is what ``summary.json`` holds."""

    files: list[str]
    rows_read: int = 0
    flows_valid: int = 0
    flows_gpu: int = 0
    bytes_gpu: int = 0
    rejects: RejectCounter = field(default_factory=RejectCounter)
    ignored: Counter = field(default_factory=Counter)
    first_ns: int | None = None
    last_ns: int | None = None
    jobs: pd.DataFrame | None = None
    job_spans: pd.DataFrame | None = None  # job_id, first_ns, last_ns, flows
    pairs: pd.DataFrame | None = None  # job_id, src, dst, type
    seconds: float = 0.0

    def summary(self) -> dict:
        jobs = []
        if self.jobs is not None and len(self.jobs):
            spans = self.job_spans.set_index("job_id") if self.job_spans is not None else None
            for job_id, g in self.jobs.groupby("job_id", sort=True):
                servers = sorted(g["server"].unique())
                row = {"job_id": job_id, "gpus": int(len(g)), "servers": servers}
                if self.pairs is not None:
                    types = self.pairs.loc[self.pairs["job_id"] == job_id, "type"].value_counts()
                    row.update(dp_pairs=int(types.get("DP", 0)), pp_pairs=int(types.get("PP", 0)))
                if spans is not None and job_id in spans.index:
                    row.update(
                        flows=int(spans.at[job_id, "flows"]),
                        first_ns=int(spans.at[job_id, "first_ns"]),
                        last_ns=int(spans.at[job_id, "last_ns"]),
                    )
                jobs.append(row)
        return {
            "files": self.files,
            "rows_read": self.rows_read,
            "rows_rejected": self.rejects.total,
            "rejected_by_reason": self.rejects.as_dict(),
            "rejected_examples": self.rejects.examples,
            "flows_valid": self.flows_valid,
            "flows_ignored": int(sum(self.ignored.values())),
            "ignored_by_reason": {k: int(v) for k, v in sorted(self.ignored.items())},
            "flows_gpu": self.flows_gpu,
            "bytes_gpu": self.bytes_gpu,
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            "seconds": round(self.seconds, 3),
            "peak_rss_mib": _peak_rss_mib(),
            "jobs": jobs,
        }


def _peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class _NicActivity:
    """Per-NIC first/last flow time and flow count, updated per chunk."""

    def __init__(self, n: int):
        self.first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        self.last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        self.flows = np.zeros(n, dtype=np.int64)

    def update(self, src: np.ndarray, dst: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        # both ends bound a NIC's active span; a flow is counted on its source
        # only, so a job's flow count is the sum over its NICs
        for nic in (src, dst):
            np.minimum.at(self.first, nic, start)
            np.maximum.at(self.last, nic, end)
        self.flows += np.bincount(src, minlength=len(self.flows))


STAGES = ("jobs", "pairs")


class _GpuFlows:
    """Compact columns of the GPU flows the per-pair analyses need (24 B/flow)."""

    def __init__(self):
        self.parts: list[tuple] = []

    def add(self, a, b, start, size):
        self.parts.append([a.astype(np.int32), b.astype(np.int32), start, size])

    def columns(self):
        """The four columns, concatenated; each column's chunks are freed once joined."""
        if not self.parts:
            e = np.empty(0, dtype=np.int64)
            return e, e, e, e
        cols = []
        for i in range(4):
            cols.append(np.concatenate([p[i] for p in self.parts]))
            for p in self.parts:
                p[i] = None
        self.parts = []
        return cols


def replay(
    paths,
    topology: Topology,
    out_dir: str | Path | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    progress: bool | None = None,
    stop_after: str = "pairs",
) -> ReplayResult:
    """Read flow dumps, recognise jobs, and write the output contract.

    Parameters
    ----------
    paths : list of str
        Flow files (see :mod:`prism.readers`), ``-`` for stdin.
    topology : Topology
    out_dir : path, optional
        Where to write the output files; nothing is written if None.
    chunk_rows : int
        Rows per chunk: bounds memory, whatever the input size.
    progress : bool, optional
        Show a progress bar (default: when stderr is a terminal).
    stop_after : {"jobs", "pairs"}
        Last analysis to run. ``"jobs"`` keeps memory at O(chunk_rows +
        distinct GPU pairs); the per-pair analyses keep 24 bytes per GPU flow.
    """
    from tqdm.auto import tqdm

    if stop_after not in STAGES:
        raise ValueError(f"stop_after must be one of {STAGES}")
    t_start = time.perf_counter()
    res = ReplayResult(files=[str(p) for p in paths])
    recognizer = JobRecognizer(topology)
    activity = _NicActivity(len(topology))
    gpu_flows = _GpuFlows() if stop_after != "jobs" else None
    for path in paths:
        reader = FlowReader(path, chunk_rows=chunk_rows, rejects=res.rejects)
        total = reader.bytes_total or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=Path(str(path)).name, disable=(None if progress is None else not progress), leave=False) as bar:
            for chunk in reader:
                _consume(chunk, topology, recognizer, activity, res, gpu_flows)
                if total:
                    bar.update(reader.bytes_done - bar.n)
                bar.set_postfix(rows=f"{reader.rows_read:,}", refresh=False)
        res.rows_read += reader.rows_read
    res.jobs = recognizer.predict()
    res.job_spans = _job_spans(res.jobs, topology, activity)
    if gpu_flows is not None:
        res.pairs = classify_pairs(gpu_flows, recognizer, topology, res.jobs)
    res.seconds = time.perf_counter() - t_start
    if out_dir is not None:
        write_outputs(res, Path(out_dir))
    return res


def classify_pairs(gpu_flows: _GpuFlows, recognizer: JobRecognizer, topology: Topology, jobs: pd.DataFrame) -> pd.DataFrame:
    """``pairs.csv``: DP/PP per communicating GPU pair, ``src < dst`` as text."""
    a, b, start, size = gpu_flows.columns()
    if len(a) == 0:
        return pd.DataFrame(columns=OUTPUT_COLUMNS["pairs.csv"])
    labels = recognizer.labels()
    pred = ParallelismClassifier().fit(a, b, start, size, labels).predict()
    src, dst = topology.pair_addresses(pred["a"], pred["b"])
    job_id = jobs.set_index("ip")["job_id"].reindex(src).to_numpy()  # both ends share the job
    out = pd.DataFrame({"job_id": job_id, "src": src, "dst": dst, "type": pred["type"].to_numpy()})
    return out.sort_values(["job_id", "src", "dst"]).reset_index(drop=True)


def _consume(
    chunk: pd.DataFrame,
    topology: Topology,
    recognizer: JobRecognizer,
    activity: _NicActivity,
    res: ReplayResult,
    gpu_flows: _GpuFlows | None,
) -> None:
    n = len(chunk)
    if n == 0:
        return
    res.flows_valid += n
    a = topology.nic_index(chunk["src"])
    b = topology.nic_index(chunk["dst"])
    non_gpu = (a < 0) | (b < 0)
    self_flow = ~non_gpu & (a == b)
    res.ignored["non_gpu_address"] += int(non_gpu.sum())
    res.ignored["self_flow"] += int(self_flow.sum())
    gpu = ~(non_gpu | self_flow)
    if not gpu.any():
        return
    a, b = a[gpu], b[gpu]
    start = chunk["start_ns"].to_numpy()[gpu]
    end = start + chunk["duration_ns"].to_numpy()[gpu]
    res.flows_gpu += int(gpu.sum())
    res.bytes_gpu += int(chunk["size"].to_numpy()[gpu].sum())
    lo, hi = int(start.min()), int(end.max())
    res.first_ns = lo if res.first_ns is None else min(res.first_ns, lo)
    res.last_ns = hi if res.last_ns is None else max(res.last_ns, hi)
    recognizer.partial_fit_pairs(a, b)
    activity.update(a, b, start, end)
    if gpu_flows is not None:
        gpu_flows.add(a, b, start, chunk["size"].to_numpy()[gpu])


def _job_spans(jobs: pd.DataFrame, topology: Topology, activity: _NicActivity) -> pd.DataFrame:
    if jobs is None or jobs.empty:
        return pd.DataFrame(columns=["job_id", "first_ns", "last_ns", "flows"])
    idx = topology.ips.get_indexer(jobs["ip"])
    df = pd.DataFrame({"job_id": jobs["job_id"], "first": activity.first[idx], "last": activity.last[idx], "flows": activity.flows[idx]})
    g = df.groupby("job_id")
    return pd.DataFrame({"first_ns": g["first"].min(), "last_ns": g["last"].max(), "flows": g["flows"].sum()}).reset_index()


def write_outputs(res: ReplayResult, out: Path) -> None:
    """Write every file of the output contract (headers even when empty)."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = res.jobs if res.jobs is not None else pd.DataFrame(columns=["job_id", "ip"])
    jobs[OUTPUT_COLUMNS["jobs.csv"]].to_csv(out / "jobs.csv", index=False)
    pairs = res.pairs if res.pairs is not None else pd.DataFrame(columns=OUTPUT_COLUMNS["pairs.csv"])
    pairs[OUTPUT_COLUMNS["pairs.csv"]].to_csv(out / "pairs.csv", index=False)
    # filled in by the timeline and diagnosis stages (issue 4)
    for name in ("steps.csv", "anomalies.csv"):
        pd.DataFrame(columns=OUTPUT_COLUMNS[name]).to_csv(out / name, index=False)
    (out / "timeline.json").write_text(json.dumps(chrome_trace(res), indent=None) + "\n")
    (out / "summary.json").write_text(json.dumps(res.summary(), indent=2) + "\n")


def chrome_trace(res: ReplayResult) -> dict:
    """Chrome Trace Event format: a process per job with its active span.

    Timestamps are microseconds relative to the first flow (``ts`` must be
    a number of microseconds; absolute epoch ns would lose precision in a
    JSON double).
    """
    events = []
    t0 = res.first_ns or 0
    if res.job_spans is not None:
        for pid, row in enumerate(res.job_spans.sort_values("job_id").itertuples(index=False), start=1):
            events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": row.job_id}})
            events.append({"ph": "M", "pid": pid, "tid": 0, "name": "thread_name", "args": {"name": "job"}})
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": 0,
                    "name": "observed",
                    "ts": (int(row.first_ns) - t0) / 1e3,
                    "dur": (int(row.last_ns) - int(row.first_ns)) / 1e3,
                    "args": {"flows": int(row.flows)},
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"generator": "prism replay", "epoch_ns": t0}}


def format_summary(res: ReplayResult) -> str:
    """The readable summary printed on stdout."""
    s = res.summary()
    rate = s["rows_read"] / res.seconds if res.seconds > 0 else 0.0
    lines = [
        f"read {s['rows_read']:,} rows from {len(s['files'])} file(s) in {res.seconds:.2f} s ({rate:,.0f} rows/s)",
        f"  rejected: {s['rows_rejected']:,}" + (" (" + ", ".join(f"{k} {v:,}" for k, v in s["rejected_by_reason"].items()) + ")" if s["rows_rejected"] else ""),
    ]
    for reason, examples in s["rejected_examples"].items():
        for ex in examples[:2]:
            lines.append(f"    e.g. {reason}: {ex}")
    lines.append(
        f"  ignored (not GPU-to-GPU training traffic): {s['flows_ignored']:,}"
        + (" (" + ", ".join(f"{k} {v:,}" for k, v in s["ignored_by_reason"].items() if v) + ")" if s["flows_ignored"] else "")
    )
    lines.append(f"  GPU flows: {s['flows_gpu']:,} ({s['bytes_gpu'] / 1e9:,.1f} GB)")
    if s["first_ns"] is not None:
        lines.append(f"  capture: {(s['last_ns'] - s['first_ns']) / 1e9:,.1f} s")
    lines.append(f"jobs: {len(s['jobs'])}")
    for j in s["jobs"]:
        srv = j["servers"]
        srv_txt = srv[0] if len(srv) == 1 else f"{srv[0]}..{srv[-1]}"
        extra = f", {j['flows']:,} flows" if "flows" in j else ""
        if "dp_pairs" in j:
            extra += f", {j['dp_pairs']} DP / {j['pp_pairs']} PP pairs"
        lines.append(f"  {j['job_id']}  {j['gpus']:>5} GPUs on {len(srv):>4} servers ({srv_txt}){extra}")
    return "\n".join(lines)
