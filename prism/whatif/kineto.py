"""Execution graphs from PyTorch profiler (Kineto) traces of every rank, as Lumos (MLSys 2025) builds them.

One trace (``.json`` or ``.json.gz``) per rank. The graph's tasks:

* every GPU operation (kernel, memcpy, memset) with its measured duration;
  the NCCL kernels of one collective on all its ranks are one
  synchronisation node (:mod:`.optrace`'s model: its duration is the
  transfer, from the last member's arrival to the end; the waiting comes
  back from the dependencies);
* every CUDA runtime call on every CPU thread (the host side that launches
  the GPU work), with the host work between two calls as a gap;
* per rank and ``ProfilerStep#N``, a step-begin and a step-end marker.

Its dependencies:

* **stream order**: a GPU operation follows the previous one on its stream;
* **launch**: a GPU operation cannot start before its launch call
  (``cudaLaunchKernel`` etc., matched by ``correlation``) has returned;
* **cross-stream**: the traces name no event or stream in
  ``cudaStreamWaitEvent``, so the wait is taken conservatively: the next
  GPU operation the thread launches after a ``cudaStreamWaitEvent`` waits
  for the last operation launched before it on every other stream of the
  rank; and an operation that started later than its launch and its
  stream allowed waits for the other stream's operation that ended in
  between (what the timeline shows);
* **host waits**: a blocking call (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, a synchronous ``cudaMemcpy``...) that returned
  just after a GPU operation ended waited for it: it runs from that end,
  its own time is what remains;
* **threads**: each CPU thread's calls in order; a thread's first call of a
  step, or after an idle spell, follows the rank's main thread (the one that
  launched most GPU work), and the main thread after an idle spell follows the others'
  latest call (the autograd thread of the backward pass);
* **collectives**: the Nth NCCL kernel of a kind (AllReduce, SendRecv, ...)
  on a communicator is one collective on all its ranks. The communicator is
  the kernel's ``Process Group Name`` and ``Process Group Ranks`` when the
  trace records them, else every rank (one world communicator);
* **steps**: a rank's ``ProfilerStep#N+1`` begins when its step N ended
  (the main thread's last call of step N plus the host time after it), the first step at
  its observed start. A GPU operation belongs to the step its launch call is
  in.

Timestamps from different ranks are compared (a collective's last arrival),
so the traces must share a clock (one host, or synchronised hosts): the
spread of the members' ends of each collective is reported as a check.
"""
from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from prism.common.components import connected_components
from prism.whatif.graph import ExecutionGraph, SimResult

__all__ = ["RankTrace", "KinetoGraph", "read_kineto", "kineto_paths"]

GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
CALL_CATS = {"cuda_runtime", "cuda_driver"}
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
NCCL_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
RANK_RE = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.I)
#: host calls that can block until GPU work is done
BLOCKING_RE = re.compile(r"Synchronize|^cudaMemcpy|^cuMemcpy|^cudaFree")
#: a blocking call returned within this long after the GPU operation it waited for (µs)
WAKE_US = 50.0
#: a thread idle this long (µs) started a new burst of work for someone else
IDLE_US = 100.0
#: timestamps of a CPU call and a GPU operation agree within this (µs)
TOL_US = 1.0


@dataclass
class RankTrace:
    """One rank's trace: GPU operations, host calls and steps (times in µs, as in the trace)."""

    rank: int
    path: str
    world_size: int | None
    gpu: pd.DataFrame  # ts, dur, stream, corr, name, cat, coll (NCCL kind or ""), comm, comm_ranks
    calls: pd.DataFrame  # ts, dur, tid, corr, name
    steps: pd.DataFrame  # step, start, end


def kineto_paths(sources: list[str | Path]) -> list[Path]:
    """The trace files named: files as given, directories by their ``*.json`` and ``*.json.gz``."""
    out: list[Path] = []
    for s in sources:
        p = Path(s)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and (q.name.endswith(".json") or q.name.endswith(".json.gz")))
            if not found:
                raise ValueError(f"{p}: no Kineto trace (*.json, *.json.gz) in the directory")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise ValueError(f"{p}: no such file or directory")
    return out


def _load(path: Path) -> dict:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                d = json.load(f)
        else:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read it as JSON: {e}") from e
    if not isinstance(d, dict) or not isinstance(d.get("traceEvents"), list):
        raise ValueError(f"{path}: not a PyTorch profiler (Kineto) trace: no traceEvents list")
    return d


#: bytes per element of the dtypes PyTorch names in an NCCL kernel's args
_DTYPE_BYTES = {"double": 8, "long": 8, "float": 4, "int": 4, "half": 2, "bfloat16": 2, "short": 2, "byte": 1, "char": 1,
                "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _msg_bytes(args: dict) -> int:
    """An NCCL kernel's input in bytes from its args (``In msg nelems`` x the dtype's size, PyTorch 2.1 on), -1 unknown.

    >>> _msg_bytes({"In msg nelems": 1024, "dtype": "BFloat16"}), _msg_bytes({"dtype": "Float"})
    (2048, -1)
    """
    n, size = args.get("In msg nelems"), _DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
    if isinstance(n, bool) or not isinstance(n, int) or n < 0 or size is None:
        return -1
    return n * size


def _read_rank(path: Path, n_files: int) -> RankTrace:
    d = _load(path)
    info_raw = d.get("distributedInfo")
    info: dict = info_raw if isinstance(info_raw, dict) else {}
    rank = info.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool):
        m = RANK_RE.search(path.name)
        if m:
            rank = int(m.group(1))
        elif n_files == 1:
            rank = 0
        else:
            raise ValueError(f"{path}: no rank (distributedInfo.rank, or rank/worker N in the file name)")
    ws = info.get("world_size")
    world_size = ws if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else None
    gpu, calls, steps = [], [], []
    for e in d["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), e.get("name")
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        if not (np.isfinite(ts) and np.isfinite(dur)) or dur < 0:
            raise ValueError(f"{path}: event {name!r} has a bad time (ts {e.get('ts')!r}, dur {e.get('dur')!r})")
        args_raw = e.get("args")
        args: dict = args_raw if isinstance(args_raw, dict) else {}
        if cat in GPU_CATS:
            m = NCCL_RE.match(str(name))
            ranks = args.get("Process Group Ranks")
            gpu.append((ts, dur, args.get("stream", e.get("tid")), args.get("correlation"), str(name), GPU_CATS[cat],
                        m.group(1) if m else "", str(args.get("Process Group Name", "world")) if m else "",
                        str(ranks) if m and ranks is not None else "", _msg_bytes(args) if m else -1))
        elif cat in CALL_CATS:
            calls.append((ts, dur, e.get("tid"), args.get("correlation"), str(name)))
        elif isinstance(name, str) and cat in ("user_annotation", "cpu_op", "cpu_instant_event") and STEP_RE.match(name):
            steps.append((int(STEP_RE.match(name).group(1)), ts, ts + dur))  # type: ignore[union-attr]
    if not gpu:
        raise ValueError(f"{path}: no GPU kernel in the trace (a Kineto trace recorded with CUDA activities is needed)")
    if not steps:
        raise ValueError(f"{path}: no ProfilerStep#N annotation (record with torch.profiler and call prof.step() every step)")
    g = pd.DataFrame(gpu, columns=["ts", "dur", "stream", "corr", "name", "cat", "coll", "comm", "comm_ranks", "bytes"])
    g["stream"] = g["stream"].astype(str)
    c = pd.DataFrame(calls, columns=["ts", "dur", "tid", "corr", "name"])
    c["tid"] = c["tid"].astype(str)
    s = pd.DataFrame(steps, columns=["step", "start", "end"]).groupby("step").agg(start=("start", "min"), end=("end", "max"))
    return RankTrace(int(rank), str(path), world_size, g, c, s.reset_index())


def read_kineto(sources: list[str | Path], partial: bool = False) -> list[RankTrace]:
    """Every rank's trace, checked: one file per rank, no rank missing (``distributedInfo.world_size``).

    ``partial``: the ranks given are modelled as the job (a sample of a larger job's ranks)."""
    paths = kineto_paths(sources)
    ranks = [_read_rank(p, len(paths)) for p in paths]
    seen: dict[int, str] = {}
    for r in ranks:
        if r.rank in seen:
            raise ValueError(f"{r.path}: rank {r.rank} again (also {seen[r.rank]}); give one trace per rank")
        seen[r.rank] = r.path
    sizes = {r.world_size for r in ranks if r.world_size}
    if len(sizes) > 1:
        raise ValueError(f"the traces disagree on the world size ({', '.join(f'{r.path}: {r.world_size}' for r in ranks)})")
    ws = sizes.pop() if sizes else len(ranks)
    missing = sorted(set(range(ws)) - set(seen))
    if missing and not partial:
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        raise ValueError(f"missing rank(s) {shown} of world size {ws}: the traces given ({', '.join(sorted(seen.values()))}) "
                         "hold only ranks " + ", ".join(map(str, sorted(seen))) + " (--partial models the ranks given)")
    extra = sorted(set(seen) - set(range(ws)))
    if extra:
        raise ValueError(f"{seen[extra[0]]}: rank {extra[0]} is outside the world size {ws}")
    return sorted(ranks, key=lambda r: r.rank)


class _Items:
    """Columns of the graph's items (before collectives are merged into nodes) and the edges between them."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in ("kind", "rank", "step", "ts", "end", "work", "name", "track", "coll_key", "release", "bytes")}
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []
        self.gap: list[np.ndarray] = []
        self.n = 0

    def add(self, n: int, **cols) -> np.ndarray:
        for k in self.cols:
            v = cols.get(k, {"coll_key": "", "release": 0.0, "work": 0.0, "bytes": -1}.get(k))
            self.cols[k].append(np.asarray(v) if np.ndim(v) else np.full(n, v, dtype=object if isinstance(v, str) else None))
        idx = np.arange(self.n, self.n + n)
        self.n += n
        return idx

    def edge(self, src, dst, gap) -> None:
        src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        self.src.append(src)
        self.dst.append(dst)
        self.gap.append(np.broadcast_to(np.asarray(gap, np.float64), src.shape).copy())


class KinetoGraph:
    """Every rank's Kineto trace as one :class:`ExecutionGraph`, with the map from trace items to nodes for scenarios.

    Items are step markers (``kind`` "begin"/"end"), host calls ("call") and GPU operations ("gpu"); times in
    seconds from the earliest step start. ``work`` is what an item costs without waiting: a host call's time
    after the GPU operation it waited for, an NCCL kernel's transfer (from its collective's last arrival).
    """

    def __init__(self, ranks: list[RankTrace], wait_event_edges: bool = True, inferred_edges: bool = True, partial: bool = False,
                 launch_latency: bool = True):
        self.ranks = ranks
        self.partial = partial
        self.launch_latency = launch_latency
        self.launch_latency_us: dict[int, float] = {}
        common = set.intersection(*(set(r.steps["step"]) for r in ranks))
        if not common:
            raise ValueError("no ProfilerStep#N is in every rank's trace: " + "; ".join(
                f"{r.path}: {', '.join(map(str, r.steps['step'].tolist()[:5]))}" for r in ranks))
        self.step_ids = sorted(common)
        base = min(float(r.steps["start"].min()) for r in ranks)
        self.base_us = base
        it = _Items()
        nccl_items: list[tuple] = []  # (item idx, rank, comm, kind, ts, comm_ranks, path)
        for r in ranks:
            self._add_rank(it, r, base, nccl_items, wait_event_edges, inferred_edges)
        cols = {k: np.concatenate(v) if v else np.zeros(0) for k, v in it.cols.items()}
        self.items = pd.DataFrame({k: cols[k] for k in ("kind", "rank", "step", "ts", "end", "name", "track")})
        self.items["rank"] = self.items["rank"].astype(np.int64)
        self.items["step"] = self.items["step"].astype(np.int64)
        self.items[["ts", "end"]] = self.items[["ts", "end"]].astype(np.float64)
        work = cols["work"].astype(np.float64)
        #: per item, an NCCL kernel's input bytes where the trace gives them (-1: unknown or not NCCL)
        self.item_bytes = cols["bytes"].astype(np.int64)
        release = cols["release"].astype(np.float64)
        src, dst, gap = (np.concatenate(x) if x else np.zeros(0) for x in (it.src, it.dst, it.gap))
        pairs, self.collectives, self.clock_spread_us = self._match_collectives(nccl_items, work)
        n = it.n
        self.node = connected_components(pairs[:, 0], pairs[:, 1], n).astype(np.int64) if n else np.zeros(0, np.int64)
        self.n_nodes = int(self.node.max()) + 1 if n else 0
        self.work_items = work
        self.is_comm = np.zeros(n, bool)
        if len(self.collectives):
            self.is_comm[self.collectives["item"].to_numpy()] = True
        self.is_gpu = (self.items["kind"] == "gpu").to_numpy()
        s, d = self.node[src.astype(np.int64)], self.node[dst.astype(np.int64)]
        keep = s != d
        self.src, self.dst, self.gap = s[keep], d[keep], gap[keep] / 1e6
        self.release = np.zeros(self.n_nodes)
        np.maximum.at(self.release, self.node, release / 1e6)
        self.step = np.zeros(self.n_nodes, np.int64)
        self.step[self.node] = self.items["step"].to_numpy()
        self.label = np.empty(self.n_nodes, object)
        self.label[self.node] = self.items["name"].to_numpy()
        members = np.bincount(self.node, minlength=self.n_nodes)
        self.proc = np.full(self.n_nodes, -1, np.int64)
        single = members[self.node] == 1
        self.proc[self.node[single]] = self.items["rank"].to_numpy()[single]

    # ------------------------------------------------------------------ building

    def _add_rank(self, it: _Items, r: RankTrace, base: float, nccl_items: list, wait_event_edges: bool, inferred_edges: bool) -> None:
        steps = r.steps[r.steps["step"].isin(self.step_ids)].sort_values("step").reset_index(drop=True)
        s_start, s_end, s_id = (steps[c].to_numpy() for c in ("start", "end", "step"))
        n_s = len(steps)

        def step_of(ts: np.ndarray) -> np.ndarray:
            """Index into ``steps`` of the step each time falls in, -1 outside every step."""
            i = np.searchsorted(s_start, ts, side="right") - 1
            ok = (i >= 0) & (ts < s_end[np.clip(i, 0, None)])
            return np.where(ok, i, -1)

        # step markers
        begin = it.add(n_s, kind="begin", rank=r.rank, step=s_id, ts=s_start - base, end=s_start - base, name="ProfilerStep",
                       track="steps")
        end = it.add(n_s, kind="end", rank=r.rank, step=s_id, ts=s_end - base, end=s_end - base, name="ProfilerStep end",
                     track="steps")
        consecutive = np.r_[False, np.diff(s_id) == 1]
        first_of_run = ~consecutive
        it.cols["release"][-2] = np.where(first_of_run, s_start - base, 0.0)  # the begin markers' release
        c = np.flatnonzero(consecutive)
        it.edge(end[c - 1], begin[c], s_start[c] - s_end[c - 1])

        # host calls inside a step
        calls = r.calls.copy()
        calls["si"] = step_of(calls["ts"].to_numpy())
        calls = calls[calls["si"] >= 0].sort_values(["ts"], kind="stable").reset_index(drop=True)
        ct, cd = calls["ts"].to_numpy(np.float64), calls["dur"].to_numpy(np.float64)
        ce = ct + cd
        csi = calls["si"].to_numpy()
        cidx = it.add(len(calls), kind="call", rank=r.rank, step=s_id[csi] if len(calls) else np.zeros(0, np.int64),
                      ts=ct - base, end=ce - base, work=cd.copy(), name=calls["name"].to_numpy(object),
                      track=("thread " + calls["tid"]).to_numpy(object))
        call_work = it.cols["work"][-1]
        # GPU operations: the step of their launch call, else the step they ran in
        gpu = r.gpu.copy()
        corr_to_call = pd.Series(np.arange(len(calls)), index=calls["corr"].to_numpy())
        corr_to_call = corr_to_call[~corr_to_call.index.duplicated() & corr_to_call.index.notna()]
        gpu["call"] = gpu["corr"].map(corr_to_call).fillna(-1).astype(np.int64).to_numpy()
        has_call = gpu["call"].to_numpy() >= 0
        gpu["si"] = np.where(has_call, csi[np.clip(gpu["call"].to_numpy(), 0, None)] if len(calls) else -1, step_of(gpu["ts"].to_numpy()))
        gpu = gpu[gpu["si"] >= 0].sort_values(["ts"], kind="stable").reset_index(drop=True)
        gt, gd = gpu["ts"].to_numpy(np.float64), gpu["dur"].to_numpy(np.float64)
        ge = gt + gd
        gcall, gsi = gpu["call"].to_numpy(), gpu["si"].to_numpy()
        gidx = it.add(len(gpu), kind="gpu", rank=r.rank, step=s_id[gsi] if len(gpu) else np.zeros(0, np.int64), ts=gt - base,
                      end=ge - base, work=gd.copy(), name=gpu["name"].to_numpy(object), bytes=gpu["bytes"].to_numpy(np.int64),
                      track=("stream " + gpu["stream"]).to_numpy(object))
        for i in np.flatnonzero(gpu["coll"].to_numpy() != ""):
            nccl_items.append((int(gidx[i]), r.rank, gpu["comm"].iat[i], gpu["coll"].iat[i], gt[i], gpu["comm_ranks"].iat[i], r.path))

        # threads: in order; the main thread's first call of a step after the step's begin; bursts join the other threads
        tid = calls["tid"].to_numpy(object)
        # the main thread launches the most GPU work (a watchdog or a polling thread may make more calls)
        launches = pd.Series(tid[gcall[gcall >= 0]]).value_counts() if (gcall >= 0).any() else calls["tid"].value_counts()
        main = launches.index[0] if len(launches) else None
        is_main = tid == main
        last_main_before = _latest_ended_before(ct, ce, is_main)  # per call, the main-thread call that ended last before it
        last_other_before = _latest_ended_before(ct, ce, ~is_main)
        for t in pd.unique(tid):
            idx = np.flatnonzero(tid == t)
            first = np.r_[True, csi[idx[1:]] != csi[idx[:-1]]]
            gap = np.r_[0.0, ct[idx[1:]] - ce[idx[:-1]]]
            if t == main:
                f = idx[first]
                it.edge(begin[csi[f]], cidx[f], ct[f] - s_start[csi[f]])
                chain = np.flatnonzero(~first | np.r_[False, np.diff(csi[idx]) == 1])  # a step's first call also follows the last
                chain = chain[chain > 0]
                it.edge(cidx[idx[chain - 1]], cidx[idx[chain]], gap[chain])
                idle = idx[(~first) & (gap > IDLE_US)]
                o = last_other_before[idle]
                ok = (o >= 0) & (csi[np.clip(o, 0, None)] == csi[idle])
                it.edge(cidx[o[ok]], cidx[idle[ok]], ct[idle[ok]] - ce[o[ok]])
            else:
                burst = first | (gap > IDLE_US)
                k = np.arange(1, len(idx))
                it.edge(cidx[idx[k - 1]], cidx[idx[k]], np.where(burst[k], 0.0, gap[k]))
                b = idx[burst]
                m = last_main_before[b]
                ok = (m >= 0) & (csi[np.clip(m, 0, None)] == csi[b])
                it.edge(cidx[m[ok]], cidx[b[ok]], ct[b[ok]] - ce[m[ok]])
                it.edge(begin[csi[b[~ok]]], cidx[b[~ok]], ct[b[~ok]] - s_start[csi[b[~ok]]])
        # the step ends the host time after the main thread's last call of the step (any thread's, if it made none)
        for si in range(n_s):
            k = np.flatnonzero((csi == si) & is_main)
            if not len(k):
                k = np.flatnonzero(csi == si)
            if len(k):
                last = k[np.argmax(ce[k])]
                it.edge([cidx[last]], [end[si]], [s_end[si] - ce[last]])
            else:
                it.edge([begin[si]], [end[si]], [s_end[si] - s_start[si]])

        # host waits: a blocking call that returned just after a GPU operation ended waited for it; when that is its own
        # copy (a synchronous cudaMemcpy), the copy was launched when the call began
        own_waited = np.zeros(len(gpu), bool)
        blocking = np.flatnonzero(calls["name"].str.contains(BLOCKING_RE).to_numpy()) if len(calls) else np.zeros(0, np.int64)
        if len(blocking) and len(gpu):
            order = np.argsort(ge, kind="stable")
            ends_sorted = ge[order]
            for b in blocking:
                lo, hi = np.searchsorted(ends_sorted, [ct[b], ce[b]], side="right")
                cand = order[lo:hi]
                cand = cand[gcall[cand] <= b]  # launched before or by the call
                if not len(cand):
                    continue
                own = cand[gcall[cand] == b]  # a copy waits for itself, not for what else ended meanwhile
                w = own[-1] if len(own) else cand[np.argmax(ge[cand])]
                if ce[b] - ge[w] > WAKE_US:
                    continue
                it.edge([gidx[w]], [cidx[b]], [0.0])
                call_work[b] = max(ce[b] - ge[w], 0.0)
                own_waited[w] = gcall[w] == b
        thread_prev = np.full(len(calls), -1)
        for t in pd.unique(tid):
            idx = np.flatnonzero(tid == t)
            thread_prev[idx[1:]] = idx[:-1]
        # stream order
        stream = gpu["stream"].to_numpy(object)
        streams = pd.unique(stream)
        by_stream = {s: np.flatnonzero(stream == s) for s in streams}
        pred = np.full(len(gpu), -1)
        for idx in by_stream.values():
            it.edge(gidx[idx[:-1]], gidx[idx[1:]], 0.0)
            pred[idx[1:]] = idx[:-1]
        # cross-stream
        waits_across = np.zeros(len(gpu), bool)  # a GPU operation given a wait on another stream
        if len(streams) > 1:
            launch_ts = np.where(gcall >= 0, ct[np.clip(gcall, 0, None)] if len(calls) else 0, gt)
            if wait_event_edges and len(calls):
                waits_across[self._wait_event_edges(it, calls, ct, tid, gt, ge, gidx, gcall, launch_ts, by_stream, stream)] = True
            if inferred_edges:
                ready = np.where(gcall >= 0, ce[np.clip(gcall, 0, None)] if len(calls) else gt, gt)
                ready = np.maximum(ready, np.where(pred >= 0, ge[np.clip(pred, 0, None)], -np.inf))
                late = np.flatnonzero(gt > ready + TOL_US)
                for s, idx in by_stream.items():
                    ends = np.maximum.accumulate(ge[idx])
                    other = late[stream[late] != s]
                    j = np.searchsorted(ends, gt[other], side="right") - 1  # last op on s that ended by then
                    ok = j >= 0
                    ok[ok] = ends[j[ok]] >= ready[other[ok]]  # ...inside the unexplained delay
                    it.edge(gidx[idx[j[ok]]], gidx[other[ok]], 0.0)
                    waits_across[other[ok]] = True
        # launch: a GPU operation starts no earlier than its call returned (earlier only if it did)
        # several operations from one call (a CUDA graph): the first from the call, the others keep their observed
        # spacing after the one before (the graph's own dependencies are not in the trace)
        same_call = np.zeros(len(gpu), bool)
        if len(gpu):
            by_call = pd.Series(np.arange(len(gpu)))[gcall >= 0].groupby(gcall[gcall >= 0])
            rank_in_call = by_call.cumcount()
            same_call[rank_in_call.index[rank_in_call.to_numpy() > 0]] = True
            prev_in_call = by_call.shift(1)
            k = rank_in_call.index[rank_in_call.to_numpy() > 0].to_numpy()
            pk = prev_in_call.loc[k].to_numpy(np.int64)
            it.edge(gidx[pk], gidx[k], gt[k] - ge[pk])
        # a kernel starts the launch latency (the rank's median, when the launch was what it waited for) after its call
        lc = np.flatnonzero((gcall >= 0) & ~own_waited & ~same_call)
        lat = gt[lc] - ce[gcall[lc]]
        pred_end = np.full(len(gpu), -np.inf)
        for idx in pd.Series(np.arange(len(gpu))).groupby(gpu["stream"].to_numpy()).indices.values():
            pred_end[idx[1:]] = ge[idx[:-1]]
        bound = (lat >= 0) & (pred_end[lc] <= ce[gcall[lc]]) & ~waits_across[lc]
        self.launch_latency_us[r.rank] = latency = float(np.median(lat[bound])) if bound.any() and self.launch_latency else 0.0
        it.edge(cidx[gcall[lc]], gidx[lc], np.minimum(latency, lat))
        ow = np.flatnonzero(own_waited)
        c_of = gcall[ow]
        p = thread_prev[c_of]
        has_p = p >= 0
        it.edge(cidx[p[has_p]], gidx[ow[has_p]], np.minimum(ct[c_of[has_p]] - ce[p[has_p]], gt[ow[has_p]] - ce[p[has_p]]))
        it.edge(begin[csi[c_of[~has_p]]], gidx[ow[~has_p]], ct[c_of[~has_p]] - s_start[csi[c_of[~has_p]]])
        nl = np.flatnonzero(gcall < 0)
        it.edge(begin[gsi[nl]], gidx[nl], gt[nl] - s_start[gsi[nl]])

    @staticmethod
    def _wait_event_edges(it, calls, ct, tid, gt, ge, gidx, gcall, launch_ts, by_stream, stream) -> np.ndarray:
        """After a ``cudaStreamWaitEvent``, the thread's next launched GPU operation waits for the last one launched before
        the wait on every other stream (the event's stream is not in the trace)."""
        waits = np.flatnonzero(calls["name"].to_numpy(object) == "cudaStreamWaitEvent")
        given: list[int] = []
        if not len(waits):
            return np.array(given, np.int64)
        launched = np.flatnonzero(gcall >= 0)
        launched = launched[np.argsort(gcall[launched], kind="stable")]  # GPU ops in launch-call order
        lcall = gcall[launched]
        for s, idx in by_stream.items():
            lt = launch_ts[idx]
            order = np.argsort(lt, kind="stable")
            lt_sorted = lt[order]
            targets, sources = [], []
            for w in waits:
                # the thread's next launch after the wait
                k = np.searchsorted(lcall, w, side="right")
                while k < len(launched) and tid[lcall[k]] != tid[w]:
                    k += 1
                if k == len(launched):
                    continue
                g = launched[k]
                if stream[g] == s:
                    continue
                j = np.searchsorted(lt_sorted, ct[w], side="left") - 1  # last op on s launched before the wait
                if j >= 0 and ge[idx[order[j]]] <= gt[g]:  # ...if the timeline agrees that it waited
                    targets.append(g)
                    sources.append(idx[order[j]])
            if targets:
                it.edge(gidx[np.array(sources)], gidx[np.array(targets)], 0.0)
                given += targets
        return np.array(given, np.int64)

    def _match_collectives(self, nccl_items: list, work: np.ndarray) -> tuple[np.ndarray, pd.DataFrame, float]:
        """The Nth NCCL kernel of a kind on a communicator, on every member rank, is one collective.

        Returns the (lead, member) item pairs, a table of the members (item, rank, comm, kind, instance), and the
        median spread of the members' ends (µs: 0 when the ranks share a clock). Sets each member's work to its
        transfer: from the collective's last arrival to its own end.
        """
        if not nccl_items:
            return np.zeros((0, 2), np.int64), pd.DataFrame(columns=["item", "rank", "comm", "kind", "instance"]), 0.0
        t = pd.DataFrame(nccl_items, columns=["item", "rank", "comm", "kind", "ts", "comm_ranks", "path"])
        t = t.sort_values(["comm", "kind", "rank", "ts"], kind="stable")
        t["instance"] = t.groupby(["comm", "kind", "rank"]).cumcount()
        path_of = {r.rank: r.path for r in self.ranks}
        all_ranks = sorted(path_of)
        for (comm, kind), g in t.groupby(["comm", "kind"], sort=True):
            listed = g["comm_ranks"].iloc[0]
            members = sorted(int(x) for x in re.findall(r"\d+", listed)) if listed else all_ranks
            if self.partial:  # a sample of the job's ranks: the collective as the ranks given see it
                members = [m for m in members if m in path_of]
            absent = [m for m in members if m not in path_of]
            if absent:
                raise ValueError(f"{g['path'].iloc[0]}: communicator {comm} ({kind}) spans rank(s) {', '.join(map(str, absent))}, "
                                 "whose trace is missing")
            counts = g.groupby("rank").size().reindex(members, fill_value=0)
            if counts.nunique() > 1:
                lo, hi = counts.idxmin(), counts.idxmax()
                raise ValueError(f"{path_of[lo]}: {counts[lo]} NCCL {kind} kernel(s) on communicator {comm} in the steps modelled, "
                                 f"but {path_of[hi]} (rank {hi}) has {counts[hi]}: the collectives cannot be matched across ranks "
                                 f"(per rank: {', '.join(f'{k}: {v}' for k, v in counts.items())})")
        items = self.items  # set before the collectives are matched
        t = t.drop(columns=["path", "comm_ranks"])
        t["ts"] = items["ts"].to_numpy()[t["item"].to_numpy()]
        t["end"] = items["end"].to_numpy()[t["item"].to_numpy()]
        key = [t["comm"], t["kind"], t["instance"]]
        last = t.groupby(key)["ts"].transform("max")
        work[t["item"].to_numpy()] = np.maximum(t["end"].to_numpy() - last.to_numpy(), 0.0)
        lead = t.groupby(key)["item"].transform("min")
        spread = (t.groupby(key)["end"].max() - t.groupby(key)["end"].min())
        pairs = np.stack([lead.to_numpy(np.int64), t["item"].to_numpy(np.int64)], axis=1)
        return pairs, t.reset_index(drop=True), float(spread.median())

    # ------------------------------------------------------------------ use

    def durations(self, item_work: np.ndarray | None = None) -> np.ndarray:
        """Node durations (s) from items' work (µs; default: observed): a collective takes its shortest member's transfer."""
        w = self.work_items if item_work is None else np.asarray(item_work, np.float64)
        out = np.full(self.n_nodes, np.inf)
        np.minimum.at(out, self.node, w)
        return out / 1e6

    def graph(self, item_work: np.ndarray | None = None) -> ExecutionGraph:
        return ExecutionGraph(self.durations(item_work), self.step, self.src, self.dst, self.gap, self.release, self.label, self.proc)

    def work(self) -> np.ndarray:
        """Per item, its work (µs): a host call without its wait for the GPU, an NCCL kernel's transfer, the rest as measured."""
        return self.work_items.copy()

    def observed_steps(self) -> pd.DataFrame:
        """Per step: the job's step time (first begin to the last end of a host call or GPU operation of the step, any
        rank) and per rank (its begin to its last end), seconds."""
        return self._steps(self.items["ts"].to_numpy() / 1e6, self.items["end"].to_numpy() / 1e6)

    def simulated_steps(self, result: SimResult) -> pd.DataFrame:
        return self._steps(result.start[self.node], result.finish[self.node])

    def _steps(self, start: np.ndarray, finish: np.ndarray) -> pd.DataFrame:
        it = self.items
        df = pd.DataFrame({"step": it["step"].to_numpy(), "rank": it["rank"].to_numpy(), "s": start, "e": finish})
        begin = it["kind"].to_numpy() == "begin"
        b = df[begin].set_index(["step", "rank"])["s"]
        e = df.groupby(["step", "rank"])["e"].max()
        per_rank = (e - b).rename("step_s").reset_index()
        job = (df.groupby("step")["e"].max() - df[begin].groupby("step")["s"].min()).rename("step_s")
        per_rank["job_step_s"] = per_rank["step"].map(job)
        return per_rank


def _latest_ended_before(ts: np.ndarray, end: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per element, the index of the element of ``mask`` with the latest end at or before its ts (-1 if none)."""
    cand = np.flatnonzero(mask)
    if not len(cand):
        return np.full(len(ts), -1)
    order = cand[np.argsort(end[cand], kind="stable")]
    j = np.searchsorted(end[order], ts, side="right") - 1
    return np.where(j >= 0, order[np.clip(j, 0, None)], -1)
