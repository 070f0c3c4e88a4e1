"""``prism replay --workers`` and ``--scheduler``: the per-job analyses in worker processes.

Job recognition needs every flow, so it runs first, in the replay's own
process, over the whole capture. What fans out is the rest: each batch of
whole jobs (:func:`prism.analysis.batches.plan_analysis`) is one task, analysed
where it runs, and the results are combined in the plan's order, so the
output files are those of one process, byte for byte. Two executors take
the tasks, neither of them Prism's own:

* **a process pool** on this machine (``--workers N``): a
  ``concurrent.futures.ProcessPoolExecutor`` whose workers are forked once
  the flows are grouped by job, so each reads its rows of them in place
  (:class:`prism.analysis.batches.RowRange`; spilled flows: its batch's file,
  :class:`prism.offline.spill.SpillBatch`). No flow is pickled or copied.
* **Dask distributed** (``--scheduler tcp://host:8786``, or ``local`` for a
  ``LocalCluster`` of ``--workers`` processes), for a capture no one
  machine holds: the replay's process keeps no flow (the memory of
  ``--stop-after jobs``), and each task reads its own jobs' flows from the
  Parquet files (:class:`ParquetJobs`), which every worker must be able
  to open at the same paths. Dask schedules the tasks.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import socket
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism.analysis.batches import BatchLoader, JobChunks
from prism.ingest.formats.common import TEXT_COLUMNS
from prism.ingest.gpu_traffic import gpu_traffic
from prism.ingest.records import FLOW_COLUMNS, RejectCounter, normalise_address, validate_flows
from prism.ingest.topology import Topology

__all__ = ["EngineError", "ParquetJobs", "check_engine_inputs", "dask_executor", "local_pool"]

#: seconds to wait for a scheduler's address to answer before saying it cannot be reached
CONNECT_TIMEOUT_S = 10.0


class EngineError(RuntimeError):
    """The distributed engine cannot be used as asked (not installed, scheduler unreachable, inputs it cannot read): the message says why."""


def local_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes, forked at its first task (so they share what this process holds by then)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, not {workers}")
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))


def check_engine_inputs(paths: Sequence[str]) -> list[str]:
    """The flow files as absolute paths, which every worker opens; an :class:`EngineError` unless each is a plain Parquet file."""
    out = []
    for p in paths:
        if str(p) == "-" or not str(p).endswith(".parquet"):
            raise EngineError(f"{p}: --scheduler reads Parquet files (.parquet, not gzipped, not stdin), which each worker opens itself")
        if not os.path.isfile(p):
            raise EngineError(f"{p}: no such file")
        out.append(os.path.abspath(p))
    return out


@contextmanager
def dask_executor(scheduler: str, workers: int) -> Iterator[tuple[Executor, int]]:
    """A Dask distributed executor, and its number of workers.

    ``scheduler`` is a scheduler's address (``tcp://host:8786``) or
    ``local``: a ``LocalCluster`` of ``workers`` processes of one thread
    each, closed on exit. Raises :class:`EngineError` if Dask is not
    installed or the scheduler cannot be reached.
    """
    try:
        from distributed import Client, LocalCluster
    except ImportError as e:
        raise EngineError("--scheduler needs Dask distributed, which is not installed: pip install 'prism-netdiag[distributed]'") from e
    # its import sets INFO on its loggers (every worker, connection and close); its warnings still show, and --log.level debug shows all
    root = logging.getLogger().getEffectiveLevel()
    logging.getLogger("distributed").setLevel(root if root <= logging.DEBUG else max(root, logging.WARNING))
    cluster = None
    if scheduler == "local":
        # the scheduler's HTTP server (metrics, health) on a free port: 8787 may be another cluster's
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0", worker_dashboard_address=None)
        client = Client(cluster)
    else:
        _check_reachable(scheduler)
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as e:
            raise EngineError(f"--scheduler {scheduler}: no Dask scheduler answers there: {e}") from e
    try:
        if not client.nthreads():
            try:  # a scheduler without workers would hold the tasks forever
                client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)
            except TimeoutError as e:
                raise EngineError(f"--scheduler {scheduler}: the scheduler has no worker (none joined within {CONNECT_TIMEOUT_S:g} s)") from e
        n = sum(client.nthreads().values()) or workers  # task slots: workers x their threads
        yield client.get_executor(pure=False), n
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _check_reachable(address: str) -> None:
    """Fail at once, saying why, where nothing listens at a TCP scheduler address (Dask would retry until its timeout)."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.scheme not in ("tcp", "tls"):
        raise EngineError(f"--scheduler {address}: expected tcp://HOST:PORT, tls://HOST:PORT or local")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as e:
        raise EngineError(f"--scheduler {address}: {e}") from e
    if not host or port is None:
        raise EngineError(f"--scheduler {address}: expected tcp://HOST:PORT (the scheduler's port, 8786 by default)")
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise EngineError(f"--scheduler {address}: cannot reach the scheduler: {e.strerror or e}") from e


class ParquetJobs(BatchLoader):
    """A batch of jobs' flows, read by the task that analyses it from the capture's Parquet files.

    Each file is read a row group at a time: its ``src`` column first, a
    row kept when its source is one of the batch's GPU NICs (decided per
    distinct address: the files store addresses as a dictionary), and a
    row group none of whose rows is kept is not decoded further (files
    that collectors write per rack or switch hold some jobs only). The
    rows kept are validated and taken as the replay takes them
    (:func:`validate_flows`, :func:`gpu_traffic`), so a task holds one row
    group and its own jobs' flows (32 bytes each), the flows the replay's
    own pass saw, in the same order.
    """

    def __init__(self, files: Sequence[str], topology: Topology, labels: np.ndarray, batch_labels: np.ndarray, in_slices: bool, flows: int) -> None:
        self.files, self.topology, self.labels = list(files), topology, labels
        self.batch_labels, self.in_slices, self.flows = np.asarray(batch_labels), in_slices, flows

    def __call__(self) -> list[np.ndarray] | JobChunks:
        mine = np.isin(self.labels, self.batch_labels)  # per NIC
        ips = set(self.topology.ips[mine])
        parts: list[list[Any]] = []
        for path in self.files:
            pf = pq.ParquetFile(path)
            text = [f.name for f in pf.schema_arrow if f.name in TEXT_COLUMNS and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))]
            if text:
                pf = pq.ParquetFile(path, read_dictionary=text)
            cols = [c for c in FLOW_COLUMNS if c in pf.schema_arrow.names]
            for group in range(pf.num_row_groups):
                # the source addresses first: a row group without this task's jobs (a collector's file of other racks) is not decoded
                keep = _rows_from(pf.read_row_group(group, columns=["src"]).column("src"), ips) if "src" in cols else None
                if keep is not None and not keep.any():
                    continue
                table = pf.read_row_group(group, columns=cols)
                if keep is not None:
                    table = table.filter(pa.array(keep))
                chunk = validate_flows(table, RejectCounter(), path)
                del table
                t = gpu_traffic(self.topology, chunk["src"], chunk["dst"])
                m = t.gpu & mine[np.where(t.a >= 0, t.a, 0)]
                if m.any():
                    parts.append([t.a[m].astype(np.int32), t.b[m].astype(np.int32), chunk["start_ns"].to_numpy()[m],
                                  chunk["duration_ns"].to_numpy()[m], chunk["size"].to_numpy()[m]])
        if not parts:
            parts = [[np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)]]
        out: list[np.ndarray] = []
        for i in range(5):  # in capture order: the task groups them by job (analyse_by_jobs), as the replay does
            out.append(np.concatenate([p[i] for p in parts]))
            for p in parts:
                p[i] = None
        if self.in_slices:  # in time order, as the replay sorts a sliced job's flows
            o = np.argsort(out[2], kind="stable")
            return JobChunks.of_columns([c[o] for c in out])
        return out


def _rows_from(src: pa.Array | pa.ChunkedArray, ips: set) -> np.ndarray | None:
    """Per row, whether its source address is one of ``ips`` (canonical); None where the column is not text (validation decides)."""
    arr = src.combine_chunks() if isinstance(src, pa.ChunkedArray) else src
    if not isinstance(arr, pa.DictionaryArray):
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            return None
        arr = pc.dictionary_encode(arr)
    values = arr.dictionary.to_pylist()
    ok = np.array([isinstance(v, str) and normalise_address(v.strip()) in ips for v in values] + [False], dtype=bool)
    idx = arr.indices.to_numpy(zero_copy_only=False)
    valid = arr.indices.is_valid().to_numpy(zero_copy_only=False)
    return ok[np.where(valid, idx, len(values))]
