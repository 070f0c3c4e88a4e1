"""Hangs, ends and restarts: what a job's silences say.

A job whose collective never completes (one member never joins, the rest
wait inside it) goes silent exactly like a job that ended. What tells them
apart is the last collective before the silence: a job that ended (or
paused for a checkpoint) finished it, every member sent its part; a hung
job's last burst of collective traffic lacks some members, who sent
their last collective traffic a whole step earlier.

Per job, a **silence** is a pause in all its traffic of at least
``max(min_silence_s, silence_steps x its median step)``; at the end of the
traffic, inside a collective that lacks members, one of
``max(min_silence_s, hang_steps x its median step)`` (a hang is reported
within seconds of the floor for steps of a few seconds, a step for long
ones). Before each one
(and at the capture's or window's end) the job's last collective burst
(its collective flows within ``burst_steps`` median steps of its last) is
checked against the members that sent collective traffic since the
previous silence. The job is

* **hung** at a silence where some members never joined that burst
  (``hang`` anomaly, naming their servers; the step it never finished is
  not a whole step, and the timeline's step ending at the burst is
  dropped: :attr:`HangDiagnoser.drop_`);
* **stopped mid-step** where, after a complete burst, the next step's
  pipeline traffic began and stopped (a crash before the collective);
* **paused** (or **ended**, at the end) where the burst was complete and
  only control traffic followed: a checkpoint, or the end of training.

A silence after a hang or a mid-step stop that traffic follows, or one
after which a new member sends collective traffic (a server replaced: a
job whose steps send nothing but the collective stops mid-step without a
trace), is a **restart**: :attr:`HangDiagnoser.runs_` labels the flows of each run
between such silences, so that the timeline cuts each run's steps on its
own (the outage is not a step; the broken step and the first step after
the restart are not whole). A pause is not a run boundary: the step across
it is a slow step (a checkpoint), as before.

The burst check runs on every job's tail, silent or not: a job whose last
burst lacks members has a collective still in progress, and a step the
timeline ends there is not whole yet.

Per-flow work is compiled: one pass over the flows for every job's
silences, collective traffic and members (two more where a collective is
incomplete or a job silent); the loops left run over jobs and silences.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numba
import numpy as np
import pandas as pd

from prism.analysis.diagnosis.anomalies import ANOMALY_COLUMNS, empty_anomalies
from prism.common.kernels import register_warm_up

__all__ = ["HangDiagnoser", "JOB_STATES"]

#: the states ``prism_job_state`` exports, in its order
JOB_STATES = ("running", "hung", "ended")

_HANG, _MID_STEP, _PAUSE, _SWAPPED, _UNKNOWN = "hang", "mid_step", "pause", "swapped", "unknown"


class HangDiagnoser:
    """Find hung jobs, ended jobs and restarts from the silences in each job's traffic.

    Parameters
    ----------
    min_silence_s : float, default 8.0
        A silence lasts at least this long (seconds of event time). With the
        daemon's 15 s window step and 2 s lateness, a hang is reported within
        about 25 s of stream time.
    silence_steps : float, default 5.0
        ... and at least this many of the job's median steps.
    burst_steps : float, default 0.5
        A job's last collective burst: its collective flows within this many
        median steps of its last one.
    light_share : float, default 0.01
        Flows under this share of the job's median collective flow are
        control traffic (the grad-norm all-reduce), not a step's transfers.
    hang_steps : float, default 1.0
        A job silent at the end inside an incomplete collective (some
        members never joined its last burst) is judged hung after a silence
        of ``max(min_silence_s, hang_steps x its median step)`` rather than
        ``silence_steps``: a healthy collective waits a whole step for none
        of its members, while a straggler's lag is a fraction of a step.

    Attributes (after :meth:`fit`)
    ------------------------------
    silences_ : DataFrame
        ``job, job_id, start_ns, end_ns, tail, stop, hung_at_ns, members,
        gpus``: every silence (``tail``: the one at the end, up to the
        capture's end), how the traffic before it stopped (``hang``,
        ``mid_step``, ``pause``; ``swapped``: a pause after which a new
        member sent; ``unknown``: the job has no steps to judge by), and for a hang when its collective began
        and the servers (``|``-joined) and GPUs that never joined it.
    drop_ : DataFrame
        ``job, after_ns, until_ns``: a job's steps ending in ``(after_ns,
        until_ns]`` end at a collective that never completed: not whole.
    runs_ : int array or None
        Per flow, its run's label (labels past the jobs' for runs after a
        restart); None when no job restarted.
    run_job_ : dict
        Run label -> job label (the runs after restarts).
    states_ : DataFrame
        ``job_id, state, since_ns``: ``running``, ``hung`` or ``ended``
        per job with steps to judge by.
    """

    def __init__(self, min_silence_s: float = 8.0, silence_steps: float = 5.0, burst_steps: float = 0.5, light_share: float = 0.01,
                 hang_steps: float = 1.0):
        self.min_silence_s = float(min_silence_s)
        self.silence_steps = float(silence_steps)
        self.hang_steps = float(hang_steps)
        self.burst_steps = float(burst_steps)
        self.light_share = float(light_share)

    def fit(self, job: np.ndarray, src: np.ndarray, start: np.ndarray, end: np.ndarray, size: np.ndarray, is_dp: np.ndarray,
            collective: np.ndarray | None, steps: pd.DataFrame, capture_end: int, job_names: Mapping[int, Any],
            server_of: np.ndarray) -> "HangDiagnoser":
        """Judge every job's silences.

        Parameters
        ----------
        job : int array
            Job label per flow (-1: none).
        src, start, end, size : arrays
            Source NIC, start, end and bytes per flow.
        is_dp, collective : bool arrays
            The flow is on a DP pair; on a pair with collective timing. A
            job's collective traffic is its DP flows, else its collective
            flows, else all its flows (as the timeline cuts it).
        steps : DataFrame
            The timeline's ``steps_`` (``job`` label, ``step``, ``start_ns``,
            ``end_ns``, ``duration_ns``): the median step of each job.
        capture_end : int
            The capture's (or window's) end.
        job_names : mapping
            Job label -> job id.
        server_of : array
            Server name per NIC.
        """
        job = np.asarray(job, dtype=np.int64)
        start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
        is_dp = np.asarray(is_dp, dtype=bool)
        collective = is_dp if collective is None else np.asarray(collective, dtype=bool)
        self.runs_: np.ndarray | None = None
        self.run_job_: dict[int, int] = {}
        self._steps = steps
        cols = ["job", "job_id", "start_ns", "end_ns", "tail", "stop", "hung_at_ns", "members", "gpus"]
        self.silences_ = pd.DataFrame(columns=cols)
        self.drop_ = pd.DataFrame({"job": pd.Series(dtype=np.int64), "after_ns": pd.Series(dtype=np.int64), "until_ns": pd.Series(dtype=np.int64)})
        self.states_ = pd.DataFrame(columns=["job_id", "state", "since_ns"])
        n_jobs = int(job.max()) + 1 if len(job) else 0
        if n_jobs == 0:
            return self
        median = np.full(n_jobs, np.nan)
        if steps is not None and len(steps):  # none at all (one job, its outage hiding every step): the silences still split it
            med = steps.groupby("job")["duration_ns"].median()
            in_range = (med.index >= 0) & (med.index < n_jobs)
            median[med.index.to_numpy(np.int64)[in_range]] = med.to_numpy(np.float64)[in_range]
        # a job without steps: its traffic may hold an outage too long for the timeline to find any (one step
        # longer than the rest together); its silences of min_silence_s split it, to cut each run on its own
        floor = self.min_silence_s * 1e9
        thr = np.where(np.isnan(median), floor, np.maximum(floor, self.silence_steps * median))
        ordered = len(start) < 2 or bool(np.all(start[1:] >= start[:-1]))
        order = np.arange(len(start)) if ordered else np.argsort(start, kind="stable")
        n_nic = int(src.max()) + 1 if len(src) else 0
        kind, g_job, g_start, g_end, last_end, last_mark, mark_mean, nic_last, nic_job = _sums(
            order, job, np.asarray(src, np.int64), start, end, np.asarray(size, np.int64), is_dp, collective, thr.astype(np.float64), n_jobs, n_nic)
        seen = last_end > _LO

        # every job's tail: is its last collective burst complete? (one compiled pass over all jobs)
        cut = np.where(np.isfinite(median) & (last_mark > _LO), last_mark - self.burst_steps * np.nan_to_num(median, nan=0.0), -np.inf)
        nics = np.flatnonzero(nic_job >= 0)
        nj = nic_job[nics]
        judged_nic = np.isfinite(median[nj])
        nics, nj = nics[judged_nic], nj[judged_nic]
        # a member that never joined the last burst, but sent since the job's last silence (not a replaced server)
        lost = (nic_last[nics] <= cut[nj]) & (nic_last[nics] > last_mark[nj] - thr[nj])
        # a job silent inside an incomplete collective is judged after hang_steps of its steps (a collective waits
        # that long for no healthy member), one silent after a whole step after silence_steps (a checkpoint's pause)
        incomplete = np.zeros(n_jobs, dtype=bool)
        incomplete[nj[lost]] = True
        wait = np.where(incomplete, np.maximum(floor, self.hang_steps * np.nan_to_num(median, nan=0.0)), thr)
        silent = np.where(seen, capture_end - np.where(seen, last_end, 0), 0)
        tail = seen & np.isfinite(median) & (silent >= wait)
        if lost.any() or tail.any():  # when the last burst began, and what followed it: only where it matters
            first, after = _tails(job, start, end, np.asarray(size, np.int64), is_dp, collective, kind, cut, self.light_share * mark_mean)
        else:
            first, after = np.zeros(n_jobs, np.int64), np.zeros(n_jobs, dtype=bool)
        servers = np.asarray(server_of)
        tail_stop: dict[int, tuple] = {}
        hung = set(np.unique(nj[lost]).tolist())
        for j in np.flatnonzero(np.isfinite(median) & seen):
            if int(j) in hung:
                gone = nics[lost & (nj == j)]
                tail_stop[int(j)] = (int(first[j]), "|".join(sorted(set(servers[gone].tolist()))), len(gone), _HANG)
                self.drop_.loc[len(self.drop_)] = (int(j), int(first[j]), np.iinfo(np.int64).max)
            else:
                tail_stop[int(j)] = (-1, "", 0, _MID_STEP if after[j] else _PAUSE)
        rows: list[tuple] = []
        for t in np.flatnonzero(tail).tolist():
            hung_at, members, gpus, stop = tail_stop[t]
            rows.append((t, job_names.get(t, t), int(last_end[t]), int(capture_end), True, stop, hung_at, members, gpus))
        # the silences inside a job's traffic: how did the traffic before each stop? (a loop over the few jobs with one)
        runs = None
        next_label = n_jobs
        for j in np.unique(g_job).tolist():
            sel = g_job == j
            ends_before = g_start[sel]
            idx = np.flatnonzero(job == j)
            seg = np.searchsorted(ends_before, start[idx], side="left")  # 0: before the first silence
            mark = _marker(kind[j], is_dp[idx], collective[idx])
            senders = src[idx][mark]
            for k, (s0, s1) in enumerate(zip(ends_before, g_end[sel])):
                f = seg == k
                hung_at, members, gpus, stop = _burst(src[idx][f], start[idx][f], end[idx][f], size[idx][f], mark[f], median[j],
                                                      mark_mean[j], self.burst_steps, self.light_share, servers)
                if stop == _PAUSE and len(np.setdiff1d(senders[seg[mark] == k + 1], senders[seg[mark] == k])):
                    stop = _SWAPPED  # a new member after the silence: restarted with another server, not a pause
                rows.append((int(j), job_names.get(int(j), int(j)), int(s0), int(s1), False, stop, hung_at, members, gpus))
                if stop == _HANG:
                    self.drop_.loc[len(self.drop_)] = (int(j), hung_at, int(s0))
                if stop in (_HANG, _MID_STEP, _SWAPPED, _UNKNOWN):  # a restart: the traffic after it is a new run of steps
                    if runs is None:
                        runs = job.copy()
                    runs[idx[seg > k]] = next_label
                    self.run_job_[next_label] = int(j)
                    next_label += 1
        self.runs_ = runs
        if rows:
            self.silences_ = pd.DataFrame(rows, columns=cols)
        # states: a job silent at the end is hung (its last collective incomplete) or ended
        judged = np.flatnonzero(np.isfinite(median) & seen)
        is_hung = np.array([tail_stop[int(j)][3] == _HANG for j in judged], dtype=bool)
        state = np.where(tail[judged], np.where(is_hung, "hung", "ended"), "running")
        since = np.where(tail[judged], last_end[judged], 0)
        self.states_ = pd.DataFrame({"job_id": [job_names.get(int(j), int(j)) for j in judged], "state": state, "since_ns": since})
        return self

    def predict(self) -> pd.DataFrame:
        """``hang`` anomaly rows (:data:`prism.analysis.diagnosis.ANOMALY_COLUMNS`): one per silence after an incomplete collective."""
        hangs = self.silences_[self.silences_["stop"] == _HANG] if len(self.silences_) else self.silences_
        if not len(hangs):
            return empty_anomalies()
        rows = []
        for r in hangs.itertuples(index=False):
            steps = self._steps[(self._steps["job"] == r.job) & (self._steps["end_ns"] <= r.hung_at_ns)]
            step = int(steps["step"].max()) + 1 if len(steps) else -1
            silent = (r.end_ns - r.start_ns) / 1e9
            med = float(self._steps.loc[self._steps["job"] == r.job, "duration_ns"].median())
            after = "and is still silent" if r.tail else "then restarted"
            rows.append(("hang", r.job_id, step, int(r.hung_at_ns), r.members, round(silent / (med / 1e9), 1),
                         f"hung in the collective of step {step}: {r.gpus} GPUs on {r.members.replace('|', ', ')} never joined it; "
                         f"the job went silent for {silent:,.1f} s ({silent / (med / 1e9):,.0f} steps) {after}"))
        return pd.DataFrame(rows, columns=ANOMALY_COLUMNS)


_LO = np.iinfo(np.int64).min
#: which of a job's flows are its collective traffic: its DP flows, its collective flows, or all of them
_BY_DP, _BY_COLLECTIVE, _ALL = 0, 1, 2


@register_warm_up
def warm_up() -> None:
    """Load the kernels: the sums every window takes, and the last burst's, which only an incomplete collective or a silent job reaches."""
    i = np.arange(3, dtype=np.int64)
    yes = np.ones(3, dtype=bool)
    _sums(i, i % 1, i, i, i + 1, i, yes, yes, np.ones(1), 1, 3)
    _tails(i % 1, i, i + 1, i, yes, yes, np.zeros(1, np.int64), np.zeros(1), np.zeros(1))


def _marker(kind: int, is_dp: np.ndarray, collective: np.ndarray) -> np.ndarray:
    return is_dp if kind == _BY_DP else collective if kind == _BY_COLLECTIVE else np.ones(len(is_dp), dtype=bool)


def _burst(src, start, end, size, mark, median, mark_size, burst_steps, light_share, server_of) -> tuple[int, str, int, str]:
    """How one job's traffic (one run, up to a silence) stops: ``(hung_at, members, gpus, stop)``."""
    if not np.isfinite(median):
        return -1, "", 0, _UNKNOWN  # no steps to judge by
    if not mark.any():
        return -1, "", 0, _PAUSE
    ms, ma = start[mark], src[mark]
    last = int(ms.max())
    cut = last - burst_steps * median
    codes, inv = np.unique(ma, return_inverse=True)
    nic_last = np.full(len(codes), np.iinfo(np.int64).min)
    np.maximum.at(nic_last, inv, ms)
    lost = codes[nic_last <= cut]
    in_burst = ms > cut
    if len(lost):
        return int(ms[in_burst].min()), "|".join(sorted(set(np.asarray(server_of)[lost].tolist()))), len(lost), _HANG
    heavy = ~mark & (size >= light_share * mark_size)
    return -1, "", 0, _MID_STEP if (start[heavy] > end[mark][in_burst].max()).any() else _PAUSE


@numba.njit(cache=True, nogil=True)
def _sums(order, job, src, start, end, size, is_dp, collective, thr, n_jobs, n_nic):  # pragma: no cover - compiled
    """One pass over the flows in start order (a second only where a job has a silence): per job, which flows are its
    collective traffic (``_BY_DP``, ``_BY_COLLECTIVE``, ``_ALL``), its silences of at least ``thr`` (the gaps in its
    traffic, overlapping flows merged: their job, start and end), its last end, its last collective start and mean
    collective bytes; per NIC, its last collective start and its job. The sums are kept for each of the three kinds
    of collective traffic at once, and the job's kind picked at the end."""
    lo = np.iinfo(np.int64).min
    has = np.zeros((2, n_jobs), np.bool_)
    last = np.full((3, n_jobs), lo)
    total = np.zeros((3, n_jobs))
    count = np.zeros((3, n_jobs))
    nic_last = np.full((3, n_nic), lo)
    nic_job = np.full(n_nic, -1, np.int64)
    busy = np.full(n_jobs, lo)
    n_gaps = 0
    for t in range(len(order)):
        f = order[t]
        j = job[f]
        if j < 0:
            continue
        if busy[j] != lo and start[f] - busy[j] >= thr[j]:
            n_gaps += 1
        if end[f] > busy[j]:
            busy[j] = end[f]
        a = src[f]
        nic_job[a] = j
        for k in range(3):
            if (k == 0 and not is_dp[f]) or (k == 1 and not collective[f]):
                continue
            if k < 2:
                has[k, j] = True
            if start[f] > last[k, j]:
                last[k, j] = start[f]
            total[k, j] += size[f]
            count[k, j] += 1
            if start[f] > nic_last[k, a]:
                nic_last[k, a] = start[f]
    kind = np.full(n_jobs, 2, np.int64)
    last_mark = np.full(n_jobs, lo)
    mean = np.zeros(n_jobs)
    for j in range(n_jobs):
        k = 0 if has[0, j] else 1 if has[1, j] else 2
        kind[j] = k
        last_mark[j] = last[k, j]
        mean[j] = total[k, j] / max(count[k, j], 1.0)
    nic_mark = np.full(n_nic, lo)
    for a in range(n_nic):
        if nic_job[a] >= 0:
            nic_mark[a] = nic_last[kind[nic_job[a]], a]
            if nic_mark[a] == lo:
                nic_job[a] = -1  # sent none of its job's collective traffic: no member
    g_job = np.empty(n_gaps, np.int64)
    g_start = np.empty(n_gaps, np.int64)
    g_end = np.empty(n_gaps, np.int64)
    if n_gaps:
        busy[:] = lo
        i = 0
        for t in range(len(order)):
            f = order[t]
            j = job[f]
            if j < 0:
                continue
            if busy[j] != lo and start[f] - busy[j] >= thr[j]:
                g_job[i] = j
                g_start[i] = busy[j]
                g_end[i] = start[f]
                i += 1
            if end[f] > busy[j]:
                busy[j] = end[f]
    return kind, g_job, g_start, g_end, busy, last_mark, mean, nic_mark, nic_job


@numba.njit(cache=True, nogil=True)
def _tails(job, start, end, size, is_dp, collective, kind, cut, light):  # pragma: no cover - compiled
    """Per job, its last collective burst (collective flows starting after ``cut``): when it began, and whether heavy
    traffic (not under ``light`` bytes) of the job's other flows began after it ended (the next step's)."""
    n_jobs = len(cut)
    first = np.full(n_jobs, np.iinfo(np.int64).max)
    burst_end = np.full(n_jobs, np.iinfo(np.int64).min)
    for f in range(len(job)):
        j = job[f]
        if j < 0 or not start[f] > cut[j]:
            continue
        k = kind[j]
        if (k == 0 and is_dp[f]) or (k == 1 and collective[f]) or k == 2:
            if start[f] < first[j]:
                first[j] = start[f]
            if end[f] > burst_end[j]:
                burst_end[j] = end[f]
    after = np.zeros(n_jobs, np.bool_)
    for f in range(len(job)):
        j = job[f]
        if j < 0 or after[j] or start[f] <= burst_end[j] or burst_end[j] == np.iinfo(np.int64).min:
            continue
        k = kind[j]
        if not ((k == 0 and is_dp[f]) or (k == 1 and collective[f]) or k == 2) and size[f] >= light[j]:
            after[j] = True
    return first, after
