"""Diagnosers: one module each, DataFrames in, anomaly rows out.

Every diagnoser's ``predict()`` returns rows with :data:`ANOMALY_COLUMNS`:
``kind`` (what was found), ``job_id`` (empty for fabric anomalies), ``step``
(-1 if not tied to a step), ``start_ns`` (when it began), ``subject`` (what
is slow: a step, servers joined by ``|``, a switch or link), ``score``
(how far from normal; its meaning is in the explanation) and a one-line
``explanation`` for people.
"""
from __future__ import annotations

import pandas as pd

ANOMALY_COLUMNS = ["kind", "job_id", "step", "start_ns", "subject", "score", "explanation"]


def empty_anomalies() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64" if c in ("step", "start_ns") else "float64" if c == "score" else "object") for c in ANOMALY_COLUMNS})


from .cross_group import StageLagDiagnoser  # noqa: E402
from .cross_step import CrossStepDiagnoser  # noqa: E402
from .switches import SwitchBandwidth, SwitchDiagnoser  # noqa: E402

__all__ = ["ANOMALY_COLUMNS", "empty_anomalies", "CrossStepDiagnoser", "StageLagDiagnoser", "SwitchBandwidth", "SwitchDiagnoser"]
