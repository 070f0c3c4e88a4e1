"""Execution graphs from ``prism replay`` output: what the network alone says about each job.

Per job, the processors are its DP rings (``phases.csv``, kind
``dp_collective``). In step s, ring g runs

* a *work* task: from the step's start to the arrival of the ring's last
  member (its first flow of the collective; compute and pipeline traffic of
  its stage as the network sees them, up to the slowest member), then
* its *collective*: the ring's DP burst from that arrival (the earlier
  members' wait for the last one is not the collective's time);

and the step ends when every ring's collective has (a synchronisation node
all rings join, lasting what the step does after its last collective; the
next step's work follows it). With
observed durations the replay gives back the observed step times.

Scenarios:

* ``remove-stragglers``: in the steps of a ``slow_group`` anomaly, each
  ring's work task takes its median over the job's steps without one (its
  own healthy baseline); with no such step, the work is divided by the
  lagging server's ratio (the slowest stage paces every micro-batch).
  ``slow_step`` steps are left as they are (they are not stragglers);
* ``heal-switch:NAME``: in the switch windows where NAME ran slower than its
  tier (``switches.csv`` ratio < 1), the collectives of rings whose traffic
  crosses NAME (their servers' leaf on the ring's rail; spines: rings
  spanning several leaves) that are clearly longer than the same step's
  collectives of rings that do not cross it take their peers' median (all
  rings cross it: ``ratio`` of their time); in those steps the job's work
  phases (pipeline traffic between the same servers) take their median over
  the steps without a slowed collective;
* ``scale-comm:X``: every collective X times as long.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from prism.whatif.graph import ExecutionGraph, SimResult

__all__ = ["ReplayGraph", "read_replay"]


#: the columns the what-if reads from a replay directory
REPLAY_COLUMNS = {"steps": ("job_id", "step", "start_ns", "end_ns"), "phases": ("job_id", "step", "group", "kind", "start_ns", "end_ns")}
#: longer than this is not a training step (nor a collective): a corrupt value
MAX_SPAN_NS = 24 * 3600 * 10**9


def read_replay(replay_dir: str | Path, topology: str | Path | None = None) -> dict:
    """A ``prism replay`` output directory's tables, checked.

    Missing files or columns are an error. A job with a row whose step or
    times are not numbers, not finite, or impossible (ending before it
    starts, spanning over a day) cannot be modelled: it is listed under
    ``"invalid"`` (job -> the first bad row, by file and line) and its rows
    are dropped, so the other jobs go on.
    """
    d = Path(replay_dir)
    need = ["steps.csv", "phases.csv"]
    missing = [n for n in need if not (d / n).is_file()]
    if missing:
        raise ValueError(f"{d}: not a 'prism replay' output directory (missing {', '.join(missing)})")
    out: dict[str, Any] = {}
    for name in need:
        try:
            out[name[:-4]] = pd.read_csv(d / name)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise ValueError(f"{d / name}: not a readable CSV file: {e}") from None
    for name, cols in REPLAY_COLUMNS.items():
        lacking = [c for c in cols if c not in out[name].columns]
        if lacking:
            raise ValueError(f"{d / (name + '.csv')}: missing column(s) {', '.join(lacking)} (a 'prism replay' output has "
                             f"{', '.join(cols)}, ...)")
    invalid: dict = {}
    for name in REPLAY_COLUMNS:
        out[name] = _checked_times(out[name], f"{name}.csv", invalid)
    for name in REPLAY_COLUMNS:
        out[name] = out[name][~out[name]["job_id"].isin(list(invalid))].reset_index(drop=True)
    out["invalid"] = invalid
    for opt in ("anomalies.csv", "switches.csv"):
        out[opt[:-4]] = pd.read_csv(d / opt) if (d / opt).is_file() and (d / opt).stat().st_size else None
    out["topology"] = pd.read_csv(topology) if topology else None
    return out


def _checked_times(df: pd.DataFrame, file: str, invalid: dict) -> pd.DataFrame:
    """``df`` with its step and time columns as int64; jobs with a bad row go into ``invalid``."""
    df = df.copy()
    df["job_id"] = df["job_id"].astype(str)
    cols = [c for c in ("step", "start_ns", "arrival_ns", "end_ns") if c in df.columns]
    num = {c: pd.to_numeric(df[c], errors="coerce").to_numpy(np.float64) for c in cols}
    bad = np.zeros(len(df), bool)
    why = np.full(len(df), "", object)
    for c in cols:
        b = ~np.isfinite(num[c]) | (np.abs(num[c]) > 2.0**62) | (num[c] != np.round(num[c]))
        why[b & ~bad] = c
        bad |= b
    span = num["end_ns"] - num["start_ns"]
    b = ~bad & ((span < 0) | (span > MAX_SPAN_NS))
    why[b] = "end_ns"
    bad |= b
    for i in np.flatnonzero(bad).tolist():
        job = df["job_id"].iat[i]
        if job not in invalid:
            c = why[i]
            invalid[job] = (f"{file} line {i + 2}: {c}={df[c].iat[i]!r} is not a valid "
                            + ("step number" if c == "step" else "time (a whole number of ns, ending after the start, within a day of it)"))
    for c in cols:  # the bad rows' jobs are dropped by the caller
        df[c] = np.where(bad, 0, num[c]).astype(np.int64)
    return df


class ReplayGraph:
    """One job's step timeline from the network, as an :class:`ExecutionGraph`."""

    def __init__(self, job_id: str, steps: pd.DataFrame, phases: pd.DataFrame):
        self.job_id = job_id
        st = steps[steps["job_id"] == job_id].sort_values("step").reset_index(drop=True)
        ph = phases[(phases["job_id"] == job_id) & (phases["kind"] == "dp_collective")]
        ph = ph[ph["step"].isin(st["step"])]
        self.steps_seen = len(st)
        if ph.empty:
            raise ValueError(f"no DP collective seen in its {len(st)} steps (a pipeline-only job, or its DP rings on "
                             "NVLink): the network gives its step times but not what paces them")
        # steps every ring took part in: the graph needs each ring once per step
        rings = sorted(ph["group"].unique())
        full = ph.groupby("step")["group"].nunique()
        keep = full[full == len(rings)].index
        st = st[st["step"].isin(keep)].reset_index(drop=True)
        ph = ph[ph["step"].isin(keep)].sort_values(["step", "group"]).reset_index(drop=True)
        self.steps, self.phases, self.rings = st, ph, rings
        n_s, n_r = len(st), len(rings)
        if n_s == 0 or n_r == 0:
            raise ValueError(f"none of its {self.steps_seen} steps has all of its {n_r} DP rings' collectives")
        s0 = st["start_ns"].to_numpy(np.int64)
        ring_of = ph["group"].map({g: i for i, g in enumerate(rings)}).to_numpy()
        step_i = np.repeat(np.arange(n_s), n_r)
        base = s0[step_i]
        # the collective runs from its last member's arrival; before that its members wait for the straggler,
        # which is that member's work, not the collective's (replays without arrival_ns: the phase's start)
        arrival = (ph["arrival_ns"] if "arrival_ns" in ph.columns else ph["start_ns"]).to_numpy(np.int64)
        self.work = (arrival - base) / 1e9
        self.coll = (ph["end_ns"].to_numpy(np.int64) - arrival) / 1e9
        # what the step does after its last collective (grad-norm all-reduce, optimizer): the step-end
        # synchronisation's own time, as observed
        last_coll = ph["end_ns"].to_numpy(np.int64).reshape(n_s, n_r).max(axis=1)
        self.tail = np.maximum((st["end_ns"].to_numpy(np.int64) - last_coll) / 1e9, 0.0)
        # how much of the step the DP traffic spans: most of it when the parameters are all-gathered at its
        # start (distributed optimizer) or buckets overlap the backward; then "work" and "collective" blur
        self.dp_span = float(np.median(self.coll.reshape(n_s, n_r).max(axis=1) / np.maximum(self.observed(), 1e-12)))
        # step end: when the last ring's collective ended; the next step starts there (observed: its start)
        self.end_gap = np.maximum((np.r_[s0[1:], st["end_ns"].iloc[-1]] - st["end_ns"].to_numpy(np.int64)) / 1e9, 0)
        # nodes: work (n_s*n_r), collectives (n_s*n_r), barriers (n_s)
        nw = n_s * n_r
        w = np.arange(nw)
        c = nw + w
        b = 2 * nw + np.arange(n_s)
        src = [w, c]
        dst = [c, b[step_i]]
        gap = [np.zeros(nw), np.zeros(nw)]
        nxt = step_i < n_s - 1  # barrier of step s -> work of step s+1 (same ring)
        src.append(b[step_i[nxt]])
        dst.append(w[nxt] + n_r)
        gap.append(self.end_gap[step_i[nxt]])
        self.src, self.dst, self.gap = np.concatenate(src), np.concatenate(dst), np.concatenate(gap)
        self.n_s, self.n_r, self.step_i, self.ring_of = n_s, n_r, step_i, ring_of
        self.t0 = int(s0[0])

    def graph(self, work: np.ndarray | None = None, coll: np.ndarray | None = None) -> ExecutionGraph:
        work = self.work if work is None else work
        coll = self.coll if coll is None else coll
        dur = np.concatenate([work, coll, self.tail])
        step = np.concatenate([self.steps["step"].to_numpy()[self.step_i]] * 2 + [self.steps["step"].to_numpy()])
        labels = np.array(["work"] * len(work) + ["DP collective"] * len(coll) + ["step end"] * self.n_s, object)
        proc = np.concatenate([self.ring_of, self.ring_of, np.full(self.n_s, -1)])
        return ExecutionGraph(dur, step, self.src, self.dst, self.gap, label=labels, proc=proc)

    def step_ends(self, result: SimResult) -> np.ndarray:
        """Simulated end of each step (seconds from the first step's start)."""
        return result.finish[2 * self.n_s * self.n_r:]

    def observed(self) -> np.ndarray:
        return (self.steps["end_ns"].to_numpy(np.int64) - self.steps["start_ns"].to_numpy(np.int64)) / 1e9

    def simulated_steps(self, result: SimResult) -> np.ndarray:
        ends = self.step_ends(result)
        starts = np.r_[0.0, ends[:-1] + self.end_gap[:-1]]
        return ends - starts

    # ---- scenarios
    def _healthy_baseline(self, values: np.ndarray, affected: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        """Affected tasks take their ring's median over its unaffected steps (else ``fallback``)."""
        out = values.copy()
        df = pd.DataFrame({"ring": self.ring_of, "v": values, "ok": ~affected})
        base = df[df["ok"]].groupby("ring")["v"].median()
        b = pd.Series(self.ring_of).map(base).to_numpy(np.float64)
        have = affected & ~np.isnan(b)
        out[have] = b[have]
        out[affected & ~have] = fallback[affected & ~have]
        return out

    def remove_stragglers(self, anomalies: pd.DataFrame | None, work: np.ndarray) -> np.ndarray:
        """Work of the steps a ``slow_group`` anomaly covers, as in the job's steps without one."""
        if anomalies is None:
            return work
        a = anomalies[(anomalies["kind"] == "slow_group") & (anomalies["job_id"] == self.job_id)]
        step = self.steps["step"].to_numpy()[self.step_i]
        affected = np.zeros(len(work), bool)
        divided = work.copy()
        for r in a.itertuples(index=False):
            m = re.search(r"steps (\d+)-(\d+)", str(r.explanation))
            lo, hi = (int(m.group(1)), int(m.group(2))) if m else (int(r.step), int(r.step))
            if float(r.score) > 1:
                sel = (step >= lo) & (step <= hi)
                affected |= sel
                divided[sel] = work[sel] / float(r.score)
        slow_steps = anomalies[(anomalies["kind"] == "slow_step") & (anomalies["job_id"] == self.job_id)]["step"]
        # slow steps are neither stragglers nor a healthy baseline
        baseline_ok = ~affected & ~np.isin(step, slow_steps.to_numpy())
        out = self._healthy_baseline(np.where(baseline_ok | affected, work, np.nan), affected, divided)
        return np.where(np.isnan(out), work, out)

    def heal_switch(self, name: str, switches: pd.DataFrame | None, topology: pd.DataFrame | None, coll: np.ndarray,
                    work: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(collectives, work) with the switch as fast as its peers."""
        if switches is None:
            raise ValueError("heal-switch needs switches.csv in the replay directory")
        sw = switches[(switches["kind"] == "switch") & (switches["name"] == name)]
        if sw.empty:
            known = ", ".join(sorted(switches.loc[switches["kind"] == "switch", "name"].unique())[:10])
            raise ValueError(f"heal-switch:{name}: no such switch in switches.csv (e.g. {known})")
        crosses = self._rings_crossing(name, str(sw["tier"].iloc[0]), topology)[self.ring_of]
        slow_ratio = float(sw["ratio"].min())
        # peers: the job's rings that do not cross the switch, in the same step
        df = pd.DataFrame({"step": self.step_i, "coll": coll})
        peer = df[~crosses].groupby("step")["coll"].median().reindex(np.arange(self.n_s)).to_numpy()[self.step_i]
        if slow_ratio >= 1 or not crosses.any():
            return coll, work
        # a crossing ring's collective slowed by the switch: clearly longer than its peers' in that step
        sel = crosses & ~np.isnan(peer) & (coll > peer * (1 + 0.5 * (1 - slow_ratio)))
        healed = coll.copy()
        healed[sel] = peer[sel]
        no_peer = crosses & np.isnan(peer)
        healed[no_peer] = coll[no_peer] * slow_ratio  # every ring crosses it: scale by its bandwidth ratio
        # the job's pipeline traffic runs between the same servers, over the same leaves: in the steps where
        # a ring's collective was slowed, every ring's work phase (compute and PP traffic) takes its median
        # over the steps where none was
        steps_hit = np.zeros(self.n_s, bool)
        steps_hit[self.step_i[sel]] = True
        healed_work = self._healthy_baseline(work, steps_hit[self.step_i], work)
        return healed, healed_work

    def _rings_crossing(self, name: str, tier: str, topology: pd.DataFrame | None) -> np.ndarray:
        """Which rings' traffic goes through the switch (all, without a topology)."""
        if topology is None or "leaf" not in topology.columns:
            return np.ones(self.n_r, bool)
        topo = topology.assign(ip=topology["ip"].astype(str))
        rail_of = topo.set_index("ip")["rail"] if "rail" in topo.columns else None
        out = np.zeros(self.n_r, bool)
        servers = self.phases.drop_duplicates("group").set_index("group")["servers"]
        for i, g in enumerate(self.rings):
            ip = g.split("@", 1)[1]
            members = str(servers[g]).split("|")
            t = topo[topo["server"].isin(members)]
            if rail_of is not None and ip in rail_of.index:
                t = t[t["rail"] == rail_of[ip]]
            leaves = set(t["leaf"])
            out[i] = (name in leaves) if tier == "leaf" else len(leaves) > 1
        return out
