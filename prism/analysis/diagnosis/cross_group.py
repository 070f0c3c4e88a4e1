"""Cross-group diagnosis: pipeline stages (and their servers) that compute slowly.

The network shows when each pipeline stage receives its first activation of
a step and when it sends its first output, so it shows that stage's compute
time for the first microbatch, with no network time in it:

- stage 0: first send to stage 1, minus the step's start (the end of the
  previous collective; the optimizer time in between is the same for all);
- a middle stage: first send onward, minus the end of the first arrival;
- the last stage: first gradient sent back, minus the first arrival (its
  forward and backward).

The same stage of every pipeline of a job does the same work, so those
times are compared across pipelines, step by step. A degraded link cannot
make a stage look slow here (transfer time is not in the measure); a slow
GPU, server or thermal throttling does. Servers whose stages are slower
than their peers for long enough, and by enough, are reported once, with
the step where it began. "Enough" is measured against the job's own normal
spread: real jobs have passing imbalance (sequence lengths differ between
micro-batches), so a server lagging three steps in a row in a job where one
cell in twenty lags by chance is not news, and a 1.2x lag in a job whose
servers routinely vary by 1.1x is not either. Where the chance rate is
high, a server still counts if, from its run's start on, it keeps lagging
and its median lag stands out among all servers' medians over those steps
(the passing imbalance averages out; a straggler's does not).

Baseline: the lower quartile of the peers, not the median: a slow server
often holds half a job's replicas of a stage (tensor parallel ranks share
servers), and the median of two equal groups is no baseline.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from prism.analysis.diagnosis.anomalies import ANOMALY_COLUMNS, empty_anomalies

__all__ = ["StageLagDiagnoser", "pipeline_stages"]

#: the run of steps a slow_group explanation ends with (see :meth:`StageLagDiagnoser.renumber`)
_SPAN_RE = re.compile(r"steps (\d+)-(\d+) \((\d+) steps\)$")


def _span(first: int, n: int) -> str:
    return f"steps {first}-{first + n - 1} ({n} steps)"


def pipeline_stages(first_flows: pd.DataFrame) -> pd.DataFrame:
    """Order every pipeline's GPUs into stages.

    Parameters
    ----------
    first_flows : DataFrame
        ``job_id, step, src, dst, start_ns, end_ns``: the first flow of each
        directed PP pair in each step (NIC indices).

    Returns
    -------
    DataFrame
        ``node, job_id, pipeline, stage, stages, prev, next`` for the GPUs of
        pipelines that form a chain (``prev``/``next``: -1 at the ends).

    Notes
    -----
    Pipelines are the connected components of the PP pairs. Stage 0 is the
    chain end whose flow opens most steps (the first forward). The walk
    along each chain is a Python loop over GPUs in pipelines, not flows.
    """
    cols = ["node", "job_id", "pipeline", "stage", "stages", "prev", "next"]
    if first_flows.empty:
        return pd.DataFrame(columns=cols)
    from prism.analysis.timeline import parallel_groups

    a, b = first_flows["src"].to_numpy(), first_flows["dst"].to_numpy()
    n = int(max(a.max(), b.max())) + 1
    comp = parallel_groups(a, b, n)
    ff = first_flows.assign(pipeline=comp[a])
    opener = ff.loc[ff.groupby(["job_id", "step", "pipeline"])["start_ns"].idxmin()]
    stage0 = _most_common(opener["pipeline"].to_numpy(), opener["src"].to_numpy())
    job_of = ff.groupby("pipeline")["job_id"].first()
    und = pd.DataFrame({"x": np.minimum(a, b), "y": np.maximum(a, b), "pipeline": comp[a]}).drop_duplicates()
    adj: dict[int, list[int]] = {}
    for x, y in zip(und["x"].to_numpy(), und["y"].to_numpy()):
        adj.setdefault(int(x), []).append(int(y))
        adj.setdefault(int(y), []).append(int(x))
    rows = []
    pl: Any  # a pipeline number (the stubs type a Series' labels as any hashable)
    for pl, s0 in stage0.items():
        s0 = int(s0)
        if len(adj.get(s0, [])) != 1:
            continue  # not the end of a chain
        chain, prev = [s0], -1
        while True:
            nxt = [v for v in adj[chain[-1]] if v != prev]
            if len(nxt) != 1 or len(adj[chain[-1]]) > 2 or nxt[0] in chain:
                break
            prev = chain[-1]
            chain.append(nxt[0])
        if len(adj[chain[-1]]) > 2 or len(chain) != (comp == pl).sum():
            continue  # a branch: not a pipeline chain
        P = len(chain)
        for i, node in enumerate(chain):
            rows.append((node, job_of[pl], int(pl), i, P, chain[i - 1] if i else -1, chain[i + 1] if i + 1 < P else -1))
    return pd.DataFrame(rows, columns=cols)


def _most_common(group: np.ndarray, value: np.ndarray) -> pd.Series:
    """The most frequent value per group (ties: the one seen first), indexed by group in ascending order.

    What ``groupby(group).agg(lambda s: s.value_counts().idxmax())`` gives,
    without a Python call per group (one per pipeline and window in the
    daemon).

    >>> _most_common(np.array([1, 1, 1, 0]), np.array([5, 6, 6, 7])).to_dict()
    {0: 7, 1: 6}
    """
    pairs = pd.DataFrame({"g": group, "v": value}).groupby(["g", "v"], sort=False).size()  # first-seen order
    g, v, n = pairs.index.get_level_values(0).to_numpy(), pairs.index.get_level_values(1).to_numpy(), pairs.to_numpy()
    o = np.lexsort((-n, g))  # by group, most frequent first; stable: ties keep first-seen order
    first = np.r_[True, g[o][1:] != g[o][:-1]]
    return pd.Series(v[o][first], index=g[o][first])


class StageLagDiagnoser:
    """Find servers whose pipeline stages compute slower than their peers.

    Parameters
    ----------
    min_excess : float, default 0.10
        A lagging stage takes at least this much longer than the lower
        quartile of its peers.
    z : float, default 6.0
        ... and this many robust spreads (1.4826 MAD of the faster half).
    min_rel_spread : float, default 0.01
        Floor of the spread, as a share of the baseline.
    min_steps : int, default 3
        Lagging steps in a row before a server is reported.
    min_peers : int, default 4
        Pipelines a stage needs to be compared.
    alpha : float, default 1e-3
        Persistence: a run of lagging steps is reported only if a run that
        long would occur by chance anywhere in the job with at most this
        probability, given how often the job's servers lag by chance
        (``base_rate ** steps * cells <= alpha``).
    min_base_rate : float, default 0.005
        Floor of that chance rate (a perfectly regular job still has one).
    spread_factor : float, default 4.0
        Effect size: the run's median ratio must exceed 1 + this many robust
        spreads of the job's per-server ratios (and ``min_excess``).
    min_tail_steps, min_tail_share : int, float, default 6, 0.75
        Where chance lags are common, a server still counts if, from its
        run's start to the window's end (at least ``min_tail_steps`` steps,
        lagging in ``min_tail_share`` of them), its median lag stands out
        among all servers' (robust z >= ``z``).

    Attributes
    ----------
    needed_ : DataFrame
        Per job: ``base_rate``, the ``steps`` in a row and the ``min_ratio``
        a lagging server needs.
    """

    def __init__(self, min_excess: float = 0.10, z: float = 6.0, min_rel_spread: float = 0.01, min_steps: int = 3, min_peers: int = 4,
                 alpha: float = 1e-3, min_base_rate: float = 0.005, spread_factor: float = 4.0, min_tail_steps: int = 6,
                 min_tail_share: float = 0.75):
        self.min_tail_steps = int(min_tail_steps)
        self.min_tail_share = float(min_tail_share)
        self.alpha = float(alpha)
        self.min_base_rate = float(min_base_rate)
        self.spread_factor = float(spread_factor)
        self.min_excess = float(min_excess)
        self.z = float(z)
        self.min_rel_spread = float(min_rel_spread)
        self.min_steps = int(min_steps)
        self.min_peers = int(min_peers)

    def fit(self, first_flows: pd.DataFrame, steps: pd.DataFrame, server_of: np.ndarray) -> "StageLagDiagnoser":
        """Compare stages.

        Parameters
        ----------
        first_flows : DataFrame
            See :func:`pipeline_stages`.
        steps : DataFrame
            ``job_id, step, start_ns`` of whole steps.
        server_of : array
            Server name per NIC index.
        """
        self.stages_ = st = pipeline_stages(first_flows)
        self.lag_ = pd.DataFrame()
        if st.empty:
            self.anomalies_ = empty_anomalies()
            return self
        edge = first_flows.set_index(["job_id", "step", "src", "dst"])[["start_ns", "end_ns"]]
        step_start = steps.set_index(["job_id", "step"])["start_ns"]
        # one row per (step, stage GPU); "send" is the first output, "recv" the first input
        grid = first_flows[["job_id", "step"]].drop_duplicates().merge(st, on="job_id")
        last = grid["stage"] == grid["stages"] - 1
        send_to = np.where(last, grid["prev"], grid["next"])
        send = edge["start_ns"].reindex(pd.MultiIndex.from_arrays([grid["job_id"], grid["step"], grid["node"], send_to])).to_numpy(dtype=np.float64)
        recv = edge["end_ns"].reindex(pd.MultiIndex.from_arrays([grid["job_id"], grid["step"], grid["prev"], grid["node"]])).to_numpy(dtype=np.float64)
        s0 = step_start.reindex(pd.MultiIndex.from_arrays([grid["job_id"], grid["step"]])).to_numpy(dtype=np.float64)
        grid["compute_ns"] = send - np.where(grid["stage"] == 0, s0, recv)
        grid = grid[np.isfinite(grid["compute_ns"]) & (grid["compute_ns"] > 0)]
        key = ["job_id", "step", "stage"]
        g = grid.groupby(key)["compute_ns"]
        idx = pd.MultiIndex.from_frame(grid[key])
        grid = grid.assign(base=g.quantile(0.25).reindex(idx).to_numpy(), peers=g.transform("size"), med=g.transform("median"))
        fast = grid[grid["compute_ns"] <= grid["med"]]
        mad = (fast["compute_ns"] - fast.groupby(key)["compute_ns"].transform("median")).abs().groupby([fast[k] for k in key]).median()
        grid["spread"] = np.maximum(1.4826 * mad.reindex(pd.MultiIndex.from_frame(grid[key])).to_numpy(), self.min_rel_spread * grid["base"].to_numpy())
        grid["ratio"] = grid["compute_ns"] / grid["base"]
        grid["z"] = (grid["compute_ns"] - grid["base"]) / grid["spread"]
        grid = grid[grid["peers"] >= self.min_peers]
        grid["server"] = np.asarray(server_of)[grid["node"].to_numpy()]
        per_server = grid.groupby(["job_id", "server", "step"]).agg(ratio=("ratio", "median"), z=("z", "median"), stage=("stage", "min")).reset_index()
        per_server["lag"] = (per_server["ratio"] >= 1 + self.min_excess) & (per_server["z"] >= self.z)
        return self.diagnose(per_server, steps)

    def diagnose(self, per_server: pd.DataFrame, steps: pd.DataFrame) -> "StageLagDiagnoser":
        """The anomalies of a per-server lag table (``lag_``), without the flows.

        :meth:`fit` ends here. Every row of the table is one step's, so the
        tables of several fits over consecutive time slices of a job,
        concatenated (steps numbered once), diagnose as one fit over the
        whole job would (:func:`prism.analysis.slices.analyse_sliced`).

        Parameters
        ----------
        per_server : DataFrame
            ``job_id, server, step, ratio, z, stage, lag``.
        steps : DataFrame
            ``job_id, step, start_ns`` of the same steps.
        """
        self.lag_ = per_server
        if per_server is None or per_server.empty:
            self.anomalies_ = empty_anomalies()
            return self
        self.anomalies_ = self._runs(per_server, steps.set_index(["job_id", "step"])["start_ns"])
        return self

    def _runs(self, per_server: pd.DataFrame, step_start: pd.Series) -> pd.DataFrame:
        # The job's own spread: how often any server lags by chance (real
        # jobs have passing imbalance, e.g. sequence lengths), and how far.
        job = per_server.groupby("job_id")
        base_rate = job["lag"].mean().clip(lower=self.min_base_rate)
        cells = job.size()
        ratio = per_server["ratio"]
        mad = (ratio - job["ratio"].transform("median")).abs().groupby(per_server["job_id"]).median()
        #: per job: steps in a row a server must lag before it is news, and by how much
        self.needed_ = pd.DataFrame({
            "base_rate": base_rate,
            "steps": np.maximum(self.min_steps, np.ceil(np.log(self.alpha / cells) / np.log(base_rate))).astype(int),
            "min_ratio": 1 + np.maximum(self.min_excess, self.spread_factor * 1.4826 * mad),
        })
        lag = per_server[per_server["lag"]].sort_values(["job_id", "server", "step"])
        if lag.empty:
            return empty_anomalies()
        # runs of consecutive steps per (job, server)
        new_run = (lag["job_id"] != lag["job_id"].shift()) | (lag["server"] != lag["server"].shift()) | (lag["step"] != lag["step"].shift() + 1)
        lag = lag.assign(run=new_run.cumsum())
        runs = lag.groupby("run").agg(job_id=("job_id", "first"), server=("server", "first"), step=("step", "first"), last=("step", "last"), n=("step", "size"), ratio=("ratio", "median"), stage=("stage", "first"))
        need = self.needed_.reindex(runs["job_id"])
        rare = (runs["n"].to_numpy() >= need["steps"].to_numpy()) & (runs["ratio"].to_numpy() >= need["min_ratio"].to_numpy())
        persistent = np.zeros(len(runs), dtype=bool)
        persistent[~rare] = self._persistent_outliers(runs[~rare], per_server)
        runs = runs[rare | persistent]
        rows = []
        for r in runs.itertuples(index=False):
            start = int(step_start.get((r.job_id, r.step), 0))
            rows.append(("slow_group", r.job_id, int(r.step), start, r.server, round(float(r.ratio), 4),
                         f"{r.server}: pipeline stage {int(r.stage)} computes {r.ratio:.2f}x its peers' time, {_span(int(r.step), int(r.n))}"))
        return pd.DataFrame(rows, columns=ANOMALY_COLUMNS)

    @staticmethod
    def renumber(explanation: str, first: int) -> str:
        """A ``slow_group`` explanation with its run of steps numbered from ``first``.

        The daemon diagnoses a window whose steps are numbered from its
        start; the run's steps keep their count, the numbers become the
        job's own.

        >>> StageLagDiagnoser.renumber("srv1: pipeline stage 2 computes 1.40x its peers' time, steps 3-9 (7 steps)", 30)
        "srv1: pipeline stage 2 computes 1.40x its peers' time, steps 30-36 (7 steps)"
        """
        m = _SPAN_RE.search(explanation)
        return explanation if m is None else explanation[: m.start()] + _span(first, int(m.group(3)))

    def _persistent_outliers(self, runs: pd.DataFrame, per_server: pd.DataFrame) -> np.ndarray:
        """Runs whose server's typical lag over the run stands out among all servers' over the same steps.

        Where passing imbalance makes many servers lag now and then (a high
        base rate), a straggler still differs: it lags *every* step, so its
        median ratio over the run is far above the other servers' medians
        over the same steps, whose spread the passing imbalance averages
        out. Measured from the run's start to the window's end (at least
        ``min_tail_steps``, lagging in ``min_tail_share`` of them): robust z
        (MAD) of the per-server medians, at least ``z``.
        """
        ok = np.zeros(len(runs), dtype=bool)
        r: Any  # a row: the stubs type its fields as any scalar
        for i, r in enumerate(runs.itertuples(index=False)):
            if r.n < self.min_steps:
                continue
            # from the run's start to the window's end, not the run alone: a
            # run picked because it lagged is biased; what follows it is not
            sub = per_server[(per_server["job_id"] == r.job_id) & (per_server["step"] >= r.step)]
            own = sub[sub["server"] == r.server]
            if len(own) < self.min_tail_steps or own["lag"].mean() < self.min_tail_share:
                continue
            med = sub.groupby("server")["ratio"].median()
            if len(med) < self.min_peers:
                continue
            center = float(med.median())
            spread = max(1.4826 * float((med - center).abs().median()), self.min_rel_spread * center)
            ok[i] = med[r.server] >= 1 + self.min_excess and (med[r.server] - center) / spread >= self.z
        return ok

    def predict(self) -> pd.DataFrame:
        """Anomaly rows (:data:`prism.analysis.diagnosis.ANOMALY_COLUMNS`)."""
        return self.anomalies_
