"""Step timelines: each job's training steps, reconstructed from its flows.

A synchronous training step ends with the data-parallel (DP) collective:
the optimizer cannot run before the gradients are reduced, and the next
step's traffic cannot start before the optimizer is done. So, per job, the
DP traffic comes in bursts separated by the compute of the next step, and
the end of each burst is a step boundary (LLMPrism section 4.3).

The bursts are found without a time constant: the gaps between the job's
DP flows (after merging overlapping flows) fall in two groups orders of
magnitude apart, inside a collective (microseconds to a few ms, between
the staggered collectives of pipeline stages) and between steps (the
forward and backward compute, tens of ms to seconds). :func:`natural_break`
finds the split as the widest jump in the sorted log-gaps. A job with no
DP pairs (pipeline only) is cut the same way over its PP traffic, whose
widest gap is the pipeline flush: the last backward, the optimizer and the
first forward.

Steps cut by the capture's edges are not whole and are not reported: a
step needs a boundary on both sides, and the last boundary is trusted only
if the capture went on for a full break after it (otherwise the burst may
have been cut short).

Per whole step the timeline keeps its phases: the span of its PP traffic,
of its DP collective, and the same per DP group (ring) and per pipeline.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

__all__ = ["StepTimeline", "natural_break", "busy_gaps", "parallel_groups", "STEP_COLUMNS", "PHASE_COLUMNS"]

STEP_COLUMNS = [
    "job_id", "step", "start_ns", "end_ns", "duration_ns",
    "pp_start_ns", "pp_end_ns", "dp_start_ns", "dp_end_ns", "flows", "bytes",
]
PHASE_COLUMNS = ["job_id", "step", "group", "kind", "start_ns", "end_ns", "flows", "bytes", "servers"]


def busy_gaps(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Idle gaps between time-sorted flows, overlapping flows merged.

    Parameters
    ----------
    start, end : int arrays
        Flows sorted by ``start``.

    Returns
    -------
    gap : int array, length ``n - 1``
        ``start[i + 1]`` minus the latest end among flows ``0..i``; zero or
        negative where flow ``i + 1`` starts while the link is still busy.
    busy_end : int array, length ``n``
        Running maximum of ``end``.

    Notes
    -----
    O(n): one running maximum.

    Examples
    --------
    >>> busy_gaps(np.array([0, 5, 20]), np.array([10, 8, 30]))[0].tolist()
    [-5, 10]
    """
    busy_end = np.maximum.accumulate(end)
    return start[1:] - busy_end[:-1], busy_end


def natural_break(gap: np.ndarray, busy_end: np.ndarray, min_jump: float = 1.2, min_steps: int = 3, floor_ns: int = 1, tie: float = 0.02) -> float:
    """The gap threshold that cuts a job's traffic into the most regular steps.

    Parameters
    ----------
    gap, busy_end : arrays
        From :func:`busy_gaps`.
    min_jump : float
        Candidate thresholds sit where the sorted gaps jump by at least this
        ratio (between two groups of gaps, never inside one).
    min_steps : int
        A candidate must yield at least this many steps.
    floor_ns : int
        Gaps below this (overlaps, rounding) count as this.
    tie : float
        Scores within this of the best are a tie, won by the coarsest cut.

    Returns
    -------
    float
        The threshold (geometric mean of the gaps on either side of the
        chosen jump); ``inf`` when no candidate yields ``min_steps`` steps.

    Notes
    -----
    The largest jump is not the answer: inside a step the collectives of
    successive pipeline stages are themselves separated by gaps (a backward
    pass apart), and a pipeline-only job's flush is not much longer than its
    cooldown gaps. What tells the step gaps apart is that they repeat with
    the step period: of all candidate thresholds, the one whose steps have
    the smallest robust spread (MAD / median of durations) wins. Too low a
    threshold mixes stage gaps in (short and long steps alternate), too high
    merges steps (durations jump by multiples). A single slow step or a
    level shift moves the median and MAD of durations little.

    O(n log n + c n) for ``n`` gaps and ``c`` candidate jumps (few).

    Examples
    --------
    Bursts every 100 (gaps 60) with a 30 gap inside each burst:

    >>> ends = np.arange(0, 1000, 100)
    >>> s = np.sort(np.concatenate([ends, ends + 10, ends + 40]))
    >>> e = s + 1
    >>> gap, busy_end = busy_gaps(s, e)
    >>> round(natural_break(gap, busy_end))
    41
    """
    g = np.maximum(np.asarray(gap, dtype=np.float64), floor_ns)
    if len(g) < min_steps:
        return np.inf
    u = np.unique(g)
    counts_above = len(g) - np.searchsorted(np.sort(g), u, side="right")  # gaps above each value
    jumps = np.flatnonzero((u[1:] / u[:-1] >= min_jump) & (counts_above[:-1] >= min_steps + 1))
    scored = []
    for i in jumps:
        tau = float(np.sqrt(u[i] * u[i + 1]))
        dur = np.diff(busy_end[:-1][g >= tau])
        if len(dur) < min_steps:
            continue
        med = np.median(dur)
        spread = np.median(np.abs(dur - med)) / med
        merged = dur[dur >= 1.9 * med].sum() / dur.sum()  # time in what look like merged steps
        scored.append((spread + merged, tau))
    if not scored:
        return np.inf
    best = min(s for s, _ in scored)
    # near-ties go to the coarsest cut: a pipeline's microbatches are as
    # regular as its steps
    best_tau = max(t for s, t in scored if s <= best + tie)
    return best_tau


def parallel_groups(a: np.ndarray, b: np.ndarray, n_nodes: int) -> np.ndarray:
    """Connected component of every node in the graph of pairs ``(a, b)``.

    Nodes in no pair get their own component. O(nodes + pairs).

    >>> parallel_groups(np.array([0, 2]), np.array([1, 3]), 5).tolist()
    [0, 0, 1, 1, 2]
    """
    g = coo_matrix((np.ones(len(a)), (a, b)), shape=(n_nodes, n_nodes))
    return connected_components(g, directed=False)[1]


class StepTimeline:
    """Reconstruct every job's whole training steps and their phases.

    Parameters
    ----------
    min_jump : float, default 1.2
        Step gaps must be at least this many times the largest gap inside a
        step (see :func:`natural_break`).
    min_steps : int, default 3
        Jobs with fewer whole steps report none (there is no period to
        find in fewer).

    Attributes
    ----------
    steps_ : pandas.DataFrame
        After ``fit``: :data:`STEP_COLUMNS`, one row per whole step, with
        the integer job label in ``job`` as well.
    flow_step_ : int array
        Per flow (in the order given to ``fit``), the index of its step in
        ``steps_``, or -1 outside whole steps.
    breaks_ : dict
        Per job label, the gap threshold (ns) used, ``inf`` if none.
    """

    def __init__(self, min_jump: float = 1.2, min_steps: int = 3):
        self.min_jump = float(min_jump)
        self.min_steps = int(min_steps)

    def fit(self, job, start, end, is_dp, size=None, capture_end=None, job_names=None) -> "StepTimeline":
        """Find the steps.

        Parameters
        ----------
        job : int array
            Job label per flow (-1: not in a job).
        start, end : int arrays
            Flow start and end (ns).
        is_dp : bool array
            The flow is on a DP pair.
        size : int array, optional
            Flow bytes (for the per-step byte count).
        capture_end : int, optional
            Start of the last record of the whole capture (any traffic); the
            last burst of a job is whole only if the capture ran a full
            break past it. Default: the last flow start given.
        job_names : sequence, optional
            ``job_names[label]`` is the job id written out (default: label).
        """
        job = np.asarray(job)
        start = np.asarray(start, dtype=np.int64)
        end = np.asarray(end, dtype=np.int64)
        is_dp = np.asarray(is_dp, dtype=bool)
        size = np.zeros(len(start), dtype=np.int64) if size is None else np.asarray(size, dtype=np.int64)
        if capture_end is None:
            capture_end = int(start.max()) if len(start) else 0
        order = np.lexsort((start, job))
        js = job[order]
        bounds = np.flatnonzero(np.diff(js)) + 1
        firsts = np.concatenate([[0], bounds])
        lasts = np.concatenate([bounds, [len(js)]])
        flow_step = np.full(len(start), -1, dtype=np.int64)
        frames, self.breaks_ = [], {}
        n_steps = 0
        for f0, f1 in zip(firsts, lasts):
            label = int(js[f0]) if f1 > f0 else -1
            if label < 0:
                continue
            idx = order[f0:f1]
            ends = self._boundaries(label, start[idx], end[idx], is_dp[idx], capture_end)
            if len(ends) < 2:
                continue
            # flow -> step: e[k] <= start < e[k+1] is step k (the flows after
            # the last boundary and before the first are outside whole steps)
            k = np.searchsorted(ends, start[idx], side="right") - 1
            inside = (k >= 0) & (k < len(ends) - 1)
            flow_step[idx[inside]] = n_steps + k[inside]
            name = job_names[label] if job_names is not None else label
            frames.append(self._step_table(label, name, ends, k[inside], start[idx][inside], end[idx][inside], is_dp[idx][inside], size[idx][inside]))
            n_steps += len(ends) - 1
        cols = ["job"] + STEP_COLUMNS
        self.steps_ = pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame({c: pd.Series(dtype=np.int64) for c in cols})
        self.flow_step_ = flow_step
        return self

    def _boundaries(self, label, start, end, dp, capture_end) -> np.ndarray:
        """Step boundaries (ends of whole collective bursts), sorted."""
        marker = dp if dp.any() else np.ones(len(dp), dtype=bool)  # PP-only: the flush
        s, e = start[marker], end[marker]
        if len(s) < 3:
            self.breaks_[label] = np.inf
            return np.zeros(0, dtype=np.int64)
        gap, busy_end = busy_gaps(s, e)
        tau = natural_break(gap, busy_end, self.min_jump, self.min_steps)
        self.breaks_[label] = tau
        if not np.isfinite(tau):
            return np.zeros(0, dtype=np.int64)
        cut = np.flatnonzero(gap >= tau)  # a burst ends at flow `cut`
        ends = busy_end[cut]
        # The last burst is whole if the capture ran a full break past it,
        # or if the job's next step began (its PP traffic waits for the
        # optimizer, which waits for the collective). Otherwise the capture
        # may have cut the burst short.
        last = busy_end[-1]
        if capture_end - last >= tau or (start[~marker] > last).any():
            ends = np.append(ends, last)
        return ends.astype(np.int64)

    @staticmethod
    def _step_table(label, name, ends, k, start, end, dp, size) -> pd.DataFrame:
        n = len(ends) - 1
        out = pd.DataFrame({"job": label, "job_id": name, "step": np.arange(n), "start_ns": ends[:-1], "end_ns": ends[1:]})
        out["duration_ns"] = out["end_ns"] - out["start_ns"]
        for kind, m in (("pp", ~dp), ("dp", dp)):
            lo = np.full(n, np.iinfo(np.int64).max)
            hi = np.full(n, np.iinfo(np.int64).min)
            np.minimum.at(lo, k[m], start[m])
            np.maximum.at(hi, k[m], end[m])
            has = np.bincount(k[m], minlength=n) > 0
            out[f"{kind}_start_ns"] = pd.array(np.where(has, lo, 0), dtype="Int64")
            out[f"{kind}_end_ns"] = pd.array(np.where(has, hi, 0), dtype="Int64")
            out.loc[~has, [f"{kind}_start_ns", f"{kind}_end_ns"]] = pd.NA
        out["flows"] = np.bincount(k, minlength=n)
        out["bytes"] = np.bincount(k, weights=size, minlength=n).astype(np.int64)
        return out
