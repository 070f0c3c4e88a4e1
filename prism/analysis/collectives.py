"""Per-collective metrics from the network: what NCCL Inspector reports from inside NCCL, seen on the wire.

Operators want, per job and kind of collective, how many ran, how many
bytes they moved, how long they took and at what bus bandwidth. NCCL
Inspector gets that from inside NCCL; Prism has only the flow records, so
this module rebuilds the collectives from the GPU flows and the pair types
the analyses already gave, with or without the job's steps.

**Kinds** (what the network can tell apart, by the pair types):

=================  ===========================================================
``dp_collective``  a data-parallel ring collective: all-reduce, or a
                   reduce-scatter or all-gather (ZeRO, FSDP, the distributed
                   optimizer); the ring bursts an MoE job's dense all-reduce
                   sends over its expert pairs count here too
``pp_sendrecv``    one pipeline send/recv (activations forward, gradients
                   back); the embedding and grad-norm all-reduces Megatron
                   runs over pipeline pairs count here too (a two-member
                   all-reduce is a send and a receive each way on the wire)
``ep_alltoall``    an expert-parallel all-to-all (an MoE dispatch or combine)
``cp_ring``        one ring-attention pass of K/V blocks (context parallel)
=================  ===========================================================

**An instance** is a burst: the flows of one group, back to back with no
pause longer than ``min_pause_ns`` (20 us: the chunks of one collective
leave gaps of nanoseconds, compute between collectives takes far longer)
or than :data:`PAUSE_SHARE` of the burst so far (a ring whose steps wait
for its slowest edge pauses between them for a few percent of a step),
**unless the pause is a rendezvous**: a DP, EP or CP burst does not end
at a pause whose next flow comes from a NIC that sent in the group's
previous burst and has not yet sent in this one. NCCL's network transport
moves a ring edge once both its ends have entered the collective, so the
ranks entering microseconds to milliseconds apart (their compute clocks
drift) leave waits inside one collective as long as the pauses between
collectives, and the pause alone cannot tell them apart (on the
SYNTHETIC rendezvous DDP at 0.3 s steps it counted 29.6 all-reduces a
step for 11; at 5 s, 88 for 41). What tells them apart is who sends
next: after a wait inside a collective, the member whose entry ended it
(and its ring predecessor, whose edge waited for it) send their first
messages of the collective; a new collective's first messages come from
members that have sent already once the last one is whole. So a burst
cannot close before every member of the previous burst has sent in it,
and a member that sends nothing in a collective holds no burst open
beyond the next pause that a present member ends (the next collective
is its own). A group's first burst awaits every NIC not yet seen. A
group's last burst still missing members of the one before is
``waiting`` (:data:`INSTANCE_COLUMNS`), and :func:`settled` keeps it
open for the next piece. The wait is in the collective's duration, as
it is in NCCL's own timing of the early ranks.
A DP, EP or CP group is a component of that kind's pairs, joined with
the others that share a server: all rails together (each rail's NICs run
their own ring over the same servers at once: one collective over those
servers), and the pieces of a ring partly inside servers (TP smaller than
a server) together. A PP group is one directed NIC pair (a send and its
receive, as NCCL counts point-to-point operations). So Prism counts a collective once per group of servers: a
Megatron job with TP 8 runs 8 DP communicators side by side on the 8
rails, which NCCL Inspector counts as 8 all-reduces; a DP-only job's one
communicator spreads over the rails as channels, and both count one.
Collectives issued back to back with no pause (Megatron's gradient
buckets after the last backward) are one burst on the wire, and count
as one.

**Bus bandwidth.** NCCL-tests define ``busbw = algbw * 2(n-1)/n`` for an
all-reduce (``(n-1)/n`` for all-gather, reduce-scatter and all-to-all, 1
for send/recv), with ``algbw = S / t`` for a buffer of ``S`` bytes per
rank: in each case that is the bytes each rank puts on its link over the
time, the figure to compare with the link speed. Prism sees exactly
those bytes (it cannot see ``S``, nor tell an all-reduce from a
reduce-scatter and all-gather pair: both are ring passes), so it reports
``busbw = wire bytes / (sending NICs * duration)``, which is NCCL-tests'
busbw for every one of those collectives when each rank has its own NIC.
``algbw`` would be ``busbw * n / (2(n-1))`` for an all-reduce of ``n``
ranks and ``busbw * n / (n-1)`` for the others; Prism does not report it.
The duration runs from the burst's first flow start to its last flow end:
a rank that enters the collective late delays its first send, so a
straggler's wait shows as lower bus bandwidth, as it does in NCCL's own
timing. The flows are RDMA messages, so NVLink traffic inside a server is
not seen: a ring partly inside servers shows only its network edges.

**Counting once.** The instance table (:data:`INSTANCE_COLUMNS`) is per
burst, so the tables of pieces of a job (batches of jobs, time slices,
the daemon's windows) combine: :func:`settled` takes a piece's bursts
that end in a span no other piece takes. :func:`summarise` gives the
per-(job, kind) table ``prism replay`` writes (:data:`COLLECTIVE_COLUMNS`).

Vectorised: the groups are found per pair and per NIC, and one compiled
pass over the flows in the order they come (each job's in start order;
the table of bursts grows by doubling) cuts every group's flows into
bursts at once, with no sort and no array over the flows (per NIC and
kind of group, the burst it last sent in: that is all the rendezvous rule
needs); the loops left in Python run over kinds, and over jobs and kinds
in :func:`summarise`. About 17 ns a flow of CPU (37 ms for the demo
preset's 2.1M GPU flows, as before the rendezvous rule).
"""
from __future__ import annotations

from typing import Any

import numba
import numpy as np
import pandas as pd

from prism.common.components import connected_components
from prism.common.ordering import rank_keys, stable_order

__all__ = ["KINDS", "INSTANCE_COLUMNS", "COLLECTIVE_COLUMNS", "MIN_PAUSE_NS", "PAUSE_SHARE", "DP", "PP", "EP", "CP", "collective_instances",
           "concat_instances", "empty_instances", "settled", "settled_by_job", "summarise"]

#: the kinds, in the order of their codes (:data:`DP`, :data:`PP`, :data:`EP`, :data:`CP`)
KINDS = ("dp_collective", "pp_sendrecv", "ep_alltoall", "cp_ring")
DP, PP, EP, CP = range(4)
#: a pause longer than this ends a burst (as the phases' and the arrival diagnosis's bursts) ...
MIN_PAUSE_NS = 20_000
#: ... if it is also longer than this share of the burst so far
PAUSE_SHARE = 0.25

#: one row per collective instance (burst): its job, kind, first flow start, last flow end, flows, wire bytes, sending NICs,
#: and (a group's last burst) the sending NICs of the group's previous burst that have not sent in it yet: a collective
#: some members have not entered, which a later flow of theirs would continue after any pause (see :func:`settled`)
INSTANCE_COLUMNS = ["job_id", "kind", "start_ns", "end_ns", "flows", "bytes", "nics", "waiting"]
#: ``collectives.csv``: per job and kind. ``per_step``: the instances that start inside the job's whole steps over those
#: steps (empty without steps); ``nics``: median sending NICs of an instance; busbw (GB/s, 1e9 bytes a second): over all
#: instances (their bytes over their NIC-seconds) and the median of the instances'
COLLECTIVE_COLUMNS = ["job_id", "kind", "collectives", "per_step", "bytes", "flows", "nics", "duration_sum_ns", "duration_median_ns",
                      "duration_p95_ns", "busbw_gbps", "busbw_median_gbps"]


def concat_instances(frames: list) -> pd.DataFrame | None:
    """Instance tables (of batches, slices) as one, the job and kind columns kept categorical (their categories joined):
    a replay's millions of pipeline sends then hold a byte a row for each, and :func:`summarise` groups them by code."""
    given = [f for f in frames if f is not None]
    frames = [f for f in given if len(f)] or given[:1]
    if not frames:
        return None
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    cols: dict[str, Any] = {}
    for c in INSTANCE_COLUMNS:
        if all(isinstance(f[c].dtype, pd.CategoricalDtype) for f in frames):
            cats = pd.Index(pd.unique(np.concatenate([np.asarray(f[c].cat.categories, dtype=object) for f in frames])), dtype=object)
            codes = [np.append(cats.get_indexer(f[c].cat.categories), -1)[f[c].cat.codes.to_numpy()] for f in frames]  # -1 stays -1
            cols[c] = pd.Categorical.from_codes(np.concatenate(codes), categories=cats)
        else:
            cols[c] = np.concatenate([f[c].to_numpy() for f in frames])
    return pd.DataFrame(cols)


def empty_instances() -> pd.DataFrame:
    return pd.DataFrame({"job_id": pd.Series(dtype="object"), "kind": pd.Series(dtype="object"),
                         **{c: pd.Series(dtype="int64") for c in INSTANCE_COLUMNS[2:]}})


def collective_instances(kind: np.ndarray, a: np.ndarray, b: np.ndarray, start: np.ndarray, end: np.ndarray, size: np.ndarray,
                         flow_pair: np.ndarray, pair_a: np.ndarray, pair_b: np.ndarray, labels: np.ndarray, server_of: np.ndarray,
                         job_names: dict, min_pause_ns: int = MIN_PAUSE_NS, pause_share: float = PAUSE_SHARE) -> pd.DataFrame:
    """The collective instances (bursts) of the flows, :data:`INSTANCE_COLUMNS`, in the order they open.

    Parameters
    ----------
    kind : int array
        Per flow, its kind's code (:data:`DP`, :data:`PP`, :data:`EP`,
        :data:`CP`), -1 for a flow of none (left out).
    a, b : int arrays
        Source and destination NIC per flow.
    start, end, size : int arrays
        Per flow. Each job's flows in start order is the fast path (as a
        replay's batches and the daemon's windows give them): one pass in
        the given order, no sort; any other order gives the same rows, by
        a sort of the starts.
    flow_pair : int array
        Per flow, its row of the pair table ``pair_a, pair_b`` (unordered NIC pairs).
    labels : int array
        Job label per NIC; ``job_names`` maps it to the job id.
    server_of : int array
        Server code per NIC.

    Notes
    -----
    Memory: a few arrays over the NICs and the pairs (the groups'
    state), none over the flows beyond ``kind``.
    """
    kind = np.asarray(kind, np.int8)
    if not len(kind):
        return empty_instances()
    n_nics, n_pairs = len(labels), len(pair_a)
    used = _used_pairs(kind, np.asarray(flow_pair), n_pairs)  # per kind (DP, PP, EP, CP) and pair: has it a flow of the kind
    if not used.any():
        return empty_instances()
    nic_group = np.full((3, n_nics), -1, np.int64)  # DP, EP, CP: per NIC its server-set group (one per NIC and kind)
    group_kind: list[int] = []
    for row, k in enumerate((DP, EP, CP)):
        if not used[k].any():
            continue
        groups, n_groups = _server_set_groups(used[k], pair_a, pair_b, n_nics, server_of)
        nic_group[row] = np.where(groups >= 0, groups + len(group_kind), -1)
        group_kind += [k] * n_groups
    n_set = len(group_kind)  # then a PP group per directed pair: n_set + 2 * pair + (src > dst)
    args = (kind, np.asarray(a), np.asarray(b), np.asarray(flow_pair), np.asarray(start, np.int64), np.asarray(end, np.int64),
            np.asarray(size, np.int64), nic_group, np.int64(n_set), np.int64(n_set + 2 * n_pairs), np.int64(min_pause_ns), float(pause_share))
    out = _bursts(np.zeros(0, np.int64), *args)
    if out is None:  # a group's flows not in start order: in the order of their starts
        out = _bursts(np.argsort(start, kind="stable"), *args)
    g, first, b0, b1, flows, nbytes, nics, waiting = out
    kcode = np.where(g < n_set, np.asarray(group_kind + [PP], np.int64)[np.minimum(g, n_set)], PP)
    job_label = np.asarray(labels)[np.asarray(a)[first]].astype(np.int64) + 1  # 0: a NIC of no job (none here: pairs are within jobs)
    present = np.flatnonzero(np.bincount(job_label, minlength=1))
    code_of = np.zeros(int(present[-1]) + 1 if len(present) else 1, np.int64)
    code_of[present] = np.arange(len(present))
    job_ids = pd.Index([job_names.get(int(j) - 1, str(int(j) - 1)) for j in present], dtype=object)  # one per job, not per burst
    # categoricals: a code per burst, no string per row
    return pd.DataFrame({"job_id": pd.Categorical.from_codes(code_of[job_label], categories=job_ids),
                         "kind": pd.Categorical.from_codes(kcode, categories=pd.Index(KINDS, dtype=object)), "start_ns": b0, "end_ns": b1,
                         "flows": flows, "bytes": nbytes, "nics": nics, "waiting": waiting})


def _server_set_groups(used: np.ndarray, pair_a: np.ndarray, pair_b: np.ndarray, n_nics: int, server_of: np.ndarray) -> tuple[np.ndarray, int]:
    """Per NIC, its group (-1 outside the ``used`` pairs): the components of those pairs joined where they share a server; and how many.

    Each rail runs its own ring over the same servers, and a ring partly
    inside servers shows on the network as pieces (its NVLink edges
    hidden) that meet at its servers: one group either way. Connected
    components over the NICs and servers (per pair and NIC, not per flow).
    """
    pa, pb = pair_a[used], pair_b[used]
    nodes = np.unique(np.concatenate([pa, pb]))
    srv = np.asarray(server_of)[nodes].astype(np.int64)
    comp = connected_components(np.concatenate([pa, nodes]), np.concatenate([pb, n_nics + srv]), n_nics + int(srv.max()) + 1)
    out = np.full(n_nics, -1, np.int64)
    group, _ = pd.factorize(comp[nodes])  # numbered in NIC order
    out[nodes] = group
    return out, int(group.max(initial=-1)) + 1


@numba.njit(cache=True, nogil=True)
def _used_pairs(kind, flow_pair, n_pairs):  # pragma: no cover - compiled
    """Per kind code and pair: does one of the pair's flows have that kind (one pass)."""
    used = np.zeros((4, n_pairs), np.bool_)
    for i in range(len(kind)):
        if kind[i] >= 0:
            used[kind[i], flow_pair[i]] = True
    return used


@numba.njit(cache=True, nogil=True)
def _bursts(order, kind, a, b, flow_pair, start, end, size, nic_group, n_set, n_groups, min_pause, share):  # pragma: no cover - compiled
    """Cut each group's flows into bursts, in one pass over the flows (``order``, or as given when it is empty).

    A flow's group: its NIC's server-set group for DP, EP and CP (``nic_group`` rows), its directed pair for PP. Per
    burst, in the order they open: its group, first flow, first start, last end, flows, bytes, distinct sources, and
    for each group's last burst the sources of the group's burst before it that have not sent in it (0 for the
    others, which a later burst closed, and for a group's first: who it awaits is not known). None when a group's flows are not in start order (the caller passes an order
    by start). The rule is :func:`_run`'s; the table per burst grows by doubling between its calls (no array over the
    flows, and none reassigned inside the loop over them, which would cost numba a reference count a flow).
    """
    n = len(order) if len(order) else len(kind)
    cur = np.full(n_groups, -1, np.int64)  # the group's open burst
    prev = np.full(n_groups, -1, np.int64)  # the burst before it (-1: none, so every NIC not yet seen is awaited)
    busy = np.zeros(n_groups, np.int64)  # the group's latest end so far
    opened = np.zeros(n_groups, np.int64)  # when the group's open burst began
    last = np.zeros(n_groups, np.int64)  # the group's latest start so far
    seen = np.full((3, len(nic_group[0])), -1, np.int64)  # per kind of server-set group and NIC: the burst it last sent in
    out = np.zeros((max(1024, n >> 6), 8), np.int64)  # per burst: group, first flow, start, end, flows, bytes, sources, kept
    i, nb = 0, 0
    while True:
        i, nb = _run(i, nb, out, order, kind, a, b, flow_pair, start, end, size, nic_group, n_set, min_pause, share, cur, prev, busy,
                     opened, last, seen)
        if i < 0:
            return None
        if i >= n:
            break
        grown = np.zeros((2 * len(out), 8), np.int64)
        grown[:nb] = out[:nb]
        out = grown
    waiting = np.zeros(nb, np.int64)
    for g in range(n_set):
        if cur[g] >= 0 and prev[g] >= 0:
            waiting[cur[g]] = out[prev[g], 6] - out[cur[g], 7]
    return (out[:nb, 0].copy(), out[:nb, 1].copy(), out[:nb, 2].copy(), out[:nb, 3].copy(), out[:nb, 4].copy(), out[:nb, 5].copy(),
            out[:nb, 6].copy(), waiting)


@numba.njit(cache=True, nogil=True)
def _run(i0, nb, out, order, kind, a, b, flow_pair, start, end, size, nic_group, n_set, min_pause, share, cur, prev, busy, opened,
         last, seen):  # pragma: no cover - compiled
    """:func:`_bursts`' pass from flow ``i0`` (``nb`` bursts so far, in ``out``): (where it stopped, bursts): the end of
    the flows, or the flow that opens a burst ``out`` has no row for; -1 when a group's flows are out of start order.

    A burst opens at a group's first flow and at a flow after a pause (its start minus the latest end of the group's
    earlier flows) over ``min_pause`` and over ``share`` of the burst so far, unless the pause is a rendezvous: the
    flow's source (DP, EP or CP) sent in the group's previous burst and not yet in this one, a member that entered
    the collective late (the module docstring). ``out[j, 7]``: the sources of burst ``j`` that sent in the group's
    previous burst too.
    """
    n = len(order) if len(order) else len(kind)
    for i in range(i0, n):
        f = order[i] if len(order) else i
        g = _group(kind[f], a[f], b[f], flow_pair[f], nic_group, n_set)
        if g < 0:
            continue
        j = cur[g]
        if j >= 0 and start[f] < last[g]:
            return -1, nb
        member = g < n_set  # a server-set group's flow (a PP group has one source)
        row = 0 if kind[f] == 0 else kind[f] - 1
        if j < 0 or (start[f] - busy[g] > max(min_pause, share * (busy[g] - opened[g])) and not (member and seen[row, a[f]] == prev[g])):
            if nb == len(out):
                return i, nb
            prev[g] = j
            j = nb
            nb += 1
            cur[g] = j
            busy[g] = end[f]
            opened[g] = start[f]
            out[j, 0] = g
            out[j, 1] = f
            out[j, 2] = start[f]
            out[j, 3] = end[f]
        elif end[f] > busy[g]:
            busy[g] = end[f]
            out[j, 3] = end[f]
        last[g] = start[f]
        out[j, 4] += 1
        out[j, 5] += size[f]
        if not member:  # a PP send: one source
            out[j, 6] = 1
        elif seen[row, a[f]] != j:  # a NIC is in one server-set group of each kind, whose bursts follow one another
            out[j, 6] += 1
            if seen[row, a[f]] == prev[g]:
                out[j, 7] += 1
            seen[row, a[f]] = j
    return n, nb


@numba.njit(cache=True, nogil=True, inline="always")
def _group(k, a, b, pair, nic_group, n_set):  # pragma: no cover - compiled
    """A flow's group (see :func:`_bursts`); -1 for a flow of no kind."""
    if k < 0:
        return -1
    if k == 1:  # PP: its directed pair
        return n_set + 2 * pair + (1 if a > b else 0)
    return nic_group[0 if k == 0 else k - 1, a]


def settled(instances: pd.DataFrame | None, after_ns: int | None, settle_ns: int | None, min_pause_ns: int = MIN_PAUSE_NS,
            pause_share: float = PAUSE_SHARE) -> tuple[pd.DataFrame, int | None]:
    """The instances of a piece of one job's traffic that no other piece takes, and where the next piece takes on.

    A piece (a time slice, a daemon window) holds every flow that starts up
    to ``settle_ns`` (its end; None: the last piece, which takes all). A
    burst could go on in the next piece if a flow starting after
    ``settle_ns`` would not open a new one (its pause under the burst's
    threshold: ``min_pause_ns``, or ``pause_share`` of it); the pieces hand
    over before the earliest such burst starts (and ``min_pause_ns``
    before the piece's end). Taken: the bursts that end after ``after_ns``
    (where the previous piece handed over; None: the first piece) and
    up to the hand-over. Each burst's end falls in one piece's span, so
    each is taken once, though the pieces overlap.

    >>> df = pd.DataFrame({"start_ns": [0, 40, 90], "end_ns": [10, 50, 95]})
    >>> rows, to = settled(df, None, 100, min_pause_ns=10); rows["end_ns"].tolist(), to
    ([10, 50], 89)
    >>> settled(df, 10, None)[0]["end_ns"].tolist()
    [50, 95]
    """
    if instances is None or not len(instances):
        horizon = None if settle_ns is None else int(settle_ns) - int(min_pause_ns)
        return (instances if instances is not None else empty_instances()), _later(after_ns, horizon)
    e = instances["end_ns"].to_numpy(np.int64)
    keep = np.ones(len(e), dtype=bool) if after_ns is None else e > after_ns
    if settle_ns is None:
        return instances[keep], after_ns
    s = instances["start_ns"].to_numpy(np.int64)
    open_ = _open(instances, s, e, settle_ns, min_pause_ns, pause_share)
    horizon = int(settle_ns) - int(min_pause_ns)
    if open_.any():
        horizon = min(horizon, int(s[open_].min()) - 1)
    keep &= e <= horizon
    return instances[keep], _later(after_ns, horizon)


def settled_by_job(instances: pd.DataFrame, after: dict, settle_ns: int | None, min_pause_ns: int = MIN_PAUSE_NS,
                   pause_share: float = PAUSE_SHARE) -> tuple[pd.DataFrame, dict]:
    """:func:`settled` for the instances of several jobs at once, each job from its own ``after[job_id]`` (None or
    missing: its first piece); the rows taken, and each job's new hand-over. Vectorised over the instances (a daemon
    window's), a loop over the jobs only to read and write ``after``.

    >>> df = pd.DataFrame({"job_id": ["a", "a", "b"], "start_ns": [0, 90, 40], "end_ns": [10, 95, 50]})
    >>> rows, to = settled_by_job(df, {"b": 50}, 100, min_pause_ns=10); rows["end_ns"].tolist(), to
    ([10], {'a': 89, 'b': 90})
    """
    codes, ids = pd.factorize(instances["job_id"])
    lowest = np.iinfo(np.int64).min
    prev = np.array([lowest if after.get(j) is None else int(after[j]) for j in ids], dtype=np.int64)
    e = instances["end_ns"].to_numpy(np.int64)
    keep = e > prev[codes]
    if settle_ns is None:
        return instances[keep], {j: after.get(j) for j in ids}
    s = instances["start_ns"].to_numpy(np.int64)
    open_ = _open(instances, s, e, settle_ns, min_pause_ns, pause_share)
    horizon = np.full(len(ids), int(settle_ns) - int(min_pause_ns), dtype=np.int64)
    np.minimum.at(horizon, codes[open_], s[open_] - 1)
    keep &= e <= horizon[codes]
    return instances[keep], dict(zip(ids, np.maximum(horizon, prev).tolist()))


def _open(instances: pd.DataFrame, s: np.ndarray, e: np.ndarray, settle_ns: int, min_pause_ns: int, pause_share: float) -> np.ndarray:
    """Per instance: could a flow after ``settle_ns`` continue it (a pause under its threshold, or a member it waits for)."""
    open_ = e + np.maximum(min_pause_ns, pause_share * (e - s)) >= settle_ns
    if "waiting" in instances:
        open_ |= instances["waiting"].to_numpy(np.int64) > 0
    return open_


def _later(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def summarise(instances: pd.DataFrame | None, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per job and kind, :data:`COLLECTIVE_COLUMNS`, from the instance table (and the whole steps, for ``per_step``).

    Rows in job then kind (:data:`KINDS`) order; figures that do not
    depend on the instances' order, so pieces combined in any order give
    the same table. The instances are grouped by one counting sort and
    each group's figures taken from its slice (a replay's millions of
    pipeline sends: a few arrays over the instances, no frame of them).
    """
    if instances is None or not len(instances):
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    job_code, job_ids = pd.factorize(instances["job_id"])
    kind_code = pd.Categorical(instances["kind"], categories=list(KINDS)).codes.astype(np.int64)
    rank, keys = rank_keys(job_code.astype(np.int64) * len(KINDS) + kind_code, len(job_ids) * len(KINDS))
    order = stable_order(rank, len(keys))
    bounds = np.concatenate([[0], np.cumsum(np.bincount(rank, minlength=len(keys)))])
    del rank
    cols = {c: instances[c].to_numpy(np.int64) for c in ("start_ns", "end_ns", "flows", "bytes", "nics")}
    spans = _step_spans(steps)
    rows = []
    for g, key in enumerate(keys.tolist()):  # per job and kind
        idx = order[bounds[g]:bounds[g + 1]]
        start, nbytes, nics = cols["start_ns"][idx], cols["bytes"][idx], cols["nics"][idx]
        dur = cols["end_ns"][idx] - start
        nic_ns = int((nics * dur).sum())
        with np.errstate(divide="ignore", invalid="ignore"):
            busbw = np.where(dur > 0, nbytes / np.maximum(nics * dur, 1), np.nan)  # bytes a ns: GB/s
        job_id = job_ids[key // len(KINDS)]
        span = spans.get(job_id)
        per_step = np.nan if span is None else _inside(start, *span) / len(span[0])
        rows.append((job_id, KINDS[key % len(KINDS)], len(idx), per_step, int(nbytes.sum()), int(cols["flows"][idx].sum()),
                     float(np.median(nics)), int(dur.sum()), float(np.median(dur)), float(np.quantile(dur, 0.95)),
                     nbytes.sum() / nic_ns if nic_ns > 0 else np.nan, float(np.nanmedian(busbw)) if (dur > 0).any() else np.nan))
    out = pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS).sort_values("job_id", kind="stable").reset_index(drop=True)  # kinds stay in order
    for c in ("busbw_gbps", "busbw_median_gbps", "per_step"):
        out[c] = out[c].astype(np.float64).round(4)
    for c in ("duration_median_ns", "duration_p95_ns", "nics"):
        out[c] = out[c].round(1)
    return out


def _step_spans(steps: pd.DataFrame | None) -> dict:
    """Per job, its whole steps' starts and ends, in start order."""
    if steps is None or not len(steps):
        return {}
    return {job_id: (st["start_ns"].to_numpy(np.int64), st["end_ns"].to_numpy(np.int64))
            for job_id, st in steps.sort_values("start_ns", kind="stable").groupby("job_id", sort=False)}


def _inside(start: np.ndarray, s0: np.ndarray, s1: np.ndarray) -> int:
    """How many of ``start`` fall inside one of the steps ``[s0, s1]`` (in start order)."""
    i = np.searchsorted(s0, start, side="right") - 1
    return int(((i >= 0) & (start <= s1[np.maximum(i, 0)])).sum())
