"""``prism whatif --chakra``: the simulated graph as Chakra execution traces, read back with protobuf."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pandas as pd
import pytest
import yaml

from prism.cli import main
from prism.whatif import et_def_pb2 as et
from prism.whatif.chakra import read_et
from prism.whatif.graph import simulate
from prism.whatif.optrace import OpGraph, read_op_trace
from prism.whatif.scenarios import apply_op_scenarios, parse_scenario
from prism.whatif.schedule import one_f_one_b_calls

DP, PP, M, STEPS = 2, 3, 4, 2
P2P_BYTES = {"forward": 4 << 20, "backward": 4 << 20}
COLLECTIVES = [("grads-reduce-scatter", 64 << 20), ("optimizer-clip-main-grad", 4), ("params-all-gather", 32 << 20)]


def synthetic_job(seed: int = 0) -> pd.DataFrame:
    """A DP x PP job running Megatron's 1F1B for M micro-batches a step, then its DP reduce-scatter, the grad-norm
    all-reduce over every rank, the optimizer and the DP all-gather; each rank's calls laid out one after another
    (an op trace's start times only order a rank's calls), with a ``bytes`` column for the communication."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(STEPS):
        for d in range(DP):
            for s in range(PP):
                rank, t = d * PP + s, 0.0
                calls = one_f_one_b_calls(s, PP, M) + [[(c, 0)] for c, _ in COLLECTIVES[:2]] + [[("optimizer", 0)]] + [[(COLLECTIVES[2][0], 0)]]
                for call in calls:
                    durs = []
                    for optype, mb in call:
                        dur = float(rng.uniform(1e-3, 5e-3))
                        nbytes = P2P_BYTES[optype.split("-")[0]] if optype.endswith(("send", "recv")) else dict(COLLECTIVES).get(optype, np.nan)
                        rows.append((d, s, rank, step, optype, t, dur, mb, nbytes))
                        durs.append(dur)
                    t += max(durs) + 1e-4
    return pd.DataFrame(rows, columns=["dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "bytes"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("chakra")
    trace = d / "job.csv"
    synthetic_job().to_csv(trace, index=False)
    (d / "meta.yaml").write_text(yaml.safe_dump({"dp_size": DP, "pp_size": PP, "trial_name": "syn"}))
    rc = main(["whatif", "--ops", str(trace), "--meta", str(d / "meta.yaml"), "--scenario", "scale-compute:0.5",
               "--chakra", str(d / "et"), "--out", str(d / "out"), "--quiet"])
    assert rc == 0
    # the graph the what-if simulated, built the same way here
    g = OpGraph(read_op_trace(trace))
    graph = simulate(g.graph(apply_op_scenarios(g, [parse_scenario("scale-compute:0.5")]), launch_delay=False)).graph
    files = {r: read_et(d / "et" / f"workload.{r}.et") for r in range(DP * PP)}
    return g, graph, files, d


def test_every_rank_has_a_file_with_one_node_per_task(exported):
    g, _, files, d = exported
    assert sorted(p.name for p in (d / "et").glob("*.et")) == sorted(f"workload.{r}.et" for r in range(DP * PP))
    per_rank = g.ops.groupby("rank").size()
    for r, (meta, nodes) in files.items():
        assert meta.version and {a.name for a in meta.attr} >= {"rank", "world_size"}
        assert len(nodes) == per_rank[r]
        assert sorted(n.id for n in nodes) == list(range(len(nodes)))
        assert Counter(n.type for n in nodes)[et.COMP_NODE] == int((g.ops["rank"] == r).sum()) - int(
            ((g.ops["rank"] == r) & g.ops["optype"].str.contains("send|recv|scatter|gather|clip")).sum())


def test_dependencies_stay_in_their_rank_and_follow_the_graph(exported):
    g, graph, files, _ = exported
    for r, (_, nodes) in files.items():
        ids = {n.id for n in nodes}
        n_roots = 0
        for n in nodes:
            assert set(n.data_deps) <= ids and set(n.ctrl_deps) <= ids and n.id not in n.data_deps
            n_roots += not n.data_deps and not n.ctrl_deps
        assert n_roots == 1  # the rank's first task; every later one waits on something (steps are chained)
        # as many dependencies as the graph has edges on this rank (consecutive tasks of the rank)
        tasks = g.ops[g.ops["rank"] == r]
        node = g.node[tasks.index.to_numpy()]
        own = set(node)
        edges = sum(1 for u, v in zip(graph.src, graph.dst) if u in own and v in own)
        batched = Counter(node)  # a task with two ops of this rank (a batched send and receive): each one's deps
        expected = sum(batched[v] * batched[u] for u, v in set(zip(graph.src, graph.dst)) if u in own and v in own)
        assert edges and sum(len(n.data_deps) for n in nodes) == expected


def test_compute_durations_and_sizes_are_the_graphs(exported):
    g, graph, files, _ = exported
    for r, (_, nodes) in files.items():
        mine = g.ops["rank"].to_numpy() == r
        comp_ops = mine & ~g.ops["optype"].str.contains("send|recv|scatter|gather|clip").to_numpy()
        want_us = np.round(graph.duration[g.node[comp_ops]] * 1e6).sum()
        got_us = sum(n.duration_micros for n in nodes if n.type == et.COMP_NODE)
        assert got_us == want_us and abs(got_us - graph.duration[g.node[comp_ops]].sum() * 1e6) <= comp_ops.sum()
        for n in nodes:
            a = {x.name: x for x in n.attr}
            if n.type == et.COMM_COLL_NODE:
                want = dict(COLLECTIVES)[n.name]
                assert a["comm_size"].int64_val == want
                assert a["comm_type"].int64_val == {"grads-reduce-scatter": et.REDUCE_SCATTER, "params-all-gather": et.ALL_GATHER,
                                                    "optimizer-clip-main-grad": et.ALL_REDUCE}[n.name]
            elif n.type in (et.COMM_SEND_NODE, et.COMM_RECV_NODE):
                assert a["comm_size"].int64_val == P2P_BYTES[n.name.split("-")[0]]


def test_sends_and_receives_pair_up_across_ranks(exported):
    g, _, files, d = exported
    ends = defaultdict(list)
    for r, (_, nodes) in files.items():
        for n in nodes:
            if n.type in (et.COMM_SEND_NODE, et.COMM_RECV_NODE):
                a = {x.name: x for x in n.attr}
                ends[a["comm_tag"].int32_val].append((n.type, r, a["comm_src"].int32_val, a["comm_dst"].int32_val, a["comm_size"].int64_val))
    # every pipeline transfer of the trace: (PP - 1) boundaries x 2 directions x M micro-batches x DP x steps
    assert len(ends) == (PP - 1) * 2 * M * DP * STEPS
    for tag, pair in ends.items():
        assert sorted(t for t, *_ in pair) == [et.COMM_SEND_NODE, et.COMM_RECV_NODE], tag
        (_, s_rank, s_src, s_dst, s_size), (_, r_rank, r_src, r_dst, r_size) = sorted(pair)
        assert (s_src, s_dst) == (r_src, r_dst) == (s_rank, r_rank) and s_size == r_size
        assert abs(s_rank - r_rank) == 1  # neighbouring stages of one pipeline
    # the collectives' groups: each DP group of a stage, and every rank for the grad-norm all-reduce
    groups = json.loads((d / "et" / "workload.comm_groups.json").read_text())
    assert sorted(map(tuple, groups.values())) == sorted([tuple(range(s, DP * PP, PP)) for s in range(PP)] + [tuple(range(DP * PP))])
    for r, (_, nodes) in files.items():
        for n in nodes:
            if n.type == et.COMM_COLL_NODE:
                assert r in groups[{x.name: x for x in n.attr}["pg_name"].string_val]


def test_a_truncated_file_and_a_network_replay_are_refused(exported, tmp_path, capsys):
    _, _, _, d = exported
    blob = (d / "et" / "workload.0.et").read_bytes()
    (tmp_path / "cut.et").write_bytes(blob[:-3])
    with pytest.raises(ValueError, match="runs past the end"):
        read_et(tmp_path / "cut.et")
    rc = main(["whatif", str(tmp_path), "--chakra", str(tmp_path / "et"), "--out", str(tmp_path / "o"), "--quiet"])
    assert rc != 0 and "--chakra needs ranks" in capsys.readouterr().err


def _kineto_rank(rank: int, compute_us: float, sized: bool) -> dict:
    """One rank of a hand-made 2-rank Kineto trace: a GEMM, then an NCCL all-reduce waiting for it, the host syncing."""
    def ev(cat, name, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": args.get("stream", 101), "ts": ts, "dur": dur, "args": args}

    k_end = 1020 + compute_us
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}, "traceEvents": [
        ev("user_annotation", "ProfilerStep#1", 1000, 700),
        ev("cuda_runtime", "cudaLaunchKernel", 1010, 5, correlation=1),
        ev("kernel", "volta_sgemm_128x64_nn", 1020, compute_us, stream=7, correlation=1),
        ev("cuda_runtime", "cudaStreamWaitEvent", 1016, 1, correlation=2),
        ev("cuda_runtime", "cudaLaunchKernel", 1020, 5, correlation=3),
        ev("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", k_end, 50, stream=20, correlation=3,
           **{"In msg nelems": 1 << 20, "dtype": "Float"} if sized else {}),
        ev("cuda_runtime", "cudaStreamSynchronize", 1030, k_end + 55 - 1030, correlation=4)]}


@pytest.mark.parametrize("sized", [True, False])
def test_kineto_traces_export_their_gpu_and_host_tasks(tmp_path, capsys, sized):
    """From Kineto traces: every GPU operation and host call of a rank is a node (the step markers are not), the
    all-reduce is one ALL_REDUCE over both ranks, its size the kernel's input (PyTorch's In msg nelems x dtype), 0
    with a warning where the trace gives none."""
    k = tmp_path / "k"
    k.mkdir()
    for r, c in enumerate([100.0, 300.0]):
        (k / f"rank{r}.json").write_text(json.dumps(_kineto_rank(r, c, sized)))
    rc = main(["whatif", "--kineto", str(k), "--chakra", str(tmp_path / "et"), "--chakra-prefix", "dlrm",
               "--out", str(tmp_path / "o"), "--output", "json"])
    assert rc == 0
    warned = "without a size" in json.dumps(json.loads(capsys.readouterr().out).get("warnings", []))
    assert warned != sized
    for r in (0, 1):
        _, nodes = read_et(tmp_path / "et" / f"dlrm.{r}.et")
        assert Counter(n.type for n in nodes) == {et.COMP_NODE: 5, et.COMM_COLL_NODE: 1}  # 4 host calls, the GEMM
        ids = {n.id for n in nodes}
        assert all(set(n.data_deps) <= ids for n in nodes)
        ar = next(n for n in nodes if n.type == et.COMM_COLL_NODE)
        a = {x.name: x for x in ar.attr}
        assert a["comm_type"].int64_val == et.ALL_REDUCE and a["comm_size"].int64_val == (4 << 20 if sized else 0)
        gemm = next(n for n in nodes if n.name.startswith("volta"))
        assert gemm.id in ar.data_deps or any(gemm.id in n.data_deps for n in nodes)
        assert gemm.duration_micros == [100, 300][r]
    assert json.loads((tmp_path / "et" / "dlrm.comm_groups.json").read_text()) == {"1": [0, 1]}
