"""Diagnosers: one module each, DataFrames in, anomaly rows out.

Every diagnoser's ``predict()`` returns rows with :data:`ANOMALY_COLUMNS`:
``kind`` (what was found), ``job_id`` (empty for fabric anomalies), ``step``
(-1 if not tied to a step), ``start_ns`` (when it began), ``subject`` (what
is slow: a step, servers joined by ``|``, a host, a switch or link; the
kinds are :data:`ANOMALY_KINDS`), ``score``
(how far from normal; its meaning is in the explanation) and a one-line
``explanation`` for people.
"""
from __future__ import annotations

from prism.analysis.diagnosis.anomalies import ANOMALY_COLUMNS, ANOMALY_KINDS, empty_anomalies, in_time_order, not_named_by
from prism.analysis.diagnosis.arrival import ARRIVAL_COLUMNS, ArrivalDiagnoser
from prism.analysis.diagnosis.cross_group import StageLagDiagnoser
from prism.analysis.diagnosis.cross_step import CrossStepDiagnoser
from prism.analysis.diagnosis.hang import JOB_STATES, HangDiagnoser
from prism.analysis.diagnosis.switches import SwitchBandwidth, SwitchDiagnoser

__all__ = ["ANOMALY_COLUMNS", "ANOMALY_KINDS", "ARRIVAL_COLUMNS", "ArrivalDiagnoser", "empty_anomalies", "in_time_order", "not_named_by", "CrossStepDiagnoser", "HangDiagnoser", "JOB_STATES", "StageLagDiagnoser", "SwitchBandwidth", "SwitchDiagnoser"]
