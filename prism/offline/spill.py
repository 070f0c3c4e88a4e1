"""GPU flow columns kept on disk, read back a batch of whole jobs at a time.

``prism replay`` holds 32 bytes per GPU flow until the capture is read
(jobs are known only then: they are components over all GPU pairs). A
capture bigger than ``--spill-above`` flows is written here instead, and
read back one batch of whole jobs at a time, so the replay's peak memory
is bounded by the batch, not by the capture's length:

1. :meth:`SpilledFlows.add` appends each chunk's flows to one file
   (32-byte records, in capture order);
2. :meth:`SpilledFlows.job_batches` scatters that file, a slice at a time,
   into one file per batch of jobs (:func:`prism.analysis.batches.plan_job_batches`),
   keeping the capture order within each;
3. each batch's file is read when the analysis reaches it, its flows
   grouped by job (a stable sort), and deleted; a batch that is one job
   too big to analyse at once (:func:`prism.analysis.batches.plan_analysis`) is
   read ``slice_rows`` at a time instead, for its analysis in time slices
   (:mod:`prism.analysis.slices`).

The batches are the ones :func:`prism.analysis.batches.analyse_by_jobs` analyses in
memory, in the same order, so the results are the same (tested equal).
Disk: 64 bytes per GPU flow at most (the file and the batch files), in a
temporary directory removed by :meth:`SpilledFlows.close`.
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from prism.analysis.analyse import DEFAULT_SLICE_FLOWS

if TYPE_CHECKING:
    from prism.analysis.batches import JobChunks

__all__ = ["SpilledFlows", "SpillBatch", "SpillError", "RECORD", "DEFAULT_SPILL_ABOVE"]

#: GPU flows ``prism replay`` holds in memory (32 B each, 640 MB) before
#: spilling them here: above it, peak memory no longer grows with the capture
DEFAULT_SPILL_ABOVE = 20_000_000

#: one GPU flow on disk: the columns the per-pair analyses read (32 bytes)
RECORD = np.dtype([("a", "<i4"), ("b", "<i4"), ("start", "<i8"), ("duration", "<i8"), ("size", "<i8")])
COLUMNS: tuple[str, ...] = RECORD.names or ()
#: records read at a time when scattering the file into batches
SLICE_ROWS = 1 << 20


class SpillError(OSError):
    """The spill directory could not be written or read (full, gone, not allowed): the message says where."""


@contextmanager
def _spill_io(where):
    try:
        yield
    except SpillError:
        raise
    except OSError as e:
        try:
            free = f"{shutil.disk_usage(where).free / 2**20:,.0f} MiB free there"
        except OSError:
            free = "no such directory"
        raise SpillError(f"spilling GPU flows to {where}: {e.strerror or e}; {free} (the spill takes up to 64 B a GPU flow: "
                         f"give --spill-dir a directory with room, or a larger --spill-above)") from e


class SpilledFlows:
    """GPU flows appended to a file, read back per batch of whole jobs.

    Parameters
    ----------
    n_nics : int
        NICs in the topology (flows are counted per source NIC as they are
        written, so batches are planned without reading the file again).
    directory : path, optional
        Where the temporary directory goes (default: the system's temporary
        directory, ``TMPDIR``).
    slice_rows : int, optional
        Records read at a time when scattering into batches (memory:
        ``slice_rows`` x 32 bytes, twice); default :data:`SLICE_ROWS`.

    Examples
    --------
    >>> s = SpilledFlows(n_nics=3)
    >>> s.add(np.array([0, 2]), np.array([1, 1]), np.array([5, 6]), np.array([1, 1]), np.array([10, 20]))
    >>> len(s), s.flows_per_nic.tolist()
    (2, [1, 0, 1])
    >>> [c.tolist() for c in s.read_all()][2]
    [5, 6]
    >>> s.close()
    """

    def __init__(self, n_nics: int, directory: str | Path | None = None, slice_rows: int | None = None):
        with _spill_io(directory or tempfile.gettempdir()):
            self.dir = Path(tempfile.mkdtemp(prefix="prism-spill-", dir=directory))
        self.path = self.dir / "flows.bin"
        with _spill_io(self.dir):
            self._file = open(self.path, "wb")
        self.slice_rows = int(SLICE_ROWS if slice_rows is None else slice_rows)
        self.flows_per_nic = np.zeros(n_nics, dtype=np.int64)
        self._n = 0
        # earliest and latest flow start per source NIC: a job's time span, for its time buckets
        self.first_start = np.full(n_nics, np.iinfo(np.int64).max, dtype=np.int64)
        self.last_start = np.full(n_nics, np.iinfo(np.int64).min, dtype=np.int64)

    def __len__(self) -> int:
        return self._n

    def add(self, a: np.ndarray, b: np.ndarray, start: np.ndarray, duration: np.ndarray, size: np.ndarray) -> None:
        """Append one chunk's flows (column arrays of equal length)."""
        rec = np.empty(len(a), dtype=RECORD)
        for name, col in zip(COLUMNS, (a, b, start, duration, size)):
            rec[name] = col
        with _spill_io(self.dir):
            rec.tofile(self._file)
        self.flows_per_nic += np.bincount(np.asarray(a), minlength=len(self.flows_per_nic))
        self._n += len(a)
        np.minimum.at(self.first_start, np.asarray(a), np.asarray(start, dtype=np.int64))
        np.maximum.at(self.last_start, np.asarray(a), np.asarray(start, dtype=np.int64))

    def _records(self, path: Path):
        """The records of a file, ``slice_rows`` at a time."""
        with open(path, "rb") as f:
            while True:
                rec = np.fromfile(f, dtype=RECORD, count=self.slice_rows)
                if len(rec) == 0:
                    return
                yield rec

    def read_all(self) -> list[np.ndarray]:
        """All flows as ``a, b, start, duration, size`` columns, in capture order."""
        with _spill_io(self.dir):
            self._file.flush()
            return _columns(np.fromfile(self.path, dtype=RECORD))

    def job_batches(self, labels: np.ndarray, plan: list[np.ndarray], on_stage: Callable[[str], object] | None = None,
                    sliced: list[bool] | None = None, slice_flows: int | None = None,
                    lazy: bool = False) -> Iterator[tuple[np.ndarray, list[np.ndarray] | JobChunks | SpillBatch]]:
        """Yield ``(batch labels, columns)`` per batch of ``plan``, each job's flows together.

        Parameters
        ----------
        labels : int array
            Job label per NIC (-1: no job).
        plan : list of int arrays
            :func:`prism.analysis.batches.plan_job_batches` over
            :meth:`flows_per_label`.
        on_stage : callable(str), optional
            Called with ``"spill"`` before the scatter and before each
            batch is read back (progress, and the time it takes, for the
            caller: see :func:`prism.analysis.analyse.analyse`).
        sliced : list of bool, optional
            Per batch: a job too big to analyse at once
            (:func:`prism.analysis.batches.plan_analysis`). Its flows are yielded as
            :class:`prism.analysis.batches.JobChunks`, read ``slice_rows`` at a time,
            never all at once: the caller consumes them before asking for
            the next batch. They come in time order: the scatter writes such
            a job's flows into time buckets (a quarter of ``slice_flows``
            flows each at a steady rate), each sorted when read back, so
            files of several collectors, each covering the whole capture,
            reach the time slices in order.
        slice_flows : int, optional
            The flows of a time slice (default
            :data:`~prism.analysis.analyse.DEFAULT_SLICE_FLOWS`); sets the time buckets.
        lazy : bool
            Yield each batch as a :class:`SpillBatch` that reads it when
            called (in the worker that analyses it), not as its columns.

        The columns are those :func:`prism.analysis.batches.analyse_by_jobs` slices
        out of the grouped capture. Complexity: each flow was written once
        by :meth:`add`, and is read, written to its batch's file and read
        again here (O(flows) I/O); memory O(slice_rows + largest batch).
        """
        stage = on_stage or (lambda name: None)
        stage("spill")
        with _spill_io(self.dir):
            self._file.flush()
        batch_of = np.full(int(labels.max(initial=-1)) + 2, -1, dtype=np.int64)  # by label + 1
        for i, batch_labels in enumerate(plan):
            batch_of[np.asarray(batch_labels) + 1] = i
        paths = [self.dir / f"batch-{i}.bin" for i in range(len(plan))]
        sliced = sliced or [False] * len(plan)
        # a sliced job's flows go to time buckets, read back in order (its flows may come file after file, each
        # covering the capture); at most a quarter of a slice a bucket, if the job's flow rate is steady
        counts = self.flows_per_label(labels)
        buckets, span = {}, {}  # sliced batch -> time buckets, and the job's (first, last) start
        for i in np.flatnonzero(sliced).tolist():
            label = int(plan[i][0])
            buckets[i] = max(1, -(-int(counts[label + 1]) // max(1, (slice_flows or DEFAULT_SLICE_FLOWS) // 4)))
            nics = labels == label
            span[i] = (int(self.first_start[nics].min()), int(self.last_start[nics].max()))
        with _spill_io(self.dir):
            for rec in self._records(self.path):
                bid = batch_of[labels[rec["a"]] + 1]
                if (bid < 0).any():
                    raise ValueError("a spilled flow's job is in no batch of the plan")
                for i, nb in buckets.items():  # per sliced job, not per flow
                    mine = bid == i
                    if mine.any():
                        t0, t1 = span[i]
                        when = np.clip(((rec["start"][mine] - t0) * (nb / (t1 - t0 + 1))).astype(np.int64), 0, nb - 1)
                        o = np.argsort(when, kind="stable")  # one sort, then a run per bucket: not a pass per bucket
                        part, when = rec[mine][o], when[o]
                        ks, firsts = np.unique(when, return_index=True)
                        for k, lo, hi in zip(ks, firsts, np.r_[firsts[1:], len(when)]):
                            with open(self.dir / f"batch-{i}-t{k}.bin", "ab") as f:
                                part[lo:hi].tofile(f)
                        del part, when, o
                        bid = np.where(mine, -1, bid)
                keep = bid >= 0
                rec, bid = rec[keep], bid[keep]
                # capture order kept within each batch; 16-bit keys get numpy's radix sort (5x a 64-bit stable sort)
                o = np.argsort(bid.astype(np.int16) if len(plan) <= np.iinfo(np.int16).max else bid, kind="stable")
                rec, bid = rec[o], bid[o]
                cuts = np.searchsorted(bid, np.arange(len(plan) + 1))
                for i in np.flatnonzero(np.diff(cuts)).tolist():
                    with open(paths[i], "ab") as f:
                        rec[cuts[i]:cuts[i + 1]].tofile(f)
                del rec, bid, o
        for i, (batch_labels, path, in_slices) in enumerate(zip(plan, paths, sliced)):
            stage("spill")
            files = [self.dir / f"batch-{i}-t{k}.bin" for k in range(buckets[i])] if in_slices else [path]
            if not in_slices and not path.exists():  # a batch is planned from flow counts: it has flows
                raise ValueError(f"{path.name}: a planned batch of jobs has no spilled flows")
            batch = SpillBatch(files, labels, in_slices, self.slice_rows, int(counts[np.asarray(batch_labels) + 1].sum()))
            yield batch_labels, (batch if lazy else batch())

    def flows_per_label(self, labels: np.ndarray) -> np.ndarray:
        """Flows per job label, indexed by label + 1 (as :func:`prism.analysis.batches.plan_job_batches` takes them)."""
        return np.bincount(labels + 1, weights=self.flows_per_nic, minlength=1).astype(np.int64)

    def close(self) -> None:
        """Remove the files."""
        if not self._file.closed:
            self._file.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SpilledFlows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SpillBatch:
    """One batch of a spill, read back when called (a :class:`prism.analysis.batches.BatchLoader`): in a worker, if the replay has some.

    Its files are the batch's (or, for a job analysed in time slices, its
    time buckets'); each goes once read. Picklable: paths and the job
    labels, no flow.
    """

    def __init__(self, files: list[Path], labels: np.ndarray, in_slices: bool, slice_rows: int, flows: int) -> None:
        self.files, self.labels, self.in_slices, self.slice_rows, self.flows = files, labels, in_slices, slice_rows, flows

    def __call__(self) -> list[np.ndarray] | JobChunks:
        from prism.common.ordering import group_rows  # compiled with numba: loaded when used, not when the CLI starts

        if self.in_slices:  # one job, bucket after bucket: no grouping
            from prism.analysis.batches import JobChunks

            return JobChunks(_bucket_chunks(self.files, self.slice_rows))
        path = self.files[0]
        with _spill_io(path.parent):
            cols = _columns(np.fromfile(path, dtype=RECORD))
            path.unlink()
        labels = self.labels
        key = labels[cols[0]] + 1
        return group_rows([cols], [key], np.bincount(key, minlength=int(labels.max(initial=-1)) + 2))


def _columns(rec: np.ndarray) -> list[np.ndarray]:
    return [np.ascontiguousarray(rec[name]) for name in COLUMNS]


def _bucket_chunks(paths: list[Path], slice_rows: int):
    """The flows of these time buckets' files, each sorted by start, as columns ``slice_rows`` at a time; each file goes once read."""
    for path in paths:
        with _spill_io(path.parent):
            if not path.exists():  # a time bucket the job has no flow in
                continue
            rec = np.fromfile(path, dtype=RECORD)  # a quarter of a slice, at a steady flow rate
            path.unlink()
        rec = rec[np.argsort(rec["start"], kind="stable")]
        for i in range(0, len(rec), slice_rows):
            yield _columns(rec[i:i + slice_rows])
