"""The data-parallel-only shapes of the SYNTHETIC generator (synthetic/dpshapes.py): their truth is self-consistent."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from synthetic import ClusterGenerator, Fabric, JobSpec, SlowServer
from synthetic.dpshapes import DP_SHAPES, FAMILY, STEP_LENGTHS, DPJob, dp_cluster, dp_job
from synthetic.generator import EPOCH_NS

MiB = 1 << 20
T = 8


def _job(shape, servers=2, **kw):
    # small messages' worth: every ring chunk is one message, so flows count ring steps
    base = dict(tp=T, pp=1, dp=servers, microbatches=3, fwd_ms=4, optimizer_ms=2, grad_bytes=96 * MiB, bucket_bytes=40 * MiB,
                message_bytes=64 * MiB, layers=4, shape=shape)
    base.update(kw)
    return DPJob(f"{shape}-{servers}", **base)


def _generate(job, duration_s=1.5, faults=(), with_faults=True, seed=0):
    fab = Fabric(servers=job.dp + 2, servers_per_group=4, spines=4)
    return ClusterGenerator(fab, [job], duration_s=duration_s, faults=list(faults), seed=seed, with_faults=with_faults,
                            uniform_dp_share=0.0, storage_flows_per_s=0).generate()


def _edge_flows(c, job, s_from, s_to, rail=0):
    """Flows of one directed ring edge: rail ``rail`` of the job's server ``s_from`` to that of ``s_to``."""
    servers = c.meta["jobs"][job.name]["servers"]
    ips = c.topology.set_index(["server", "rail"])["ip"]
    a, b = ips[(servers[s_from], rail)], ips[(servers[s_to], rail)]
    f = c.flows
    return f[(f["src"].astype(str) == a) & (f["dst"].astype(str) == b)]


def _per_step(c, edge):
    """(flows, bytes) of ``edge`` starting inside each truth step."""
    st = edge["start_ns"].to_numpy()
    rows = [((st >= s) & (st < e)) for s, e in zip(c.steps["start_ns"], c.steps["end_ns"])]
    return [int(m.sum()) for m in rows], [int(edge["size"].to_numpy()[m].sum()) for m in rows]


def _expected_ring_steps(job, ring="all"):
    """Ring steps one edge carries in one optimizer step, from the shape's definition (not the generator's code)."""
    S, M, L = job.dp, job.microbatches, job.layers
    nb = len(job.bucket_sizes())
    if job.shape == "ddp":
        return (1 if job.no_sync else M) * nb * 2 * (S - 1)
    if job.shape == "zero1":
        return nb * 2 * (S - 1) + nb * (S - 1)
    if job.shape == "zero2":
        return M * nb * (S - 1) + nb * (S - 1)
    if job.shape == "fsdp":
        return 3 * L * M * (S - 1)
    g = job.shard_servers
    if ring == "shard":
        return 3 * L * M * (g - 1)
    return L * M * 2 * (S // g - 1)


CASES = [
    _job("ddp"),
    _job("ddp", no_sync=False),
    _job("ddp", servers=4),
    _job("zero1"),
    _job("zero2", servers=3),
    _job("fsdp"),
    _job("fsdp", servers=4, microbatches=2, layers=6),
    _job("hsdp", servers=4, shard_servers=2),
]


@pytest.mark.parametrize("job", CASES, ids=lambda j: f"{j.name}{'' if j.no_sync else '-sync'}-M{j.microbatches}-L{j.layers}")
def test_every_truth_step_holds_its_collectives(job):
    c = _generate(job)
    assert len(c.steps) >= 5
    if job.shape == "hsdp":
        checks = [((0, 1), "shard"), ((0, 2), "replica")]
    else:
        checks = [((0, 1), "all")]
    for (a, b), ring in checks:
        counts, nbytes = _per_step(c, _edge_flows(c, job, a, b))
        want = _expected_ring_steps(job, ring)
        assert counts == [want] * len(counts), (ring, counts[:5], want)
        # bytes add up: a ring collective of B bytes over k members moves (k - 1) / k of B per phase on each edge
        k = job.shard_servers if ring == "shard" else (job.dp // job.shard_servers if ring == "replica" else job.dp)
        per_rail = job.grad_bytes / T
        if job.shape == "ddp":
            ideal = (1 if job.no_sync else job.microbatches) * 2 * (k - 1) / k * per_rail
        elif job.shape == "zero1":
            ideal = 3 * (k - 1) / k * per_rail
        elif job.shape == "zero2":
            ideal = (job.microbatches + 1) * (k - 1) / k * per_rail
        elif ring == "replica":  # the shard's all-reduce
            ideal = job.microbatches * 2 * (k - 1) / k * per_rail / job.shard_servers
        else:
            ideal = 3 * job.microbatches * (k - 1) / k * per_rail
        assert all(abs(n - ideal) <= want * k for n in nbytes), (nbytes[:3], ideal)  # rounding: under k bytes a ring step


@pytest.mark.parametrize("job", CASES[:1] + CASES[3:6] + CASES[7:], ids=lambda j: j.name)
def test_steps_are_the_optimizer_steps(job):
    """Every GPU flow inside the steps' span falls in one step; steps tile time; a step ends with its last flow."""
    c = _generate(job)
    f = c.flows
    s, e = c.steps["start_ns"].to_numpy(), c.steps["end_ns"].to_numpy()
    assert (s[1:] == e[:-1]).all() and (np.diff(s) > 0).all()
    st, en = f["start_ns"].to_numpy(), (f["start_ns"] + f["duration_ns"]).to_numpy()
    inside = (st >= s[0]) & (st < e[-1])
    k = np.searchsorted(e, st[inside], side="right")
    assert (en[inside] <= e[k] + 2).all()
    last_end = pd.Series(en[inside]).groupby(k).max().to_numpy()
    assert np.allclose(last_end, e, atol=2)
    # the step is the optimizer step: its length is the micro-batches' compute and more, never one micro-batch's
    assert np.median(e - s) >= job.lower_bound_step_ns()


def test_collectives_per_step_match_the_flows():
    job = _job("fsdp", microbatches=2, layers=5)
    per = job.collectives_per_step()
    assert per == {"all-gather": 2 * 5 * 2, "reduce-scatter": 5 * 2}
    counts, _ = _per_step(_generate(job), _edge_flows(_generate(job), job, 1, 0))
    assert set(counts) == {sum(per.values())}  # two servers: one ring step a collective
    d = _job("ddp", grad_bytes=250 * MiB, bucket_bytes=100 * MiB)
    assert d.collectives_per_step() == {"all-reduce": 3} and replace(d, no_sync=False).collectives_per_step() == {"all-reduce": 9}


def test_pairs_are_dp_and_the_shape_is_in_the_truth():
    job = _job("hsdp", servers=4, shard_servers=2)
    c = _generate(job)
    assert set(c.pairs["type"]) == {"DP"}
    servers = c.topology.set_index("ip")["server"]
    spans = {tuple(sorted((servers[a], servers[b]))) for a, b in zip(c.pairs["src"], c.pairs["dst"])}
    names = c.meta["jobs"][job.name]["servers"]
    assert (names[0], names[1]) in spans and (names[0], names[2]) in spans  # sharded within a group, replicated across
    assert (names[0], names[3]) not in spans
    assert len(c.pairs) == T * (2 + 2)  # two 2-member shard rings and two 2-member replica rings a rail: one pair each
    assert c.meta["jobs"][job.name]["shape"] == "hsdp" and FAMILY["hsdp"] == "hybrid"
    assert set(c.jobs["ip"]) == set(c.topology["ip"][c.topology["server"].isin(names)])


@pytest.mark.parametrize("shape", ["ddp", "zero2", "fsdp", "hsdp"])
def test_slow_server_makes_every_collective_wait(shape):
    job = _job(shape, servers=4, **({"shard_servers": 2} if shape == "hsdp" else {}))
    fault = SlowServer(job.name, server=2, from_step=4, factor=1.5)
    bad, twin = _generate(job, faults=[fault]), _generate(job, faults=[fault], with_faults=False)
    assert len(twin.faults) == 0
    f = bad.faults.iloc[0]
    assert (f["kind"], f["step"], f["subject"]) == ("slow_group", 4, bad.meta["jobs"][job.name]["servers"][2])
    db, dt = (bad.steps["end_ns"] - bad.steps["start_ns"]).to_numpy(), (twin.steps["end_ns"] - twin.steps["start_ns"]).to_numpy()
    assert (db[:4] == dt[:4]).all()  # the same random numbers until the fault
    assert pd.Series(bad.steps["start_ns"]).iloc[:5].equals(pd.Series(twin.steps["start_ns"]).iloc[:5])
    assert np.median(db[5:]) > 1.35 * np.median(dt[5:])  # everyone waits for the slow server: the whole step slows


def test_checkpoint_every_n_steps_with_dp_shapes():
    for shape in ("ddp", "zero1", "fsdp"):
        job = _job(shape)
        plain = _generate(job, duration_s=2.0)
        ck = _generate(replace(job, checkpoint_every=3, checkpoint_pause=0.5), duration_s=2.0)
        dp_, dc = (plain.steps["end_ns"] - plain.steps["start_ns"]).to_numpy(), (ck.steps["end_ns"] - ck.steps["start_ns"]).to_numpy()
        n = min(len(dp_), len(dc))
        extra = (dc[:n] - dp_[:n]) / job.lower_bound_step_ns()
        slow = np.flatnonzero(extra > 0.4)
        assert len(slow) >= 3 and (np.diff(slow) == 3).all(), (shape, extra.round(2))
        assert np.allclose(extra[slow], 0.5, atol=0.01) and np.allclose(np.delete(extra, slow), 0, atol=1e-9)


def test_dp_job_checks():
    with pytest.raises(ValueError, match="shape"):
        DPJob("x", shape="ring")
        _generate(DPJob("x", shape="ring"))
    for bad in (dict(tp=4, dp=4), dict(pp=2), dict(shape="hsdp", dp=4, shard_servers=4), dict(shape="hsdp", dp=4, shard_servers=3)):
        with pytest.raises(ValueError):
            _generate(DPJob("x", **{"dp": 2, **bad}))


def test_the_3d_shape_is_the_old_simulation():
    """A plain JobSpec has no shape: the generator runs the Megatron simulation for it (its flows are unchanged)."""
    from synthetic.dpshapes import DPShapeSimulation
    from synthetic.generator import JobSimulation, _simulation

    assert _simulation(JobSpec("a")) is JobSimulation and _simulation(_job("ddp")) is DPShapeSimulation
    assert not hasattr(JobSpec("a"), "shape")


def test_matrix_shapes_and_step_lengths():
    """Every matrix job generates, and its fault-free steps take about the step length it is named for."""
    for shape in DP_SHAPES:
        for length, (secs, *_rest) in STEP_LENGTHS.items():
            j = dp_job(shape, length)
            j.check()
            assert 0.8 * secs <= j.lower_bound_step_ns() / 1e9 <= secs
    c = dp_cluster("zero1", "0.3s", duration_s=4, with_faults=False)
    d = (c.steps["end_ns"] - c.steps["start_ns"]) / 1e9
    assert 0.27 < d.median() < 0.33 and c.meta["dp_shape"] == "zero1" and c.steps["start_ns"].min() >= EPOCH_NS


def test_slow_step_slows_one_optimizer_step():
    from synthetic import SlowStep

    job = _job("zero2")
    bad, twin = _generate(job, faults=[SlowStep(job.name, step=3, factor=2.0)]), _generate(job, faults=[SlowStep(job.name, step=3, factor=2.0)], with_faults=False)
    db, dt = (bad.steps["end_ns"] - bad.steps["start_ns"]).to_numpy(), (twin.steps["end_ns"] - twin.steps["start_ns"]).to_numpy()
    assert (db[:3] == dt[:3]).all() and db[3] > 1.5 * dt[3]
    assert np.allclose(db[5:8], dt[5:8], atol=2)  # the steps after it are back to normal (same draws; ns rounding)
    f = bad.faults.iloc[0]
    assert (f["kind"], f["step"]) == ("slow_step", 3) and f["start_ns"] == bad.steps["start_ns"].iloc[3]


def test_rings_are_a_rendezvous():
    """A ring edge moves once both its ends are in: with server 2 slow, edges 1 -> 2 and 2 -> 3 open every collective
    together, when it enters, while the edges between the early servers (3 -> 0, 0 -> 1) have moved already; no record
    spans a wait. With ``cts_bytes`` each edge's receiver sends a clear-to-send as it enters, once a collective."""
    job = _job("ddp", servers=4)
    fault = SlowServer(job.name, server=2, from_step=4, factor=1.5)
    c = _generate(job, faults=[fault])
    t0 = int(c.faults.iloc[0]["start_ns"])
    start = {i: np.sort(_edge_flows(c, job, i, (i + 1) % job.dp)["start_ns"].to_numpy()) for i in range(job.dp)}
    e = start[1]
    opens = e[1:][(np.diff(e) > 300_000) & (e[1:] > t0)]  # edge 1 -> 2 after a wait: a collective's step 0
    assert len(opens) >= 10
    assert np.isin(opens, start[2]).all()  # the slow server's two edges: a tie, at its entry
    for early in (3, 0):  # no edge between early servers waited for it
        near = np.searchsorted(start[early], opens)
        assert not np.isin(opens, start[early]).any() and (near > 0).all()
    d = c.flows["duration_ns"].to_numpy()
    assert d.max() < 1.2 * np.median(d[c.flows["size"].to_numpy() == c.flows["size"].max()])  # one message, no wait inside
    cts = _generate(replace(job, cts_bytes=256), faults=[fault])
    back = _edge_flows(cts, job, 2, 1)  # server 2's clear-to-send to server 1 (no data goes 2 -> 1)
    assert set(back["size"]) == {256}
    assert np.isin(opens, back["start_ns"].to_numpy()).all()  # as it enters, with the data it lets move
    n_coll = len(start[1]) // (2 * (job.dp - 1))
    assert abs(len(back) - n_coll) <= 2  # one a collective (the window's edges may cut one)
