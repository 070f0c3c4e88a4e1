"""Cross-step diagnosis: steps slow against the job's own recent steps.

Each step's duration is compared with the median of the job's previous
``window`` normal steps, in units of their spread (MAD). A step is slow when
it is both ``min_excess`` longer than that baseline (it matters) and ``z``
spreads above it (it is not noise). A run of ``regime_steps`` or more slow
steps in a row is not that many slow steps but one lasting change (a
straggler appeared, a link degraded): it is reported once, as a
``regime_change`` at its first step, and the baseline restarts from it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import ANOMALY_COLUMNS, empty_anomalies

__all__ = ["CrossStepDiagnoser"]


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

    Examples
    --------
    >>> d = [100.0] * 20 + [180.0] + [100.0] * 5 + [130.0] * 10
    >>> steps = pd.DataFrame({"job_id": "j", "step": range(len(d)), "start_ns": range(len(d)), "duration_ns": d})
    >>> CrossStepDiagnoser().fit(steps).predict()[["kind", "step"]].values.tolist()
    [['slow_step', 20], ['regime_change', 26]]
    """

    def __init__(self, window: int = 16, min_excess: float = 0.15, z: float = 6.0, min_rel_spread: float = 0.005, regime_steps: int = 3):
        self.window = int(window)
        self.min_excess = float(min_excess)
        self.z = float(z)
        self.min_rel_spread = float(min_rel_spread)
        self.regime_steps = int(regime_steps)

    def fit(self, steps: pd.DataFrame) -> "CrossStepDiagnoser":
        """``steps``: ``job_id, step, start_ns, duration_ns`` (a timeline's ``steps_``)."""
        rows = []
        self._base: list[tuple] = []
        for job_id, g in steps.sort_values(["job_id", "step"]).groupby("job_id", sort=True):
            rows.extend(self._job(job_id, g["step"].to_numpy(), g["start_ns"].to_numpy(), g["duration_ns"].to_numpy().astype(np.float64)))
        self.anomalies_ = pd.DataFrame(rows, columns=ANOMALY_COLUMNS) if rows else empty_anomalies()
        #: per step: the baseline it was judged against and whether it was slow
        self.baseline_ = pd.DataFrame(self._base, columns=["job_id", "step", "baseline_ns", "slow"])
        return self

    def _job(self, job_id, step, start, dur):
        # a loop over steps (hundreds per job and window), not over flows
        out = []
        base_rows = self._base
        history: list[float] = []
        pending: list[tuple[int, float, float]] = []  # (index, excess, baseline)
        first = float(np.median(dur[: self.window]))

        def flush_single():
            for i, exc, base in pending:
                out.append(("slow_step", job_id, int(step[i]), int(start[i]), f"step {int(step[i])}", round(1 + exc, 4),
                            f"step {int(step[i])} took {dur[i] / 1e6:,.1f} ms, {1 + exc:.2f}x the job's recent median {base / 1e6:,.1f} ms"))

        for i, d in enumerate(dur):
            recent = np.asarray(history[-self.window :]) if history else np.asarray([first])
            base = float(np.median(recent))
            spread = max(1.4826 * float(np.median(np.abs(recent - base))), self.min_rel_spread * base)
            exc = d / base - 1
            slow = exc >= self.min_excess and (d - base) / spread >= self.z
            base_rows.append((job_id, int(step[i]), base, slow))
            if slow:
                pending.append((i, exc, base))
                if len(pending) == self.regime_steps:
                    i0, _, base0 = pending[0]
                    level = float(np.median([dur[j] for j, _, _ in pending]))
                    out.append(("regime_change", job_id, int(step[i0]), int(start[i0]), f"from step {int(step[i0])}", round(level / base0, 4),
                                f"steps slowed from {base0 / 1e6:,.1f} ms to {level / 1e6:,.1f} ms ({level / base0:.2f}x) at step {int(step[i0])} and stayed slow"))
                    history = [dur[j] for j, _, _ in pending]
                    pending = []
                continue
            if pending:
                flush_single()
                pending = []
            history.append(d)
        if pending:
            flush_single()
        return out

    def predict(self) -> pd.DataFrame:
        """Anomaly rows (:data:`prism.diagnosis.ANOMALY_COLUMNS`)."""
        return self.anomalies_
