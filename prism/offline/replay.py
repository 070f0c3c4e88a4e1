"""``prism replay``: the offline pipeline over captured flow dumps.

source (files) -> records (validated chunks) -> analyses -> sinks (files)

Output contract (names and columns are fixed; later stages fill them in):

===================  ==========================================================
``jobs.csv``         ``job_id,ip``
``pairs.csv``        ``job_id,src,dst,type,confidence,evidence`` (unordered pair, src < dst, DP/PP)
``steps.csv``        ``job_id,step,start_ns,end_ns`` then ``duration_ns``,
                     PP and DP spans, ``flows,bytes`` (whole steps only)
``phases.csv``       ``job_id,step,group,kind,start_ns,end_ns,flows,bytes,servers``
                     per step and DP group (ring) or pipeline
``anomalies.csv``    ``kind,job_id,step,start_ns,subject,score,explanation``
``collectives.csv``  ``job_id,kind,collectives,per_step,bytes,...,busbw_gbps``
                     per job and kind of collective (DP ring, PP send/recv,
                     EP all-to-all, CP ring): count, bytes, duration, bus bandwidth
``switches.csv``     effective bandwidth per window and switch / link
``timeline.json``    Chrome Trace Event format (Perfetto, chrome://tracing)
``summary.json``     counts, rejects by reason, ignored by reason, jobs
===================  ==========================================================

The first four columns of ``steps.csv`` and the first six of
``anomalies.csv`` are fixed; columns may be added after them.
"""
from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Executor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from prism.analysis.analyse import Analysis, Settings
from prism.analysis.batches import JOB_BATCH_FLOWS, analyse_by_jobs, analyse_chunks_by_jobs, analyse_job_batches, plan_analysis
from prism.analysis.collectives import COLLECTIVE_COLUMNS, summarise
from prism.analysis.diagnosis import ANOMALY_COLUMNS, SwitchBandwidth
from prism.analysis.diagnosis.switches import DEFAULT_WINDOW_S, SWITCH_COLUMNS
from prism.analysis.jobs import JobRecogniser
from prism.analysis.parallelism import UNCERTAIN_BELOW
from prism.analysis.timeline import PHASE_COLUMNS, STEP_COLUMNS
from prism.common.allocator import release_free_memory
from prism.ingest.gpu_traffic import gpu_traffic
from prism.ingest.inventory import JobNames
from prism.ingest.readers import DEFAULT_CHUNK_ROWS, FlowReader
from prism.ingest.records import RejectCounter
from prism.ingest.topology import Topology
from prism.offline.spill import DEFAULT_SPILL_ABOVE, SpilledFlows

__all__ = ["ReplayResult", "replay", "OUTPUT_COLUMNS"]

OUTPUT_COLUMNS = {
    "jobs.csv": ["job_id", "ip"],
    "pairs.csv": ["job_id", "src", "dst", "type", "confidence", "evidence"],
    "steps.csv": STEP_COLUMNS,
    "phases.csv": PHASE_COLUMNS,
    "anomalies.csv": ANOMALY_COLUMNS,
    "collectives.csv": COLLECTIVE_COLUMNS,
}

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
    last_start_ns: int | None = None  # start of the last record (any traffic): the capture's end
    jobs: pd.DataFrame | None = None
    job_spans: pd.DataFrame | None = None  # job_id, first_ns, last_ns, flows
    analysis: Analysis | None = None
    switch_window_ns: int | None = None
    flows_spilled: int = 0  # GPU flows written to disk and analysed a batch of jobs at a time
    seconds: float = 0.0  # reading and analysis (not writing the outputs)
    stage_seconds: dict = field(default_factory=dict)  # read, [spill,] pairs, steps, phases, diagnosis, write

    @property
    def pairs(self) -> pd.DataFrame | None:
        return self.analysis.pairs if self.analysis is not None else None

    def summary(self) -> dict:
        jobs = []
        if self.jobs is not None and len(self.jobs):
            spans = self.job_spans.set_index("job_id") if self.job_spans is not None else None
            for job_id, g in self.jobs.groupby("job_id", sort=True):
                servers = sorted(g["server"].unique())
                row: dict[str, Any] = {"job_id": job_id, "gpus": int(len(g)), "servers": servers}
                if "job_name" in g:
                    row["job_name"] = str(g["job_name"].iloc[0])  # the scheduler's name, from an inventory ("" if unlisted)
                if self.pairs is not None:
                    types = self.pairs.loc[self.pairs["job_id"] == job_id, "type"].value_counts()
                    row.update(dp_pairs=int(types.get("DP", 0)), pp_pairs=int(types.get("PP", 0)))
                    # expert and context parallel pairs, where a job has them (a key only then: the usual summary stays as it was)
                    row.update({f"{k.lower()}_pairs": int(types[k]) for k in ("EP", "CP") if types.get(k, 0)})
                    if "confidence" in self.pairs:
                        row.update(uncertain_pairs=int(((self.pairs["job_id"] == job_id) & (self.pairs["confidence"] < UNCERTAIN_BELOW)).sum()))
                an = self.analysis
                if an is not None and an.shapes is not None and job_id in set(an.shapes["job_id"]):
                    sh = an.shapes.set_index("job_id").loc[job_id]
                    row.update(dp=int(sh["dp"]), pp=int(sh["pp"]), nics_per_stage=int(sh["nics_per_stage"]), dp_exact=bool(sh["dp_exact"]))
                    row.update({k: int(sh[k]) for k in ("ep", "cp") if sh.get(k, 0)})  # GPUs per all-to-all group, per attention ring
                if an is not None and an.steps is not None:
                    d = an.steps.loc[an.steps["job_id"] == job_id, "duration_ns"]
                    row.update(steps=int(len(d)), median_step_ms=round(float(d.median()) / 1e6, 3) if len(d) else None)
                if an is not None and an.anomalies is not None:
                    row.update(anomalies=int((an.anomalies["job_id"] == job_id).sum()))
                if an is not None and job_id in an.slices:
                    row.update(slices=int(an.slices[job_id]))  # analysed in time slices (--slice-flows)
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
            "flows_spilled": self.flows_spilled,
            "bytes_gpu": self.bytes_gpu,
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            "seconds": round(self.seconds, 3),
            "seconds_by_stage": {k: round(v, 3) for k, v in self.stage_seconds.items()},
            "peak_rss_mib": _peak_rss_mib(),
            "jobs": jobs,
            "anomalies": _records(self.analysis.anomalies) if self.analysis is not None and self.analysis.anomalies is not None else [],
            "warnings": self.warnings() + _stepless(jobs),
        }

    def warnings(self) -> list[str]:
        """Results that are probably not what the user meant (``--strict`` makes them an exit status of 1)."""
        out = []
        if self.rows_read == 0:
            out.append("the input holds no flow records")
        elif self.flows_gpu == 0:
            reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(self.ignored.items()) if v)
            out.append(f"no flow is between two GPU NICs of the topology ({reasons or 'none valid'}): is --topology this cluster's?")
        elif self.jobs is not None and len(self.jobs) == 0:
            out.append("GPU flows were read but no job was recognised")
        if self.rows_read and self.rejects.total > 0.01 * self.rows_read:
            out.append(f"{self.rejects.total / self.rows_read:.1%} of the rows were rejected as malformed (see rejected_by_reason)")
        return out


def _stepless(jobs: list[dict]) -> list[str]:
    """A warning per job whose steps were looked for and none was found: its steps and slow-step diagnosis are off."""
    return [f"{j['job_id']}: no whole training step found in its {j['flows']:,} flows: the capture holds fewer than 3 of its "
            "steps, or no gap in its traffic recurs once a step (FSDP's per-layer collectives); its steps are not reported"
            for j in jobs if j.get("steps") == 0 and j.get("flows")]


def _records(df: pd.DataFrame) -> list[dict]:
    """JSON-ready rows (numpy scalars to Python)."""
    return json.loads(df.to_json(orient="records"))


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


STAGES = ("jobs", "pairs", "steps", "diagnosis")


class _GpuFlows:
    """Compact columns of the GPU flows the per-pair analyses need (32 B/flow).

    Held in memory up to ``spill_above`` flows; past it, written to disk
    (:class:`prism.offline.spill.SpilledFlows`) and read back a batch of whole jobs
    at a time, so memory follows the largest job, not the whole capture.
    """

    N_COLUMNS = 5  # a, b, start, duration, size

    def __init__(self, n_nics: int, spill_above: int | None = None, spill_dir: str | Path | None = None):
        self.parts: list[list] = []
        self.n_nics, self.spill_above, self.spill_dir = n_nics, spill_above, spill_dir
        self.spilled: SpilledFlows | None = None
        self._n = 0

    def add(self, a: np.ndarray, b: np.ndarray, start: np.ndarray, duration: np.ndarray, size: np.ndarray) -> None:
        if self.spilled is not None:
            self.spilled.add(a, b, start, duration, size)
            return
        self.parts.append([a.astype(np.int32), b.astype(np.int32), start, duration, size])
        self._n += len(a)
        if self.spill_above is not None and self._n > self.spill_above:
            self.spilled = SpilledFlows(self.n_nics, self.spill_dir)
            for part in self.parts:
                self.spilled.add(*part)
            self.parts = []
            release_free_memory()

    def take_chunks(self) -> list[list[np.ndarray]]:
        """The chunks' columns, handed over (the caller consumes them; see :func:`prism.analysis.batches.analyse_chunks_by_jobs`)."""
        chunks, self.parts = self.parts, []
        return chunks

    def close(self) -> None:
        self.parts = []
        if self.spilled is not None:
            self.spilled.close()

    def analyse(self, labels: np.ndarray, jobs: pd.DataFrame, topology: Topology, executor: Executor | None = None, max_flows: int | None = None,
                on_batch: Any = None, **kw: Any) -> Analysis:
        """:func:`prism.analysis.batches.analyse_by_jobs` over the flows, from memory or from disk.

        With ``executor`` (a process pool that forks its workers at its first
        task: :func:`prism.offline.workers.local_pool`), the batches of at most
        ``max_flows`` flows are analysed by its workers, each reading its rows
        of the flows in memory, or its batch's spill file.
        """
        fan: dict[str, Any] = {"executor": executor, "on_batch": on_batch} if executor is not None else {}
        if self.spilled is None:
            return analyse_chunks_by_jobs(self.take_chunks() or [[np.empty(0, dtype=np.int64)] * self.N_COLUMNS], labels, jobs, topology,
                                          max_flows=max_flows, **fan, **kw)
        spilled = self.spilled
        counts = spilled.flows_per_label(labels)
        slice_flows = (kw.get("settings") or Settings()).slice_flows
        plan, sliced = plan_analysis(counts, slice_flows, max_flows)
        if len(plan) <= 1 and not any(sliced):  # one batch: the flows as given, as in memory
            a, b, start, duration, size = spilled.read_all()
            return analyse_by_jobs(a, b, start, duration, size, labels, jobs, topology, **kw)
        batches = spilled.job_batches(labels, plan, kw.get("on_stage"), sliced, slice_flows, lazy=executor is not None)
        return analyse_job_batches(batches, labels, jobs, topology, **fan, **kw)


def batch_flows(flows: int, workers: int) -> int | None:
    """Flows a batch of jobs holds at most when ``workers`` analyse them: a few batches a worker (whole jobs, so some may be bigger).

    >>> batch_flows(1000, 1), batch_flows(1000, 2)
    (None, 250)
    """
    if workers <= 1:
        return None
    return int(max(1, min(JOB_BATCH_FLOWS, -(-flows // (2 * workers)))))


def replay(
    paths: Sequence[str],
    topology: Topology,
    out_dir: str | Path | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    progress: bool | None = None,
    stop_after: str = "diagnosis",
    settings: Settings | None = None,
    switch_window_s: float = DEFAULT_WINDOW_S,
    plots: bool = False,
    spill_above: int | None = DEFAULT_SPILL_ABOVE,
    spill_dir: str | Path | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    job_names: JobNames | None = None,
) -> ReplayResult:
    """Read flow dumps, run the analyses, and write the output contract.

    Parameters
    ----------
    paths : list of str
        Flow files (see :mod:`prism.ingest.readers`), ``-`` for stdin.
    topology : Topology
    out_dir : path, optional
        Where to write the output files; nothing is written if None.
    chunk_rows : int
        Rows per chunk: bounds the reading memory, whatever the input size.
    progress : bool, optional
        Show a progress bar (default: when stderr is a terminal).
    stop_after : {"jobs", "pairs", "steps", "diagnosis"}
        Last analysis to run. ``"jobs"`` keeps memory at O(chunk_rows +
        distinct GPU pairs); the later ones keep 32 bytes per GPU flow
        (on disk past ``spill_above``).
    settings : Settings, optional
        Analysis settings (default: :class:`prism.analysis.analyse.Settings()`).
    switch_window_s : float
        Window of the switch-level bandwidth comparison.
    plots : bool
        Also write PNG plots (needs ``out_dir``).
    spill_above : int or None
        GPU flows held in memory at most; past it they are written to
        ``spill_dir`` (32 B a flow, twice) and analysed a batch of whole jobs
        at a time, with the same results. None: never spill. Either way, a
        job of more than ``settings.slice_flows`` flows is analysed in time
        slices (:mod:`prism.analysis.slices`); spilled, it is read back a chunk at a
        time, so memory no longer grows with the capture at all.
    spill_dir : path, optional
        Where spilled flows go (default: the system's temporary directory).
    workers : int
        Processes that analyse the jobs (:mod:`prism.offline.workers`): more
        than one, a process pool on this machine, once every flow is read
        and the jobs are recognised. The outputs are the same, byte for byte.
    scheduler : str, optional
        Analyse the jobs on Dask distributed instead: a scheduler's address
        (``tcp://host:8786``) or ``"local"`` (a local cluster of ``workers``
        processes). This process then keeps no flow; each task reads its
        jobs' flows from ``paths``, which must be Parquet files every worker
        can open. Raises :class:`prism.offline.workers.EngineError` when Dask
        is missing, the scheduler cannot be reached or an input is not Parquet.
    job_names : JobNames, optional
        An inventory of the scheduler's job names (:mod:`prism.ingest.inventory`):
        each job's name goes into ``jobs.csv`` (a ``job_name`` column) and
        the summary.
    """
    from tqdm.auto import tqdm

    if stop_after not in STAGES:
        raise ValueError(f"stop_after must be one of {STAGES}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, not {workers}")
    t_start = time.perf_counter()
    res = ReplayResult(files=[str(p) for p in paths])
    recogniser = JobRecogniser(topology)
    activity = _NicActivity(len(topology))
    on_engine = scheduler is not None and stop_after != "jobs"
    gpu_flows = _GpuFlows(len(topology), spill_above, spill_dir) if stop_after != "jobs" and not on_engine else None
    switch_bw = SwitchBandwidth(switch_window_s, hosts=topology.servers[topology.server_codes]) if stop_after == "diagnosis" else None
    res.switch_window_ns = switch_bw.window_ns if switch_bw is not None else None
    context = ExitStack()
    executor: Executor | None = None
    n_workers = workers
    try:
        if on_engine:
            from prism.offline.workers import check_engine_inputs, dask_executor

            files = check_engine_inputs(paths)
            # before the read: an unreachable scheduler fails now, not after a long pass over the capture
            executor, n_workers = context.enter_context(dask_executor(str(scheduler), workers))
        elif workers > 1 and gpu_flows is not None:
            from prism.offline.workers import local_pool

            executor = context.enter_context(local_pool(workers))  # forked at its first task, once the flows are grouped
        for path in paths:
            reader = FlowReader(path, chunk_rows=chunk_rows, rejects=res.rejects, temp_dir=None if spill_dir is None else str(spill_dir))  # a .parquet.gz is unpacked there
            total = reader.bytes_total or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=Path(str(path)).name, disable=(None if progress is None else not progress), leave=False) as bar:
                for chunk in reader:
                    _consume(chunk, topology, recogniser, activity, res, gpu_flows, switch_bw)
                    if total:
                        bar.update(reader.bytes_done - bar.n)
                    bar.set_postfix(rows=f"{reader.rows_read:,}", refresh=False)
            res.rows_read += reader.rows_read
        res.jobs = recogniser.predict()
        if job_names is not None:
            res.jobs["job_name"] = res.jobs["job_id"].map(res.jobs.groupby("job_id")["server"].agg(lambda s: job_names.name(set(s))))
        res.job_spans = _job_spans(res.jobs, topology, activity)
        stages = _StageClock(res.stage_seconds, progress)
        stages.begin("read", t_start)
        kw: dict[str, Any] = dict(capture_end=res.last_start_ns or 0, switch_bw=switch_bw, settings=settings, stop_after=stop_after, on_stage=stages.begin)
        if on_engine:
            res.analysis = _analyse_on_engine(files, executor, n_workers, recogniser.labels(), res.jobs, topology, activity, res.flows_gpu,
                                              on_batch=stages.batch, **kw)
        elif gpu_flows is not None:
            res.flows_spilled = len(gpu_flows.spilled) if gpu_flows.spilled is not None else 0
            fan: dict[str, Any] = {"executor": executor, "max_flows": batch_flows(res.flows_gpu, workers), "on_batch": stages.batch} if executor else {}
            res.analysis = gpu_flows.analyse(recogniser.labels(), res.jobs, topology, **fan, **kw)
    finally:
        if gpu_flows is not None:
            gpu_flows.close()  # a spill's files go, whatever stopped the replay
        context.close()  # the pool's processes, the engine's client (and a local cluster)
    stages.end()
    res.seconds = time.perf_counter() - t_start
    if out_dir is not None:
        stages.begin("write")
        write_outputs(res, Path(out_dir))
        if plots:
            from prism.offline.plots import write_plots

            write_plots(res, Path(out_dir))
        stages.end()
    return res


def _analyse_on_engine(files: list[str], executor: Executor | None, n_workers: int, labels: np.ndarray, jobs: pd.DataFrame, topology: Topology,
                       activity: _NicActivity, flows_gpu: int, on_batch: Any, **kw: Any) -> Analysis:
    """Groups of whole jobs as tasks of a distributed engine, each reading its jobs' flows from the Parquet files (:class:`ParquetJobs`)."""
    from prism.offline.workers import ParquetJobs

    counts = np.bincount(labels + 1, weights=activity.flows, minlength=1).astype(np.int64)  # GPU flows per job, counted at their source NIC
    # a task reads every file to find its jobs' flows: about one task a worker, of at most a time slice's flows
    # (it holds them, 32 B each, and analyses them in batches of JOB_BATCH_FLOWS)
    slice_flows = (kw.get("settings") or Settings()).slice_flows
    plan, sliced = plan_analysis(counts, slice_flows, max(1, min(slice_flows, -(-flows_gpu // max(1, n_workers)))))
    if not plan:  # no GPU flow: what the in-memory replay gives
        e = np.empty(0, dtype=np.int64)
        return analyse_by_jobs(e, e.copy(), e.copy(), e.copy(), e.copy(), labels, jobs, topology, **kw)
    batches = ((b, ParquetJobs(files, topology, labels, b, s, int(counts[b + 1].sum()))) for b, s in zip(plan, sliced))
    return analyse_job_batches(batches, labels, jobs, topology, executor=executor, on_batch=on_batch, **kw)


class _StageClock:
    """Times the pipeline's stages into ``seconds`` and, with a progress bar, says which is running."""

    def __init__(self, seconds: dict, progress: bool | None):
        self.seconds = seconds
        self.show = sys.stderr.isatty() if progress is None else bool(progress)
        self.name: str | None = None  # the running stage
        self.t = 0.0  # when it began (read only while one runs)

    def begin(self, name: str, t: float | None = None) -> None:
        now = time.perf_counter()
        self.end(now)
        self.name, self.t = name, (now if t is None else t)
        if self.show and name != "read":
            print(f"\r{name}...{' ' * 20}", end="", file=sys.stderr, flush=True)

    def batch(self, done: int, total: int, seconds: dict) -> None:
        """A worker's batch of jobs is back: its stages' seconds are added (summed over the workers), and the progress line says how many."""
        for k, v in seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v
        if self.show:
            print(f"\ranalyse: {done}/{total} batches of jobs{' ' * 10}", end="", file=sys.stderr, flush=True)

    def end(self, now: float | None = None) -> None:
        if self.name is not None:
            self.seconds[self.name] = self.seconds.get(self.name, 0.0) + (now or time.perf_counter()) - self.t
            self.name = None
        if self.show:
            print("\r" + " " * 40 + "\r", end="", file=sys.stderr, flush=True)


def _consume(
    chunk: pd.DataFrame,
    topology: Topology,
    recogniser: JobRecogniser,
    activity: _NicActivity,
    res: ReplayResult,
    gpu_flows: _GpuFlows | None,
    switch_bw: SwitchBandwidth | None,
) -> None:
    n = len(chunk)
    if n == 0:
        return
    res.flows_valid += n
    last_start = int(chunk["start_ns"].max())
    res.last_start_ns = last_start if res.last_start_ns is None else max(res.last_start_ns, last_start)
    traffic = gpu_traffic(topology, chunk["src"], chunk["dst"])
    res.ignored.update(traffic.ignored)  # Counter.update adds
    a, b, gpu = traffic.a, traffic.b, traffic.gpu
    if not gpu.any():
        return
    a, b = a[gpu], b[gpu]
    start = chunk["start_ns"].to_numpy()[gpu]
    duration = chunk["duration_ns"].to_numpy()[gpu]
    size = chunk["size"].to_numpy()[gpu]
    end = start + duration
    res.flows_gpu += int(gpu.sum())
    res.bytes_gpu += int(size.sum())
    lo, hi = int(start.min()), int(end.max())
    res.first_ns = lo if res.first_ns is None else min(res.first_ns, lo)
    res.last_ns = hi if res.last_ns is None else max(res.last_ns, hi)
    recogniser.partial_fit_pairs(a, b)
    activity.update(a, b, start, end)
    if gpu_flows is not None:
        gpu_flows.add(a, b, start, duration, size)
    if switch_bw is not None:
        switch_bw.partial_fit(start, duration, size, chunk["switches"][gpu], src=a, dst=b)


def _job_spans(jobs: pd.DataFrame, topology: Topology, activity: _NicActivity) -> pd.DataFrame:
    if jobs is None or jobs.empty:
        return pd.DataFrame(columns=["job_id", "first_ns", "last_ns", "flows"])
    idx = topology.ips.get_indexer(jobs["ip"])  # type: ignore[arg-type]  # pandas takes any array-like; the stubs ask for an Index
    df = pd.DataFrame({"job_id": jobs["job_id"], "first": activity.first[idx], "last": activity.last[idx], "flows": activity.flows[idx]})
    g = df.groupby("job_id")
    return pd.DataFrame({"first_ns": g["first"].min(), "last_ns": g["last"].max(), "flows": g["flows"].sum()}).reset_index()


def write_outputs(res: ReplayResult, out: Path) -> None:
    """Write every file of the output contract (headers even when empty)."""
    from prism.offline.trace import chrome_trace

    out.mkdir(parents=True, exist_ok=True)
    jobs = res.jobs if res.jobs is not None else pd.DataFrame(columns=["job_id", "ip"])
    jobs[OUTPUT_COLUMNS["jobs.csv"] + (["job_name"] if "job_name" in jobs else [])].to_csv(out / "jobs.csv", index=False)
    an = res.analysis
    frames = {
        "pairs.csv": an.pairs if an is not None else None,
        "steps.csv": an.steps if an is not None else None,
        "phases.csv": an.phases if an is not None else None,
        "anomalies.csv": an.anomalies if an is not None else None,
        "collectives.csv": summarise(an.collectives, an.steps) if an is not None and an.collectives is not None else None,
    }
    # with --job-names, every per-job file carries the scheduler's name beside the id, as jobs.csv does
    names = jobs.drop_duplicates("job_id").set_index("job_id")["job_name"] if "job_name" in jobs else None
    for name, df in frames.items():
        df = df if df is not None else pd.DataFrame(columns=OUTPUT_COLUMNS[name])
        df = df[OUTPUT_COLUMNS[name]]
        if names is not None:
            df = df.assign(job_name=df["job_id"].map(names).fillna(""))
        df.to_csv(out / name, index=False)
    sw = an.switch_bandwidth if an is not None and an.switch_bandwidth is not None else pd.DataFrame(columns=SWITCH_COLUMNS)
    sw.to_csv(out / "switches.csv", index=False)
    (out / "timeline.json").write_text(json.dumps(chrome_trace(res), indent=None) + "\n")
    (out / "summary.json").write_text(json.dumps(res.summary(), indent=2) + "\n")


def format_summary(res: ReplayResult) -> str:
    """The readable summary printed on stdout."""
    s = res.summary()
    read_s = res.stage_seconds.get("read", res.seconds)
    rate = s["rows_read"] / read_s if read_s > 0 else 0.0
    rest = ", ".join(f"{k} {v:.2f} s" for k, v in res.stage_seconds.items() if k != "read")
    lines = [
        f"read {s['rows_read']:,} rows from {len(s['files'])} file(s) in {read_s:.2f} s ({rate:,.0f} rows/s)"
        + (f"; then {rest}" if rest else ""),
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
    for w in s["warnings"]:
        lines.append(f"  warning: {w}")
    for j in s["jobs"]:
        srv = j["servers"]
        srv_txt = srv[0] if len(srv) == 1 else f"{srv[0]}..{srv[-1]}"
        extra = f", {j['flows']:,} flows" if "flows" in j else ""
        if "dp_pairs" in j:
            extra += f", {j['dp_pairs']} DP / {j['pp_pairs']} PP" + "".join(f" / {j[k]} {k[:2].upper()}" for k in ("ep_pairs", "cp_pairs") if k in j) + " pairs"
        named = f" ({j['job_name']})" if j.get("job_name") else ""
        lines.append(f"  {j['job_id']}{named}  {j['gpus']:>5} GPUs on {len(srv):>4} servers ({srv_txt}){extra}")
        if "dp" in j:
            shape = f"DP{j['dp']} x PP{j['pp']}, {j['nics_per_stage']} NICs per stage of a replica" if j["dp_exact"] else f"DP>={j['dp']} x PP{j['pp']} (a DP ring runs partly inside servers)"
            parts = [shape + "".join(f", {what} of {j[k]}" for k, what in (("ep", "expert all-to-all groups"), ("cp", "context-parallel rings")) if k in j)]
            if "steps" in j:  # not with --stop-after pairs
                parts.append(f"{j['steps']} steps, median {j['median_step_ms']:,.1f} ms" if j["steps"] else "no whole step")
            if "anomalies" in j:  # not with --stop-after pairs or steps
                parts.append(f"{j['anomalies']} anomalies")
            if j.get("uncertain_pairs"):
                parts.append(f"{j['uncertain_pairs']} pair type(s) uncertain")
            if j.get("slices"):
                parts.append(f"analysed in {j['slices']} time slices")
            lines.append("      " + "; ".join(parts))
    if s.get("anomalies"):
        lines.append(f"anomalies: {len(s['anomalies'])}")
        for a in s["anomalies"][:20]:
            lines.append(f"  {a['kind']:<13} {a['job_id'] or '-':<13} {a['explanation']}")
        if len(s["anomalies"]) > 20:
            lines.append(f"  ... {len(s['anomalies']) - 20} more in anomalies.csv")
    return "\n".join(lines)
