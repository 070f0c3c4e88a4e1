"""One job's analysis over overlapping time slices, stitched into one result.

The analyses hold over a hundred bytes a flow at their peak (sorts,
per-flow step and pair indices), so a job with more flows than fit in
memory cannot be analysed at once, however its flows are stored (in
memory at 32 bytes each, or spilled to disk). Such a job is analysed
``slice_flows`` flows at a time, in time order, each slice reaching back
over the last few steps of the one before; the results are stitched:

* **steps** -- taken by the rule the daemon's windows use
  (:mod:`prism.analysis.stitch`): once they end a hold (two median steps)
  before the slice's last flow, the later ones waiting for the next
  slice, which re-cuts them with what follows; new if they end past the
  last taken step's end and do not start before it (within a quarter of
  a median step). Steps are numbered anew, in order;
* **phases and per-server lag** -- per step, so the taken steps' rows are
  kept (with the new numbers) and the others dropped;
* **collective arrivals** -- per DP collective burst, not per step: a
  slice's bursts that start after the last one taken are kept;
* **collective instances** -- per burst of any kind: a slice's bursts that
  end in its span past the last slice's (:func:`prism.analysis.collectives.settled`);
* **anomalies** -- the cross-step diagnosis runs once over the stitched
  steps, the cross-group one over the stitched lag table and the arrival
  one over the stitched bursts, as they would over one run (all read only
  per-step or per-burst rows);
* **pairs** -- typed in every slice; a pair's type is the one its slices
  gave with the most confidence in all, its confidence that sum divided by
  the slices that saw it (a slice that typed it the other way counts as
  zero: a pair typed two ways is less certain), and its evidence says when
  slices disagreed;
* **shape** -- the most common over the slices.

Memory: one slice's analysis, whatever the job's length. The stitched
frames grow by one row per step (and per phase and lag row), not per flow.

Flows must come in time order (the replay sorts a sliced job's flows, or
reads them back from the spill in sorted time buckets): each slice is
sorted, but a flow that arrives after its time was analysed only joins
the next slice, where it cannot change steps already taken; such flows
are counted and warned about.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from prism.analysis.analyse import Analysis, Settings, analyse
from prism.analysis.collectives import concat_instances, settled
from prism.analysis.diagnosis import in_time_order, not_named_by
from prism.analysis.stitch import StepStitcher, median_step_ns
from prism.analysis.timeline import PHASE_COLUMNS, STEP_COLUMNS
from prism.common.allocator import release_free_memory
from prism.ingest.topology import Topology

__all__ = ["analyse_sliced"]

log = logging.getLogger("prism.slices")

#: median steps each slice reaches back into the one before
OVERLAP_STEPS = 8
#: median steps before a slice's last flow within which a step waits for the next slice
HOLD_STEPS = 2.0
#: steps a slice should hold: with fewer, the gap threshold and the optimizer-split rule
#: see too few steps, and stitched boundaries move (by 0.2% of a step on the real traces at 6)
MIN_SLICE_STEPS = 10


class _Stitch:
    """The stitched results of the slices so far."""

    def __init__(self) -> None:
        self.steps: list[pd.DataFrame] = []
        self.phases: list[pd.DataFrame] = []
        self.lag: list[pd.DataFrame] = []
        self.arrivals: list[pd.DataFrame] = []
        self.collectives: list[pd.DataFrame] = []
        self.collectives_to: int | None = None  # collective instances ending up to here are taken
        self.pairs: list[pd.DataFrame] = []
        self.shapes: list[pd.DataFrame] = []
        self.stitcher = StepStitcher(HOLD_STEPS)
        self.durations: list[np.ndarray] = []  # taken steps' durations, for the median
        self.hangs: list[pd.DataFrame] = []  # the slices' hang anomalies (a hang before a restart, or at the end)
        self.states: pd.DataFrame | None = None  # the last slice's job states

    @property
    def last_end(self) -> int | None:
        """End of the last taken step (ns)."""
        return self.stitcher.last_end

    def median_ns(self, fallback: np.ndarray) -> float:
        """The median step over the last 64 slices' taken steps (``fallback``'s before any)."""
        return median_step_ns(np.concatenate(self.durations[-64:]) if self.durations else None, fallback)

    def take(self, an: Analysis, settle_ns: int | None) -> int | None:
        """Keep ``an``'s settled new steps and what belongs to them; return the last taken step's end."""
        if an.anomalies is not None and len(an.anomalies):
            self.hangs.append(an.anomalies[an.anomalies["kind"] == "hang"])
        self.states = an.job_states
        if an.pairs is not None and len(an.pairs):
            self.pairs.append(an.pairs)
        if an.shapes is not None and len(an.shapes):
            self.shapes.append(an.shapes)
        if an.arrivals is not None and len(an.arrivals):
            taken = self.arrivals[-1]["start_ns"].max() if self.arrivals else None
            new = an.arrivals if taken is None else an.arrivals[an.arrivals["start_ns"] > taken]
            if len(new):
                self.arrivals.append(new)
        if an.collectives is not None:
            taken, self.collectives_to = settled(an.collectives, self.collectives_to, settle_ns)
            if len(taken):
                self.collectives.append(taken)
        steps = an.steps
        if steps is None or steps.empty:
            return self.last_end
        steps = steps.sort_values("start_ns", kind="stable")
        start, end = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
        keep, numbers = self.stitcher.take(start, end, self.median_ns(end - start), settle_ns)
        if not keep.any():
            return self.last_end
        taken = steps[keep].copy()
        renumber = dict(zip(taken["step"].tolist(), numbers.tolist()))  # the slice's step numbers -> the stitched ones
        taken["step"] = numbers
        self.steps.append(taken)
        self.durations.append(end[keep] - start[keep])
        for frame, out in ((an.phases, self.phases), (an.group_lag, self.lag)):
            if frame is not None and len(frame) and "step" in frame:
                rows = frame[frame["step"].isin(renumber)].copy()
                rows["step"] = rows["step"].map(renumber).astype(np.int64)
                out.append(rows)
        return self.last_end

    def result(self, s: Settings, stop_after: str) -> Analysis:
        out = Analysis(pairs=_vote_pairs(self.pairs))
        out.shapes = _common_shape(self.shapes)
        if stop_after == "pairs":
            return out
        out.steps = pd.concat(self.steps, ignore_index=True)[STEP_COLUMNS] if self.steps else pd.DataFrame(columns=STEP_COLUMNS)
        out.phases = pd.concat(self.phases, ignore_index=True) if self.phases else pd.DataFrame(columns=PHASE_COLUMNS)
        out.collectives = concat_instances(self.collectives)
        if stop_after == "steps":
            return out
        out.group_lag = pd.concat(self.lag, ignore_index=True) if self.lag else pd.DataFrame()
        out.arrivals = pd.concat(self.arrivals, ignore_index=True) if self.arrivals else None
        lag = s.cross_group.diagnose(out.group_lag, out.steps).predict()
        arrival = not_named_by(s.arrival.diagnose(out.arrivals, out.steps).predict(), lag)
        # a hang seen by two overlapping slices is one
        hangs = pd.concat(self.hangs, ignore_index=True).drop_duplicates(["job_id", "start_ns"]) if self.hangs else None
        if hangs is not None and len(hangs):  # the step it hung in, in the stitched numbers
            hangs = hangs.assign(step=[int(((out.steps["job_id"] == j) & (out.steps["end_ns"] <= t)).sum()) for j, t in zip(hangs["job_id"], hangs["start_ns"])])
        out.anomalies = in_time_order([s.cross_step.fit(out.steps).predict(), lag, arrival] + ([hangs] if hangs is not None else []))
        out.job_states = self.states
        return out


def _vote_pairs(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per pair from the slices' typings: the type with the most confidence summed over the slices."""
    if not frames:
        return pd.DataFrame(columns=["job_id", "src", "dst", "type", "confidence", "evidence"])
    allp = pd.concat(frames, ignore_index=True)
    if len(frames) == 1:
        return allp
    key = ["job_id", "src", "dst"]
    seen = allp.groupby(key, sort=False).size().rename("slices")
    by_type = allp.groupby(key + ["type"], sort=False)["confidence"].agg(["sum", "size"]).reset_index()
    best = by_type.sort_values(["sum", "type"], ascending=[False, True], kind="stable").drop_duplicates(key)
    best = best.merge(seen, left_on=key, right_index=True)
    # the evidence of the surest slice that gave the winning type
    ev = (allp.merge(best[key + ["type"]], on=key + ["type"]).sort_values("confidence", ascending=False, kind="stable")
          .drop_duplicates(key)[key + ["evidence"]])
    best = best.merge(ev, on=key)
    split = best["size"] < best["slices"]
    best["confidence"] = (best["sum"] / best["slices"]).round(4)
    best.loc[split, "evidence"] = (best.loc[split, "evidence"] + "; typed " + best.loc[split, "type"] + " in "
                                   + best.loc[split, "size"].astype(str) + " of " + best.loc[split, "slices"].astype(str) + " slices")
    return best[["job_id", "src", "dst", "type", "confidence", "evidence"]].sort_values(key).reset_index(drop=True)


def _common_shape(frames: list[pd.DataFrame]) -> pd.DataFrame | None:
    if not frames:
        return None
    allf = pd.concat(frames, ignore_index=True)
    cols = [c for c in allf.columns if c != "job_id"]
    counted = allf.groupby(["job_id", *cols], sort=False).size().rename("n").reset_index()
    return (counted.sort_values("n", ascending=False, kind="stable").drop_duplicates("job_id")
            .drop(columns="n").sort_values("job_id").reset_index(drop=True))


def analyse_sliced(chunks: Iterable[list[np.ndarray]], labels: np.ndarray, jobs: pd.DataFrame, topology: Topology, capture_end: int,
                   settings: Settings | None = None, stop_after: str = "diagnosis",
                   on_stage: Callable[[str], object] | None = None) -> Analysis:
    """:func:`prism.analysis.analyse.analyse` of one job, ``settings.slice_flows`` flows at a time (see the module docstring).

    Parameters
    ----------
    chunks : iterable of column lists
        The job's flows as ``[a, b, start, duration, size]`` arrays, a
        chunk at a time, roughly in time order.
    labels, jobs, topology, capture_end, settings, stop_after, on_stage
        As for :func:`prism.analysis.analyse.analyse` (``jobs``: the job's rows);
        the job's own anomalies only, as for one batch of
        :func:`prism.analysis.batches.analyse_job_batches` (the switches are
        diagnosed once over all flows, when the batches are combined).

    Notes
    -----
    Every flow is analysed once, plus the overlap (:data:`OVERLAP_STEPS`
    steps, at most half a slice); memory is one slice's analysis.
    """
    s = settings or Settings()
    limit = max(2, int(s.slice_flows))  # a slice moves on by half: two flows at least
    stitch = _Stitch()
    buf: list[list[np.ndarray]] = []
    held = 0
    slices = 0
    warned = False
    analysed_before: int | None = None  # flows starting before this were in a slice already analysed
    late = 0

    def warn_stepless(n: int) -> None:
        nonlocal warned
        if not warned and stop_after not in ("pairs",):
            warned = True
            log.warning("a slice of %d flows of job %s gave no new step: are its steps longer than a slice? (raise --slice-flows)",
                        n, ", ".join(sorted(set(jobs["job_id"]))))

    def warn_few_steps(n: int, k: int) -> None:
        nonlocal warned
        if not warned:
            warned = True
            log.warning("a slice of %d flows of job %s holds %d steps: step boundaries are surest with %d or more (raise --slice-flows)",
                        n, ", ".join(sorted(set(jobs["job_id"]))), k, MIN_SLICE_STEPS)

    def run(final: bool) -> None:
        nonlocal buf, held, slices, analysed_before
        every = [np.concatenate([c[i] for c in buf]) for i in range(5)] if len(buf) > 1 else buf[0]
        order = np.argsort(every[2], kind="stable")
        every = [c[order] for c in every]
        del order
        cols = every if final else [c[:limit] for c in every]  # the slice: the earliest flows held
        last = int(cols[2][-1])
        an = analyse(cols[0], cols[1], cols[2], cols[3], cols[4], labels, jobs, topology, capture_end if final else last, None, s,
                     stop_after, on_stage)
        slices += 1
        before = stitch.last_end
        taken_to = stitch.take(an, None if final else last)
        log.debug("slice %d: %d flows, %d..%d, %d steps, taken to %s (before %s)", slices, len(cols[2]), cols[2][0], last,
                  0 if an.steps is None else len(an.steps), taken_to, before)
        if final:
            buf, held = [], 0
            return
        # the next slice: from OVERLAP_STEPS median steps before the last taken step's end, at most half this one
        median = stitch.median_ns(np.zeros(0))
        begin = (taken_to - int(OVERLAP_STEPS * median)) if taken_to is not None and median > 0 else None
        n = len(cols[2])
        i = n // 2 if begin is None else int(np.searchsorted(cols[2], begin, side="left"))
        i = max(i, n - limit // 2)  # the slice moves on by half at least, however long the steps
        if begin is None or taken_to == before:
            warn_stepless(n)
        elif an.steps is not None and len(an.steps) < MIN_SLICE_STEPS:  # steps were taken: an.steps is set
            warn_few_steps(n, len(an.steps))
        buf = [[c[i:].copy() for c in every]]  # the overlap and the flows past the slice (copied: the slice's columns go)
        held = len(every[2]) - i
        analysed_before = int(cols[2][min(i, n - 1)])
        del an, cols, every
        # the slice's temporaries, freed, leave holes in the heap that arrays of
        # other sizes do not fit (the batch allocator settings keep them):
        # without this the peak creeps up by some 12 bytes a flow of the job
        release_free_memory()

    for chunk in chunks:
        chunk = [np.asarray(c) for c in chunk]
        if not len(chunk[0]):
            continue
        if analysed_before is not None:
            late += int((chunk[2] < analysed_before).sum())
        buf.append(chunk)
        held += len(chunk[0])
        while held >= limit:
            run(final=False)
    if held:
        run(final=True)
    if slices > 1:
        log.debug("analysed a job in %d slices of %d flows", slices, limit)
    if late:
        log.warning("%d flows of job %s came after their time slice had been analysed (the input is not in time order): "
                    "they joined a later slice, and steps of that time may be missing", late, ", ".join(sorted(set(jobs["job_id"]))))
    out = stitch.result(s, stop_after)
    out.slices = {job_id: slices for job_id in sorted(set(jobs["job_id"]))}
    return out
