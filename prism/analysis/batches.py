"""Whole jobs in batches: what one :func:`~prism.analysis.analyse.analyse` over every flow gives, with bounded memory.

Every analysis but the switches' is per job, so batches of whole jobs give
what one run over all flows gives (tested equal), while the analyses'
temporaries scale with the batch, not the capture. A job too long for one
batch is analysed in time slices (:mod:`prism.analysis.slices`). The offline
replay drives these, from memory or from flows spilled to disk, in this
process or fanned out to worker processes (``executor``: a process pool on
one machine, or a distributed engine's) that each analyse their batches.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, as_completed
from typing import Any

import numpy as np
import pandas as pd

from prism.analysis.analyse import Analysis, Settings, add_anomalies, analyse
from prism.analysis.collectives import concat_instances
from prism.analysis.diagnosis import SwitchBandwidth
from prism.analysis.slices import analyse_sliced
from prism.common.allocator import release_free_memory
from prism.common.ordering import group_rows
from prism.ingest.topology import Topology

__all__ = ["JOB_BATCH_FLOWS", "BatchLoader", "JobChunks", "RowRange", "analyse_batch", "analyse_by_jobs", "analyse_chunks_by_jobs",
           "analyse_job_batches", "plan_analysis", "plan_job_batches"]


#: flows analysed together at most (whole jobs: a bigger job is analysed alone)
JOB_BATCH_FLOWS = 2_000_000


class JobChunks:
    """One job's flows as column chunks (``[a, b, start, duration, size]``), roughly in time order.

    A batch of :func:`analyse_job_batches` given this way, rather than as
    columns, is a job too big to analyse at once: it is analysed in time
    slices (:func:`prism.analysis.slices.analyse_sliced`), its flows read a chunk
    at a time.
    """

    def __init__(self, chunks: Iterable[list[np.ndarray]]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        return iter(self.chunks)

    @classmethod
    def of_columns(cls, cols: list[np.ndarray]) -> JobChunks:
        """One job's flows held as whole columns (in time order), handed over a chunk at a time (views, no copies)."""
        return cls(_row_chunks(cols, 0, len(cols[0])))


class BatchLoader:
    """A batch's flows, read where it is called: in the process that analyses the batch (a worker).

    Handed to :func:`analyse_job_batches` in place of a batch's columns (any
    callable with a ``flows`` count will do: :class:`prism.offline.spill.SpillBatch`), so
    a worker gets a small picklable description of its flows (rows of
    memory it shares, a file, its jobs' NICs in a dataset) rather than the
    flows themselves. Calling it returns the columns ``[a, b, start,
    duration, size]`` (each job's flows together, in capture order), or a
    :class:`JobChunks` for a job analysed in time slices.
    """

    #: flows of the batch (a scheduling hint: the biggest batches are handed out first)
    flows: int = 0

    def __call__(self) -> list[np.ndarray] | JobChunks:
        raise NotImplementedError


#: the grouped flows of :func:`analyse_chunks_by_jobs`, seen by the worker processes it forks (see :class:`RowRange`)
_SHARED_ROWS: list[list[np.ndarray]] = []


class RowRange(BatchLoader):
    """Rows ``f0:f1`` of the grouped flows :func:`analyse_chunks_by_jobs` holds, read by a process forked after it grouped them.

    A process pool forked then shares the columns with the parent (copy on
    write, and nothing writes them): no flow is copied or sent, only the
    row range.
    """

    def __init__(self, f0: int, f1: int, in_slices: bool) -> None:
        self.f0, self.f1, self.in_slices, self.flows = f0, f1, in_slices, f1 - f0

    def __call__(self) -> list[np.ndarray] | JobChunks:
        if not _SHARED_ROWS:
            raise RuntimeError("the grouped flows are not in this process: the pool's workers must be forked after the flows were grouped")
        cols = [c[self.f0:self.f1] for c in _SHARED_ROWS[-1]]
        if not self.in_slices:
            return [c.copy() for c in cols]  # this process's own: analysed in place (a write to the shared pages would copy them a page at a time)
        o = np.argsort(cols[2], kind="stable")  # in time order (see analyse_chunks_by_jobs); a copy, the shared rows stay as they are
        return JobChunks.of_columns([c[o] for c in cols])


def plan_analysis(flows_per_label: np.ndarray, slice_flows: int, max_flows: int | None = None) -> tuple[list[np.ndarray], list[bool]]:
    """:func:`plan_job_batches`, and per batch whether it is one job analysed in time slices.

    A job of more than ``slice_flows`` flows is a batch alone, analysed
    ``slice_flows`` flows at a time (:func:`prism.analysis.slices.analyse_sliced`).

    >>> plan, sliced = plan_analysis(np.array([0, 3, 2, 9]), slice_flows=4, max_flows=5)
    >>> [b.tolist() for b in plan], sliced
    ([[0, 1], [2]], [False, True])
    """
    counts = np.asarray(flows_per_label)
    big = counts > slice_flows  # by label + 1
    big[:1] = False  # flows of no job are not analysed
    plan = []
    for batch in plan_job_batches(counts, max_flows):  # loops over batches and jobs, not flows
        lo = 0
        for i in np.flatnonzero(big[batch + 1]):  # a big job alone; the jobs around it as they were packed
            plan += [batch[lo:i]] if i > lo else []
            plan.append(batch[i:i + 1])
            lo = i + 1
        plan += [batch[lo:]] if lo < len(batch) else []
    return plan, [len(b) == 1 and bool(big[b[0] + 1]) for b in plan]


#: rows a chunk of an in-memory job analysed in slices hands over at a time
_CHUNK_ROWS = 1 << 20


def _row_chunks(cols: list[np.ndarray], f0: int, f1: int):
    """Rows ``f0:f1`` of the columns, :data:`_CHUNK_ROWS` at a time (views, no copies)."""
    for i in range(f0, f1, _CHUNK_ROWS):
        yield [c[i:min(i + _CHUNK_ROWS, f1)] for c in cols]


def plan_job_batches(flows_per_label: np.ndarray, max_flows: int | None = None) -> list[np.ndarray]:
    """Batches of whole jobs: consecutive job labels, at most ``max_flows`` flows a batch.

    Parameters
    ----------
    flows_per_label : int array
        Flows per job label, indexed by label + 1 (index 0: flows of no job).
    max_flows : int, optional
        Default :data:`JOB_BATCH_FLOWS`. A job bigger than it is a batch alone.

    Returns
    -------
    list of int arrays
        The labels of each batch, in label order (the order one run reports
        jobs in). Labels without flows are left out.

    Examples
    --------
    >>> [b.tolist() for b in plan_job_batches(np.array([0, 3, 2, 0, 5]), max_flows=5)]
    [[0, 1], [3]]
    """
    max_flows = JOB_BATCH_FLOWS if max_flows is None else int(max_flows)
    counts = np.asarray(flows_per_label)
    uniq = np.flatnonzero(counts) - 1
    bounds = np.concatenate([[0], np.cumsum(counts[uniq + 1])])
    batches, lo = [], 0
    for k in range(1, len(uniq) + 1):
        if k == len(uniq) or bounds[k + 1] - bounds[lo] > max_flows:
            batches.append(uniq[lo:k])
            lo = k
    return batches


def analyse_by_jobs(a: np.ndarray, b: np.ndarray, start: np.ndarray, duration: np.ndarray, size: np.ndarray, labels: np.ndarray,
                    jobs: pd.DataFrame, topology: Topology, capture_end: int, switch_bw: SwitchBandwidth | None = None,
                    settings: Settings | None = None, stop_after: str = "diagnosis", on_stage: Callable[[str], object] | None = None,
                    max_flows: int | None = None) -> Analysis:
    """:func:`analyse`, run over batches of whole jobs of at most ``max_flows`` flows (default :data:`JOB_BATCH_FLOWS`).

    Every analysis but the switches' is per job, so batches of whole jobs
    give what one run over all flows gives (tested equal); the analyses'
    temporaries (over a hundred bytes a flow at their peak) then scale
    with the batch, not the capture. The flows are grouped by job once (a
    stable counting sort: each job's flows keep their order) and the
    switch diagnosis runs once over ``switch_bw``.

    The column arrays are reordered in place (the caller's copies are
    consumed: no second set of columns is held).
    """
    return analyse_chunks_by_jobs([[a, b, start, duration, size]], labels, jobs, topology, capture_end, switch_bw, settings,
                                  stop_after, on_stage, max_flows)


def analyse_chunks_by_jobs(chunks: list[list[np.ndarray]], labels: np.ndarray, jobs: pd.DataFrame, topology: Topology, capture_end: int,
                           switch_bw: SwitchBandwidth | None = None, settings: Settings | None = None, stop_after: str = "diagnosis",
                           on_stage: Callable[[str], object] | None = None, max_flows: int | None = None, executor: Executor | None = None,
                           on_batch: Callable[[int, int, dict], object] | None = None) -> Analysis:
    """:func:`analyse_by_jobs` over flows given as chunks of columns (``[a, b, start, duration, size]`` each), in capture order.

    The chunks are consumed: each chunk's column goes as the whole column
    fills, so the flows are held once, plus one column (one chunk's
    columns are reordered in place). Grouped by job straight from the
    chunks (:func:`prism.common.ordering.group_rows`), not joined first and then
    reordered: one pass over each column instead of three.

    With ``executor`` (a process pool that forks its workers at its first
    task, as ``ProcessPoolExecutor`` with the ``fork`` start method does),
    the batches are analysed by its workers, each given its rows of the
    grouped flows (:class:`RowRange`), which they share with this process;
    ``on_batch`` as for :func:`analyse_job_batches`.
    """
    key_of = (np.asarray(labels) + 1).astype(np.int32)  # by label + 1 (0: no job); 4 bytes a flow
    keys = [key_of[c[0]] for c in chunks]
    counts = np.zeros(int(labels.max(initial=-1)) + 2, dtype=np.int64)
    for k in keys:
        counts += np.bincount(k, minlength=len(counts))
    plan, sliced = plan_analysis(counts, (settings or Settings()).slice_flows, max_flows)
    if len(plan) <= 1 and not any(sliced):  # one batch: the flows as given, not regrouped
        del keys
        a, b, start, duration, size = _joined(chunks)
        return analyse(a, b, start, duration, size, labels, jobs, topology, capture_end, switch_bw, settings, stop_after, on_stage)
    cols = group_rows(chunks, keys, counts, after_column=release_free_memory if len(chunks) > 1 else None)
    del keys, chunks

    def batches():  # the grouped flows run job after job, in label order, as the plan does
        f0 = 0
        for batch_labels, in_slices in zip(plan, sliced):
            f1 = f0 + int(counts[batch_labels + 1].sum())
            if executor is not None:
                yield batch_labels, RowRange(f0, f1, in_slices)
            elif in_slices:
                # in time order: a job's flows may come file after file (several collectors, each covering the capture)
                o = np.argsort(cols[2][f0:f1], kind="stable")
                for c in cols:
                    c[f0:f1] = c[f0:f1][o]
                del o
                yield batch_labels, JobChunks(_row_chunks(cols, f0, f1))
            else:
                yield batch_labels, [c[f0:f1] for c in cols]
            f0 = f1

    if executor is None:
        return analyse_job_batches(batches(), labels, jobs, topology, capture_end, switch_bw, settings, stop_after, on_stage)
    _SHARED_ROWS.append(cols)
    try:
        return analyse_job_batches(batches(), labels, jobs, topology, capture_end, switch_bw, settings, stop_after, on_stage, executor, on_batch)
    finally:
        _SHARED_ROWS.remove(cols)


def _joined(chunks: list[list[Any]]) -> list[np.ndarray]:
    """The chunks' columns, each joined whole; a column's chunks go once it is joined."""
    if len(chunks) == 1:
        return chunks[0]
    cols = []
    for i in range(len(chunks[0])):
        cols.append(np.concatenate([c[i] for c in chunks]))
        for c in chunks:
            c[i] = None
        release_free_memory()  # the chunks' pages: holes no whole column fits in
    return cols


def analyse_job_batches(batches: Iterable[tuple[np.ndarray, list[np.ndarray] | JobChunks | Callable[[], list[np.ndarray] | JobChunks]]], labels: np.ndarray, jobs: pd.DataFrame,
                        topology: Topology, capture_end: int, switch_bw: SwitchBandwidth | None = None, settings: Settings | None = None,
                        stop_after: str = "diagnosis", on_stage: Callable[[str], object] | None = None, executor: Executor | None = None,
                        on_batch: Callable[[int, int, dict], object] | None = None) -> Analysis:
    """:func:`analyse` over each batch of whole jobs, combined into what one run over all of them gives.

    Parameters
    ----------
    batches : iterable of (labels, columns)
        Per batch (from :func:`plan_job_batches`, at least one): its job
        labels and its flows' ``a, b, start, duration, size`` columns, each
        job's flows together and in their capture order. Consumed one at a
        time: a batch's columns can be read when it is reached (see
        :class:`prism.offline.spill.SpilledFlows`). A batch given as
        :class:`JobChunks` is one job analysed in time slices; one given as
        a :class:`BatchLoader` is read where it is analysed.
    labels, jobs, topology, capture_end, switch_bw, settings, stop_after, on_stage
        As for :func:`analyse`; the switch diagnosis runs once, over
        ``switch_bw``, after the batches.
    executor : concurrent.futures.Executor, optional
        Analyse the batches there, each a task (:func:`analyse_batch`): a
        process pool, or a distributed engine's executor. Its batches should
        be :class:`BatchLoader` (a worker then reads only its own flows).
        The biggest are handed out first; the results are combined in the
        plan's order, so they are what one process gives, byte for byte.
        ``on_stage`` is then called once, with ``"analyse"``.
    on_batch : callable(done, total, seconds), optional
        With ``executor``: called as each batch's analysis comes back
        (progress), with the seconds its worker spent per stage (``load``,
        ``pairs``, ``steps``, ...).
    """
    job_label = labels[topology.ips.get_indexer(jobs["ip"])]  # type: ignore[arg-type]  # pandas takes any array-like; the stubs ask for an Index
    s = settings or Settings()
    if executor is not None:
        parts = _fan_out(batches, job_label, labels, jobs, topology, capture_end, settings, stop_after, on_stage, executor, on_batch)
        return _combine(parts, switch_bw, s, stop_after, topology)
    parts = []
    for batch_labels, cols in batches:
        batch_jobs = jobs[np.isin(job_label, batch_labels)]
        if callable(cols):  # a BatchLoader
            cols = cols()
        # each batch runs every stage: on_stage is called per batch (a stage's time is the sum over batches)
        if isinstance(cols, JobChunks):
            parts.append(analyse_sliced(cols, labels, batch_jobs, topology, capture_end, settings, stop_after, on_stage))
        else:
            a, b, start, duration, size = cols
            parts.append(analyse(a, b, start, duration, size, labels, batch_jobs, topology, capture_end, None, settings, stop_after, on_stage))
            del a, b, start, duration, size  # the batch's columns go before the next is read
        del cols
    return _combine(parts, switch_bw, s, stop_after, topology)


def analyse_batch(cols: list[np.ndarray] | JobChunks | Callable[[], list[np.ndarray] | JobChunks], labels: np.ndarray, batch_jobs: pd.DataFrame, topology: Topology, capture_end: int,
                  settings: Settings | None, stop_after: str) -> tuple[Analysis, dict]:
    """One batch's analysis, as a worker runs it: (its :class:`Analysis`, seconds per stage).

    A batch of several jobs is analysed as :func:`analyse_by_jobs` would
    (in batches of at most :data:`JOB_BATCH_FLOWS` flows, a job past the
    slice size in time slices), so a task may hold more jobs than one
    analysis should. The switch diagnosis is not run here (it needs every
    flow: the caller runs it once, after the batches).
    """
    seconds: dict[str, float] = {}
    running: list[tuple[str, float]] = []  # the stage running, and since when

    def on_stage(name: str) -> None:
        now = time.perf_counter()
        if running:
            last, t = running.pop()
            seconds[last] = seconds.get(last, 0.0) + now - t
        running.append((name, now))

    on_stage("load")  # a loader reads the batch's flows here
    if callable(cols):  # a BatchLoader
        cols = cols()
    if isinstance(cols, JobChunks):
        out = analyse_sliced(cols, labels, batch_jobs, topology, capture_end, settings, stop_after, on_stage)
    else:  # several jobs, maybe: in batches of JOB_BATCH_FLOWS here too (the columns are the task's own, reordered in place)
        a, b, start, duration, size = cols
        del cols
        out = analyse_by_jobs(a, b, start, duration, size, labels, batch_jobs, topology, capture_end, None, settings, stop_after, on_stage)
    on_stage("")
    seconds.pop("", None)
    return out, seconds


def _fan_out(batches, job_label, labels, jobs, topology, capture_end, settings, stop_after, on_stage, executor: Executor, on_batch) -> list[Analysis]:
    """Every batch a task of ``executor``, the biggest first; the analyses back in the plan's order."""
    work = []
    for batch_labels, cols in batches:  # loaders: cheap (a spill's scatter runs before its first)
        work.append((getattr(cols, "flows", 0) if callable(cols) else len(cols[0]) if isinstance(cols, list) else 0, batch_labels, cols))
    if on_stage is not None:
        on_stage("analyse")
    sizes = [w[0] for w in work]
    order = sorted(range(len(work)), key=lambda i: -sizes[i])  # longest first: the last tasks to start are short ones
    futures = {}
    for i in order:
        _, batch_labels, cols = work[i]
        batch_jobs = jobs[np.isin(job_label, batch_labels)]
        futures[executor.submit(analyse_batch, cols, labels, batch_jobs, topology, capture_end, settings, stop_after)] = i
    del work
    parts: list[Analysis | None] = [None] * len(futures)
    done = 0
    try:
        for f in as_completed(futures):
            part, seconds = f.result()
            parts[futures[f]] = part
            done += 1
            if on_batch is not None:
                on_batch(done, len(parts), seconds)
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    return [p for p in parts if p is not None]


def _combine(parts: list[Analysis], switch_bw, s: Settings, stop_after: str, topology: Topology) -> Analysis:
    """One :class:`Analysis` from per-batch ones, in the order a single run gives."""
    def cat(name):
        frames = [getattr(p, name) for p in parts if getattr(p, name) is not None]
        return pd.concat(frames, ignore_index=True) if frames else None

    out = Analysis(pairs=cat("pairs").sort_values(["job_id", "src", "dst"]).reset_index(drop=True))
    out.shapes = cat("shapes").sort_values("job_id").reset_index(drop=True)
    out.slices = {job: n for p in parts for job, n in p.slices.items()}
    if stop_after == "pairs":
        return out
    out.steps, out.phases = cat("steps"), cat("phases")
    out.collectives = concat_instances([p.collectives for p in parts])
    states = cat("job_states")
    out.job_states = states.sort_values("job_id", kind="stable").reset_index(drop=True) if states is not None else None
    if stop_after == "steps":
        return out
    lag = [p.group_lag for p in parts if p.group_lag is not None and len(p.group_lag.columns)]
    # the cross-group diagnosis orders its rows by job id, not by job label
    out.group_lag = pd.concat(lag, ignore_index=True).sort_values(["job_id", "server", "step"], kind="stable").reset_index(drop=True) if lag else pd.DataFrame()
    arrivals = cat("arrivals")
    out.arrivals = arrivals.sort_values(["job_id", "start_ns"], kind="stable").reset_index(drop=True) if arrivals is not None else None
    add_anomalies(out, [p.anomalies for p in parts if p.anomalies is not None], switch_bw, s, topology)
    return out
