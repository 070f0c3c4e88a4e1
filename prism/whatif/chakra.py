"""The simulated execution graph as Chakra execution traces (MLCommons), the input of ASTRA-sim and SimAI.

``prism whatif --chakra DIR`` writes the graph it simulated, after the scenarios, as one file per rank,
``DIR/<prefix>.<rank>.et``: a ``GlobalMetadata`` message, then one ``Node`` per task of that rank, each
message preceded by its length as a varint (Chakra's ``protolib.encodeMessage``). The messages are those
of Chakra's schema (``et_def.proto``; :mod:`.et_def_pb2`, vendored) and protobuf serialises them.

A graph node that several ranks join (a collective, a send/receive pair) becomes one ET node on each
member rank; a task of one rank stays one node. Per rank:

* a task that only its own rank runs -> ``COMP_NODE`` with the graph's duration (a communication op the
  graph could not match with any peer is simulated as local work, and exported so);
* a collective -> ``COMM_COLL_NODE``: ``comm_type`` from its name (reduce-scatter, all-gather, all-to-all,
  broadcast, all-reduce, NCCL's SendRecv as all-to-all; a name that says none of them is exported as ``ALL_REDUCE`` and counted in
  the warnings), ``comm_size`` in bytes where the input gives it (0 and a warning where not),
  ``pg_name``: a communication group of ``<prefix>.comm_groups.json`` (``{"id": [ranks]}``, as
  ASTRA-sim's ``--comm-group-configuration`` reads it);
* a pipeline send / receive -> ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` with ``comm_src``, ``comm_dst``
  and ``comm_tag`` (one tag per pair, the same on both ends) and ``comm_size``;
* every node: ``duration_micros`` (the graph's duration, rounded to whole microseconds; for
  communication, the transfer the what-if simulated), ``start_time_micros`` (its simulated start),
  ``is_cpu_op`` and ``prism_step``;
* dependencies: a graph edge ``u -> v`` becomes ``data_deps`` of each of v's nodes on a rank on u's
  nodes on the same rank (the graph's cross-rank waits are the communication nodes themselves). The
  gaps of the edges (launch delays) have no place in the schema and are dropped. Steps the graph
  releases separately at their observed starts are chained: a rank's task with no dependency, after its
  first step, gets ``ctrl_deps`` on the rank's last tasks of its previous step.

>>> from prism.whatif.chakra import comm_type_of
>>> comm_type_of("grads-reduce-scatter"), comm_type_of("ncclDevKernel_AllGather_RING_LL"), comm_type_of("barrier")
((7, True), (2, True), (0, False))
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from prism.whatif import et_def_pb2 as et
from prism.whatif.graph import SimResult

if TYPE_CHECKING:
    from prism.whatif.kineto import KinetoGraph
    from prism.whatif.optrace import OpGraph

__all__ = ["comm_type_of", "op_tasks", "kineto_tasks", "write_chakra", "read_et", "ET_VERSION", "TASK_COLUMNS"]

#: the schema version written in GlobalMetadata (Chakra's converter writes the version of its ET schema)
ET_VERSION = "0.0.4"
#: one row per task of one rank: the graph node it is, what it is, and what the ET needs to say about it
TASK_COLUMNS = ("rank", "node", "step", "name", "kind", "comm_type", "comm_size", "peer", "tag", "group", "cpu")

_TYPES = ((r"reduce[-_ ]?scatter", et.REDUCE_SCATTER), (r"all[-_ ]?gather", et.ALL_GATHER), (r"all[-_ ]?to[-_ ]?all", et.ALL_TO_ALL),
          (r"broadcast", et.BROADCAST), (r"all[-_ ]?reduce|clip-main-grad", et.ALL_REDUCE),
          # PyTorch's all_to_all runs as NCCL's grouped send/receive: a SendRecv kernel over a communicator
          (r"sendrecv", et.ALL_TO_ALL))


def comm_type_of(name: str) -> tuple[int, bool]:
    """Chakra's ``CollectiveCommType`` for a collective's name, and whether the name said it (else ALL_REDUCE)."""
    for pattern, t in _TYPES:
        if re.search(pattern, str(name), re.IGNORECASE):
            return int(t), True
    return int(et.ALL_REDUCE), False


def _ranks_per_node(node: np.ndarray, rank: np.ndarray, n_nodes: int) -> np.ndarray:
    """How many distinct ranks each graph node has members on."""
    pairs = np.unique(np.stack([node, rank], axis=1), axis=0) if len(node) else np.zeros((0, 2), np.int64)
    return np.bincount(pairs[:, 0], minlength=n_nodes)


def _sizes(df: pd.DataFrame, column: str = "bytes") -> np.ndarray:
    """Per row, the bytes it moves from an optional column (-1: unknown)."""
    if column not in df.columns:
        return np.full(len(df), -1, np.int64)
    b = pd.to_numeric(df[column], errors="coerce").to_numpy(np.float64)
    return np.where(np.isfinite(b) & (b >= 0), np.round(b), -1).astype(np.int64)


def op_tasks(g: OpGraph) -> pd.DataFrame:
    """An op trace's graph (:class:`~.optrace.OpGraph`), one row per op: its rank's task (:data:`TASK_COLUMNS`).

    Pipeline sends and receives are matched as the graph matched them (same step, DP rank and micro-batch, the
    neighbouring stage); a collective's group is the ranks of its graph node. ``comm_size``: the trace's optional
    ``bytes`` column, -1 where it has none.
    """
    from prism.whatif.optrace import COLLECTIVE_GROUPS

    o = g.ops
    n = len(o)
    rank = o["rank"].to_numpy(np.int64)
    node = g.node
    multi = _ranks_per_node(node, rank, g.n_nodes)[node] > 1
    kind = np.full(n, "comp", object)
    peer = np.full(n, -1, np.int64)
    tag = np.full(n, -1, np.int64)
    idx = pd.Series(np.arange(n))
    next_tag = 0
    for send, recv, delta in (("forward-send", "forward-recv", 1), ("backward-send", "backward-recv", -1)):
        s = o[o["optype"] == send][["step", "dp_rank", "stage", "seq_id"]].assign(i=idx[(o["optype"] == send).to_numpy()].to_numpy())
        r = o[o["optype"] == recv][["step", "dp_rank", "stage", "seq_id"]].assign(j=idx[(o["optype"] == recv).to_numpy()].to_numpy())
        m = s.assign(stage=s["stage"] + delta).merge(r, on=["step", "dp_rank", "stage", "seq_id"])
        # the first receive of a send (a trace that repeats one is matched once, as a pair)
        m = m.drop_duplicates("i").drop_duplicates("j")
        i, j = m["i"].to_numpy(np.int64), m["j"].to_numpy(np.int64)
        ok = (node[i] == node[j]) & (rank[i] != rank[j])  # the graph joined them: a transfer between two ranks
        i, j = i[ok], j[ok]
        kind[i], kind[j] = "send", "recv"
        peer[i], peer[j] = rank[j], rank[i]
        tag[i] = tag[j] = next_tag + np.arange(len(i))
        next_tag += len(i)
    coll = o["optype"].isin(list(COLLECTIVE_GROUPS)).to_numpy() & multi
    kind[coll] = "coll"
    comm_type = np.full(n, -1, np.int64)
    known = {t: comm_type_of(t)[0] for t in o["optype"].unique()}
    comm_type[coll] = o["optype"].map(known).to_numpy(np.int64)[coll]
    return pd.DataFrame({"rank": rank, "node": node, "step": o["step"].to_numpy(np.int64), "name": o["optype"].to_numpy(object),
                         "kind": kind, "comm_type": comm_type, "comm_size": np.where(kind != "comp", _sizes(o), -1),
                         "peer": peer, "tag": tag, "group": _groups(node, rank, kind == "coll"), "cpu": False})


def kineto_tasks(g: KinetoGraph) -> pd.DataFrame:
    """A Kineto graph (:class:`~.kineto.KinetoGraph`), one row per item: host calls (``cpu``) and GPU operations;
    NCCL kernels matched across ranks are collectives (a ``SendRecv`` kernel as ``ALL_TO_ALL`` over its
    communicator: PyTorch's all_to_all runs as one; a kernel does not say which way a pipeline
    transfer went); ``comm_size``: the kernel's ``In msg nelems`` times its dtype's size (its input, as Chakra's PyTorch
    converter counts it) where the trace gives them (PyTorch 2.1 on), else -1.
    Step markers, which take no time, are left out, and dependencies through them are kept by bridging them."""
    it = g.items
    n = len(it)
    rank = it["rank"].to_numpy(np.int64)
    node = g.node
    multi = _ranks_per_node(node, rank, g.n_nodes)[node] > 1
    coll = np.zeros(n, bool)
    name = it["name"].to_numpy(object).copy()
    if len(g.collectives):
        coll[g.collectives["item"].to_numpy(np.int64)] = True
    coll &= multi
    comm_type = np.full(n, -1, np.int64)
    types = {k: comm_type_of(k)[0] for k in pd.unique(name[coll])}
    comm_type[coll] = [types[k] for k in name[coll]]
    return pd.DataFrame({"rank": rank, "node": node, "step": it["step"].to_numpy(np.int64), "name": name,
                         "kind": np.where(coll, "coll", "comp"), "comm_type": comm_type, "comm_size": np.where(coll, g.item_bytes, -1),
                         "peer": -1, "tag": -1, "group": _groups(node, rank, coll), "cpu": (it["kind"] == "call").to_numpy(),
                         "marker": it["kind"].isin(["begin", "end"]).to_numpy()})


def _groups(node: np.ndarray, rank: np.ndarray, coll: np.ndarray) -> np.ndarray:
    """Per row, its collective's member ranks as a string key ("" for a row that is not a collective)."""
    out = np.full(len(node), "", object)
    if coll.any():
        members = pd.DataFrame({"node": node[coll], "rank": rank[coll]}).drop_duplicates().sort_values(["node", "rank"])
        key = members.groupby("node")["rank"].agg(lambda r: ",".join(map(str, r)))
        out[coll] = key.reindex(node[coll]).to_numpy()
    return out


def _bridge_markers(tasks: pd.DataFrame, src: np.ndarray, dst: np.ndarray) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Drop zero-time marker nodes (Kineto's step begin/end), joining each one's predecessors to its successors."""
    if "marker" not in tasks.columns or not tasks["marker"].any():
        return tasks, src, dst
    marked = np.zeros(int(max(tasks["node"].max(), src.max() if len(src) else 0, dst.max() if len(dst) else 0)) + 1, bool)
    marked[tasks.loc[tasks["marker"], "node"].to_numpy(np.int64)] = True
    e = pd.DataFrame({"u": src, "v": dst})
    for m in np.flatnonzero(marked):
        ins, outs = e[e["v"] == m]["u"], e[e["u"] == m]["v"]
        e = e[(e["u"] != m) & (e["v"] != m)]
        if len(ins) and len(outs):
            e = pd.concat([e, pd.DataFrame({"u": np.repeat(ins.to_numpy(), len(outs)), "v": np.tile(outs.to_numpy(), len(ins))})])
    e = e.drop_duplicates()
    return tasks[~tasks["marker"]].drop(columns="marker"), e["u"].to_numpy(np.int64), e["v"].to_numpy(np.int64)


def _attr(name: str, **value) -> et.AttributeProto:
    return et.AttributeProto(name=name, **value)


def write_chakra(result: SimResult, tasks: pd.DataFrame, out: str | Path, prefix: str = "workload") -> dict:
    """Write ``out/<prefix>.<rank>.et`` for every rank of ``tasks`` (rows of :data:`TASK_COLUMNS` on ``result``'s
    graph), and ``out/<prefix>.comm_groups.json`` (files ``<prefix>.<n>.et`` of an earlier export are removed); returns a summary (files, nodes per rank, warnings)."""
    graph = result.graph
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", prefix):
        raise ValueError(f"--chakra-prefix {prefix!r}: letters, digits, '.', '_' and '-' only")
    tasks, src, dst = _bridge_markers(tasks.reset_index(drop=True), graph.src, graph.dst)
    tasks = tasks.reset_index(drop=True)
    warnings: list[str] = []
    node = tasks["node"].to_numpy(np.int64)
    start, finish = result.start[node], result.finish[node]
    # per rank, ids in simulated order (a dependency starts no later than what waits on it)
    tasks = tasks.assign(_start=start, _finish=finish).sort_values(["rank", "_start", "_finish", "node"], kind="stable").reset_index(drop=True)
    tasks["id"] = tasks.groupby("rank").cumcount().astype(np.int64)
    # data dependencies: an edge u -> v on every rank that has tasks of both
    at = tasks[["rank", "node", "id"]]
    e = pd.DataFrame({"u": src, "v": dst})
    dv = e.merge(at.rename(columns={"node": "v", "id": "vid"}), on="v")
    full = dv.merge(at.rename(columns={"node": "u", "id": "uid"}), on=["u", "rank"])
    deps = full[["rank", "vid", "uid"]].drop_duplicates()
    cross = len(e.drop_duplicates()) - len(full[["u", "v"]].drop_duplicates())
    if cross > 0:
        warnings.append(f"{cross} dependency edge(s) between tasks of different ranks not through a communication node: "
                        "not in the ET (its dependencies are within a rank)")
    data = deps.groupby(["rank", "vid"])["uid"].agg(list)
    # steps released separately: a rank's task with no dependency after its first step waits for its previous step
    has_dep = pd.MultiIndex.from_frame(deps[["rank", "vid"]]).unique()
    is_dep = pd.MultiIndex.from_frame(deps[["rank", "uid"]]).unique()
    key = pd.MultiIndex.from_arrays([tasks["rank"], tasks["id"]])
    root, sink = ~key.isin(has_dep), ~key.isin(is_dep)
    steps = np.sort(tasks["step"].unique())
    prev_step = dict(zip(steps[1:], steps[:-1]))
    sinks = tasks[sink].groupby(["rank", "step"])["id"].agg(list)
    ctrl: dict[tuple[int, int], list[int]] = {}
    for r, i, s in tasks.loc[root, ["rank", "id", "step"]].itertuples(index=False):
        p = prev_step.get(s)
        if p is not None and (r, p) in sinks.index:
            ctrl[(int(r), int(i))] = [int(x) for x in sinks.loc[(r, p)]]
    # communication groups
    groups = sorted({gk for gk in tasks["group"] if gk}, key=lambda s: [int(x) for x in s.split(",")])
    group_id = {gk: str(i + 1) for i, gk in enumerate(groups)}
    (out / f"{prefix}.comm_groups.json").write_text(json.dumps({group_id[gk]: [int(x) for x in gk.split(",")] for gk in groups}, indent=1) + "\n")
    unknown_type = sorted({n for n, k in zip(tasks["name"], tasks["kind"]) if k == "coll" and not comm_type_of(n)[1]})
    if unknown_type:
        warnings.append(f"collective(s) whose name gives no type, exported as ALL_REDUCE: {', '.join(map(str, unknown_type[:5]))}")
    no_size = int(((tasks["kind"] != "comp") & (tasks["comm_size"] < 0)).sum())
    if no_size:
        warnings.append(f"{no_size} communication node(s) without a size in the input: comm_size 0 (duration_micros holds "
                        "the transfer time the what-if simulated)")
    ranks = sorted(int(r) for r in tasks["rank"].unique())
    if ranks != list(range(len(ranks))):
        warnings.append(f"ranks {ranks[:8]}{' ...' if len(ranks) > 8 else ''} are not 0..{len(ranks) - 1}: a simulator expects one file per NPU from 0")
    dur_us = np.round(np.nan_to_num(graph.duration[tasks["node"].to_numpy(np.int64)], posinf=0.0) * 1e6)
    start_us = np.round(np.maximum(tasks["_start"].to_numpy(), 0.0) * 1e6)
    # a rank of an earlier export that this graph does not have would be read as part of this job
    for stale in out.glob(f"{prefix}.*.et"):
        if stale.name[len(prefix) + 1:-3].isdigit():
            stale.unlink()
    files, counts = [], {}
    types = {"comp": et.COMP_NODE, "coll": et.COMM_COLL_NODE, "send": et.COMM_SEND_NODE, "recv": et.COMM_RECV_NODE}
    col = {c: tasks[c].to_numpy().tolist() for c in ("rank", "id", "step", "name", "kind", "comm_type", "comm_size", "peer", "tag",
                                                      "group", "cpu")}
    dur_l, start_l = dur_us.astype(np.int64).tolist(), start_us.astype(np.int64).tolist()
    data_of = {(int(r), int(v)): sorted(int(u) for u in us) for (r, v), us in data.items()}
    rows_of = pd.Series(np.arange(len(tasks))).groupby(col["rank"], sort=True).agg(list)
    for r, rows in rows_of.items():
        r = int(r)
        path = out / f"{prefix}.{r}.et"
        with open(path, "wb") as f:
            _write_message(f, et.GlobalMetadata(version=ET_VERSION, attr=[
                _attr("schema", string_val=f"prism-whatif {ET_VERSION}"), _attr("rank", int64_val=r),
                _attr("world_size", int64_val=len(ranks))]))
            for i in rows:
                kind, tid = col["kind"][i], int(col["id"][i])
                n = et.Node(id=tid, name=str(col["name"][i]), type=types[kind], duration_micros=dur_l[i], start_time_micros=start_l[i])
                n.data_deps.extend(data_of.get((r, tid), []))
                n.ctrl_deps.extend(sorted(ctrl.get((r, tid), [])))
                attrs = [_attr("is_cpu_op", bool_val=bool(col["cpu"][i])), _attr("prism_step", int64_val=int(col["step"][i]))]
                if kind != "comp":
                    attrs.append(_attr("comm_size", int64_val=max(int(col["comm_size"][i]), 0)))
                if kind == "coll":
                    attrs += [_attr("comm_type", int64_val=int(col["comm_type"][i])), _attr("pg_name", string_val=group_id[col["group"][i]])]
                elif kind in ("send", "recv"):
                    peer = int(col["peer"][i])
                    src_rank, dst_rank = (r, peer) if kind == "send" else (peer, r)
                    attrs += [_attr("comm_src", int32_val=src_rank), _attr("comm_dst", int32_val=dst_rank),
                              _attr("comm_tag", int32_val=int(col["tag"][i]))]
                n.attr.extend(attrs)
                _write_message(f, n)
        files.append(path.name)
        counts[str(r)] = len(rows)
    return {"dir": str(out), "prefix": prefix, "files": files, "nodes_per_rank": counts,
            "comm_groups": len(groups), "warnings": warnings}


def _write_message(f, message) -> None:
    """One length-delimited message, as Chakra's ``protolib.encodeMessage`` writes it: its size as a varint, then it."""
    body = message.SerializeToString()
    size = len(body)
    head = bytearray()
    while True:
        bits, size = size & 0x7F, size >> 7
        head.append(bits | (0x80 if size else 0))
        if not size:
            break
    f.write(bytes(head))
    f.write(body)


def read_et(path: str | Path) -> tuple[et.GlobalMetadata, list[et.Node]]:
    """An ET file read back: its GlobalMetadata and its nodes (length-delimited, as :func:`write_chakra` writes them)."""
    buf = Path(path).read_bytes()
    pos, messages = 0, []
    while pos < len(buf):
        size = shift = 0
        while True:  # the length as a varint, as protolib's _DecodeVarint32 reads it
            if pos >= len(buf):
                raise ValueError(f"{path}: truncated at byte {pos}")
            b = buf[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if pos + size > len(buf):
            raise ValueError(f"{path}: a message of {size} bytes at byte {pos} runs past the end")
        messages.append(buf[pos:pos + size])
        pos += size
    if not messages:
        raise ValueError(f"{path}: empty")
    meta = et.GlobalMetadata.FromString(messages[0])
    return meta, [et.Node.FromString(m) for m in messages[1:]]
