"""DP/PP (and EP/CP) identification per GPU pair.

Two classifiers:

- :class:`ParallelismClassifier` (the default) decides from several
  independent signals, byte direction, the job's ring size, episode timing,
  two-way symmetry and pipeline structure, and says how sure it is; see its
  docstring.
- :class:`SizeRuleClassifier`, the baseline: LLMPrism's Algorithm 2 and our
  earlier additions to it, described below. It is exact on the plain
  synthetic generator and wrong where pipeline pairs carry collectives (the
  embedding and grad-norm all-reduces of real Megatron jobs) or messages of
  varied sizes (``docs/robustness.md``).

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
and docs/accuracy.md shows what each is worth):

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

from typing import Any

import numba
import numpy as np
import pandas as pd

from prism.analysis.changepoint import BOCD
from prism.common.components import connected_components
from prism.common.ordering import order_by, rank_keys

__all__ = ["ParallelismClassifier", "SizeRuleClassifier", "SIGNALS", "UNCERTAIN_BELOW", "pair_steps", "refine_by_dp_components", "pair_episodes", "pair_ids"]

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
    # a node with no DP edge is its own component, so PP pairs between such
    # nodes are left alone
    return is_dp | _inside(a, b, is_dp)


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


class SizeRuleClassifier:
    """LLMPrism's size-count rule (Algorithm 2) and our earlier additions to it.

    Kept as the baseline of the robustness benchmark: exact on the synthetic
    generator it was tuned on, and wrong where PP pairs carry collectives
    (embedding and grad-norm all-reduces) or messages of varied sizes.
    :class:`ParallelismClassifier` is the default.

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
    def paper(cls, refine: bool = True, **kw: Any) -> "SizeRuleClassifier":
        """LLMPrism's Algorithm 2 as published (with or without refinement)."""
        return cls(refine=refine, use_direction=False, use_job_sizes=False, size_repeats=1, min_size_share=0.0, use_burstiness=False, **kw)

    def fit(self, src: np.ndarray, dst: np.ndarray, start: np.ndarray, size: np.ndarray, job_of: np.ndarray,
            end: np.ndarray | None = None) -> "SizeRuleClassifier":
        """Classify from GPU flows (``end`` is accepted and not used).

        Parameters
        ----------
        src, dst : int arrays
            NIC index of each flow's ends.
        start, size : int arrays
            Flow start (ns) and size (bytes).
        job_of : int array
            Job label per NIC (from :class:`prism.analysis.jobs.JobRecogniser`).

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
        order = order_by([key], start)
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


#: Pairs typed with less confidence than this are reported as uncertain.
UNCERTAIN_BELOW = 0.6

#: The signals :class:`ParallelismClassifier` can do without (ablations).
SIGNALS = ("direction", "ring_job", "timing", "symmetry", "structure", "light")


@numba.njit(cache=True, nogil=True, inline="always")
def _continues(start, busy, merge_ns):  # pragma: no cover - compiled
    """A flow starting at ``start`` continues the episode busy until ``busy``."""
    return start <= busy + merge_ns


@numba.njit(cache=True, nogil=True)
def _new_episode(pair_id, start, end, merge_ns):  # pragma: no cover - compiled
    n = len(start)
    new = np.empty(n, np.bool_)
    busy = np.int64(0)
    for i in range(n):
        if i == 0 or pair_id[i] != pair_id[i - 1] or not _continues(start[i], busy, merge_ns):
            new[i] = True
            busy = end[i]
        else:
            new[i] = False
            if end[i] > busy:
                busy = end[i]
    return new


def pair_ids(src: np.ndarray, dst: np.ndarray, n_nodes: int, directed: bool = False) -> tuple[np.ndarray, int]:
    """Per flow, the number of its pair of NICs, and how many pairs there are.

    Pairs are unordered and numbered in ``(min, max)`` order; ``directed``
    pairs are numbered in ``(src, dst)`` order. Keys run over the m NICs
    present, so :func:`prism.common.ordering.rank_keys` numbers them through a
    table of m^2 marks (O(flows + m^2)) where that range is small, by a
    sort otherwise.
    """
    key, m = _ranked_pair_keys(np.asarray(src), np.asarray(dst), n_nodes, directed)
    pair, pairs = rank_keys(key, m * m)
    return pair, len(pairs)


@numba.njit(cache=True, nogil=True)
def _ranked_pair_keys(src, dst, n_nodes, directed):  # pragma: no cover - compiled
    """Per flow, ``rank(src) * m + rank(dst)`` (unordered: the smaller rank first), ranks over the m NICs present; and m."""
    rank = np.zeros(n_nodes, np.int64)
    for i in range(len(src)):
        rank[src[i]] = 1
        rank[dst[i]] = 1
    m = 0
    for v in range(n_nodes):  # keeps the NICs' order, so the pairs' too
        if rank[v]:
            rank[v] = m
            m += 1
    key = np.empty(len(src), np.int64)
    for i in range(len(src)):
        x, y = rank[src[i]], rank[dst[i]]
        if not directed and y < x:
            x, y = y, x
        key[i] = x * m + y
    return key, m


@numba.njit(cache=True, nogil=True)
def _pair_sums(src, dst, start, end, size, in_time, pair, n_pairs, merge_ns, every_flow):  # pragma: no cover - compiled
    """Per pair of NICs (``pair``: its number per flow): its sums and episodes, in passes over the flows in time order.

    ``in_time`` lists the flows in time order (ties: input order); empty
    when the input already is. Each pair's flows are then met in the
    order a sort by (pair, start) gives, so the floats sum to the same
    values numpy's ``bincount`` over that sort gave, without the sort or
    any sorted copy of a column; each pair's running sums and episode are
    kept aside.
    """
    n = len(src)
    lo_nic = np.empty(n_pairs, np.int64)
    hi_nic = np.empty(n_pairs, np.int64)
    flows = np.zeros(n_pairs, np.int64)
    first = np.empty(n_pairs, np.int64)
    last = np.empty(n_pairs, np.int64)
    big = np.full(n_pairs, -np.inf)
    nbytes = np.zeros(n_pairs)
    fwd_bytes = np.zeros(n_pairs)
    for t in range(n):
        i = in_time[t] if len(in_time) else t
        p = pair[i]
        if flows[p] == 0:
            lo_nic[p], hi_nic[p] = min(src[i], dst[i]), max(src[i], dst[i])
            first[p], last[p] = start[i], end[i]
        elif end[i] > last[p]:
            last[p] = end[i]
        flows[p] += 1
        nbytes[p] += size[i]
        if src[i] <= dst[i]:
            fwd_bytes[p] += size[i]
        if size[i] > big[p]:
            big[p] = size[i]
    # episodes: control messages (a few bytes: the grad-norm all-reduce)
    # open none, a pair's timing is that of the transfers it carries
    episodes = np.zeros(n_pairs)
    both_ways = np.zeros(n_pairs)
    busy = np.zeros(n_pairs, np.int64)
    ep_flows = np.zeros(n_pairs, np.int64)
    ep_fwd = np.zeros(n_pairs, np.int64)
    for t in range(n):
        i = in_time[t] if len(in_time) else t
        p = pair[i]
        if not (every_flow or size[i] >= 0.01 * big[p]):
            continue
        if ep_flows[p] == 0 or not _continues(start[i], busy[p], merge_ns):
            if ep_flows[p]:  # the episode before carried both directions?
                both_ways[p] += 0 < ep_fwd[p] < ep_flows[p]
            episodes[p] += 1
            busy[p], ep_flows[p], ep_fwd[p] = end[i], 0, 0
        elif end[i] > busy[p]:
            busy[p] = end[i]
        ep_flows[p] += 1
        ep_fwd[p] += src[i] <= dst[i]
    for p in range(n_pairs):
        if ep_flows[p]:
            both_ways[p] += 0 < ep_fwd[p] < ep_flows[p]
    return lo_nic, hi_nic, flows, first, last, nbytes, fwd_bytes, episodes, both_ways


def pair_episodes(pair_id: np.ndarray, start: np.ndarray, end: np.ndarray, merge_ns: int = 20_000) -> np.ndarray:
    """Mark the flows that open an *episode*: a run of a pair's flows with no idle gap.

    Parameters
    ----------
    pair_id, start, end : int arrays
        Flows sorted by (pair, start); both directions of a pair together.
    merge_ns : int
        A flow starting within this of the pair's busy end continues the
        episode (collector jitter, back-to-back messages of one transfer).

    Returns
    -------
    bool array
        True where a flow opens an episode.

    Notes
    -----
    One compiled pass, O(n). A pipeline transfer is one episode (its
    messages back to back, or the two directions of a batched exchange); a
    collective is one episode per ring step, or one for the whole operation
    when its ring steps pipeline back to back.

    Examples
    --------
    >>> pair_episodes(np.array([0, 0, 0, 1]), np.array([0, 10, 100_000, 5]), np.array([10, 20, 100_010, 6])).tolist()
    [True, False, True, True]
    """
    return _new_episode(np.asarray(pair_id, np.int64), np.asarray(start, np.int64), np.asarray(end, np.int64), np.int64(merge_ns))


class ParallelismClassifier:
    """Type each communicating GPU pair DP, PP, EP or CP from several independent signals.

    Signals, each robust to what real Megatron traffic adds (collectives on
    pipeline pairs, messages of varied sizes, NVLink-hidden ring edges):

    1. **direction** (bytes, not flows): a ring collective over more than
       two members sends every chunk one way around the ring, so each
       network edge of a DP ring carries its bytes one way; a pipeline pair
       always carries activations forward and their gradients back. The
       grad-norm all-reduce that rides pipeline pairs one way is a few
       bytes and does not move the byte share.
    2. **the job's DP size is one number**: once a job shows one-way ring
       edges (DP > 2), every DP edge of it is one-way, so its two-way pairs
       are pipeline pairs, whatever their sizes.
    3. **timing and symmetry**, for jobs without one-way rings (DP <= 2),
       two votes: a pipeline pair exchanges once or twice per micro-batch,
       spread over the step, a DP pair of two members (or the embedding
       all-reduce between the first and last stage) once or twice per step
       (episodes, :func:`pair_episodes`, per second compared *within the
       job*, or per step where all its pairs keep one pace); and every step
       of a two-member ring goes both ways at once, while a pipeline's
       warm-up forwards and cool-down backwards go one way. A job none of
       whose two-way pairs has a one-way episode has no pipeline to set the
       pace, so there a pair as busy as the busiest is no pipeline vote
       (HSDP, a two-server fine-tuning job: a collective per layer bursts
       as often as a pipeline exchanges).
    4. **structure**: a pair inside one pipeline (a connected chain of
       pipeline pairs) is pipeline traffic, the embedding pair that closes
       the chain included; a pair inside one DP ring is DP (LLMPrism's
       refinement).

    5. **expert and context parallelism** (EP, CP), typed first, and left
       out of the job-level statistics the DP/PP signals above use:

       - EP (a mixture-of-experts all-to-all): a two-way pair inside a
         *clique* of two-way pairs (its two ends share at least
         ``ep_min_common`` two-way partners: every member of an EP group
         exchanges with every other; a pipeline is a chain, a two-member
         ring a single pair), with at least one more vote of three: its
         sizes skewed (coefficient of variation of its flow sizes at least
         ``ep_size_cv``: hot experts), its episodes both ways at once
         (``symmetric_share``: dispatch and combine go every way at once),
         and more episodes than the job's other two-way pairs (``fast_ratio``
         times their 90th percentile: an all-to-all per micro-batch and MoE
         layer, where a pipeline pair exchanges once or twice per
         micro-batch).
       - CP (ring attention): a one-way pair (a ring edge, as a DP ring's)
         that bursts many times per micro-batch: its episode rate at least
         ``fast_ratio`` times the job's two-way pairs' (90th percentile;
         a DP ring bursts once or twice a step), with few flows per episode
         (at most ``cp_max_msgs``: a K/V block per round, rounds separated
         by the block's attention compute; a ring collective's rounds run
         back to back, ``2 (k - 1)`` chunks an episode), between GPUs that
         also take part in a collective at least ``fast_ratio`` times
         slower (their own DP ring, or a two-member DP pair: both ways at
         once): a DP ring whose ring steps show apart, as in real traces,
         bursts as often, but it is its GPUs' slowest collective. A job
         with no two-way pair to compare with has no CP call.

    Every pair gets a ``confidence`` in [0, 1] from the margins of the
    signals that decided it; below ``uncertain_below`` it is reported as
    uncertain rather than a confident guess.

    Parameters
    ----------
    one_way_share : float, default 0.95
        Byte share in one direction that makes a pair one-way.
    min_flows : int, default 8
        Fewer flows than this say nothing about direction.
    min_ring_pairs : int, default 2
        One-way pairs a job needs before its DP size counts as > 2.
    rate_ratio : float, default 2.5
        In a job without one-way rings, a pair whose episode rate is this
        many times below the job's busiest pairs (90th percentile) is
        collective-like (DP candidate); within ``1.6`` it is pipeline-like.
    merge_ns : int, default 20000
        Episode merge slack (:func:`pair_episodes`).
    symmetric_share, asymmetric_share : float, default 0.97, 0.9
        A pair whose episodes carry both directions at least (at most) this
        often looks like a two-member ring (a pipeline).
    light_share : float, default 0.01
        A pair with fewer bytes than this share of its job's median pair is
        control traffic (e.g. the grad-norm ring's edge from the last stage
        back to the first): typed by timing and structure, not direction.
    ep_min_common : int, default 2
        Two-way partners the ends of a pair must share to be an EP clique
        (an EP group of 4 or more).
    ep_size_cv : float, default 0.25
        Coefficient of variation of a pair's flow sizes that votes EP.
    fast_ratio : float, default 2.5
        Episode rate, over the job's other two-way pairs' 90th percentile,
        that votes EP (two-way pairs) or CP (one-way pairs).
    cp_max_msgs : float, default 2.5
        Flows per episode at most, for a one-way pair to be CP.
    uncertain_below : float, default 0.6
    without : tuple of str
        Signals to switch off, for ablations: any of :data:`SIGNALS`.

    Attributes
    ----------
    pairs_ : pandas.DataFrame
        After ``fit``, one row per unordered pair: ``a, b, job, flows,
        bytes, fwd_share, one_way, episodes, rate, rel_rate, msgs_per_episode,
        size_cv, common, evidence, dp, type, confidence`` (``type``: DP, PP,
        EP or CP).

    Examples
    --------
    A 4-member ring (one-way edges 0>1>2>3>0, bursts every 100 ms) and a
    two-way pipeline pair 0-4 exchanging 8 times per step:

    >>> t = np.arange(20) * 100_000_000
    >>> ring = [(a, (a + 1) % 4, t + k * 30_000) for a in range(4) for k in range(3)]
    >>> pipe = [(0, 4, t + 1_000_000 + m * 9_000_000) for m in range(8)] + [(4, 0, t + 5_000_000 + m * 9_000_000) for m in range(8)]
    >>> src = np.concatenate([np.full(len(x), a) for a, b, x in ring + pipe]); dst = np.concatenate([np.full(len(x), b) for a, b, x in ring + pipe])
    >>> start = np.concatenate([x for _, _, x in ring + pipe])
    >>> clf = ParallelismClassifier().fit(src, dst, start, np.full(len(start), 1 << 20), np.zeros(5, int), end=start + 20_000)
    >>> clf.predict()[["a", "b", "type"]].values.tolist()
    [[0, 1, 'DP'], [0, 3, 'DP'], [0, 4, 'PP'], [1, 2, 'DP'], [2, 3, 'DP']]
    """

    def __init__(self, one_way_share: float = 0.95, min_flows: int = 8, min_ring_pairs: int = 2, rate_ratio: float = 2.5,
                 merge_ns: int = 20_000, symmetric_share: float = 0.97, asymmetric_share: float = 0.9, light_share: float = 0.01,
                 ep_min_common: int = 2, ep_size_cv: float = 0.25, fast_ratio: float = 2.5, cp_max_msgs: float = 2.5,
                 uncertain_below: float = UNCERTAIN_BELOW, without: tuple = ()):
        unknown = set(without) - set(SIGNALS)
        if unknown:
            raise ValueError(f"unknown signal(s) {sorted(unknown)}; choose from {', '.join(SIGNALS)}")
        self.without = frozenset(without)
        self.one_way_share = float(one_way_share)
        self.min_flows = int(min_flows)
        self.min_ring_pairs = int(min_ring_pairs)
        self.rate_ratio = float(rate_ratio)
        self.merge_ns = int(merge_ns)
        self.light_share = float(light_share)
        self.symmetric_share = float(symmetric_share)
        self.asymmetric_share = float(asymmetric_share)
        self.uncertain_below = float(uncertain_below)
        self.ep_min_common = int(ep_min_common)
        self.ep_size_cv = float(ep_size_cv)
        self.fast_ratio = float(fast_ratio)
        self.cp_max_msgs = float(cp_max_msgs)

    def fit(self, src: np.ndarray, dst: np.ndarray, start: np.ndarray, size: np.ndarray, job_of: np.ndarray, end: np.ndarray | None = None,
            server_of: np.ndarray | None = None, pair_numbers: tuple[np.ndarray, int] | None = None) -> "ParallelismClassifier":
        """Type the pairs.

        Parameters
        ----------
        src, dst : int arrays
            NIC index of each flow's ends.
        start, size : int arrays
            Flow start (ns) and bytes.
        job_of : int array
            Job label per NIC (:class:`prism.analysis.jobs.JobRecogniser`).
        end : int array, optional
            Flow end (ns); default ``start`` (episodes then merge on starts).
        server_of : int array, optional
            Server per NIC. Lets a collective-like pair between two servers
            that a pipeline pair of its job already links be typed as that
            pipeline's (the embedding pair when the stages next to the ends
            share their servers).
        pair_numbers : (int array, int), optional
            :func:`pair_ids` of ``src, dst``, when the caller has it already.

        Notes
        -----
        Compiled passes over the flows in time order (no sort when they
        come in start order, as a capture's do), each pair's running sums
        and episode kept aside; everything after works per pair.
        """
        src, dst = np.asarray(src), np.asarray(dst)
        start = np.asarray(start, np.int64)
        end = start if end is None else np.asarray(end, np.int64)
        size = np.asarray(size, np.float64)
        n_nodes = int(max(src.max(initial=0), dst.max(initial=0))) + 1
        in_time = np.zeros(0, np.int64) if len(start) < 2 or bool(np.all(start[1:] >= start[:-1])) else np.argsort(start, kind="stable")
        pair, n_pairs = pair_ids(src, dst, n_nodes) if pair_numbers is None else pair_numbers
        lo_nic, hi_nic, flows, first, last, nbytes, fwd_bytes, episodes, both = _pair_sums(
            src, dst, start, end, size, in_time, pair, n_pairs, np.int64(self.merge_ns), "light" in self.without)
        sq = np.bincount(pair, weights=size * size, minlength=n_pairs)
        del in_time, pair
        span_s = np.maximum(last - first, 1) / 1e9
        p = pd.DataFrame({"a": lo_nic, "b": hi_nic})
        p["job"] = np.asarray(job_of)[p["a"].to_numpy()]
        p["flows"] = flows
        p["bytes"] = nbytes.astype(np.int64)
        p["fwd_share"] = fwd_bytes / np.maximum(nbytes, 1)
        # a pair carrying a sliver of its job's bytes (the grad-norm ring's
        # closing edge) is control traffic: its direction says nothing
        job_med = p.groupby("job")["bytes"].transform("median").to_numpy()
        p["light"] = (nbytes < self.light_share * job_med) & ("light" not in self.without)
        p["one_way"] = (np.maximum(p["fwd_share"], 1 - p["fwd_share"]) >= self.one_way_share) & (flows >= self.min_flows) & ~p["light"] & ("direction" not in self.without)
        p["episodes"] = episodes.astype(np.int64)
        # episodes that carry both directions: every step of a two-member
        # ring does; a pipeline's warm-up forwards and cool-down backwards
        # do not
        p["both_ways"] = both / np.maximum(episodes, 1)
        # the job's step count is needed only for jobs whose pairs all keep
        # one pace; _decide asks for it through this (the sorted flows only then)
        self._job_steps = lambda jobs: _job_step_counts(jobs, np.asarray(job_of), src, dst, start, end)
        p["rate"] = episodes / span_s
        p["msgs_per_episode"] = flows / np.maximum(episodes, 1)
        mean_size = nbytes / np.maximum(flows, 1)
        p["size_cv"] = np.sqrt(np.maximum(sq / np.maximum(flows, 1) - mean_size * mean_size, 0.0)) / np.maximum(mean_size, 1.0)
        self._server_of = None if server_of is None else np.asarray(server_of)
        self.pairs_ = self._decide(p)
        del self._job_steps, self._server_of  # they hold the per-flow arrays
        return self

    # ------------------------------------------------------------------
    def _decide(self, p: pd.DataFrame) -> pd.DataFrame:
        """EP and CP pairs first (:meth:`_modern`), then DP or PP for the rest (:meth:`_decide_dp_pp`), without them."""
        kind, conf, evidence = self._modern(p)
        rest = kind == ""
        if rest.all():
            out = self._decide_dp_pp(p)
            out["type"] = np.where(out["dp"].to_numpy(), "DP", "PP")
            return out
        # the DP/PP signals compare pairs within a job: an all-to-all or a ring-attention ring is no pipeline or DP ring to compare with
        dec = self._decide_dp_pp(p[rest].copy())
        mod = p[~rest].copy()
        mod["rel_rate"] = np.nan
        mod["job_steps"] = 0
        mod["evidence"] = evidence[~rest]
        mod["collective"] = False
        mod["dp"] = False
        mod["confidence"] = np.round(conf[~rest], 3)
        mod["uncertain"] = conf[~rest] < self.uncertain_below
        out = pd.concat([dec, mod]).loc[p.index]
        out["type"] = np.where(rest, np.where(out["dp"].to_numpy(), "DP", "PP"), kind)
        return out

    def _modern(self, p: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per pair: ``(type, confidence, evidence)``, type ``EP``, ``CP`` or ``""`` (neither: DP or PP, decided after)."""
        n = len(p)
        kind = np.full(n, "", dtype=object)
        conf = np.zeros(n)
        evidence = np.full(n, "", dtype=object)
        if n == 0:
            return kind, conf, evidence
        job = p["job"].to_numpy()
        one_way = p["one_way"].to_numpy()
        light = p["light"].to_numpy()
        two_way = ~one_way & ~light & (p["flows"].to_numpy() >= self.min_flows)
        use_structure, use_timing, use_sym = ("structure" not in self.without), ("timing" not in self.without), ("symmetry" not in self.without)
        common = _common_partners(p["a"].to_numpy(), p["b"].to_numpy(), job, two_way) if use_structure else np.zeros(n, np.int64)
        p["common"] = common
        clique = two_way & (common >= self.ep_min_common)
        rate = p["rate"].to_numpy()
        # the job's other two-way pairs (not in a clique) set the pace a pipeline pair keeps
        ref = pd.Series(np.where(two_way & ~clique, rate, np.nan)).groupby(job).transform(lambda x: x.quantile(0.9)).to_numpy()
        ok_ref = np.isfinite(ref) & (ref > 0)
        fast = ok_ref & (rate >= self.fast_ratio * np.where(ok_ref, ref, 1.0)) & use_timing
        skew = p["size_cv"].to_numpy() >= self.ep_size_cv
        sym = (p["both_ways"].to_numpy() >= self.symmetric_share) & use_sym
        votes = skew.astype(int) + sym.astype(int) + fast.astype(int)
        ep = clique & (votes >= 1)
        kind[ep] = "EP"
        conf[ep] = np.select([votes[ep] >= 3, votes[ep] == 2], [0.95, 0.85], 0.7)
        names = np.array(["", "sizes skewed", "both ways at once", "sizes skewed, both ways at once", "more episodes than the pipeline",
                          "sizes skewed, more episodes than the pipeline", "both ways at once, more episodes than the pipeline",
                          "sizes skewed, both ways at once, more episodes than the pipeline"], dtype=object)
        code = skew.astype(int) + 2 * sym.astype(int) + 4 * fast.astype(int)
        evidence[ep] = [f"all-to-all clique ({c + 2} members); {names[k]}" for c, k in zip(common[ep], code[ep])]
        # CP: one-way ring edges bursting far more often than the job's two-way pairs, a block or two an episode
        ref_all = pd.Series(np.where(two_way & ~ep, rate, np.nan)).groupby(job).transform(lambda x: x.quantile(0.9)).to_numpy()
        ok_all = np.isfinite(ref_all) & (ref_all > 0)
        msgs = p["msgs_per_episode"].to_numpy()
        # ... on GPUs that also take part in a slower collective (their DP ring or two-member DP pair): a DP ring
        # whose ring steps show apart (real traces) keeps pace with itself, not with a slower collective of its own ends
        a, b = p["a"].to_numpy(), p["b"].to_numpy()
        coll = (one_way | (two_way & ~ep & (p["both_ways"].to_numpy() >= self.symmetric_share))) & ~light
        slowest = np.full(int(max(a.max(initial=0), b.max(initial=0))) + 1, np.inf)
        np.minimum.at(slowest, a[coll], rate[coll])
        np.minimum.at(slowest, b[coll], rate[coll])
        beside = np.minimum(slowest[a], slowest[b]) * self.fast_ratio <= rate
        cp = one_way & ok_all & (rate >= self.fast_ratio * np.where(ok_all, ref_all, 1.0)) & (msgs <= self.cp_max_msgs) & beside & use_timing
        kind[cp] = "CP"
        conf[cp] = np.where(msgs[cp] <= 2.0, 0.9, 0.7)
        ratio = rate[cp] / np.where(ok_all, ref_all, 1.0)[cp]
        evidence[cp] = [f"one-way ring edge bursting {r:.0f}x the pipeline's pace, {m:.1f} flows an episode, beside a slower collective"
                        for r, m in zip(ratio, msgs[cp])]
        return kind, conf, evidence

    def _decide_dp_pp(self, p: pd.DataFrame) -> pd.DataFrame:
        a, b = p["a"].to_numpy(), p["b"].to_numpy()
        one_way = p["one_way"].to_numpy()
        ring_pairs = pd.Series(one_way).groupby(p["job"].to_numpy()).transform("sum").to_numpy()
        ring_job = (ring_pairs >= self.min_ring_pairs) & ("ring_job" not in self.without)
        # the job's busiest two-way pairs set the pipeline rate
        two_way = ~one_way
        r90 = pd.Series(np.where(two_way, p["rate"], np.nan)).groupby(p["job"].to_numpy()).transform(lambda x: x.quantile(0.9)).to_numpy()
        rel = p["rate"].to_numpy() / np.where(r90 > 0, r90, np.nan)
        p["rel_rate"] = rel
        lo = 1.0 / self.rate_ratio
        hi = 1.0 / 1.6
        # a job whose two-way pairs all keep one pace (a pure DP job of two
        # replicas, or a pure pipeline) has no fast class to compare with:
        # count its episodes per step instead (DP: one or two bursts a step)
        r10 = pd.Series(np.where(two_way, p["rate"], np.nan)).groupby(p["job"].to_numpy()).transform(lambda x: x.quantile(0.1)).to_numpy()
        one_pace = ~ring_job & (r10 >= hi * r90)
        steps = self._job_steps(np.unique(p["job"].to_numpy()[one_pace]))
        p["job_steps"] = pd.Series(p["job"].to_numpy()).map(steps).fillna(0).astype(np.int64).to_numpy()
        per_step = p["episodes"].to_numpy() / np.maximum(p["job_steps"].to_numpy(), 1)
        rel = np.where(one_pace & (p["job_steps"].to_numpy() > 0), per_step / 3.0, rel)  # 3 episodes a step: the middle of the band
        p["rel_rate"] = rel
        # symmetry: every episode both ways (a two-member ring) or not (a
        # pipeline's warm-up and cool-down go one way)
        both = p["both_ways"].to_numpy()
        use_sym = "symmetry" not in self.without
        sym = two_way & (both >= self.symmetric_share) & use_sym
        asym = two_way & (both <= self.asymmetric_share) & use_sym
        # the pace is measured against the job's pipeline; where every
        # two-way pair goes both ways at once, the busiest pairs are rings
        # too (a collective per layer) and there is none to measure against
        job = p["job"].to_numpy()
        pipeline_like = pd.Series(two_way & ~sym).groupby(job).transform("sum").to_numpy()
        all_rings = ~ring_job & (pipeline_like == 0) & use_sym
        use_timing = "timing" not in self.without
        bursty = two_way & (rel <= lo) & use_timing
        paced = two_way & (rel >= hi) & use_timing
        spread = paced & ~all_rings
        vote = bursty.astype(int) - spread.astype(int) + sym.astype(int) - asym.astype(int)
        timed_dp = (vote > 0) | ((vote == 0) & sym)
        bursty = bursty | (timed_dp & ~spread)  # what the timeline treats as collective bursts
        dp = np.where(ring_job, one_way, one_way | (two_way & timed_dp))
        evidence = np.where(one_way, "one-way", np.where(ring_job, "two-way in a ring job",
                            np.where(all_rings & paced & sym, "both ways at once, as every two-way pair of the job",
                            np.where(vote >= 2, "collective-like timing, both ways at once", np.where(vote <= -2, "pipeline-like timing, warm-up one way",
                                     np.where(timed_dp, "collective-like (signals disagree)", "pipeline-like (signals disagree)"))))))
        conf = np.where(one_way, np.minimum(1.0, 0.6 + p["flows"].to_numpy() / 100.0), 0.9)
        conf = np.where(~ring_job & two_way, np.select([np.abs(vote) >= 2, np.abs(vote) == 1], [0.9, 0.7], 0.5), conf)
        # structure: a pair inside one pipeline is pipeline traffic (the
        # embedding all-reduce closes the chain); inside one DP ring, DP
        use_structure = "structure" not in self.without
        pp_closed = _inside(a, b, ~dp) & dp & two_way & use_structure
        dp = dp & ~pp_closed
        evidence = np.where(pp_closed, "closes a pipeline", evidence)
        conf = np.where(pp_closed, 0.85, conf)
        # the same across servers: with TP < 8 the stages next to a
        # pipeline's ends may share their servers, so the embedding pair
        # links two servers that a pipeline pair of the job already links
        if self._server_of is not None:
            sa, sb = self._server_of[a], self._server_of[b]
            n_srv = int(self._server_of.max(initial=0)) + 1
            job = p["job"].to_numpy().astype(np.int64)
            skey = (np.minimum(sa, sb).astype(np.int64) * n_srv + np.maximum(sa, sb)) * (int(job.max(initial=0)) + 2) + job + 1  # (server pair, job)
            pp_links = np.unique(skey[~dp])
            srv_closed = dp & two_way & ~ring_job & (sa != sb) & np.isin(skey, pp_links) & use_structure
            dp = dp & ~srv_closed
            evidence = np.where(srv_closed, "closes a pipeline across its servers", evidence)
            conf = np.where(srv_closed, 0.75, conf)
        # a timing-only DP call between GPUs that have no pipeline partner
        # on the network could as well be an embedding pair whose pipeline
        # runs over NVLink: say so
        has_pp = np.zeros(int(max(a.max(initial=0), b.max(initial=0))) + 1, dtype=bool)
        has_pp[a[~dp]] = True
        has_pp[b[~dp]] = True
        lonely = dp & two_way & ~ring_job & ~(has_pp[a] & has_pp[b]) & _job_has(p["job"].to_numpy(), ~dp)
        conf = np.where(lonely, np.minimum(conf, 0.55), conf)
        evidence = np.where(lonely, evidence + "; no pipeline partner on the network", evidence)
        dp_closed = refine_by_dp_components(a, b, dp) & ~dp & use_structure
        dp = dp | dp_closed
        evidence = np.where(dp_closed, "inside a DP ring", evidence)
        conf = np.where(dp_closed, 0.85, conf)
        p["evidence"] = evidence
        #: traffic of collectives (bursts once or twice a step), DP or not:
        #: the embedding pair of a job whose DP rings run inside servers
        p["collective"] = dp | bursty
        p["dp"] = dp
        p["confidence"] = np.round(conf, 3)
        p["uncertain"] = conf < self.uncertain_below
        return p

    def predict(self) -> pd.DataFrame:
        """``a, b, job, type, confidence`` per pair (NIC indices; ``type`` is ``DP``, ``PP``, ``EP`` or ``CP``)."""
        p = self.pairs_
        return pd.DataFrame({"a": p["a"], "b": p["b"], "job": p["job"], "type": p["type"], "confidence": p["confidence"]})


def _common_partners(a: np.ndarray, b: np.ndarray, job: np.ndarray, edge: np.ndarray, max_degree: int = 64) -> np.ndarray:
    """Per pair, how many nodes both its ends share an ``edge`` pair with, within its job (0 for pairs not ``edge``).

    Wedges through nodes of more than ``max_degree`` edges are not counted
    (an all-to-all group that large is not on one rail). One merge of the
    edges with themselves: O(sum of squared degrees).
    """
    n = len(a)
    out = np.zeros(n, np.int64)
    if not edge.any():
        return out
    idx = np.flatnonzero(edge)
    e = pd.DataFrame({"u": np.concatenate([a[idx], b[idx]]), "v": np.concatenate([b[idx], a[idx]]), "job": np.concatenate([job[idx], job[idx]])})
    deg = e.groupby("u")["v"].transform("size")
    e = e[deg.to_numpy() <= max_degree]
    w = e.merge(e, left_on=["v", "job"], right_on=["u", "job"], suffixes=("", "_2"))  # u - v - v_2
    w = w[w["u"].to_numpy() < w["v_2"].to_numpy()]
    if w.empty:
        return out
    cnt = w.groupby(["u", "v_2"]).size()
    lo, hi = np.minimum(a[idx], b[idx]), np.maximum(a[idx], b[idx])
    out[idx] = cnt.reindex(pd.MultiIndex.from_arrays([lo, hi])).fillna(0).to_numpy().astype(np.int64)
    return out


def _job_has(job: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per pair: does its job have any pair where ``mask`` holds."""
    return pd.Series(mask).groupby(job).transform("any").to_numpy()


def _job_step_counts(jobs: np.ndarray, job_of: np.ndarray, src: np.ndarray, dst: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict:
    """``{job: steps it ran in the window}`` (0: unknown) for the ``jobs`` asked.

    The job's flows (all pairs) are cut where :func:`prism.analysis.timeline.natural_break`
    finds the most regular period. One sort of the asked jobs' flows, by
    job, start, then pair.
    """
    from prism.analysis.timeline import busy_gaps, natural_break

    out: dict[int, int] = {}
    if len(jobs) == 0:
        return out
    lo_nic = np.minimum(src, dst)
    m = np.isin(job_of[lo_nic], jobs)
    lo_nic = lo_nic[m].astype(np.int64)
    fj, s_all, e_all = job_of[lo_nic], start[m], end[m]
    key = lo_nic * (int(max(src.max(initial=0), dst.max(initial=0))) + 1) + np.maximum(src[m], dst[m])
    o = np.lexsort((key, s_all, fj))
    fj, s_all, e_all, key = fj[o], s_all[o], e_all[o], key[o]
    bounds = np.flatnonzero(np.diff(fj)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(fj)]):
        s, e = s_all[lo:hi], e_all[lo:hi]
        if len(s) < 4:
            out[fj[lo]] = 0
            continue
        gap, busy_end = busy_gaps(s, e)
        tau = natural_break(gap, busy_end, pair=key[lo:hi])
        out[fj[lo]] = int((gap >= tau).sum()) + 1 if np.isfinite(tau) else 0
    return out


def _inside(a: np.ndarray, b: np.ndarray, edge: np.ndarray) -> np.ndarray:
    """Pairs whose two ends are connected through pairs where ``edge`` holds (one connected-components pass)."""
    if len(a) == 0:
        return np.zeros(0, dtype=bool)
    nodes, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    ia, ib = inv[: len(a)], inv[len(a):]
    comp = connected_components(ia[edge], ib[edge], len(nodes))
    has = np.zeros(len(nodes), dtype=bool)
    has[ia[edge]] = True
    has[ib[edge]] = True
    return has[ia] & has[ib] & (comp[ia] == comp[ib])
