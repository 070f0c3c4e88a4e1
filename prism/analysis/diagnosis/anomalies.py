"""The anomaly table every diagnoser returns, and the one order anomalies are reported in.

Its own module so that the diagnosers and the package's front door import it
without a cycle.
"""
from __future__ import annotations

import pandas as pd

__all__ = ["ANOMALY_COLUMNS", "ANOMALY_KINDS", "empty_anomalies", "in_time_order", "not_named_by"]

ANOMALY_COLUMNS = ["kind", "job_id", "step", "start_ns", "subject", "score", "explanation"]

#: Every kind an anomaly row can have, jobs' first, then the fabric's: ``slow_host`` (a server whose
#: flows are slow on every switch and link it uses) is judged before ``slow_switch`` and ``slow_link``,
#: whose evidence leaves its flows out; ``hang`` (a job stuck in a collective some members never joined).
ANOMALY_KINDS = ("slow_step", "regime_change", "slow_group", "hang", "slow_host", "slow_switch", "slow_link")


def empty_anomalies() -> pd.DataFrame:
    """An anomaly table with no rows and the columns' types."""
    return pd.DataFrame({c: pd.Series(dtype="int64" if c in ("step", "start_ns") else "float64" if c == "score" else "object") for c in ANOMALY_COLUMNS})


def in_time_order(found: list[pd.DataFrame]) -> pd.DataFrame:
    """Anomaly frames as one, by time, kind, subject and job: an order that does not depend on which came first."""
    found = [f for f in found if len(f)]
    if not found:
        return empty_anomalies()
    return pd.concat(found, ignore_index=True).sort_values(["start_ns", "kind", "subject", "job_id"], kind="stable").reset_index(drop=True)


def not_named_by(found: pd.DataFrame, named: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``found`` whose (job, subject) no ``slow_group`` row of ``named`` already reports: one anomaly a straggler."""
    if found.empty or named.empty:
        return found
    seen = set(zip(named.loc[named["kind"] == "slow_group", "job_id"], named.loc[named["kind"] == "slow_group", "subject"]))
    return found[[(j, s) not in seen for j, s in zip(found["job_id"], found["subject"])]].reset_index(drop=True)
