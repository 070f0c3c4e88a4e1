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

* ``remove-stragglers``: each slow group's lag is taken out, measured
  against its peers in the same step. A ``slow_group`` anomaly names a
  server; in the steps it covers, the pipeline (``pp_traffic`` phases) that
  server is in ends its pipeline traffic later than the job's other
  pipelines; every ring's work in that step loses that lag (the slowest
  pipeline delays every stage's gradient collective by it). A job with no
  pipeline traffic (pure data parallel), or whose pipelines all end
  together (a grad-norm clip all-reduce after the DP collectives): each
  ring's work in the anomaly's steps loses the jump it made where the
  anomaly began (or ended): the median over the 10 anomaly steps next to
  that boundary less the median over the 10 healthy steps on its other
  side. What else slows the work later on stays. With no healthy step,
  the work is divided by the anomaly's ratio. ``slow_step`` steps are left
  as they are (they are not stragglers);
* ``heal-switch:NAME``: the transfers that crossed NAME are re-costed at the
  bandwidth measured in the same capture. A collective's rate is its bytes
  over its time (with the wait before its last member's arrival beyond the
  ring's usual one: a slow transfer can delay that arrival). The rings
  whose traffic may cross NAME (the leaves of the ring's members, from its
  DP pairs, else its servers on its rail; a spine: several leaves) are
  compared with a healthy reference rate: the median rate of the job's
  rings that cannot cross it, else the rate the crossing rings reach in
  their best steps (the switch was healthy part of the time). A collective
  clearly below it takes its bytes at that rate. When no ring is faster
  than another in any step, each ring's rate per DP pair is compared with
  the tier's healthy median bandwidth per flow (``switches.csv``). Work
  phases are otherwise left as observed; the dependencies carry the change
  to the step. ``heal-link:A>B``: the same for a link, unless the link
  itself ran within 15% of its tier's bandwidth (the rings' slowness is
  then elsewhere: another link of the same leaf looks the same from the
  rings' ends);
* ``move-job:JOB@NAME``: jobs contend for a switch they share, so moving one
  off it changes every other's prediction. Each job's share of NAME (the
  fraction of its healthy rate its slowed collectives got there) is measured
  over every job of the replay first; their sum is NAME's capacity. JOB is
  healed, the others get what it leaves (:func:`contention`);
* ``scale-comm:X``: every collective X times as long;
* ``scale-dp:N``: every DP collective re-costed for N replicas instead of the
  observed D (``summary.json``'s ``dp``): a ring member sends 2(N-1)/N of the
  per-GPU bytes, which the same model and per-replica batch leave as they
  are, at the rate its ring was measured at in the same capture. A ring on
  one leaf that needs more servers than the leaf serves crosses the spines
  at N: the spine tier's healthy median per flow caps its rate where that is
  clearly lower. Each replica's work and the step's tail stay (see
  :meth:`ReplayGraph.scale_dp`).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from prism.whatif.graph import ExecutionGraph, SimResult
from prism.whatif.scenarios import dp_ring_factor

__all__ = ["ReplayGraph", "read_replay", "contention"]

#: a collective this much below the healthy rate was slowed (rates of healthy rings vary by a few %)
TOLERANCE = 0.15
#: steps on each side of where a slow group begins or ends that measure the jump it makes in a ring's work
ONSET_STEPS = 10


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
    for opt in ("anomalies.csv", "switches.csv", "pairs.csv"):
        out[opt[:-4]] = pd.read_csv(d / opt) if (d / opt).is_file() and (d / opt).stat().st_size else None
    out["topology"] = pd.read_csv(topology) if topology else None
    # the job's parallel sizes as the replay recognised them (scale-dp needs its DP size)
    out["shapes"] = {}
    if (d / "summary.json").is_file():
        try:
            jobs = json.loads((d / "summary.json").read_text()).get("jobs", [])
        except (ValueError, AttributeError):
            jobs = []
        out["shapes"] = {str(j["job_id"]): j for j in jobs if isinstance(j, dict) and "job_id" in j}
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


def _ring_pairs(members: set, pairs: pd.DataFrame | None, job_id: str) -> list:
    """The job's DP pairs between a ring's members."""
    if pairs is None:
        return []
    dp = pairs[(pairs["job_id"].astype(str) == job_id) & (pairs["type"] == "DP")]
    return [(a, b) for a, b in zip(dp["src"].astype(str), dp["dst"].astype(str)) if a in members and b in members]


class ReplayGraph:
    """One job's step timeline from the network, as an :class:`ExecutionGraph`."""

    def __init__(self, job_id: str, steps: pd.DataFrame, phases: pd.DataFrame):
        self.job_id = job_id
        st = steps[steps["job_id"] == job_id].sort_values("step").reset_index(drop=True)
        mine = phases[phases["job_id"] == job_id]
        ph = mine[(mine["kind"] == "dp_collective") & mine["step"].isin(st["step"])]
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
        # from the ring's first flow of the collective to its last member's arrival: the members' wait
        self.wait = np.maximum((arrival - ph["start_ns"].to_numpy(np.int64)) / 1e9, 0.0)
        # bytes of each collective: its rate (bytes / time) is what heal-switch compares with a healthy one
        self.bytes = pd.to_numeric(ph["bytes"], errors="coerce").to_numpy(np.float64) if "bytes" in ph.columns else None
        # per step and pipeline (the servers of a pp_traffic group): when its pipeline traffic ended, from the
        # step's start (NaN: not seen). A slow server's pipeline ends later than its peers in the same step.
        pp = mine[(mine["kind"] == "pp_traffic") & mine["step"].isin(st["step"])]
        if len(pp) and "servers" in pp.columns:
            end = pp.assign(end=(pp["end_ns"].to_numpy(np.int64) - pp["step"].map(st.set_index("step")["start_ns"]).to_numpy(np.int64)) / 1e9)
            m = end.groupby(["step", "servers"])["end"].max().unstack("servers")
            self.pipelines = [str(c) for c in m.columns]
            self.pipe_end = m.reindex(st["step"].to_numpy()).to_numpy(np.float64)
        else:
            self.pipelines, self.pipe_end = [], np.empty((len(st), 0))
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
    def _less_onset_jump(self, values: np.ndarray, affected: np.ndarray, healthy: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        """Affected tasks less the jump in their ring's work where the affected steps begin (and end, if the job
        runs healthy again): the median over the :data:`ONSET_STEPS` affected steps next to each such boundary,
        less the median over the as many healthy steps on its other side. A constant slowdown of one server
        is that jump; what else moves the work later (a switch slowing down halfway through the anomaly) is
        kept. A run of affected steps with no healthy step on either side takes ``fallback``. ``affected`` and
        ``healthy`` are per step (the same for every ring of it)."""
        n_s, n_r = self.n_s, self.n_r
        v, out = values.reshape(n_s, n_r), values.copy().reshape(n_s, n_r)
        a = np.asarray(affected.reshape(n_s, n_r).any(axis=1), bool)
        ok = np.asarray(healthy.reshape(n_s, n_r).all(axis=1), bool) & ~a
        k = ONSET_STEPS
        edges = np.flatnonzero(np.diff(np.r_[0, a.astype(np.int8), 0]))
        for i0, i1 in zip(edges[::2], edges[1::2]):  # affected steps i0..i1-1
            run = np.arange(i0, i1)
            before, after = np.flatnonzero(ok[:i0])[-k:], i1 + np.flatnonzero(ok[i1:])[:k]
            if not len(before) and not len(after):
                out[run] = fallback.reshape(n_s, n_r)[run]
                continue
            near = np.unique(np.r_[run[:k] if len(before) else [], run[-k:] if len(after) else []]).astype(np.int64)
            jump = np.median(v[near], axis=0) - np.median(v[np.r_[before, after]], axis=0)
            out[run] = np.maximum(v[run] - np.maximum(jump, 0.0)[None, :], 0.0)
        return out.ravel()

    def slow_groups(self, anomalies: pd.DataFrame | None) -> list[tuple[set, int, int, float]]:
        """The job's ``slow_group`` anomalies: (servers named, first step, last step, ratio)."""
        if anomalies is None:
            return []
        a = anomalies[(anomalies["kind"] == "slow_group") & (anomalies["job_id"].astype(str) == self.job_id)]
        out = []
        for r in a.itertuples(index=False):
            m = re.search(r"steps (\d+)-(\d+)", str(r.explanation))
            lo, hi = (int(m.group(1)), int(m.group(2))) if m else (int(r.step), int(r.step))
            out.append((set(str(r.subject).split("|")), lo, hi, float(r.score)))
        return out

    def _lag_measured(self, servers: set, lo: int, hi: int) -> bool:
        """Whether the pipelines holding ``servers`` lag their peers measurably in steps ``lo``-``hi``: by over 1%
        of the step in most of them. Not when something after the pipeline ends every pipeline together (a
        grad-norm clip or embedding all-reduce over the pipeline pairs)."""
        pipes = np.array([bool(servers & set(p.split("|"))) for p in self.pipelines], bool)
        step = self.steps["step"].to_numpy()
        sel = (step >= lo) & (step <= hi)
        if not pipes.any() or not sel.any():
            return False
        lag = self.pipeline_lag()[sel][:, pipes].max(axis=1)
        return bool(np.median(lag) > 0.01 * np.median(self.observed()))

    def pipeline_lag(self, anomalies: pd.DataFrame | None = None, groups: list | None = None) -> np.ndarray:
        """Per step and pipeline: how much later than the median of the job's other pipelines its traffic ended
        (>= 0; 0 where not seen). With ``anomalies``, only the pipelines holding a ``slow_group`` server, in
        the anomaly's steps (``groups``: those of :meth:`slow_groups` to keep)."""
        n_s, n_p = self.pipe_end.shape
        lag = np.zeros((n_s, n_p))
        if n_p < 2:
            return lag
        e = self.pipe_end
        for p in range(n_p):
            others = np.delete(e, p, axis=1)
            with np.errstate(all="ignore"):
                peer = np.nanmedian(np.where(np.isnan(others).all(axis=1, keepdims=True), 0.0, others), axis=1)
            lag[:, p] = np.nan_to_num(np.maximum(e[:, p] - peer, 0.0))
        if anomalies is None:
            return lag
        keep = np.zeros_like(lag, bool)
        step = self.steps["step"].to_numpy()
        for servers, lo, hi, _ in (self.slow_groups(anomalies) if groups is None else groups):
            pipes = np.array([bool(servers & set(p.split("|"))) for p in self.pipelines])
            keep |= ((step >= lo) & (step <= hi))[:, None] & pipes[None, :]
        return np.where(keep, lag, 0.0)

    def remove_stragglers(self, anomalies: pd.DataFrame | None, work: np.ndarray) -> np.ndarray:
        """Work with each ``slow_group``'s lag over its peers, in the same step, taken out."""
        groups = self.slow_groups(anomalies)
        if not groups or anomalies is None:
            return work
        step = self.steps["step"].to_numpy()[self.step_i]
        has_peers = self.pipe_end.shape[1] >= 2
        out = work.copy()
        fallback = np.zeros(len(work), bool)
        divided = work.copy()
        measured = []
        for servers, lo, hi, score in groups:
            sel = (step >= lo) & (step <= hi)
            if has_peers and self._lag_measured(servers, lo, hi):
                measured.append((servers, lo, hi, score))
                continue  # measured against its peers below
            if score > 1:
                fallback |= sel
                divided[sel] = work[sel] / score
        if measured:
            lag = self.pipeline_lag(anomalies, measured).max(axis=1)
            out = out - lag[self.step_i]
            # the named server's own stage also computes after its pipeline's last transfer (stage 0's last
            # backward): that tail, beyond the ring's tail in the steps without the anomaly
            tail = self.work - np.nanmax(np.where(np.isnan(self.pipe_end), -np.inf, self.pipe_end), axis=1)[self.step_i]
            slow_steps = anomalies[(anomalies["kind"] == "slow_step") & (anomalies["job_id"].astype(str) == self.job_id)]["step"]
            ring_servers = self.phases.drop_duplicates("group").set_index("group")["servers"].astype(str)
            for servers, lo, hi, score in measured:
                mine = np.array([bool(servers & set(ring_servers[g].split("|"))) for g in self.rings])[self.ring_of]
                hit = mine & (step >= lo) & (step <= hi) & np.isfinite(tail)
                ok = mine & ~((step >= lo) & (step <= hi)) & ~np.isin(step, slow_steps.to_numpy()) & np.isfinite(tail)
                healthy = pd.Series(tail[ok]).groupby(self.ring_of[ok]).median()
                h = pd.Series(self.ring_of).map(healthy).to_numpy(np.float64)
                h = np.where(np.isnan(h), tail / max(score, 1.0), h)
                out = np.where(hit, out - np.maximum(tail - h, 0.0), out)
            out = np.maximum(out, 0.0)
        if fallback.any():
            # no pipeline to compare with (pure data parallel, or a clip or embedding all-reduce that ends every
            # pipeline together): the jump in each ring's work where the anomaly begins (or ends) against the
            # job's healthy steps next to it
            slow_steps = anomalies[(anomalies["kind"] == "slow_step") & (anomalies["job_id"].astype(str) == self.job_id)]["step"]
            ok = ~fallback & ~np.isin(step, slow_steps.to_numpy())
            out = self._less_onset_jump(out, fallback, ok, divided)
        return out

    def heal_switch(self, name: str, switches: pd.DataFrame | None, topology: pd.DataFrame | None,
                    coll: np.ndarray, work: np.ndarray, kind: str = "switch",
                    pairs: pd.DataFrame | None = None, gain: float = np.inf) -> tuple[np.ndarray, np.ndarray, dict]:
        """(collectives, work) with the transfers that crossed the switch (``kind="link"``: the link ``A>B``) at
        the healthy bandwidth measured in the capture; and how (``{"crossing_rings", "healed", "reference",
        "ratio", "share"}``; ``share``: the median fraction of the healthy rate the slowed collectives ran at).

        ``gain``: the slowed collectives get ``gain`` times the rate they had there, up to the healthy one
        (:func:`contention`: the share of a switch that other jobs left); the default heals them."""
        flag = "heal-switch" if kind == "switch" else "heal-link"
        if switches is None:
            raise ValueError(f"{flag} needs switches.csv in the replay directory")
        sw = switches[(switches["kind"] == kind) & (switches["name"] == name)]
        if sw.empty:
            known = ", ".join(sorted(switches.loc[switches["kind"] == kind, "name"].unique())[:10])
            raise ValueError(f"{flag}:{name}: no such {kind} in switches.csv (e.g. {known})")
        ratio = float(sw["ratio"].min())
        crosses = self._rings_crossing(name, str(sw["tier"].iloc[0]), topology, pairs)[self.ring_of]
        info: dict = {"crossing_rings": int(crosses.reshape(self.n_s, self.n_r)[0].sum()), "healed": 0,
                      "reference": None, "ratio": ratio, "share": None}
        if ratio >= 1 or not crosses.any():
            return coll, work, info
        if kind == "link" and ratio >= 1 - TOLERANCE:
            # the link itself ran at its tier's bandwidth: what slowed the rings that may cross it is elsewhere
            # (another link of the same leaf, which the rings' ends cannot tell apart from this one)
            info["reference"] = "the link is not slow"
            return coll, work, info
        if self.bytes is None or not np.isfinite(self.bytes).all():
            # no byte counts: the crossing collectives at the switch's bandwidth ratio
            info.update(healed=int(crosses.sum()), reference="ratio", share=ratio)
            return np.where(crosses, coll * max(ratio, 1 / gain), coll), work, info
        # A slow transfer can also delay when the ring's last member is seen to arrive (its first flow of the
        # collective), so part of the collective counts as the members' wait: the wait beyond the ring's
        # usual one goes with the transfer when the transfer was slowed
        usual = pd.Series(self.wait).groupby(self.ring_of).transform("median").to_numpy()
        excess = np.maximum(self.wait - usual, 0.0)
        span = self.coll + excess
        rate = self.bytes / np.maximum(span, 1e-12)  # as observed, whatever the scenarios before changed
        # the job's rings that cannot cross the switch carry the healthy rate
        peers = ~crosses & (self.bytes > 0)
        if peers.any():
            ref, how = float(np.median(rate[peers])), "rings not crossing it"
        else:
            # every ring may cross it: the rate they reach in their best steps (the switch healthy for a while)
            ref, how = float(np.quantile(rate[crosses], 0.9)), "the crossing rings' best steps"
        slowed = crosses & (rate < ref * (1 - TOLERANCE))
        if not slowed.any() and how != "rings not crossing it":
            # no ring of the job is faster than another, in any step: either none went through the switch (a
            # spine the ECMP hash avoids), or all did for the whole capture. A ring's pairs each carry its
            # rate / pairs: against the tier's healthy median bandwidth per flow (switches.csv)
            return self._heal_against_tier(sw, crosses, rate, coll, work, info, pairs, gain)
        out, out_work = coll.copy(), work.copy()
        # the collective's bytes at the healthy rate (scaled as a scenario before may have scaled it), from
        # the end of the members' usual wait; with a gain, no faster than its observed time over the gain
        scale = coll[slowed] / np.maximum(self.coll[slowed], 1e-12)
        slow = coll[slowed] + excess[slowed]
        out[slowed] = np.minimum(slow, np.maximum((self.bytes[slowed] / ref) * scale, slow / gain))
        out_work[slowed] = np.maximum(work[slowed] - excess[slowed], 0.0)
        info.update(healed=int(slowed.sum()), reference=how, share=float(np.median(rate[slowed] / ref)) if slowed.any() else None)
        return out, out_work, info

    def _heal_against_tier(self, sw: pd.DataFrame, crosses: np.ndarray, rate: np.ndarray, coll: np.ndarray,
                           work: np.ndarray, info: dict, pairs: pd.DataFrame | None,
                           gain: float = np.inf) -> tuple[np.ndarray, np.ndarray, dict]:
        """Every ring may cross the switch and none is faster: each ring's rate per DP pair (bytes per second
        each of its pairs moves) against the tier's healthy median bandwidth; a collective clearly below it
        takes ``its rate / the median`` of its time. Without the pairs or the tier's median: the switch's
        ``ratio`` for every crossing ring."""
        members = self._ring_members(pairs)
        n_pairs = np.array([len(_ring_pairs(members[g], pairs, self.job_id)) if g in members else 0 for g in self.rings])[self.ring_of]
        tier = pd.to_numeric(sw.get("tier_median_gbps", pd.Series(dtype=float)), errors="coerce").max()
        if not (n_pairs[crosses] > 0).all() or not np.isfinite(tier) or tier <= 0:
            info.update(healed=int(crosses.sum()), reference="ratio", share=info["ratio"])
            return np.where(crosses, coll * max(info["ratio"], 1 / gain), coll), work, info
        factor = rate / np.maximum(n_pairs, 1) / 1e9 / tier  # the switches' GB/s
        slowed = crosses & (factor < 1 - TOLERANCE)
        out = np.where(slowed, coll * np.maximum(factor, 1 / gain), coll)
        info.update(healed=int(slowed.sum()), reference="the tier's median bandwidth",
                    share=float(np.median(factor[slowed])) if slowed.any() else None)
        return out, work, info

    def _ring_members(self, pairs: pd.DataFrame | None) -> dict:
        """Ring -> the NIC addresses of its members: the job's DP pairs (``pairs.csv``) joined to the ring's
        address (a ring may pair NICs on different rails)."""
        if pairs is None or not {"job_id", "src", "dst", "type"} <= set(pairs.columns):
            return {}
        dp = pairs[(pairs["job_id"].astype(str) == self.job_id) & (pairs["type"] == "DP")]
        nbr: dict = {}
        for a, b in zip(dp["src"].astype(str), dp["dst"].astype(str)):
            nbr.setdefault(a, set()).add(b)
            nbr.setdefault(b, set()).add(a)
        out = {}
        for g in self.rings:
            ip = g.split("@", 1)[1]
            if ip not in nbr:
                continue
            seen, todo = {ip}, [ip]
            while todo:
                for n in nbr[todo.pop()] - seen:
                    seen.add(n)
                    todo.append(n)
            out[g] = seen
        return out

    def _ring_leaves(self, topology: pd.DataFrame, pairs: pd.DataFrame | None) -> list[set]:
        """Per ring, the leaves its members sit on: the NICs of its DP pairs (``pairs.csv``), or without them
        its servers' NICs on the ring's rail."""
        topo = topology.assign(ip=topology["ip"].astype(str))
        rail_of = topo.set_index("ip")["rail"] if "rail" in topo.columns else None
        leaf_of = topo.set_index("ip")["leaf"]
        members_of = self._ring_members(pairs)
        servers = self.phases.drop_duplicates("group").set_index("group")["servers"]
        out = []
        for g in self.rings:
            ip = g.split("@", 1)[1]
            if g in members_of:
                out.append(set(leaf_of.reindex(list(members_of[g])).dropna()))
                continue
            t = topo[topo["server"].isin(str(servers[g]).split("|"))]
            if rail_of is not None and ip in rail_of.index:
                t = t[t["rail"] == rail_of[ip]]
            out.append(set(t["leaf"]))
        return out

    def _rings_crossing(self, name: str, tier: str, topology: pd.DataFrame | None, pairs: pd.DataFrame | None = None) -> np.ndarray:
        """Which rings' traffic goes through the switch (all, without a topology)."""
        if topology is None or "leaf" not in topology.columns:
            return np.ones(self.n_r, bool)
        # a link crosses the ring where each of its ends does (a leaf of the ring; a spine: several leaves)
        ends = list(zip(name.split(">"), tier.split(">"))) if ">" in name else [(name, tier)]
        return np.array([all((n in leaves) if tr == "leaf" else len(leaves) > 1 for n, tr in ends)
                         for leaves in self._ring_leaves(topology, pairs)], bool)

    def dp_size(self, shapes: dict, pairs: pd.DataFrame | None) -> tuple[int | None, bool]:
        """The job's DP size and whether it is exact: the replay's (``summary.json``: the largest DP ring it
        recognised, a lower bound where a ring runs partly on NVLink), else the most members of a ring in
        ``pairs.csv``; None when neither says."""
        shape = shapes.get(self.job_id, {})
        if isinstance(shape.get("dp"), int) and shape["dp"] > 1:
            return int(shape["dp"]), bool(shape.get("dp_exact", True))
        members = self._ring_members(pairs)
        return (max(map(len, members.values())), False) if members else (None, False)

    def scale_dp(self, n: int, dp: int, coll: np.ndarray, switches: pd.DataFrame | None, topology: pd.DataFrame | None,
                 pairs: pd.DataFrame | None) -> tuple[np.ndarray, dict]:
        """Collectives re-costed for ``n`` data-parallel replicas instead of the observed ``dp``; and how.

        Each ring member sends ``2(n-1)/n`` of the per-GPU bytes (unchanged: same model, same per-replica batch),
        at the rate the ring ran at in the capture (its bottleneck, step by step): :func:`dp_ring_factor` of its
        time. A ring whose members sit on one leaf and that needs more servers than the leaf serves at ``n``
        (``n / dp`` times its servers; ``--topology``) crosses the spines too: its rate per DP pair is capped by
        the spine tier's healthy median per flow (``switches.csv``) where that is clearly lower. The work (each
        replica's compute, the members' wait) and what the step does after its collectives stay."""
        f = dp_ring_factor(n, dp)
        out = coll * f
        info: dict = {"observed_dp": dp, "dp": n, "time_factor": round(f, 6), "rings_onto_spines": 0,
                      "reference": "each ring's own rate"}
        if n <= dp or topology is None or "leaf" not in topology.columns:
            return out, info
        per_leaf = topology.groupby("leaf")["server"].nunique()
        servers = self.phases.drop_duplicates("group").set_index("group")["servers"].astype(str).str.split("|").map(len)
        grows = np.array([len(lv) == 1 and math.ceil(servers[g] * n / dp) > per_leaf.get(next(iter(lv)), 0)
                          for g, lv in zip(self.rings, self._ring_leaves(topology, pairs))], bool)
        info["rings_onto_spines"] = int(grows.sum())
        if not grows.any() or self.bytes is None:
            return out, info
        spine = np.nan
        if switches is not None and "tier_median_gbps" in switches.columns:
            sp = switches[(switches["kind"] == "switch") & (switches["tier"] == "spine")]
            spine = float(np.nanmedian(pd.to_numeric(sp["tier_median_gbps"], errors="coerce"))) if len(sp) else np.nan
        members = self._ring_members(pairs)
        n_pairs = np.array([len(_ring_pairs(members[g], pairs, self.job_id)) if g in members else 0 for g in self.rings])
        if not np.isfinite(spine) or not (n_pairs[grows] > 0).all():
            info["reference"] = "each ring's own rate (no spine tier median or DP pairs to cap it with)"
            return out, info
        rate = self.bytes / np.maximum(n_pairs[self.ring_of], 1) / np.maximum(coll, 1e-12) / 1e9  # GB/s per pair
        capped = grows[self.ring_of] & (rate * (1 - TOLERANCE) > spine)
        out = np.where(capped, out * rate / spine, out)
        info.update(reference="each ring's own rate; the spine tier's median where a ring grows onto the spines",
                    spine_median_gbps=round(spine, 3), capped=int(capped.sum()))
        return out, info


def element_kind(name: str) -> str:
    """``"link"`` for a link as ``switches.csv`` names it (``A>B``), else ``"switch"``."""
    return "link" if ">" in name else "switch"


def contention(graphs: dict[str, ReplayGraph], moved: str, name: str, rep: dict) -> tuple[dict[str, float], dict]:
    """``move-job:JOB@NAME``: per job, the gain in rate its collectives through the switch (or link ``A>B``) get
    when ``moved`` takes its traffic off it; and a note for the summary.

    The jobs whose collectives through NAME were slowed shared it: each one's *share* is the median fraction of
    its healthy rate it ran at there (:meth:`ReplayGraph.heal_switch`), and the switch's capacity, in those
    units, is their sum. They are taken to share it all the time it was slow (their transfers overlapping), a
    fluid share: what the capture's per-instant overlap adds is not modelled. The moved job is healed (its
    traffic on a healthy path); the others split what it leaves, each ``capacity / (capacity - its share)``
    times faster there, up to its healthy rate.
    """
    if moved not in graphs:
        known = ", ".join(sorted(graphs)[:10])
        raise ValueError(f"no job {moved!r} is modelled in this replay (jobs: {known})")
    shares = {}
    for job, g in graphs.items():
        info = g.heal_switch(name, rep["switches"], rep["topology"], g.coll, g.work, kind=element_kind(name), pairs=rep["pairs"])[2]
        if info["share"] is not None:
            shares[job] = info["share"]
    capacity = sum(shares.values())
    left = capacity - shares.get(moved, 0.0)
    gains = {job: np.inf if job == moved else capacity / left if left > 0 else 1.0 for job in graphs}
    note = {"shares": {j: round(s, 4) for j, s in shares.items()}, "capacity": round(capacity, 4)}
    return gains, note
