"""Step timelines: each job's training steps, reconstructed from its flows.

A synchronous training step ends with the data-parallel (DP) collective:
the optimizer cannot run before the gradients are reduced, and the next
step's traffic cannot start before the optimizer is done. So, per job, the
DP traffic comes in bursts separated by the compute of the next step, and
the end of each burst is a step boundary (LLMPrism section 4.3).

The bursts are found without a time constant: the gaps between the job's
DP flows (after merging overlapping flows) fall in two groups orders of
magnitude apart, inside a collective (microseconds to a few ms, between
the staggered collectives of pipeline stages) and between steps (the
forward and backward compute, tens of ms to seconds). :func:`natural_break`
finds the split as the widest jump in the sorted log-gaps. A job with no
DP pairs (pipeline only) is cut the same way over its PP traffic, whose
widest gap is the pipeline flush: the last backward, the optimizer and the
first forward.

The step is the shortest period at which the traffic repeats. Longer
periodic structure (a checkpoint, an evaluation, an epoch's end every N
steps) is slow steps that recur every N steps, not a longer step: once a
capture holds a few such pauses, the threshold above the normal step gap
cuts perfectly regular N-step "steps", and a near-tie going to the coarser
cut would make a longer capture contradict its own first part (which holds
too few pauses to cut at). :func:`natural_break` drops a coarser cut that
merely groups whole steps of a finer regular one.

Where data parallelism reduces every micro-batch, as FSDP, HSDP and ZeRO-2
do, each layer's (or forward's) gap is longer than the optimizer's pause
between steps, so a threshold that cuts at the pause cuts at every layer.
The pause is then a class of gaps of its own, once a step: :func:`class_cut`
cuts at one class alone (and at a checkpoint's longer gaps), where that
gives regular steps that carry alike traffic and the threshold does not.
Where the pause is as long as a layer's gap, no class isolates it either;
what shows it then is what it splits: the next micro-batch's first
all-gather follows the last reduce-scatter at once, one piece, except
after the optimizer, once a step (:func:`optimizer_splits`).

A slow server hides the step from the job's own gaps: every collective
waits for it, and the early members' first messages split each wait, so
the gaps are a continuum that holds the optimizer's pause as one among
many. The ring edges into and out of the slow server wait for nothing:
cut on one pair's flows, the job's step ends are where the job is idle
in that pair's (:meth:`StepTimeline._by_pair`, two pairs agreeing). Other
pairs may agree on another cut (the rails of one ring edge are copies of
each other): the most regular cut on the job's gaps wins.
DDP that all-reduces every micro-batch shows its step only in a gap a
little longer every M pieces (:func:`accumulation_period`).

A receiver's clear-to-send (NCCL's network transport: tens to a few
hundred bytes from each ring edge's receiver to its sender, as it enters
a collective) is no data, and the early members' land in the waits and
in the optimizer's pause. The steps are cut on a job's flows less its DP
control messages (:mod:`prism.analysis.control`: under 1% of the size
that carries the job's median DP byte); those still count in the step
they start in.

Steps cut by the capture's edges are not whole and are not reported: a
step needs a boundary on both sides, and the last boundary is trusted only
if the capture went on for a full break after it (otherwise the burst may
have been cut short).

Per whole step the timeline keeps its phases: the span of its PP traffic,
of its DP collective, and the same per DP group (ring) and per pipeline.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numba
import numpy as np
import pandas as pd

from prism.analysis.control import control_messages
from prism.common.components import connected_components
from prism.common.kernels import register_warm_up
from prism.common.ordering import order_by
from prism.common.tails import binomial_at_least, hypergeometric_at_least

__all__ = ["StepTimeline", "natural_break", "class_cut", "accumulation_period", "optimizer_splits", "pause_splits", "edge_splits", "opened_inside", "gaps_within", "piece_period", "warm_up", "busy_gaps", "optimizer_gaps", "halves_of_one_burst", "control_tails", "parallel_groups", "STEP_COLUMNS", "PHASE_COLUMNS"]

STEP_COLUMNS = [
    "job_id", "step", "start_ns", "end_ns", "duration_ns",
    "pp_start_ns", "pp_end_ns", "dp_start_ns", "dp_end_ns", "flows", "bytes",
]
#: ``arrival_ns``: when the group's last member sent its first flow of the phase (a ring cannot run
#: before every member has arrived: from start_ns to arrival_ns its members wait for the last one)
PHASE_COLUMNS = ["job_id", "step", "group", "kind", "start_ns", "arrival_ns", "end_ns", "flows", "bytes", "servers"]
#: the shortest gap a class cut takes for a pause (:func:`class_cut`): a step's pause is compute (the optimizer,
#: a forward), never under a microsecond, while a busy job's few gaps that short are the wire's spacing of
#: back-to-back messages, so sparse that any few of them are a "class" of their own
MIN_PAUSE_NS = 1_000


def busy_gaps(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Idle gaps between time-sorted flows, overlapping flows merged.

    Parameters
    ----------
    start, end : int arrays
        Flows sorted by ``start``.

    Returns
    -------
    gap : int array, length ``n - 1``
        ``start[i + 1]`` minus the latest end among flows ``0..i``; zero or
        negative where flow ``i + 1`` starts while the link is still busy.
    busy_end : int array, length ``n``
        Running maximum of ``end``.

    Notes
    -----
    O(n): one running maximum.

    Examples
    --------
    >>> busy_gaps(np.array([0, 5, 20]), np.array([10, 8, 30]))[0].tolist()
    [-5, 10]
    """
    busy_end = np.maximum.accumulate(end)
    return start[1:] - busy_end[:-1], busy_end


def natural_break(gap: np.ndarray, busy_end: np.ndarray, min_jump: float = 1.2, min_steps: int = 3, floor_ns: int = 1, tie: float = 0.02,
                  min_cover: float = 0.4, span_ns: float | None = None, pair: np.ndarray | None = None,
                  weight: np.ndarray | None = None) -> float:
    """The gap threshold that cuts a job's traffic into the most regular steps.

    Parameters
    ----------
    gap, busy_end : arrays
        From :func:`busy_gaps`.
    min_jump : float
        Candidate thresholds sit where the sorted gaps jump by at least this
        ratio (between two groups of gaps, never inside one).
    min_steps : int
        A candidate must yield at least this many steps.
    floor_ns : int
        Gaps below this (overlaps, rounding) count as this.
    tie : float
        Scores within this of the best are a tie, won by the coarsest cut,
        unless that cut merely groups whole steps of a finer regular cut
        whose only slow steps recur at its boundaries (a checkpoint every N
        steps; see :func:`_groups_whole_steps`) and whose steps all carry
        the same traffic (see :func:`_pieces_alike`): then the finer cut.
    min_cover : float
        A candidate's steps must span at least this share of the traffic
        (``span_ns``): steps tile a job's time, and ``min_steps`` whole
        steps cover half of it even with a step's worth of traffic on
        either side of them and the last burst's step after. Nor may
        one step hold more than this share of the steps' time while the
        median step is under 1% of it. Either cut found the bursts inside
        a collective, not steps: the traffic holds too few steps (a daemon
        window shorter than a few of the job's steps).
    span_ns : float, optional
        The time the job's traffic spans (default: the gaps' flows', from
        the first ``busy_end`` to the last).
    pair, weight : arrays, optional
        Per flow (``len(gap) + 1``, in the same order), a key of its GPU
        pair and its bytes (default: 1 per flow). Without ``pair`` a finer
        cut is never preferred: what tells a step from a pipeline's
        micro-batch is what it carries.

    Returns
    -------
    float
        The threshold (geometric mean of the gaps on either side of the
        chosen jump); ``inf`` when no candidate yields ``min_steps`` steps
        covering ``min_cover`` of the traffic.

    Notes
    -----
    The largest jump is not the answer: inside a step the collectives of
    successive pipeline stages are themselves separated by gaps (a backward
    pass apart), and a pipeline-only job's flush is not much longer than its
    cooldown gaps. What tells the step gaps apart is that they repeat with
    the step period: of all candidate thresholds, the one whose steps have
    the smallest robust spread (MAD / median of durations) wins. Too low a
    threshold mixes stage gaps in (short and long steps alternate), too high
    merges steps (durations jump by multiples). A single slow step or a
    level shift moves the median and MAD of durations little. A threshold
    above periodic slow steps (a checkpoint every N steps) yields N-step
    "steps" more regular than the real ones; that cut is dropped for the
    finer one it groups, whatever the scores, when every finer step moves
    the same bytes over the same pairs (a whole step's collective). The
    micro-batches of a pipeline between its flushes group the same way,
    but each moves a different stage's activations.

    O(n log n + c n) for ``n`` gaps and ``c`` candidate jumps (few).

    Examples
    --------
    Bursts every 100 (gaps 60) with a 30 gap inside each burst:

    >>> ends = np.arange(0, 1000, 100)
    >>> s = np.sort(np.concatenate([ends, ends + 10, ends + 40]))
    >>> e = s + 1
    >>> gap, busy_end = busy_gaps(s, e)
    >>> round(natural_break(gap, busy_end))
    41
    """
    choice = _threshold_cut(gap, busy_end, min_jump, min_steps, floor_ns, tie, min_cover, span_ns, pair, weight)
    return np.inf if choice is None else choice.tau


def _threshold_cut(gap, busy_end, min_jump, min_steps, floor_ns, tie, min_cover, span_ns, pair, weight) -> "_Cut | None":
    """:func:`natural_break`'s choice, as a cut (None: no candidate)."""
    scored = cuts = _scored_cuts(gap, busy_end, min_jump, min_steps, floor_ns, min_cover, span_ns)
    if not scored:
        return None
    # a cut that leaves the job's traffic outside any step (beyond the
    # partial steps at the edges) is admissible only if every cut does
    if any(c.whole for c in scored):
        scored = [c for c in scored if c.whole]
    best = min(c.score for c in scored)
    # near-ties go to the coarsest cut: a pipeline's microbatches are as
    # regular as its steps
    tied = sorted((c for c in scored if c.score <= best + tie), key=lambda c: c.tau)
    choice = tied[-1]
    # ... but not one that merely leaves out a finer tied cut's boundaries
    # at one end: a threshold between the gaps of a job's steps before and
    # after it slowed (a straggler) cuts the slow ones only
    for finer in reversed(tied[:-1]):
        extra = np.setdiff1d(finer.cut, choice.cut)
        if len(extra) and np.isin(choice.cut, finer.cut).all() and (extra.max() < choice.cut[0] or extra.min() > choice.cut[-1]):
            choice = finer
    # ... unless the chosen cut merely groups whole steps of a finer cut
    # (a checkpoint every N steps): the step is the shortest period, and a
    # capture too short to hold four checkpoints is cut at the steps, so a
    # longer one must be too. From the coarsest finer cut down, each taken
    # if it explains the current one that way (a finer cut that leaves
    # more than a step out at an edge qualifies if that edge is a slow step
    # cut by the capture).
    if pair is None:
        return choice
    for finer in sorted((c for c in cuts if c.tau < choice.tau), key=lambda c: -c.tau):
        if _groups_whole_steps(finer, choice) and _pieces_alike(finer.cut, pair, weight):
            choice = finer
    return choice


def class_cut(gap: np.ndarray, busy_end: np.ndarray, pair: np.ndarray, weight: np.ndarray | None, threshold: "_Cut | None",
              alike: bool, min_jump: float = 1.2, min_steps: int = 3, floor_ns: int = MIN_PAUSE_NS, min_cover: float = 0.4,
              span_ns: float | None = None, max_score: float = 0.1, margin: float = 0.25, tie: float = 0.02) -> "_Cut | None":
    """A cut at one class of gaps (:func:`_class_cuts`) that is the step's rather than the threshold cut, or None.

    ``threshold`` is :func:`natural_break`'s cut (None: it found none) and
    ``alike`` whether its pieces carry alike traffic (:func:`_pieces_alike`).
    A class cut whose pieces are alike and regular (a score under
    ``max_score``: durations within a few percent, where the other class
    cuts of the same jobs score 0.3 or more; the most regular first, but
    before it a near-tie, within ``tie``, that cuts wherever it does and
    more) is the step's cut when

    - the threshold cut's pieces are unlike, or it found none, or it is
      far less regular (a score ``margin`` higher: durations a quarter
      apart, pieces of layers and passes): no gap threshold isolates the
      steps (FSDP, HSDP, ZeRO-2: see :func:`_class_cuts`);
    - or the threshold cut merely groups whole steps of it (a checkpoint
      every N steps of such a job: see :func:`_groups_whole_steps`).

    Gaps under ``floor_ns`` (:data:`MIN_PAUSE_NS`) count as that: they
    are no pause. A job whose collectives run back to back (a slow server's
    waits fill its gaps) has a few dozen positive gaps under a microsecond
    among a million overlaps, so sparse that jumps of 1.2x set a handful
    apart as a class: four of 131-179 ns, about evenly spaced, made three
    "steps" of 19-28 s of a faulty FSDP job with 0.3 s steps (a daemon
    window of 120 s), where the job's pairs gave every step.
    """
    classes = [c for c in _class_cuts(gap, busy_end, min_jump, min_steps, floor_ns, min_cover, span_ns) if c.score <= max_score]
    if not classes:
        return None
    # a near-tie (within ``tie``) that cuts wherever the best does and more is preferred: the step is the shortest
    # period, and a long step the best keeps is a checkpoint's pause it did not cut at
    classes.sort(key=lambda c: c.score)
    finer = [c for c in classes[1:] if c.score <= classes[0].score + tie and len(c.cut) > len(classes[0].cut)
             and np.isin(classes[0].cut, c.cut).all()]
    for c in sorted(finer, key=lambda c: -len(c.cut)) + classes:
        if ((not alike or threshold is None or threshold.score >= c.score + margin or _groups_whole_steps(c, threshold))
                and _pieces_alike(c.cut, pair, weight)):
            return c
    return None


def accumulation_period(lead: np.ndarray, max_pieces: int = 8, min_wins: float = 0.95, max_excess: float = 1.5,
                        alpha: float = 1e-4, piece_ns: float | None = None, max_many: int = 32,
                        max_extra: float = 0.2) -> tuple[int, int] | None:
    """Pieces that are micro-batches of a step: ``(M, phase)``, every ``M``-th gap (from ``phase``) a step's, or None.

    DDP without ``no_sync`` (and any job that reduces its gradients every
    micro-batch with no layer-wise traffic) sends a whole gradient
    all-reduce per micro-batch: its pieces between the longest gaps are
    micro-batches, each carrying what a step would, and a cut finds them
    regular and alike. What shows the step is the optimizer: once every
    ``M`` pieces the gap before the next forward is longer by the
    optimizer's time. ``lead`` holds the gaps that open each piece, in
    order; a period ``M`` (2 to ``max_pieces``) and phase are taken when,
    period after period, the gap at that phase is the longest of its
    period (in ``min_wins`` of them, against chance ``1 / M`` by a binomial
    test, or with the phase's gaps among the longest of all by a
    hypergeometric one where too few periods are in view for the binomial
    to tell: each at ``alpha / 2``, Bonferroni-corrected over every period
    and phase tried; see :func:`_longer_every`), and only a little longer
    (its median ratio to the period's other gaps at most ``max_excess``:
    an optimizer's step, not a checkpoint's pause). The smallest such
    ``M`` is the step.

    Many micro-batches (``M`` from ``max_pieces + 1`` to ``max_many``,
    tried only where no smaller period is found and ``piece_ns``, the
    median piece's duration, is given): the optimizer's share of a step
    is the same, so its gap is longer by more of a micro-batch's gap (a
    1% optimizer over 16 micro-batches: about half a forward's gap, as
    long as a checkpoint's short pause). What bounds it there is the time
    it adds against a piece: at most ``max_extra`` of one (an optimizer's
    1.25% of a step of 16 micro-batches), where a checkpoint's pause is a
    good part of a step (a third of one every 12 steps stays a slow step:
    a third of a piece, the pieces being steps); and the binomial test is
    Bonferroni-corrected over every period and phase from 2 to
    ``max_many`` (6 periods at least for 16 micro-batches).

    A checkpoint (or an evaluation) every ``N`` steps is the same on the
    wire: a longer gap every ``N`` pieces. It is told apart only by being
    rarer (every 33 or more steps) or longer (every 2 to 8 steps: over
    half a gap more; every 9 to 32: over a fifth of a step more): a
    checkpoint every 2 to 32 steps that adds less than that would be
    taken for accumulation.

    >>> lead = np.tile([105.0, 100.0, 100.0, 100.0], 12) * np.random.default_rng(0).lognormal(0, 0.005, 48)
    >>> accumulation_period(lead)
    (4, 0)
    >>> accumulation_period(np.random.default_rng(1).lognormal(0, 0.01, 48)) is None
    True
    >>> lead = np.tile([150.0] + [100.0] * 15, 8) * np.random.default_rng(2).lognormal(0, 0.005, 128)
    >>> accumulation_period(lead) is None, accumulation_period(lead, piece_ns=300.0)
    (True, (16, 0))
    """
    g = np.asarray(lead, dtype=np.float64)
    found = _longer_every(g, 2, max_pieces, sum(range(2, max_pieces + 1)), min_wins, alpha, lambda x, rest: float(np.median(
        x / np.median(rest, axis=1))) <= max_excess)
    if found is not None or piece_ns is None or max_many <= max_pieces:
        return found
    return _longer_every(g, max_pieces + 1, max_many, sum(range(2, max_many + 1)), min_wins, alpha, lambda x, rest: float(np.median(
        x - np.median(rest, axis=1))) <= max_extra * piece_ns)


def _longer_every(g: np.ndarray, lo: int, hi: int, tests: int, min_wins: float, alpha: float, small) -> tuple[int, int] | None:
    """:func:`accumulation_period`'s search over periods ``lo`` to ``hi``: the first period and phase whose gap is the
    longest of its period in ``min_wins`` of them and ``small(x, rest)``, significant by either of two tests, each
    at ``alpha / 2`` over ``tests``: the binomial of those wins, or the phase's gaps among the longest of all.

    Within its period a gap is the longest by chance ``1 / M``, so ``k`` periods can show no more than ``M^-k``:
    9 periods of 4 (a 60 s capture of a job slowed to 6.8 s steps) at best 4e-6, 1.3e-4 over the 35 periods and
    phases of 2 to 8, however clear the gaps (the step's 9 gaps 466-477 ms, the 27 others 414-425). What the
    periods do not compare is the gaps across them: the phase's ``k`` gaps hold ``t`` of the ``k`` longest of all
    ``k M`` by chance with a hypergeometric tail (all ``k``: one in C(36, 9), 1e-8). That is the gaps' order over
    the whole capture, which a level shift (a slow server from partway on) can blur, so it adds to the binomial
    rather than replacing it.
    """
    for m in range(lo, hi + 1):
        k = len(g) // m
        if k < 3:
            break
        x = g[: k * m].reshape(k, m)
        for phase in range(m):
            rest = np.delete(x, phase, axis=1)
            wins = int(np.sum(x[:, phase] > rest.max(axis=1)))
            if wins < min_wins * k:
                continue
            if binomial_at_least(wins, k, 1.0 / m) * 2 * tests > alpha:
                top = int(np.count_nonzero(np.argsort(-x, axis=None, kind="stable")[:k] % m == phase))  # of the k longest gaps
                if hypergeometric_at_least(top, k * m, k, k) * 2 * tests > alpha:
                    continue
            if small(x[:, phase], rest):
                return m, phase
    return None


@numba.vectorize(["boolean(float64, float64, float64)"], cache=True)
def _alike(a, b, tol):  # pragma: no cover - compiled
    """Element-wise: ``a`` and ``b`` within ``tol`` of the larger (bytes of pieces).

    A ufunc, so that numpy's callers and :func:`_first_period`'s compiled
    loop apply the one rule.
    """
    return abs(a - b) <= tol * max(abs(a), abs(b))


def piece_period(b: np.ndarray, min_periods: int = 3, min_match: float = 0.9, tol: float = 0.05, max_q: int = 1024,
                 head: int = 8192) -> int | None:
    """The shortest period (in pieces) of a sequence of pieces' bytes: ``b[i]`` like ``b[i + q]`` for ``min_match`` of ``i``.

    Periods up to ``max_q`` pieces (a micro-batch of 3 collectives on 340
    layers), looked for in the first ``head`` pieces: O(max_q head) at most.

    >>> piece_period(np.tile([3.0, 1.0, 1.0], 6))
    3
    >>> piece_period(np.random.default_rng(0).uniform(1, 2, 30)) is None
    True
    """
    b = np.ascontiguousarray(np.asarray(b, dtype=np.float64)[:head])
    q = _first_period(b, min(max_q, len(b) // min_periods), float(min_match), float(tol))
    return None if q < 0 else int(q)


@numba.njit(cache=True, nogil=True)
def _first_period(b, max_q, min_match, tol):  # pragma: no cover - compiled
    """:func:`piece_period`'s loop without its temporaries: the first ``q <= max_q`` for which ``min_match`` of the
    pieces are :func:`_alike` the piece ``q`` on, else -1."""
    n = len(b)
    for q in range(1, max_q + 1):
        alike = 0
        for i in range(n - q):
            if _alike(b[i], b[i + q], tol):
                alike += 1
        if alike / (n - q) >= min_match:
            return q
    return -1


@register_warm_up
def warm_up() -> None:
    """Load :func:`_first_period`, which only a job whose data parallelism reduces every micro-batch reaches.

    The daemon's warm-up fixture is a 3D job that reduces once a step, so it
    never calls :func:`piece_period`; the arguments have its types.
    """
    piece_period(np.ones(6))


def pause_splits(b: np.ndarray, q: int, tol: float = 0.05, follow: float = 0.9) -> np.ndarray:
    """Pieces ``j`` that end where a pause split what is one piece every micro-batch before: ``b[j] + b[j + 1]`` like ``b[j - q]``.

    ``q`` is the micro-batch's period in pieces (:func:`piece_period`).
    Where the next micro-batch starts at once, its first collective runs
    on from the last one's and the two are one piece; the optimizer's pause
    cuts them in two, once a step. Piece ``j`` is such a split when it is
    unlike the piece a period before, it and the next together are like
    it, and the next ``q - 1`` pieces repeat the period before shifted by
    the one extra piece (in ``follow`` of them).

    >>> mb = [3.0, 1.0, 1.0]  # a micro-batch: its first piece holds the last one's reduction (1.0) and its start (2.0)
    >>> b = np.array(mb * 3 + [1.0, 2.0, 1.0, 1.0] + mb * 2 + [1.0, 2.0, 1.0, 1.0] + mb * 2)
    >>> pause_splits(b, 3).tolist()
    [9, 19]
    """
    b = np.asarray(b, dtype=np.float64)
    j = np.arange(q, len(b) - q - 1)
    cand = j[_alike(b[j] + b[j + 1], b[j - q], tol) & ~_alike(b[j], b[j - q], tol)]
    if len(cand) == 0 or q < 2:
        return cand
    after = cand[:, None] + np.arange(2, q + 1)[None, :]
    return cand[_alike(b[after], b[after - q - 1], tol).mean(axis=1) >= follow]


def optimizer_splits(gap: np.ndarray, busy_end: np.ndarray, weight: np.ndarray, min_jump: float = 1.2, min_steps: int = 3,
                     floor_ns: int = 1, max_score: float = 0.1) -> np.ndarray | None:
    """Step ends at the optimizer's pause where it is as long as a layer's gap: the one place a micro-batch's traffic splits.

    FSDP and HSDP reduce every micro-batch, and the next micro-batch's
    first all-gather follows the last reduce-scatter at once. The
    optimizer's pause between steps can be as long as the layers' gaps
    (1% of a 5 s step is one layer's backward), so no class of gaps holds
    it alone (:func:`class_cut`). What shows it is what it splits: once a
    step, the piece that every other micro-batch boundary keeps whole is
    in two. The pieces' bytes repeat with the micro-batch
    (:func:`piece_period`, at a threshold of the candidate jumps); the
    splits (:func:`pause_splits`) are step ends when they recur every
    ``M q + 1`` pieces (``M`` >= 2 micro-batches of ``q`` pieces, and the
    split) in every step and the steps between them are regular (score
    at most ``max_score``). Steps are taken only between consecutive
    splits, the longest run of them: a split not seen (a record lost)
    would make a step of two. None: no threshold shows such splits.
    """
    g = np.maximum(np.asarray(gap, dtype=np.float64), floor_ns)
    w = np.asarray(weight, dtype=np.float64)
    best: np.ndarray | None = None
    for tau in _gap_jumps(g, min_jump).tau:
        cut = np.flatnonzero(g >= tau)
        if len(cut) < 2 * min_steps:
            continue
        piece = np.zeros(len(w), dtype=np.int64)
        piece[cut + 1] = 1
        b = np.bincount(np.cumsum(piece), weights=w)[1:-1]  # b[i]: the whole piece after cut i
        q = piece_period(b)
        if q is None:
            continue
        d = pause_splits(b, q)
        if len(d) < min_steps + 1:
            continue
        step = int(np.median(np.diff(d)))
        if step % q != 1 or step // q < 2 or np.mean(np.diff(d) % step == 0) < 0.9:
            continue
        ends = busy_end[cut[d + 1]]
        dur = np.diff(ends).astype(np.float64)
        one = np.diff(d) == step
        if not one.any():  # an even count's median between two spacings: no step of one period
            continue
        med = float(np.median(dur[one]))
        if float(np.median(np.abs(dur[one] - med))) / med > max_score:
            continue
        # the longest run of consecutive splits: a split not seen would make a step of two
        edges = np.flatnonzero(np.diff(np.concatenate([[0], one.astype(np.int8), [0]])))
        runs = edges.reshape(-1, 2)
        lo, hi = runs[np.argmax(runs[:, 1] - runs[:, 0])]
        if hi - lo < min_steps:
            continue
        run = ends[lo: hi + 1]
        # a split the capture's edge hides from pause_splits (no micro-batch before it, or none after): the
        # step it closes or opens is whole in the capture, and the step's pieces repeat the next one's
        span = (float(np.min(dur[lo:hi])) * (1 - max_score), float(np.max(dur[lo:hi])) * (1 + max_score))
        at = edge_splits(b, d[lo], d[hi], step, q)
        head, tail = (busy_end[cut[j + 1]] if j >= 0 else None for j in at)
        if head is not None and span[0] <= run[0] - head <= span[1]:
            run = np.concatenate([[head], run])
        if tail is not None and span[0] <= tail - run[-1] <= span[1]:
            run = np.concatenate([run, [tail]])
        if best is None or len(run) > len(best):
            best = run
    return best


def edge_splits(b: np.ndarray, first: int, last: int, step: int, q: int, tol: float = 0.05, follow: float = 0.9) -> tuple[int, int]:
    """The pause splits one step before ``first`` and one after ``last`` that the capture's edges hide: piece indices, or -1.

    :func:`pause_splits` tests a piece against the micro-batch before it
    and the one after it (``q`` pieces each), so it cannot test a split in
    the capture's first micro-batch or its last. Such a split closes (or
    opens) a step whole in the capture. ``first`` and ``last`` are the
    first and last splits of a run found ``step`` pieces apart; piece ``j
    = first - step`` (``last + step``) is a split where the test could not
    run and the whole step beside it repeats the found step next to it:
    the split's two pieces like the found split's, and the step's
    ``step`` pieces like the found step's, piece for piece (``follow`` of
    them, within ``tol``). The step's duration is for the caller to judge.

    >>> mb = [3.0, 1.0, 1.0]; one = [1.0, 2.0, 1.0, 1.0] + mb  # a step of 2 micro-batches, split by its pause
    >>> b = np.array([1.0, 1.0] + one * 5 + [1.0, 2.0])  # the capture opens 2 pieces before a split, ends 1 after one
    >>> edge_splits(b, 9, 30, 7, 3)
    (2, 37)
    """
    b = np.asarray(b, dtype=np.float64)
    n = len(b)
    out = []
    for j, ref, here, there in ((first - step, first, slice(first - step, first), slice(first, first + step)),
                                (last + step, last, slice(last, last + step), slice(last - step, last))):
        hidden = 0 <= j < q if j < first else n - q - 1 <= j <= n - 2  # pause_splits tests q <= j < n - q - 1
        ok = (hidden and 0 <= there.start and there.stop <= n
              and bool(_alike(b[j: j + 2], b[ref: ref + 2], tol).all())  # split as the found one is: the same two pieces
              and float(_alike(b[here], b[there], tol).mean()) >= follow)  # the step beside it repeats the found step
        out.append(j if ok else -1)
    return out[0], out[1]


def gaps_within(sub_ends: np.ndarray, sub_start: np.ndarray, start: np.ndarray, busy_end: np.ndarray, gap: np.ndarray,
                clear: float | None = None) -> np.ndarray:
    """Per step end of a subset of a job's flows (one pair's), the job's own idle gap it stands for: an index into ``gap``, or -1.

    ``sub_ends`` are step ends found on the subset's flows (started at
    ``sub_start``, sorted) and ``start``, ``busy_end``, ``gap`` the whole
    job's (:func:`busy_gaps`). A pair is idle from its step's end to its
    next flow; the job's step ends inside that time, at the longest gap in
    which the whole job is idle (the optimizer's: the pair's last flow may
    come before the step's last collective, another ring's). -1 where the
    subset has no later flow (the step's end is then the job's last) or
    the job is never idle in that time. With ``clear``, -2 where that
    gap is under ``clear`` times the next longest in the time: the subset
    does not pin the step's end there (a pair whose next flow comes a
    forward pass later: its time holds every forward layer's gap).

    >>> st = np.array([0, 10, 35, 50, 60]); be = np.array([5, 20, 40, 55, 70])  # the job's gaps: 5, 15, 10, 5
    >>> gaps_within(np.array([5, 55]), np.array([0, 50]), st, be, st[1:] - be[:-1]).tolist()
    [1, -1]
    >>> gaps_within(np.array([5, 55]), np.array([0, 50]), st, be, st[1:] - be[:-1], clear=1.6).tolist()  # 15 against 10
    [-2, -1]
    """
    out = np.full(len(sub_ends), -1, dtype=np.int64)
    nxt = np.searchsorted(sub_start, sub_ends, side="right")  # the subset's next flow after each end
    for k, (b, j) in enumerate(zip(sub_ends, nxt)):
        if j >= len(sub_start):
            continue
        lo = int(np.searchsorted(busy_end, b, side="left"))  # the job's gaps after b ...
        hi = int(np.searchsorted(start, sub_start[j], side="right")) - 1  # ... that end by the pair's next flow: gap[lo:hi]
        if hi > lo:
            i = lo + int(np.argmax(gap[lo:hi]))
            if gap[i] > 0:
                out[k] = i
                if clear is not None and hi - lo > 1:
                    runner_up = max(int(np.partition(gap[lo:hi], hi - lo - 2)[hi - lo - 2]), 1)
                    if gap[i] < clear * runner_up:
                        out[k] = -2
    return out


class _GapJumps(NamedTuple):
    """Where a job's gap lengths jump: the candidate thresholds of every cut."""

    tau: np.ndarray  # each threshold, the geometric mean of the two lengths it falls between
    ratio: np.ndarray  # the longer length over the shorter, at least ``min_jump``
    above: np.ndarray  # how many gaps are longer than the threshold


def _gap_jumps(g: np.ndarray, min_jump: float) -> _GapJumps:
    """The thresholds between consecutive distinct gap lengths ``g`` where the longer is at least ``min_jump`` times the shorter.

    One place for the rule every cut of :func:`natural_break` (and
    :func:`optimizer_splits`) draws its thresholds from, ascending.
    """
    u, n = np.unique(g, return_counts=True)
    ratio = u[1:] / u[:-1]
    i = np.flatnonzero(ratio >= min_jump)
    return _GapJumps(np.sqrt(u[i] * u[i + 1]), ratio[i], len(g) - np.cumsum(n)[i])


class _Cut(NamedTuple):
    """A candidate cut of :func:`natural_break`: its score (lower: more regular), threshold and steps."""

    score: float
    tau: float
    whole: bool  # no traffic left outside a step beyond a partial step at each edge
    edge: float  # the longer of the traffic before the first boundary and after the last
    ends: np.ndarray  # the step boundaries (busy ends of the cut gaps)
    dur: np.ndarray  # the steps' durations
    cut: np.ndarray  # the cut gaps' indices
    lead: np.ndarray  # the cut gaps' lengths: each step opens with one, then its traffic's burst
    band: bool = False  # cut at a class of gaps between others (:func:`_class_cuts`), not at every gap above ``tau``


def _scored_cuts(gap: np.ndarray, busy_end: np.ndarray, min_jump: float, min_steps: int, floor_ns: int, min_cover: float,
                 span_ns: float | None) -> list[_Cut]:
    """Every admissible candidate cut of :func:`natural_break`, scored, finest first."""
    g = np.maximum(np.asarray(gap, dtype=np.float64), floor_ns)
    if len(g) < min_steps:
        return []
    jumps = _gap_jumps(g, min_jump)
    span = float(busy_end[-1] - busy_end[0]) or 1.0  # for the tie-break when every cut leaves time out
    traffic = span if span_ns is None else float(span_ns)
    scored = []
    for tau in jumps.tau[jumps.above >= min_steps + 1].tolist():
        c = _score_cut(g, np.flatnonzero(g >= tau), tau, busy_end, min_steps, min_cover, span, traffic)
        if c is not None:
            scored.append(c)
    return scored


def _score_cut(g: np.ndarray, cut: np.ndarray, tau: float, busy_end: np.ndarray, min_steps: int, min_cover: float, span: float,
               traffic: float, band: bool = False) -> _Cut | None:
    """The cut at gaps ``cut`` scored as :func:`natural_break` scores its candidates; None if inadmissible."""
    b = busy_end[cut]
    dur = np.diff(b)
    if len(dur) < min_steps:
        return None
    med = np.median(dur)
    covered = float(b[-1] - b[0])
    if covered < min_cover * traffic or (_dominated(dur, covered, min_cover) and not _one_outage(dur, covered, min_cover, min_steps)):
        return None
    spread = np.median(np.abs(dur - med)) / med
    long = dur >= 1.9 * med
    if band:
        # a class cut finds each boundary at its own pause, so a long step
        # that recurs every N steps (or comes once) and adds little time is a
        # checkpoint's, not steps merged at a missed boundary (the backward
        # pieces of a cut at the forward's layers recur too, but are most of
        # the time)
        idx = np.flatnonzero(long)
        if (len(idx) <= 1 or np.ptp(np.diff(idx)) <= 1) and float(np.sum(dur[long] - med)) <= 0.25 * float(dur.sum()):
            long = np.zeros(len(dur), dtype=bool)
    merged = dur[long].sum() / dur.sum()  # time in what look like merged steps
    split = _fragments(dur, med)  # steps in what look like split ones
    # time left outside any step beyond a partial step at each edge: a
    # threshold that cuts only the slower half of a job (a straggler
    # appeared) is regular too, but leaves the faster half uncut
    outside = max(0.0, b[0] - busy_end[0] - 1.5 * med) + max(0.0, busy_end[-1] - b[-1] - 1.5 * med)
    edge = float(max(b[0] - busy_end[0], busy_end[-1] - b[-1]))
    return _Cut(float(spread + merged + split + outside / span), tau, outside == 0, edge, b, dur, cut, g[cut], band)


def _dominated(dur: np.ndarray, covered: float, min_cover: float) -> bool:
    """Does one step hold more than ``min_cover`` of the steps' time while the median step is under 1% of it?

    Then the cut found the bursts inside a collective, not steps: the
    traffic holds too few of the job's steps (a daemon window shorter than
    a few of them).
    """
    return bool(dur.max() > min_cover * covered and np.median(dur) < 0.01 * covered)


def _one_outage(dur: np.ndarray, covered: float, min_cover: float, min_steps: int, max_ratio: float = 2.0) -> bool:
    """Is the one step that dominates the cut (:func:`_dominated`) a silence between two runs of the same steps?

    A job stopped and restarted after a short outage (shorter than the
    hang diagnosis's least silence, which splits a job into runs) shows one
    step as long as the outage between the same steps on either side: in a
    window of a few seconds the outage dominates, and the steps on both
    sides were lost with it. It is one when, without it, the steps pass the
    rule themselves and still cover ``min_cover`` of the time, with at
    least ``min_steps`` on each side whose median durations are within
    ``max_ratio`` of each other. The bursts of one collective with the
    compute after it (too few steps in view) have no such second side.

    >>> run = np.full(100, 3.0)  # 100 steps, an outage, 50 steps
    >>> dur = np.r_[run, 400.0, run[:50]]
    >>> bool(_dominated(dur, 850.0, 0.4)), _one_outage(dur, 850.0, 0.4, 3)
    (True, True)
    >>> _one_outage(np.r_[run, 400.0], 700.0, 0.4, 3)  # nothing after it
    False
    >>> _one_outage(np.r_[run, 400.0, np.full(50, 30.0)], 2200.0, 0.4, 3)  # not the same steps after it
    False
    """
    i = int(np.argmax(dur))
    before, after = dur[:i], dur[i + 1:]
    rest = covered - float(dur[i])
    if min(len(before), len(after)) < min_steps or rest < min_cover * covered:
        return False
    a, b = float(np.median(before)), float(np.median(after))
    return max(a, b) <= max_ratio * min(a, b) and not _dominated(np.r_[before, after], rest, min_cover)


def _class_cuts(gap: np.ndarray, busy_end: np.ndarray, min_jump: float, min_steps: int, floor_ns: int, min_cover: float,
                span_ns: float | None, max_rare: int = 16) -> list[_Cut]:
    """Cuts at one class of gaps between two others (and at every gap above a higher class), scored.

    The gaps fall in classes between the jumps :func:`natural_break` finds.
    A threshold cuts at a class and every class above it; here a cut takes
    class ``a`` alone, plus every gap from a class ``b > a + 1`` up (none:
    ``b`` past the top). FSDP, HSDP and ZeRO-2 need this: their collectives
    run every micro-batch, separated by each layer's (or the backward's)
    compute, and the optimizer's pause between steps is shorter than those
    gaps, so every threshold that cuts at it also cuts at every layer. The
    pause is a class of its own, once a step; a checkpoint's pause, longer
    than any, is the class above, which may hold only a few gaps: the
    gaps above may start at any jump of at least ``min_jump`` (the
    ``max_rare`` widest of them, beside the classes' bounds).
    """
    g = np.maximum(np.asarray(gap, dtype=np.float64), floor_ns)
    if len(g) < min_steps:
        return []
    jumps = _gap_jumps(g, min_jump)
    taus = np.append(jumps.tau[jumps.above >= min_steps + 1], np.inf)
    # the gaps cut above a class may be rare (two checkpoints in view): any jump, the widest first
    rare = jumps.tau[np.argsort(-jumps.ratio, kind="stable")[:max_rare]]
    above = np.unique(np.concatenate([taus, rare]))
    span = float(busy_end[-1] - busy_end[0]) or 1.0
    traffic = span if span_ns is None else float(span_ns)
    out = []
    for a in range(len(taus) - 2):  # the top class alone is the top threshold
        in_class = (g >= taus[a]) & (g < taus[a + 1])
        for b in above[above > taus[a + 1]]:
            c = _score_cut(g, np.flatnonzero(in_class | (g >= b)), float(taus[a]), busy_end, min_steps, min_cover, span, traffic, band=True)
            if c is not None:
                out.append(c)
    return out


def _groups_whole_steps(fine: _Cut, coarse: _Cut, tol: float = 0.1, odd_share: float = 0.1, max_pause: float = 0.25) -> bool:
    """Does ``coarse`` merely group whole steps of ``fine``, whose only slow steps recur at its boundaries?

    A checkpoint (an evaluation, an epoch's end) every N steps pauses the
    job after one step's collective: once the capture holds a few of them,
    the threshold between the normal step gap and the pause's gap cuts
    "steps" of N steps each, more regular than the real ones (each sums N
    steps' jitter). The coarse cut is such a grouping when, with margins:

    1. every coarse step holds at least two fine steps, and about the same
       number (the long pause recurs every N steps: within one fine step,
       or 10%, a boundary record lost);
    2. the fine steps that do not open a coarse step (the pause is in the
       step that follows it) are regular: a MAD under ``tol / 2`` of their
       median, and at most ``odd_share`` of them, and of their time, off it
       by more than ``tol`` (a real slow step, a lost boundary). By time:
       the messages of a ring collective are as regular as steps, but the
       compute gaps between the collectives, few of the pieces, are most of
       the time;
    3. the fine steps that open a coarse step are no shorter than the
       others (less ``tol``) and no longer than the rest of their coarse
       step (k - 1 regular steps): a slow step, not the period. This keeps
       what the coarse cut is for: between a pipeline's microbatches (or a
       Megatron job's staggered stage collectives) and its flush, the short
       pieces are most of a step's pieces but little of its time, and the
       warm-up and cool-down pieces are unlike the steady ones;
    4. the traffic before the first fine boundary and after the last is at
       most a step, a slow one included (the capture may end in a
       checkpoint's step);
    5. the long gaps add at most ``max_pause`` of the time: a checkpoint
       or an evaluation is a small overhead, while the compute between a
       step's collectives is most of a step (DDP's gradient buckets, each
       all-reduced as the backward releases it, are as regular as steps,
       and the forward pass before them is one long gap per micro-batch,
       35% of its time in the matrix's DDP jobs);
    6. the traffic after each long gap lasts about as long as the other
       pieces' (within 2x): a checkpoint pauses between two steps' alike
       collectives, while ZeRO-2's optimizer, after the reduce-scatters
       that each micro-batch's backward spreads out, is followed by the
       parameters' all-gather at once (a DDP job that all-reduces every
       micro-batch, without ``no_sync``, is cut at its micro-batches: on
       the wire its optimizer is a checkpoint every micro-batches steps).
    """
    pos = np.searchsorted(fine.ends, coarse.ends)
    if pos[-1] >= len(fine.ends) or not np.array_equal(fine.ends[pos], coarse.ends):
        return False  # not nested (cuts of one gap array always are)
    k = np.diff(pos)  # fine steps per coarse step
    if k.min() < 2 or k.max() - k.min() > max(1.0, tol * float(np.median(k))):
        return False
    opens = np.zeros(len(fine.dur), dtype=bool)
    opens[pos[pos < len(fine.dur)]] = True  # the fine step after each coarse boundary holds the long gap
    inner, first = fine.dur[~opens], fine.dur[opens]
    if len(inner) < 2:
        return False
    med = float(np.median(inner))
    odd = np.abs(inner - med) > tol * med
    if med <= 0 or np.median(np.abs(inner - med)) > 0.5 * tol * med or np.mean(odd) > odd_share or inner[odd].sum() > odd_share * inner.sum():
        return False
    rest = (k - 1) * med  # the regular part of each whole coarse step
    longest = max(1.5 * med, (1 + tol) * float(first.max()))
    paused = float(np.sum(first - med)) / float(fine.dur.sum())  # the share of the time the long gaps add
    # the traffic after each long gap is a burst like the others: a checkpoint pauses between two steps' same
    # collectives, while ZeRO-2's optimizer, after its micro-batches' gradient reduce-scatters (each spread over
    # a backward), is followed by the parameters' all-gather, at once
    burst = fine.dur - fine.lead[: len(fine.dur)]
    b_in, b_first = float(np.median(burst[~opens])), float(np.median(burst[opens]))
    alike_bursts = b_in <= 0 or 0.5 <= b_first / b_in <= 2.0
    return bool(first.min() >= (1 - tol) * med and (first[: len(rest)] <= rest).all() and fine.edge <= longest and paused <= max_pause
                and alike_bursts)


def _pieces_alike(cut: np.ndarray, pair: np.ndarray, weight: np.ndarray | None, min_sim: float = 0.8, odd_share: float = 0.1,
                  max_cells: int = 20_000_000) -> bool:
    """Do the whole steps between cut flows carry the same traffic: the same bytes over the same pairs?

    A step's collective moves the whole gradient buffer over every ring
    edge, so the steps of a data-parallel job are alike whether or not a
    checkpoint follows some of them. The pieces of one step are not: a
    pipeline's micro-batches each move one stage boundary's activations
    (and the warm-up pieces only the first stages'), the collectives of
    Megatron's stages each run on their own rings, and FSDP's layers
    gather in the forward and gather and scatter in the backward.

    ``cut`` holds the indices of the flows (in start order, as ``pair`` and
    ``weight``) after which a piece ends. Per whole piece (between two cut
    gaps), its bytes per pair against the median piece's: the similarity
    is ``sum(min) / sum(max)``; at most ``odd_share`` of the pieces, or
    one, may stay under ``min_sim`` (a
    lost record, a jittered bucket, a slow step's same bytes all pass; two
    steps merged by a lost boundary record do not). With more than
    ``max_cells`` pieces x pairs, an even sample of the pieces is compared.
    Where a tenth of the pairs stop for good and a tenth start (a restart
    on a replaced server), the pieces on either side are compared with
    their own median piece; a pipeline's micro-batches return to their
    pairs every step, so they make no such turn.

    >>> cut = np.array([0, 2, 4, 6])  # whole pieces: flows (1,2), (3,4), (5,6)
    >>> _pieces_alike(cut, np.array([0, 1, 0, 1, 0, 1, 0, 1]), None)
    True
    >>> alternating = np.array([0, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 9])  # pieces on pairs {0, 1}, {2, 3}, {0, 1}, ...
    >>> _pieces_alike(np.array([0, 2, 4, 6, 8, 10]), alternating, None)
    False
    """
    piece = np.zeros(len(pair), dtype=np.int64)
    piece[np.asarray(cut) + 1] = 1
    piece = np.cumsum(piece)  # 0 and the last: cut by the capture's edges
    n = int(piece[-1]) - 1  # whole pieces: 1..n
    if n < 2:
        return True  # nothing to compare
    inside = (piece >= 1) & (piece <= n)
    codes, pc = np.unique(np.asarray(pair)[inside], return_inverse=True)
    k = piece[inside] - 1
    w = np.ones(len(k)) if weight is None else np.asarray(weight, dtype=np.float64)[inside]
    if not w.any():  # no byte counts (sizes not given, or all 0): the flows themselves
        w = np.ones(len(k))
    every = max(1, -(-n * len(codes) // max_cells))  # sample every `every`-th piece when the table would be too big
    keep = k % every == 0
    rows = -(-n // every)
    table = np.bincount(k[keep] // every * len(codes) + pc[keep], weights=w[keep], minlength=rows * len(codes)).reshape(rows, len(codes))
    # eras: a job restarted with a server replaced moves its traffic to other pairs for good; where a tenth of
    # the pairs stop for good and a tenth start, each side is compared with its own median piece (a pipeline's
    # first pieces only start pairs, the capture's end only stops them)
    active = table > 0
    first = active.argmax(axis=0)
    last = rows - 1 - active[::-1].argmax(axis=0)
    starts = np.bincount(first, minlength=rows)
    stops = np.bincount(np.minimum(last + 1, rows), minlength=rows + 1)[:rows]  # stops[p]: last active in p - 1
    era = np.zeros(rows, dtype=np.int64)
    era[np.flatnonzero((starts[1:] >= 0.1 * len(codes)) & (stops[1:] >= 0.1 * len(codes))) + 1] = 1
    era = np.cumsum(era)
    typical = np.empty_like(table)
    for e in range(int(era[-1]) + 1):
        typical[era == e] = np.median(table[era == e], axis=0)
    sim = np.minimum(table, typical).sum(axis=1) / np.maximum(np.maximum(table, typical).sum(axis=1), 1e-12)
    return bool((sim < min_sim).sum() <= max(1.0, odd_share * len(sim)))


def _fragments(dur: np.ndarray, med: float) -> float:
    """Share of the steps that look like a piece of a split step: short, and a typical step with a neighbour.

    A straggler that appears partway through the traffic pauses each slower
    step inside its collective. If about half the steps are slower, a cut
    at that pause is the more regular one by the median and MAD (the short
    pieces are a third of the durations, outliers to the MAD), while the
    right cut has two step lengths, before and after. The pieces give it
    away: each is under half a step and makes a step with the piece before
    or after it.
    """
    if len(dur) < 2:
        return 0.0
    short = dur < 0.5 * med
    with_prev = np.r_[False, np.abs(dur[1:] + dur[:-1] - med) <= 0.25 * med]
    with_next = np.r_[np.abs(dur[:-1] + dur[1:] - med) <= 0.25 * med, False]
    return float(np.mean(short & (with_prev | with_next)))


def optimizer_gaps(start: np.ndarray, busy_end: np.ndarray, gap: np.ndarray, cut: np.ndarray, size: np.ndarray, pair: np.ndarray,
                   other_start: np.ndarray, other_end: np.ndarray, other_size: np.ndarray, min_gap_ns: int = 100_000,
                   max_candidates: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Where, inside each collective burst, one step ends and the next begins.

    With a distributed optimizer the DP rings run two collectives per step:
    the gradients' reduce-scatter at the end of the step and, after the
    optimizer, the parameters' all-gather that opens the next. Both fall in
    one burst between the long compute gaps, and the step boundary is the
    quiet gap between them, not the burst's end. A gap inside a burst is
    that boundary when

    1. little else starts in it: the traffic that does carries under a
       quarter of the burst's bytes (the step's closing collectives on
       pipeline pairs, the embedding and grad-norm all-reduces, then the
       optimizer; a pipeline's forward would not wait for the all-gather);
    2. the DP pairs after it are pairs that also ran before it in the burst,
       and each moves about the bytes it moved before (the same rings
       gather what they scattered, edge by edge; a pipeline's stages
       reducing one after another use different rings, and a pause inside
       one collective leaves its edges unbalanced);
    3. the bytes after it are the bytes before it, within 5% (an
       all-gather moves the buffer the reduce-scatter moved; the gradient
       buckets that a backward releases one by one differ in size), or half
       of them (ZeRO-1: an all-reduce of the gradients, then the all-gather
       of the parameters, each edge moving half what it moved before);
    4. nothing after it pauses half as long: the all-gather runs at once
       when the optimizer is done, while a pure DP job's overlapped buckets,
       which may split into two equal halves, pause alike all through the
       backward.

    The longest such gap of a burst wins (the optimizer's pause).

    Parameters
    ----------
    start, busy_end, gap : arrays
        The job's DP flows sorted by start, with :func:`busy_gaps`' output.
    cut : int array
        Flow indices that end a burst (``gap[cut] >= tau``).
    size, pair : int arrays
        Bytes and pair key of each DP flow.
    other_start, other_end, other_size : int arrays
        The job's other (pipeline) flows.
    min_gap_ns : int
        Pauses shorter than this are not considered (jitter, back-to-back
        messages); of the rest, the ``max_candidates`` longest of a burst
        are checked (the gradient buckets of every stage pause too).

    Returns
    -------
    split : int array, one per burst (``len(cut) + 1``)
        Index of the DP flow after which the step ends, -1 where the burst
        has no such gap.
    ends : int array
        Where the step ends there: the last flow before the quiet part,
        control traffic in the gap included.

    Notes
    -----
    A Python loop over bursts and their large inner pauses: the byte checks
    are O(1) from prefix sums and binary searches; only a pause that passes
    them costs a per-pair sum over its burst.

    Examples
    --------
    Two steps: a reduce-scatter (flows 0-1) and, after a quiet gap, an
    all-gather on the same pair (flows 2-3), then the compute gap:

    >>> st = np.array([0, 10, 100, 110, 1000, 1010, 1100, 1110])
    >>> gap, be = busy_gaps(st, st + 5)
    >>> split, ends = optimizer_gaps(st, be, gap, np.array([3]), np.ones(8), np.zeros(8, int), np.array([500]), np.array([600]), np.array([1]), min_gap_ns=20)
    >>> split.tolist(), ends.tolist()
    ([1, 5], [15, 1015])
    """
    o = np.argsort(other_start, kind="stable")
    os_, oe = np.asarray(other_start)[o], np.asarray(other_end)[o]
    osz_cum = np.concatenate([[0], np.cumsum(np.asarray(other_size, np.float64)[o])])
    oe_run = np.maximum.accumulate(oe) if len(oe) else oe
    first = np.concatenate([[0], np.asarray(cut) + 1])
    last = np.concatenate([np.asarray(cut), [len(start) - 1]])
    pair = np.asarray(pair)
    small_keys = len(pair) > 0 and pair.min() >= 0 and pair.max() < (1 << 16)
    n_keys = int(pair.max()) + 1 if small_keys else 0
    out = np.full(len(first), -1, dtype=np.int64)
    ends = np.zeros(len(first), dtype=np.int64)
    for k, (f0, f1) in enumerate(zip(first, last)):
        if f1 <= f0:
            continue
        inner = np.arange(f0, f1)  # gap[i] separates flow i and i+1
        big = inner[gap[inner] > min_gap_ns]
        if len(big) == 0:
            continue
        big = big[np.argsort(gap[big])[::-1][:max_candidates]]  # the largest pauses first
        sz = size[f0 : f1 + 1].astype(np.float64)
        cum = np.cumsum(sz)
        n_pairs, pcodes = 0, None
        for i in big:
            lo, hi = busy_end[i], start[i + 1]
            j0 = np.searchsorted(os_, lo, side="right")  # other flows starting in the gap: j0..j1-1
            j1 = np.searchsorted(os_, hi, side="left")
            b0 = cum[i - f0]
            b1 = cum[-1] - b0
            # cheap checks first: the same buffer (a lost record or two
            # aside; ZeRO-1's all-reduce moves twice what the all-gather
            # of the same buffer does), no pipeline transfers in the pause,
            # and nothing after it pauses half as long (the all-gather runs
            # at once when the optimizer is done; DDP's gradient buckets
            # pause alike all through the backward)
            ratio = 2.0 if abs(2 * b1 - b0) <= 0.05 * b0 else 1.0
            if abs(ratio * b1 - b0) > 0.05 * b0 or osz_cum[j1] - osz_cum[j0] > 0.25 * (b0 + b1):
                continue
            if i + 1 < f1 and gap[i + 1 : f1].max() > 0.5 * gap[i]:
                continue
            if pcodes is None:
                if small_keys:  # pair numbers: counted as they are (the byte sums are exact either way)
                    pcodes, n_pairs = pair[f0 : f1 + 1], n_keys
                else:
                    codes, pcodes = np.unique(pair[f0 : f1 + 1], return_inverse=True)
                    n_pairs = len(codes)
            cut_at = i + 1 - f0
            pb0 = np.bincount(pcodes[:cut_at], weights=sz[:cut_at], minlength=n_pairs)
            pb1 = np.bincount(pcodes[cut_at:], weights=sz[cut_at:], minlength=n_pairs)
            if (pb0[pb1 > 0] == 0).any():  # a pair that only runs after the pause: another ring
                continue
            # every ring edge moves back what it moved (within 5%: loss, jitter)
            if np.abs(ratio * pb1 - pb0)[pb0 > 0].sum() > 0.05 * pb0.sum():
                continue
            out[k] = i
            # the step ends with its last flow: control messages in the gap,
            # or a collective on pipeline pairs (the embedding all-reduce)
            # still running into it
            ends[k] = max(busy_end[i], oe[j0:j1].max() if j1 > j0 else 0, oe_run[j0 - 1] if j0 > 0 else 0)
            break
    return out, ends


def halves_of_one_burst(start: np.ndarray, busy_end: np.ndarray, cut: np.ndarray, size: np.ndarray, pair: np.ndarray,
                        other_start: np.ndarray, other_size: np.ndarray, tol: float = 0.05) -> np.ndarray:
    """Per cut gap: is it a long optimizer pause between the two halves of one step's collective burst?

    With a distributed optimizer a step's collective is a reduce-scatter,
    the optimizer, then the next step's all-gather, all in one burst (see
    :func:`optimizer_gaps`). A checkpoint written after the reduce-scatter
    stretches that pause to the length of a step's compute, and the cut
    then falls between the two halves: the step holding the checkpoint
    would be cut in two. Such a gap is recognised by the two bursts it
    separates, with margins: they move the same bytes (within ``tol``),
    together those of a typical burst (within ``2 * tol``: a reduce-scatter
    and an all-gather of the same buffer), over the same pairs, each pair
    about what it moved before (within ``tol`` over all), and little else
    starts in the gap (under a quarter of their bytes: no pipeline forward
    runs while the optimizer waits).

    Parameters
    ----------
    start, busy_end : arrays
        The job's collective flows in start order and their running end.
    cut : int array
        Flow indices that end a burst.
    size, pair : arrays
        Bytes and pair key of each of those flows.
    other_start, other_size : arrays
        The job's other flows.

    Returns
    -------
    bool array, one per ``cut``: the gap after that flow joins two halves.

    Examples
    --------
    Bursts of 4 flows over pairs 0 and 1 every 100, the fourth split in two by a long pause after its reduce-scatter:

    >>> st = np.r_[0:4, 100:104, 200:204, 300:302, 350:352, 450:454, 550:554]
    >>> cut = np.array([3, 7, 11, 13, 15, 19])
    >>> halves_of_one_burst(st, st + 1, cut, np.ones(26), np.arange(26) % 2, np.zeros(0, np.int64), np.zeros(0)).tolist()
    [False, False, False, True, False, False]

    The same gaps, the second half on other pairs (another stage's ring):

    >>> other_ring = np.where((st >= 350) & (st < 400), 2 + st % 2, st % 2)
    >>> halves_of_one_burst(st, st + 1, cut, np.ones(26), other_ring, np.zeros(0, np.int64), np.zeros(0)).tolist()
    [False, False, False, False, False, False]
    """
    cut = np.asarray(cut)
    out = np.zeros(len(cut), dtype=bool)
    if len(cut) < 3:
        return out
    cum = np.concatenate([[0.0], np.cumsum(np.asarray(size, dtype=np.float64))])
    first = np.concatenate([[0], cut + 1])  # burst k: flows first[k]..last[k]
    last = np.concatenate([cut, [len(start) - 1]])
    nbytes = cum[last + 1] - cum[first]
    typical = float(np.median(nbytes[1:-1])) if len(nbytes) > 2 else 0.0
    left, right = nbytes[:-1], nbytes[1:]  # the bursts either side of each cut gap
    cand = np.flatnonzero((np.abs(left - right) <= tol * left) & (np.abs(left + right - typical) <= 2 * tol * typical))
    if len(cand) == 0:
        return out
    o = np.argsort(other_start, kind="stable")
    os_ = np.asarray(other_start)[o]
    ocum = np.concatenate([[0.0], np.cumsum(np.asarray(other_size, dtype=np.float64)[o])])
    pair = np.asarray(pair)
    sz = np.asarray(size, dtype=np.float64)
    for c in cand:
        j0, j1 = np.searchsorted(os_, busy_end[cut[c]], side="right"), np.searchsorted(os_, start[cut[c] + 1], side="left")
        if ocum[j1] - ocum[j0] > 0.25 * (left[c] + right[c]):
            continue
        a, b = slice(first[c], last[c] + 1), slice(first[c + 1], last[c + 1] + 1)
        codes, inv = np.unique(np.concatenate([pair[a], pair[b]]), return_inverse=True)
        na = last[c] + 1 - first[c]
        pa = np.bincount(inv[:na], weights=sz[a], minlength=len(codes))
        pb = np.bincount(inv[na:], weights=sz[b], minlength=len(codes))
        out[c] = bool((pa > 0).all() and (pb > 0).all() and np.abs(pb - pa).sum() <= tol * pa.sum())
    return out


def opened_inside(start: np.ndarray, busy_end: np.ndarray, gap: np.ndarray, cut: np.ndarray, size: np.ndarray, pair: np.ndarray,
                  split: np.ndarray, other_start: np.ndarray, other_end: np.ndarray, tol: float = 0.05, slack: float = 0.1) -> tuple[int, int]:
    """The first burst's optimizer pause where the capture opened inside the collective before it: (flow index, step end) or (-1, 0).

    :func:`optimizer_gaps` asks that the bytes after a pause be the bytes
    before it (or half of them); a capture that opens inside the first
    burst's gradient collective holds only its tail, so that burst's pause
    fails the test, and the step it ends (whole in the capture) was lost.
    The burst's longest inner gap is that pause when, against the next
    burst whose pause was clear (the reference):

    1. it is as long as the clear pauses (within ``slack`` of their
       median: the optimizer takes the same time every step);
    2. nothing after it pauses half as long (:func:`optimizer_gaps`' 4);
    3. the traffic after it is the reference's after its pause, pair by
       pair within ``tol`` (the same rings gather the same buffer);
    4. the traffic before it is some of the reference's before its pause:
       no pair that the reference's does not have, none moving more than
       it (within ``tol``), and something.

    Only the first burst: the capture's edge is what cuts it.
    """
    first = np.concatenate([[0], np.asarray(cut) + 1])
    last = np.concatenate([np.asarray(cut), [len(start) - 1]])
    clear = np.flatnonzero(split >= 0)
    if split[0] >= 0 or len(clear) == 0 or last[0] <= first[0]:
        return -1, 0
    f0, f1 = first[0], last[0]
    i = f0 + int(np.argmax(gap[f0:f1]))
    pause = float(np.median(gap[split[clear]]))
    if abs(gap[i] - pause) > slack * pause:
        return -1, 0
    if i + 1 < f1 and gap[i + 1: f1].max() > 0.5 * gap[i]:
        return -1, 0
    k = clear[0]
    r0, r1, ri = first[k], last[k], split[k]
    keys = np.unique(np.concatenate([pair[f0: f1 + 1], pair[r0: r1 + 1]]))

    def per_pair(a: int, b: int) -> np.ndarray:
        return np.bincount(np.searchsorted(keys, pair[a:b]), weights=size[a:b].astype(np.float64), minlength=len(keys))

    after, ref_after = per_pair(i + 1, f1 + 1), per_pair(ri + 1, r1 + 1)
    before, ref_before = per_pair(f0, i + 1), per_pair(r0, ri + 1)
    if ref_after.sum() <= 0 or np.abs(after - ref_after).sum() > tol * ref_after.sum():
        return -1, 0
    if before.sum() <= 0 or (before > (1 + tol) * ref_before).any():
        return -1, 0
    o = np.asarray(other_start) < start[i + 1]  # its end as optimizer_gaps takes it: other traffic still running in the pause
    return i, int(max(busy_end[i], np.asarray(other_end)[o].max() if o.any() else 0))


def _pause_like_the_others(busy_end, gap, cut, split, split_end) -> np.ndarray:
    """Per burst, where its step most likely ends when its own pause was not clear.

    The optimizer's pause recurs at the same distance before the burst's
    end (the all-gather that follows it takes the same time every step):
    the inner pause whose start lies nearest that distance, from the bursts
    where the pause was clear. The burst's end if it has no inner pause.
    """
    first = np.concatenate([[0], np.asarray(cut) + 1])
    last = np.concatenate([np.asarray(cut), [len(busy_end) - 1]])
    out = busy_end[last].copy()
    ok = split >= 0
    back = float(np.median(busy_end[last][ok] - split_end[ok])) if ok.any() else 0.0
    for k, (f0, f1) in enumerate(zip(first, last)):
        if f1 > f0 and not ok[k]:
            inner = np.arange(f0, f1)[gap[f0:f1] > 0]
            if len(inner):
                out[k] = busy_end[inner[np.argmin(np.abs(busy_end[last[k]] - busy_end[inner] - back))]]
    return out


def _data_flows(size: np.ndarray, is_dp: np.ndarray) -> np.ndarray | None:
    """One job's flows less its DP control messages (:func:`prism.analysis.control.control_messages`): a mask, or None if it has none.

    A receiver's clear-to-send (tens to a few hundred bytes, at its own
    entry into a collective) lands in the job's idle time while the
    others wait: in the optimizer's pause, between a late member's
    collectives. Counted as traffic, the early members' clear-to-sends
    fill the pause a step is cut at (a 2-server FSDP job with 0.3 s
    steps got no step at all) and split the gaps a class of pauses is
    told from. The steps are cut on the job's data; the control messages
    still count in the step they start in. Only DP flows: a pipeline's
    small messages (the grad-norm all-reduce) close a step
    (:func:`control_tails`).
    """
    if not is_dp.any():
        return None
    ctl = np.zeros(len(size), dtype=bool)
    ctl[is_dp] = control_messages(size[is_dp])
    return ~ctl if ctl.any() else None


def control_tails(ends: np.ndarray, light_start: np.ndarray, light_end: np.ndarray, heavy_start: np.ndarray, dp_start: np.ndarray,
                  tau: float) -> np.ndarray:
    """Move each step end past the control traffic that closes the step.

    After the gradient collective, the grad-norm all-reduce (a few bytes
    over each replica's stages) is the step's last traffic; a step ends with
    its last flow, so a boundary at the collective's end moves to the end of
    the light flows that follow it, up to the next real transfer (a pipeline
    or DP flow) and within ``tau``.

    Examples
    --------
    >>> control_tails(np.array([100, 500]), np.array([101, 130, 300]), np.array([120, 140, 310]),
    ...               np.array([200]), np.array([450]), tau=80).tolist()
    [140, 500]
    """
    ls_o = np.argsort(light_start, kind="stable")
    ls, le = np.asarray(light_start)[ls_o], np.asarray(light_end)[ls_o]
    nxt = np.sort(np.concatenate([np.asarray(heavy_start), np.asarray(dp_start)]))
    out = np.asarray(ends).copy()
    for k, b in enumerate(out):
        n = np.searchsorted(nxt, b, side="right")  # the next real transfer after b
        stop = min(b + tau, nxt[n] if n < len(nxt) else np.inf)
        j0, j1 = np.searchsorted(ls, b, side="left"), np.searchsorted(ls, stop, side="left")
        if j1 > j0:
            out[k] = max(b, le[j0:j1].max())
    return out


def parallel_groups(a: np.ndarray, b: np.ndarray, n_nodes: int) -> np.ndarray:
    """Connected component of every node in the graph of pairs ``(a, b)``.

    Nodes in no pair get their own component. O(nodes + pairs).

    >>> parallel_groups(np.array([0, 2]), np.array([1, 3]), 5).tolist()
    [0, 0, 1, 1, 2]
    """
    return connected_components(a, b, n_nodes)


@numba.njit(cache=True, nogil=True)
def _step_sums(idx, start, end, dp, size, ends, flow_step, step0):  # pragma: no cover - compiled
    """Per step between ``ends``: first start and last end of its PP (row 0) and DP (row 1) flows, their counts, its
    flows and bytes (a float sum in flow order, as ``np.bincount`` gives). ``idx``: flows in start order, so each
    flow's step is found by walking ``ends`` once (what ``searchsorted(ends, start, "right") - 1`` gives)."""
    n = len(ends) - 1
    lo = np.full((2, n), np.iinfo(np.int64).max)
    hi = np.full((2, n), np.iinfo(np.int64).min)
    count = np.zeros((2, n), np.int64)
    flows = np.zeros(n, np.int64)
    nbytes = np.zeros(n)
    j = 0
    for t in range(len(idx)):
        f = idx[t]
        s = start[f]
        while j < len(ends) and ends[j] <= s:
            j += 1
        k = j - 1
        if k < 0 or k >= n:
            continue
        if len(flow_step):
            flow_step[f] = step0 + k
        d = 1 if dp[f] else 0
        lo[d, k] = min(lo[d, k], s)
        hi[d, k] = max(hi[d, k], end[f])
        count[d, k] += 1
        flows[k] += 1
        nbytes[k] += size[f]
    return lo, hi, count, flows, nbytes


class StepTimeline:
    """Reconstruct every job's whole training steps and their phases.

    Parameters
    ----------
    min_jump : float, default 1.2
        Step gaps must be at least this many times the largest gap inside a
        step (see :func:`natural_break`).
    min_steps : int, default 3
        Jobs with fewer whole steps report none (there is no period to
        find in fewer).

    Attributes
    ----------
    steps_ : pandas.DataFrame
        After ``fit``: :data:`STEP_COLUMNS`, one row per whole step, with
        the integer job label in ``job`` as well.
    flow_step_ : int array
        Per flow (in the order given to ``fit``), the index of its step in
        ``steps_``, or -1 outside whole steps.
    breaks_ : dict
        Per job label, the gap threshold (ns) used, ``inf`` if none.
    unlike_ : set
        Job labels whose traffic has a regular cut but whose pieces carry
        different traffic (not steps: see :func:`_pieces_alike`); they get
        no steps.
    accumulation_ : dict
        Per job label cut at its micro-batches' gaps and grouped (see
        :func:`accumulation_period`), the micro-batches of a step.
    by_pair_ : dict
        Job labels whose steps were found on single pairs' flows (see
        :meth:`_by_pair`): True.
    """

    def __init__(self, min_jump: float = 1.2, min_steps: int = 3):
        self.min_jump = float(min_jump)
        self.min_steps = int(min_steps)

    def fit(self, job: np.ndarray, start: np.ndarray, end: np.ndarray, is_dp: np.ndarray, size: np.ndarray | None = None,
            capture_end: int | None = None, job_names: Mapping[int, Any] | Sequence[Any] | None = None, pair: np.ndarray | None = None,
            collective: np.ndarray | None = None) -> "StepTimeline":
        """Find the steps.

        Parameters
        ----------
        job : int array
            Job label per flow (-1: not in a job).
        start, end : int arrays
            Flow start and end (ns).
        is_dp : bool array
            The flow is on a DP pair.
        size : int array, optional
            Flow bytes (for the per-step byte count).
        capture_end : int, optional
            Start of the last record of the whole capture (any traffic); the
            last burst of a job is whole only if the capture ran a full
            break past it. Default: the last flow start given.
        job_names : sequence, optional
            ``job_names[label]`` is the job id written out (default: label).
        pair : int array, optional
            A key of each flow's GPU pair; lets a step end inside a burst
            where the same DP rings run a second collective of the same size
            (a distributed optimizer's reduce-scatter, then the next step's
            all-gather: see :func:`optimizer_gaps`), and a checkpoint every
            N steps stay a slow step rather than the period (see
            :func:`natural_break`).
        collective : bool array, optional
            The flow is on a pair with collective timing (bursts once or
            twice a step). A job whose DP rings the network does not see
            (they run over NVLink) is cut at the end of these bursts (the
            embedding all-reduce closes the step) rather than at a pipeline
            flush.
        """
        job = np.asarray(job)
        start = np.asarray(start, dtype=np.int64)
        end = np.asarray(end, dtype=np.int64)
        is_dp = np.asarray(is_dp, dtype=bool)
        size = np.zeros(len(start), dtype=np.int64) if size is None else np.asarray(size, dtype=np.int64)
        pair = None if pair is None else np.asarray(pair, dtype=np.int64)
        collective = is_dp if collective is None else np.asarray(collective, dtype=bool)
        if capture_end is None:
            capture_end = int(start.max()) if len(start) else 0
        order = order_by([job], start)
        js = job[order]
        bounds = np.flatnonzero(np.diff(js)) + 1
        firsts = np.concatenate([[0], bounds])
        lasts = np.concatenate([bounds, [len(js)]])
        flow_step = np.full(len(start), -1, dtype=np.int64)
        frames: list[pd.DataFrame] = []
        self._reset_fit_state()
        n_steps = 0
        for f0, f1 in zip(firsts, lasts):
            label = int(js[f0]) if f1 > f0 else -1
            if label < 0:
                continue
            idx = order[f0:f1]
            # a job's flows given together and in start order (a replay's batches, a window of one job) are a
            # slice: views, not copies
            rows = slice(int(idx[0]), int(idx[-1]) + 1) if bool(np.all(np.diff(idx) == 1)) else idx
            is_dp_j = is_dp[rows]
            mark = is_dp_j if is_dp_j.any() else collective[rows]  # DP bursts, else other collectives, else the flush
            s_j, e_j, z_j, p_j = start[rows], end[rows], size[rows], None if pair is None else pair[rows]
            data = _data_flows(z_j, is_dp_j)
            if data is not None:  # the receivers' clear-to-sends neither fill nor split a pause: cut on the rest
                s_j, e_j, mark, z_j, p_j = s_j[data], e_j[data], mark[data], z_j[data], None if p_j is None else p_j[data]
            ends = self._boundaries(label, s_j, e_j, mark, capture_end, z_j, p_j)
            if len(ends) < 2:
                continue
            name = job_names[label] if job_names is not None else label
            frames.append(self._step_table(label, name, ends, idx, start, end, is_dp, size, flow_step, n_steps))
            n_steps += len(ends) - 1
        cols = ["job"] + STEP_COLUMNS
        self.steps_ = pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame({c: pd.Series(dtype=np.int64) for c in cols})
        self.flow_step_ = flow_step
        return self

    def _boundaries(self, label, start, end, dp, capture_end, size=None, pair=None) -> np.ndarray:
        """Step boundaries (ends of whole collective bursts), sorted."""
        marker = dp if dp.any() else np.ones(len(dp), dtype=bool)  # PP-only: the flush
        s, e = start[marker], end[marker]
        self.optimizer_split_[label] = False
        if len(s) < 3:
            self.breaks_[label] = np.inf
            return np.zeros(0, dtype=np.int64)
        gap, busy_end = busy_gaps(s, e)
        span = float(end.max() - start.min())
        pair_m, weight_m = (None if pair is None else pair[marker]), (None if size is None else size[marker])
        threshold = _threshold_cut(gap, busy_end, self.min_jump, self.min_steps, 1, 0.02, 0.4, span, pair_m, weight_m)
        tau = np.inf if threshold is None else threshold.tau
        cut = np.flatnonzero(gap >= tau)  # a burst ends at flow `cut`
        o_start, o_end, o_size = start[~marker], end[~marker], (size[~marker] if size is not None else np.ones((~marker).sum()))
        if threshold is not None and dp.any() and size is not None and pair is not None and len(cut) >= self.min_steps:
            cut = cut[~halves_of_one_burst(s, busy_end, cut, size[marker], pair[marker], o_start, o_size)]
        alike = threshold is not None and (pair_m is None or _pieces_alike(cut, pair_m, weight_m))
        by_class = None if pair_m is None else class_cut(gap, busy_end, pair_m, weight_m, threshold, alike, self.min_jump, self.min_steps,
                                                         span_ns=span)
        if by_class is not None:
            # cut at the optimizer's pause between layers' or micro-batches' gaps: each piece is a whole step, and
            # the bursts between cut gaps are not collectives, so none of the burst rules below applies
            self.breaks_[label] = by_class.tau
            return self._last_step(by_class.ends, busy_end, float(np.max(gap)), capture_end, o_start)
        self.breaks_[label] = tau if alike else np.inf
        if not alike:
            # no gap isolates the steps: the optimizer's pause may still show by splitting, once a step, what
            # every other micro-batch boundary keeps as one piece
            by_pause = None if size is None or pair is None or not dp.any() else optimizer_splits(gap, busy_end, size[marker],
                                                                                              self.min_jump, self.min_steps)
            # one member's pairs see what the job's union hides: a slow server's waits fill the job's gaps with the
            # early members' first messages, but the pairs into and out of it wait for nothing
            by_pair = None if size is None or pair is None or not dp.any() else self._by_pair(
                s, e, size[marker], pair[marker], gap, busy_end, capture_end, span)
            if by_pair is not None:
                ends = self._last_step(busy_end[by_pair], busy_end, float(np.max(gap)), capture_end, o_start)
                if by_pause is None or (len(ends) > len(by_pause) and np.isin(by_pause, ends).all()):
                    self.by_pair_[label] = True
                    return ends
            if by_pause is not None:
                return by_pause.astype(np.int64)
            if threshold is not None:
                # the most regular cut's "steps" carry different traffic, and nothing else isolates the steps
                # either: no steps, rather than wrong ones
                self.unlike_.add(label)
            return np.zeros(0, dtype=np.int64)
        grouped = (accumulation_period(gap[cut], piece_ns=float(np.median(np.diff(busy_end[cut]))))
                   if dp.any() and len(cut) >= 2 * self.min_steps else None)
        if grouped is not None:
            # micro-batches, each with its own all-reduce: a step ends at every M-th piece, where the optimizer ran
            m, phase = grouped
            self.accumulation_[label] = m
            kept = cut[phase::m]
            trailing = len(cut) - 1 - (phase + m * (len(kept) - 1))  # whole pieces after the last step's end
            if trailing + 1 < m:
                return busy_end[kept].astype(np.int64)
            return self._last_step(busy_end[kept], busy_end, float(np.max(gap)), capture_end, o_start)
        ends = busy_end[cut]
        # control traffic: flows far smaller than a DP message (the grad-norm all-reduce)
        light = o_size < 0.01 * np.median(size[marker]) if size is not None and dp.any() else np.zeros(len(o_start), dtype=bool)
        if dp.any() and size is not None and len(cut) >= self.min_steps:
            ring = np.zeros(len(s), dtype=np.int64) if pair is None else pair[marker]
            split, split_end = optimizer_gaps(s, busy_end, gap, cut, size[marker], ring, o_start, o_end, o_size)
            if np.mean(split >= 0) >= 0.8:  # a recurring structure, not a coincidence
                self.optimizer_split_[label] = True
                # a burst without a clear pause (records lost in it) still
                # ends a step: at the pause where the others' is, the best
                # guess, rather than two steps merged into one that looks
                # twice as slow; but the first burst without one is the
                # capture opening between the two collectives
                guess = _pause_like_the_others(busy_end, gap, cut, split, split_end)
                ends = np.where(split[:-1] >= 0, split_end[:-1], guess[:-1])
                if split[0] < 0:
                    # the capture opening between the two collectives; or inside the first, whose pause is then
                    # the others' and is followed by the others' second collective
                    i0, end0 = opened_inside(s, busy_end, gap, cut, size[marker], ring, split, o_start, o_end)
                    ends = ends[1:] if i0 < 0 else np.concatenate([[end0], ends[1:]])
        # The last burst is whole if the capture ran a full break past it,
        # or if the job's next step began (its PP traffic waits for the
        # optimizer, which waits for the collective). Otherwise the capture
        # may have cut the burst short.
        last = busy_end[-1]
        if capture_end - last >= tau or (o_start[~light] > last).any():
            if self.optimizer_split_[label] and split[-1] >= 0:
                last = split_end[-1]
            ends = np.append(ends, last)
        if light.any():
            ends = control_tails(ends, o_start[light], o_end[light], o_start[~light], s, tau)
        return ends.astype(np.int64)

    def _reset_fit_state(self) -> None:
        """The per-job records a fit fills (see the class's attributes), empty: set by :meth:`fit` and by a pair's own cut."""
        self.breaks_: dict[int, float] = {}
        self.unlike_: set[int] = set()
        self.optimizer_split_: dict[int, bool] = {}
        self.accumulation_: dict[int, int] = {}
        self.by_pair_: dict[int, bool] = {}

    def _by_pair(self, s, e, size, pair, gap, busy_end, capture_end, span, max_pairs: int = 64, agree: float = 0.9,
                 max_score: float = 0.1, tie: float = 0.02) -> np.ndarray | None:
        """The job's step ends as its pairs see them, one pair at a time: indices into ``gap``, or None.

        Where the job's own gaps show no step (a slow server's waits are split
        by the early members' first messages into a continuum of gaps), a ring
        edge into or out of that server waits for nothing: its flows keep the
        job's pattern, and the rules that cut a job cut them
        (:meth:`_boundaries` on that pair's flows alone). Each step end a pair
        gives is the job's longest idle gap between that pair's step end and
        its next flow (:func:`gaps_within`). Taken only with margins: the
        job's steps between those gaps are regular (a score under
        ``max_score``, as :func:`class_cut` takes) and carry alike traffic
        (:func:`_pieces_alike`), and a second pair gives the same gaps
        (``agree`` of them): one pair's chance cut is not the job's. A pair
        more than ``1 - agree`` of whose step ends fall among several alike
        gaps of the job's (``gaps_within(clear=min_jump)``) pins no cut and is
        passed over. Up to ``max_pairs`` pairs are tried, those with the most
        flows first, and every two that agree give a candidate (the ends of
        the one with more). Pairs can agree on another cut, the rails of one
        ring edge being copies of each other: with the slow server in from the
        capture's start, the rails of the edge between two early members of a
        faulty FSDP job (0.3 s steps, 20 s) agreed on a chance class of their
        gaps, once a micro-batch, 20 ms into it (a score of 0.026 on the job's
        gaps), where the edges into and out of the slow server cut at the
        optimizer's pause (0.0015); in HSDP (5 s, 180 s) the other shard
        group's pair cut at no true end (0.043, against 0.0005). The most
        regular candidate wins, as :func:`class_cut` takes it: but a near-tie
        (within ``tie``) that cuts wherever it does and more is preferred, the
        step being the shortest period.
        """
        keys, counts = np.unique(pair, return_counts=True)
        if len(keys) < 2:
            return None
        g = np.maximum(gap.astype(np.float64), 1)
        span_all = float(busy_end[-1] - busy_end[0]) or 1.0
        sub = StepTimeline(self.min_jump, self.min_steps)
        sub._reset_fit_state()
        found: list[tuple[np.ndarray, float]] = []
        agreed: list[tuple[np.ndarray, float]] = []
        for k in keys[np.lexsort((keys, -counts))[:max_pairs]]:
            m = pair == k
            if int(m.sum()) < 3 * (self.min_steps + 1):
                continue
            ends = sub._boundaries(0, s[m], e[m], np.ones(int(m.sum()), dtype=bool), capture_end, size[m], pair[m])
            if len(ends) < self.min_steps + 1:
                continue
            idx = gaps_within(ends, s[m], s, busy_end, gap, clear=self.min_jump)
            if np.count_nonzero(idx == -2) > (1 - agree) * np.count_nonzero(idx != -1):
                continue  # the pair's ends do not pin the job's: each stands for one of several alike gaps
            idx = np.unique(idx[idx >= 0])
            c = _score_cut(g, idx, float(g[idx].min()) if len(idx) else 0.0, busy_end, self.min_steps, 0.4, span_all, span, band=True)
            if c is None or c.score > max_score or not _pieces_alike(idx, pair, size):
                continue
            for prev, score in found:
                if len(np.intersect1d(prev, idx)) >= agree * max(len(prev), len(idx)):
                    agreed.append((prev, score) if len(prev) >= len(idx) else (idx, c.score))
                    break
            else:
                found.append((idx, c.score))
        if not agreed:
            return None
        best, best_score = min(agreed, key=lambda a: a[1])
        finer = [a for a, score in agreed if score <= best_score + tie and len(a) > len(best)
                 and len(np.intersect1d(a, best)) >= agree * len(best)]
        return max(finer, key=len) if finer else best

    @staticmethod
    def _last_step(ends: np.ndarray, busy_end: np.ndarray, quiet: float, capture_end: int, o_start: np.ndarray) -> np.ndarray:
        """``ends`` and, if the job's traffic after the last of them is a whole step, its end.

        Whole when the job then went quiet for longer than any gap of its
        (``quiet``: it ended; a capture cut in the middle of a step leaves
        the step's rest unseen) or its other traffic went on.
        """
        last = busy_end[-1]
        if capture_end - last > quiet or (o_start > last).any():
            ends = np.append(ends, last)
        return ends.astype(np.int64)

    @staticmethod
    def _step_table(label, name, ends, idx, start, end, dp, size, flow_step=None, step0=0) -> pd.DataFrame:
        """One job's steps between ``ends``, from its flows ``idx`` (in start order); each flow's step into ``flow_step``.

        Flow -> step: ``ends[k] <= start < ends[k+1]`` is step k (the flows
        after the last boundary and before the first are outside whole
        steps); step k is numbered ``step0 + k`` in ``flow_step``.
        """
        n = len(ends) - 1
        lo, hi, count, flows, nbytes = _step_sums(np.asarray(idx, np.int64), start, end, dp, size, np.asarray(ends, np.int64),
                                                  np.empty(0, np.int64) if flow_step is None else flow_step, np.int64(step0))
        cols = {"job": np.full(n, label), "job_id": [name] * n, "step": np.arange(n), "start_ns": ends[:-1], "end_ns": ends[1:],
                "duration_ns": ends[1:] - ends[:-1]}
        for d, kind in enumerate(("pp", "dp")):
            missing = count[d] == 0  # a step without this kind of traffic: NA
            cols[f"{kind}_start_ns"] = pd.arrays.IntegerArray(np.where(missing, 0, lo[d]), missing)
            cols[f"{kind}_end_ns"] = pd.arrays.IntegerArray(np.where(missing, 0, hi[d]), missing.copy())
        cols["flows"] = flows
        cols["bytes"] = nbytes.astype(np.int64)
        return pd.DataFrame(cols)
