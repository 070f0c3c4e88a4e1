"""Cross-step diagnosis: steps slow against the job's own recent steps.

Each step's duration is compared with the median of the job's previous
``window`` normal steps, in units of their spread (MAD). A step is slow when
it is both ``min_excess`` longer than that baseline (it matters) and ``z``
spreads above it (it is not noise). A spread needs several steps: until the
job has ``min_baseline`` normal steps behind it, its first ``window`` steps
are the baseline (one or two previous steps have no spread, and the floor
alone would call any step 15% longer than its predecessor slow), and a job
with fewer than ``min_baseline`` steps in all is not judged. A run of
``regime_steps`` or more slow steps in a row is not that many slow steps
but one lasting change (a straggler appeared, a link degraded): it is
reported once, as a ``regime_change`` at its first step, and the baseline
restarts from it.

Slow steps that recur at a fixed number of steps (a checkpoint, an
evaluation, an epoch's end every N steps) are still reported one by one
(each is a step the job lost), but their explanation says they recur every
N steps: the likely cause is the job's own schedule, not a fault.
"""
from __future__ import annotations

import numba
import numpy as np
import pandas as pd

from prism.analysis.diagnosis.anomalies import ANOMALY_COLUMNS, empty_anomalies

__all__ = ["CrossStepDiagnoser", "recurrence"]


class CrossStepDiagnoser:
    """Find slow steps and lasting slow-downs per job.

    Parameters
    ----------
    window : int, default 16
        Normal steps in the baseline.
    min_excess : float, default 0.15
        A slow step is at least this much longer than the baseline (0.15:
        15%).
    z : float, default 6.0
        ... and this many robust standard deviations (1.4826 MAD) above it.
    min_rel_spread : float, default 0.005
        Floor on the spread, as a share of the baseline (very regular jobs
        would otherwise flag every wobble).
    regime_steps : int, default 3
        This many slow steps in a row are one regime change.
    min_baseline : int, default 5
        Steps a baseline holds at the least (see the module's docstring; at
        most ``window``).

    Examples
    --------
    >>> d = [100.0] * 20 + [180.0] + [100.0] * 5 + [130.0] * 10
    >>> steps = pd.DataFrame({"job_id": "j", "step": range(len(d)), "start_ns": range(len(d)), "duration_ns": d})
    >>> CrossStepDiagnoser().fit(steps).predict()[["kind", "step"]].values.tolist()
    [['slow_step', 20], ['regime_change', 26]]
    """

    def __init__(self, window: int = 16, min_excess: float = 0.15, z: float = 6.0, min_rel_spread: float = 0.005, regime_steps: int = 3,
                 min_baseline: int = 5):
        if int(window) < 1:
            raise ValueError(f"window must be at least one step (got {window})")
        self.window = int(window)
        self.min_excess = float(min_excess)
        self.z = float(z)
        self.min_rel_spread = float(min_rel_spread)
        self.regime_steps = int(regime_steps)
        self.min_baseline = max(1, min(int(min_baseline), self.window))  # a baseline holds at most window steps

    def fit(self, steps: pd.DataFrame) -> "CrossStepDiagnoser":
        """``steps``: ``job_id, step, start_ns, duration_ns`` (a timeline's ``steps_``)."""
        rows = []
        base_parts = []
        for job_id, g in steps.sort_values(["job_id", "step"]).groupby("job_id", sort=True):
            step, start = g["step"].to_numpy(), g["start_ns"].to_numpy()
            dur = g["duration_ns"].to_numpy().astype(np.float64)
            base, slow, event, event_base, level = _scan(dur, self.window, self.min_excess, self.z, self.min_rel_spread, self.regime_steps,
                                                        self.min_baseline)
            every = recurrence(step[event == _SLOW_STEP])
            rows.extend(self._rows(job_id, step, start, dur, event, event_base, level, every))
            base_parts.append(pd.DataFrame({"job_id": job_id, "step": step.astype(np.int64), "baseline_ns": base, "slow": slow}))
        self.anomalies_ = pd.DataFrame(rows, columns=ANOMALY_COLUMNS) if rows else empty_anomalies()
        #: per step: the baseline it was judged against and whether it was slow
        self.baseline_ = (pd.concat(base_parts, ignore_index=True) if base_parts
                          else pd.DataFrame(columns=["job_id", "step", "baseline_ns", "slow"]))
        return self

    @staticmethod
    def _rows(job_id, step, start, dur, event, event_base, level, every: int = 0) -> list[tuple]:
        """Anomaly rows of one job's scan: Python work per anomaly, not per step; ``every``: the slow steps recur every
        this many steps (0: they do not)."""
        out = []
        periodic = f"; slow steps recur every {every} steps: likely a checkpoint or an evaluation" if every else ""
        for i in np.flatnonzero(event):
            base = float(event_base[i])
            if event[i] == _SLOW_STEP:
                exc = dur[i] / base - 1
                out.append(("slow_step", job_id, int(step[i]), int(start[i]), f"step {int(step[i])}", round(1 + exc, 4),
                            f"step {int(step[i])} took {dur[i] / 1e6:,.1f} ms, {1 + exc:.2f}x the job's recent median {base / 1e6:,.1f} ms"
                            + periodic))
            else:
                lv = float(level[i])
                out.append(("regime_change", job_id, int(step[i]), int(start[i]), f"from step {int(step[i])}", round(lv / base, 4),
                            f"steps slowed from {base / 1e6:,.1f} ms to {lv / 1e6:,.1f} ms ({lv / base:.2f}x) at step {int(step[i])} and stayed slow"))
        return out

    def predict(self) -> pd.DataFrame:
        """Anomaly rows (:data:`prism.analysis.diagnosis.ANOMALY_COLUMNS`)."""
        return self.anomalies_


_SLOW_STEP, _REGIME_CHANGE = 1, 2


def recurrence(slow: np.ndarray, min_count: int = 3, tol: float = 0.05) -> int:
    """The number of steps between slow steps that recur at a fixed interval, else 0.

    ``slow``: the slow steps' numbers, in order. At least ``min_count`` of
    them (two intervals: one could be chance), and every interval within
    one step or ``tol`` of their median (a step boundary lost or gained
    shifts the count by one); an interval of one step is a run, not a
    recurrence.

    >>> recurrence(np.array([499, 999, 1499, 1999])), recurrence(np.array([3, 40, 41])), recurrence(np.array([5, 10]))
    (500, 0, 0)
    """
    slow = np.asarray(slow)
    if len(slow) < min_count:
        return 0
    gaps = np.diff(slow)
    n = float(np.median(gaps))
    if n < 2 or np.abs(gaps - n).max() > max(1.0, tol * n):
        return 0
    return int(round(n))


@numba.njit(cache=True, nogil=True)
def _scan(dur, window, min_excess, z, min_rel_spread, regime_steps, min_baseline):  # pragma: no cover - compiled
    """One job's steps in order against the median of its previous ``window`` normal steps.

    Returns per step: the baseline, whether it was slow, its event
    (0, ``_SLOW_STEP``, or ``_REGIME_CHANGE`` at the first step of a run of
    ``regime_steps`` slow steps), the baseline the event was judged
    against, and a regime's level (median of its run). A regime restarts
    the history from its run; before the first, the first ``window`` steps
    are the baseline until ``min_baseline`` normal steps are behind (and
    nothing is judged if the job has fewer). A loop per step (hundreds per
    job and window), compiled: two medians of at most ``window`` values a
    step.
    """
    n = len(dur)
    base = np.empty(n)
    slow = np.zeros(n, dtype=np.bool_)
    event = np.zeros(n, dtype=np.int8)
    event_base = np.zeros(n)
    level = np.zeros(n)
    if n == 0:
        return base, slow, event, event_base, level
    history = np.empty(n)
    h = 0  # history length; the baseline is its last ``window`` values
    pending = np.empty(n, dtype=np.int64)  # a run of slow steps not yet reported
    pending_base = np.empty(n)
    p = 0
    first = dur[:window]
    regimes = False  # a regime change restarted the history from its run
    for i in range(n):
        recent = history[max(0, h - window):h] if h >= min_baseline or regimes else first
        b = np.median(recent)
        spread = max(1.4826 * np.median(np.abs(recent - b)), min_rel_spread * b)
        d = dur[i]
        exc = d / b - 1
        # a regime's run is its baseline from its first steps on (it holds regime_steps of them), as before the rule
        s = (len(recent) >= min_baseline or regimes) and exc >= min_excess and (d - b) / spread >= z
        base[i] = b
        slow[i] = s
        if s:
            pending[p] = i
            pending_base[p] = b
            p += 1
            if p == regime_steps:
                i0 = pending[0]
                event[i0] = _REGIME_CHANGE
                event_base[i0] = pending_base[0]
                level[i0] = np.median(dur[pending[:p]])
                for k in range(p):
                    history[k] = dur[pending[k]]
                h = p
                p = 0
                regimes = True
            continue
        for k in range(p):  # a run shorter than a regime: each step slow on its own
            event[pending[k]] = _SLOW_STEP
            event_base[pending[k]] = pending_base[k]
        p = 0
        history[h] = d
        h += 1
    for k in range(p):
        event[pending[k]] = _SLOW_STEP
        event_base[pending[k]] = pending_base[k]
    return base, slow, event, event_base, level
