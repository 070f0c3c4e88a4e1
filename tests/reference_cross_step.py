"""The cross-step diagnosis as it was written first: a Python loop per step with numpy medians.

Kept as the reference the compiled :class:`prism.analysis.diagnosis.CrossStepDiagnoser`
is tested against (tests/test_diagnosis.py): same anomalies, same baselines.
"""
import numpy as np
import pandas as pd

from prism.analysis.diagnosis import ANOMALY_COLUMNS, CrossStepDiagnoser, empty_anomalies
from prism.analysis.diagnosis.cross_step import recurrence


class ReferenceCrossStepDiagnoser(CrossStepDiagnoser):
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
        first = dur[: self.window]
        regimes = False  # a regime change restarted the history from its run

        def flush_single():
            for i, exc, base in pending:
                out.append(("slow_step", job_id, int(step[i]), int(start[i]), f"step {int(step[i])}", round(1 + exc, 4),
                            f"step {int(step[i])} took {dur[i] / 1e6:,.1f} ms, {1 + exc:.2f}x the job's recent median {base / 1e6:,.1f} ms"))

        for i, d in enumerate(dur):
            # until min_baseline normal steps are behind (before any regime change), the first steps are the baseline
            recent = np.asarray(history[-self.window :]) if len(history) >= self.min_baseline or regimes else first
            base = float(np.median(recent))
            spread = max(1.4826 * float(np.median(np.abs(recent - base))), self.min_rel_spread * base)
            exc = d / base - 1
            slow = (len(recent) >= self.min_baseline or regimes) and exc >= self.min_excess and (d - base) / spread >= self.z
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
                    regimes = True
                continue
            if pending:
                flush_single()
                pending = []
            history.append(d)
        if pending:
            flush_single()
        every = recurrence(np.array([r[2] for r in out if r[0] == "slow_step"]))
        if every:  # slow steps at a fixed interval: their explanations say so
            tail = f"; slow steps recur every {every} steps: likely a checkpoint or an evaluation"
            out = [r[:6] + (r[6] + tail,) if r[0] == "slow_step" else r for r in out]
        return out
