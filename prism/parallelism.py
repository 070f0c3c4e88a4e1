"""DP/PP identification per GPU pair (LLMPrism Algorithm 2, and beyond).

The paper's rule, per GPU pair:

1. the inter-arrival times of the pair's flows go through BOCD, whose
   change points split the pair's traffic into training steps;
2. a pipeline-parallel (PP) pair sends one message size per step (the
   activations, and their gradients back), while a data-parallel (DP) pair's
   collective is cut into buckets and chunks of several sizes; so the mode,
   over steps, of the number of distinct sizes says PP (1) or DP (>1);
3. refinement: a pair whose two ends lie in one connected component of the
   DP graph becomes DP.

Refinement cannot fix a DP pair that looks uniform when its ring is broken
twice, nor one in a DP group of two. What we add (each can be switched off,
and the README's accuracy table shows what each is worth):

- **one-way traffic** (``use_direction``): a ring all-reduce sends each chunk
  one way around the ring, so a ring edge carries traffic in one direction
  only (DP > 2); a PP pair always carries activations forward and their
  gradients back. A pair whose flows all go one way is DP.
- **recurring sizes** (``size_repeats``, ``min_size_share``): a size counts
  for a pair only if it occurs at least twice *and* in at least 1% of the
  pair's flows. DP bucket and chunk sizes recur every step (the rarest, a
  last bucket's remainder, is about 5% of a DP pair's flows); the halves of
  a split PP message are one-offs (about 1 in 2,000). Where BOCD cannot split
  a PP pair's steps (a 1F1B pipeline has no distinctive gap between steps)
  they would add up to "several sizes", and over a long window two splits
  even repeat a size by chance, so a bare count of two is not enough.
- **burstiness** (``use_burstiness``): a collective is a burst per step, so
  the median gap between a DP pair's flows is a tiny fraction of the mean
  gap (about 0.02); PP flows are spread through the step (about 0.5). This
  needs no step splitting and tells DP from PP where every DP message has
  one size and the ring has two members (no direction signal).
- **job DP sizes** (``use_job_sizes``): a pair labelled PP whose sizes are all
  sizes seen on the job's DP pairs, and none of them seen on another two-way
  pair called PP, is DP: its "one size" is a DP chunk.

After the additions, refinement runs again over the larger DP graph.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from .changepoint import BOCD

__all__ = ["ParallelismClassifier", "pair_steps", "refine_by_dp_components"]

#: Flows of one pair starting closer than this are one event (e.g. both
#: directions of a two-member ring start together).
EVENT_GAP_NS = 2_000


def _event_gaps(pair_id: np.ndarray, start: np.ndarray, event_gap_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaps that open a new event within a pair.

    Flows sorted by (pair, start). Returns ``(pos, gap)``: flow ``pos + 1``
    opens an event, ``gap`` nanoseconds after the flow before it.
    """
    gap = np.diff(start).astype(np.float64)
    pos = np.flatnonzero((pair_id[1:] == pair_id[:-1]) & (gap >= event_gap_ns))
    return pos, gap[pos]


def pair_steps(
    order_key: np.ndarray,
    start: np.ndarray,
    detector: BOCD,
    min_gap_ratio: float = 4.0,
    event_gap_ns: int = EVENT_GAP_NS,
) -> np.ndarray:
    """Step index of every flow within its pair, from BOCD over inter-arrivals.

    Parameters
    ----------
    order_key : int array
        Pair key per flow; flows must be sorted by (key, start).
    start : int array
        Flow start times (ns), same order.
    detector : BOCD
    min_gap_ratio : float
        A change point starts a new step only where the gap that opens it is
        this many times the median gap of the segment before: BOCD also
        marks the return from the inter-step gap to the burst, which is not
        a step boundary.
    event_gap_ns : int
        Flows starting closer than this are one event (e.g. both directions
        of a two-member ring start together). Their zero gaps would make the
        within-burst signal bimodal and hide the step boundaries.

    Returns
    -------
    int array
        Step number per flow, counted from 0 within each pair.

    Notes
    -----
    The signal is ``log(gap)`` between events: gaps inside a collective
    burst and between steps differ by orders of magnitude, which the log
    turns into a level shift that BOCD sees.
    """
    n = len(start)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    bounds = np.flatnonzero(np.diff(order_key)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [n]])
    ev_pos, ev_gap = _event_gaps(order_key, start, event_gap_ns)  # flow ev_pos + 1 opens an event
    ev_pair = np.searchsorted(starts, ev_pos + 1, side="right") - 1
    ev_bounds = np.searchsorted(ev_pair, np.arange(len(starts) + 1))
    signal = np.log(ev_gap)
    series = [signal[ev_bounds[i] : ev_bounds[i + 1]] for i in range(len(starts))]
    bkps = detector.fit_many(series)
    new_step = np.zeros(n, dtype=bool)
    for i, bk in enumerate(bkps):
        ser = series[i]
        prev = 0
        for j in bk[:-1]:
            # event j opens a new segment; a step boundary if it is a big gap
            med = np.median(ser[prev:j]) if j > prev else ser[j]
            if ser[j] - med >= np.log(min_gap_ratio):
                new_step[ev_pos[ev_bounds[i] + j] + 1] = True
            prev = j
    # cumulative count of step starts, restarted at each pair
    step = np.cumsum(new_step)
    return step - step[starts].repeat(ends - starts)


def refine_by_dp_components(a: np.ndarray, b: np.ndarray, is_dp: np.ndarray) -> np.ndarray:
    """LLMPrism's refinement: a pair inside one component of the DP graph is DP.

    Parameters
    ----------
    a, b : int arrays
        Pair endpoints (node ids).
    is_dp : bool array
        Current labels.

    Returns
    -------
    bool array
        New labels (a superset of ``is_dp``).

    Notes
    -----
    One connected-components pass: O(nodes + pairs).

    Examples
    --------
    A ring 0-1-2-3-0 with one edge labelled PP is repaired:

    >>> refine_by_dp_components(np.array([0, 1, 2, 3]), np.array([1, 2, 3, 0]),
    ...                         np.array([True, True, True, False])).tolist()
    [True, True, True, True]
    """
    if len(a) == 0:
        return is_dp.copy()
    nodes, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    ia, ib = inv[: len(a)], inv[len(a) :]
    g = coo_matrix((np.ones(int(is_dp.sum())), (ia[is_dp], ib[is_dp])), shape=(len(nodes), len(nodes)))
    _, comp = connected_components(g, directed=False)
    # a node with no DP edge is its own component, so PP pairs between such
    # nodes are left alone
    has_dp = np.zeros(len(nodes), dtype=bool)
    has_dp[ia[is_dp]] = True
    has_dp[ib[is_dp]] = True
    return is_dp | (has_dp[ia] & has_dp[ib] & (comp[ia] == comp[ib]))


def _burstiness(pair_id: np.ndarray, start: np.ndarray, n_pairs: int, event_gap_ns: int):
    """Median / mean gap between a pair's flow events, and the event count.

    Flows sorted by (pair, start), ``pair_id`` numbering pairs 0..n-1.
    Medians per pair come from one sort of the gaps, not a group-by.
    """
    pos, gv = _event_gaps(pair_id, start, event_gap_ns)
    gk = pair_id[pos + 1]
    cnt = np.bincount(gk, minlength=n_pairs)
    mean = np.bincount(gk, weights=gv, minlength=n_pairs) / np.maximum(cnt, 1)
    order = np.lexsort((gv, gk))
    sv = gv[order]
    first = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    has = cnt > 0
    lo = first + (cnt - 1) // 2
    hi = first + cnt // 2
    med = np.zeros(n_pairs)
    med[has] = (sv[lo[has]] + sv[hi[has]]) / 2
    ratio = np.where(has & (mean > 0), med / np.where(mean > 0, mean, 1), 1.0)
    return ratio, cnt + 1


class ParallelismClassifier:
    """Label each communicating GPU pair DP or PP.

    Parameters
    ----------
    detector : BOCD, optional
        Step splitter (default ``BOCD()``).
    refine : bool, default True
        The paper's DP-component refinement.
    use_direction : bool, default True
        One-way pairs are DP (ring edges); see the module docstring.
    use_job_sizes : bool, default True
        PP-looking pairs whose sizes are the job's DP sizes are DP.
    size_repeats : int, default 2
        Occurrences a size needs in the window to count (1 = the paper).
    min_size_share : float, default 0.01
        Share of the pair's flows a size needs to count (0 = the paper).
    use_burstiness : bool, default True
        PP-looking pairs whose median/mean inter-event gap is at most
        ``burst_ratio`` are DP.
    burst_ratio : float, default 0.1
    min_events_burst : int, default 16
        Fewer events than this say nothing about burstiness.
    one_way_share : float, default 0.98
        Share of a pair's flows in one direction that counts as one-way.
    min_flows_one_way : int, default 8
        Fewer flows than this say nothing about direction.
    event_gap_ns : int, default 2000
        Flows of a pair starting closer than this are one event, for step
        splitting and burstiness alike.

    Attributes
    ----------
    pairs_ : pandas.DataFrame
        After ``fit``, one row per unordered pair: ``a, b, job, flows,
        fwd_share, steps, size_mode, burst, events, one_way, base_dp,
        refined_dp, dp``.
    """

    def __init__(
        self,
        detector: BOCD | None = None,
        refine: bool = True,
        use_direction: bool = True,
        use_job_sizes: bool = True,
        size_repeats: int = 2,
        min_size_share: float = 0.01,
        use_burstiness: bool = True,
        burst_ratio: float = 0.1,
        min_events_burst: int = 16,
        one_way_share: float = 0.98,
        min_flows_one_way: int = 8,
        event_gap_ns: int = EVENT_GAP_NS,
    ):
        self.detector = detector if detector is not None else BOCD()
        self.refine = refine
        self.use_direction = use_direction
        self.use_job_sizes = use_job_sizes
        self.size_repeats = int(size_repeats)
        self.min_size_share = float(min_size_share)
        self.use_burstiness = use_burstiness
        self.burst_ratio = burst_ratio
        self.min_events_burst = min_events_burst
        self.one_way_share = one_way_share
        self.min_flows_one_way = min_flows_one_way
        self.event_gap_ns = int(event_gap_ns)

    @classmethod
    def paper(cls, refine: bool = True, **kw) -> "ParallelismClassifier":
        """LLMPrism's Algorithm 2 as published (with or without refinement)."""
        return cls(refine=refine, use_direction=False, use_job_sizes=False, size_repeats=1, min_size_share=0.0, use_burstiness=False, **kw)

    def fit(self, src: np.ndarray, dst: np.ndarray, start: np.ndarray, size: np.ndarray, job_of: np.ndarray) -> "ParallelismClassifier":
        """Classify from GPU flows.

        Parameters
        ----------
        src, dst : int arrays
            NIC index of each flow's ends.
        start, size : int arrays
            Flow start (ns) and size (bytes).
        job_of : int array
            Job label per NIC (from :class:`prism.jobs.JobRecognizer`).

        Notes
        -----
        One sort of the flows and one ``np.unique`` over packed (pair, step,
        size) keys; the rest works on the unique triples. BOCD runs over all
        pairs at once (:meth:`BOCD.fit_many`).
        """
        src, dst = np.asarray(src), np.asarray(dst)
        n_nodes = int(max(src.max(initial=0), dst.max(initial=0))) + 1
        # the per-flow arrays dominate memory: build each once, free early
        forward = src <= dst
        key = np.minimum(src, dst).astype(np.int64)
        key *= n_nodes
        key += np.maximum(src, dst)
        order = np.lexsort((start, key))
        key = key[order]
        forward = forward[order]
        start_s = np.asarray(start)[order]
        size_s = np.asarray(size)[order]
        del order
        step = pair_steps(key, start_s, self.detector, event_gap_ns=self.event_gap_ns)
        # One pass over the flows: unique (pair, step, size) triples with
        # counts, packed into one int64. Everything after works on the
        # triples, which are far fewer than the flows.
        new_pair = np.ones(len(key), dtype=bool)
        new_pair[1:] = key[1:] != key[:-1]
        pair_id = np.cumsum(new_pair) - 1
        pair_keys = key[new_pair]
        size_code, size_values = pd.factorize(size_s)
        n_sz = max(len(size_values), 1)
        n_st = int(step.max()) + 1 if len(step) else 1
        packed, counts = np.unique((pair_id * n_st + step) * n_sz + size_code, return_counts=True)
        del new_pair, size_code
        t_size = packed % n_sz
        t_pair = packed // n_sz // n_st
        t_step = packed // n_sz % n_st
        # how often each (pair, size) occurs in the window, and the pair's flows
        ps, ps_inv = np.unique(t_pair * n_sz + t_size, return_inverse=True)
        occurrences = np.bincount(ps_inv, weights=counts)[ps_inv]
        pair_flows = np.bincount(t_pair, weights=counts, minlength=len(pair_keys))
        keep = (occurrences >= self.size_repeats) & (occurrences >= self.min_size_share * pair_flows[t_pair])
        # distinct counted sizes per (pair, step), then the mode over steps;
        # ties go to the smaller count (PP)
        pst, n_sizes = np.unique(t_pair[keep] * n_st + t_step[keep], return_counts=True)
        mode = pd.DataFrame({"pair": pst // n_st, "n": n_sizes}).value_counts().rename("cnt").reset_index()
        mode = mode.sort_values(["pair", "cnt", "n"], ascending=[True, False, True]).drop_duplicates("pair")
        n_pairs = len(pair_keys)
        fwd = np.bincount(pair_id, weights=forward, minlength=n_pairs)
        pairs = pd.DataFrame({"flows": pair_flows.astype(np.int64), "fwd_share": fwd / pair_flows}, index=pd.Index(pair_keys, name="key"))
        pairs["steps"] = np.bincount(pst // n_st, minlength=n_pairs)
        size_mode = np.ones(n_pairs, dtype=np.int64)
        size_mode[mode["pair"].to_numpy()] = mode["n"].to_numpy()
        pairs["size_mode"] = size_mode
        pairs["burst"], pairs["events"] = _burstiness(pair_id, start_s, n_pairs, self.event_gap_ns)
        pair_sizes = pd.DataFrame({"key": pair_keys[ps // n_sz], "size": size_values[ps % n_sz]})
        del packed, counts, t_size, t_pair, t_step, ps, ps_inv, occurrences
        pairs["a"] = pair_keys // n_nodes
        pairs["b"] = pair_keys % n_nodes
        job_of = np.asarray(job_of)
        pairs["job"] = job_of[pairs["a"].to_numpy()]
        pairs["one_way"] = (np.maximum(pairs["fwd_share"], 1 - pairs["fwd_share"]) >= self.one_way_share) & (pairs["flows"] >= self.min_flows_one_way)
        a, b = pairs["a"].to_numpy(), pairs["b"].to_numpy()
        base = pairs["size_mode"].to_numpy() > 1
        pairs["base_dp"] = base
        dp = refine_by_dp_components(a, b, base) if self.refine else base.copy()
        pairs["refined_dp"] = dp
        if self.use_direction:
            dp = dp | pairs["one_way"].to_numpy()
        if self.use_burstiness:
            dp = dp | ((pairs["burst"].to_numpy() <= self.burst_ratio) & (pairs["events"].to_numpy() >= self.min_events_burst))
        if self.use_job_sizes:
            dp = dp | self._job_size_match(pair_sizes, pairs, dp)
        if self.refine and (self.use_direction or self.use_job_sizes or self.use_burstiness):
            dp = refine_by_dp_components(a, b, dp)
        pairs["dp"] = dp
        self.pairs_ = pairs.reset_index(drop=True)
        return self

    def _job_size_match(self, pair_sizes: pd.DataFrame, pairs: pd.DataFrame, dp: np.ndarray) -> np.ndarray:
        """PP-labelled pairs whose every size is a DP size of the job and no PP size.

        ``pair_sizes``: the distinct (key, size) of the window.
        """
        info = pd.DataFrame({"key": pairs.index.to_numpy(), "job": pairs["job"].to_numpy(), "dp": dp, "two_way": ~pairs["one_way"].to_numpy()})
        sizes = pair_sizes.merge(info, on="key")
        dp_sizes = set(zip(sizes.loc[sizes.dp, "job"], sizes.loc[sizes.dp, "size"]))
        pp_sizes = set(zip(sizes.loc[~sizes.dp & sizes.two_way, "job"], sizes.loc[~sizes.dp & sizes.two_way, "size"]))
        cand = sizes[~sizes.dp]
        js = list(zip(cand["job"], cand["size"]))
        in_dp = np.fromiter((x in dp_sizes for x in js), dtype=bool, count=len(js))
        in_pp = np.fromiter((x in pp_sizes for x in js), dtype=bool, count=len(js))
        # the PP sizes above include this pair's own: a pair counts as PP
        # evidence only if another PP pair of the job shares its size
        own = cand.groupby(["job", "size"])["key"].transform("nunique").to_numpy()
        shared_pp = in_pp & (own > 1)
        ok = pd.Series(in_dp & ~shared_pp).groupby(cand["key"].to_numpy()).all()
        return ok.reindex(pairs.index, fill_value=False).to_numpy()

    def predict(self) -> pd.DataFrame:
        """``a, b, job, type`` per pair (NIC indices; ``type`` is ``DP`` or ``PP``)."""
        p = self.pairs_
        return pd.DataFrame({"a": p["a"], "b": p["b"], "job": p["job"], "type": np.where(p["dp"], "DP", "PP")})
