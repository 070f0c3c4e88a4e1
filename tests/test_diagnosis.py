"""Diagnosers, one class at a time, on small hand-made inputs."""
import numpy as np
import pandas as pd
import pytest

from prism.analysis.diagnosis import ANOMALY_COLUMNS, CrossStepDiagnoser, StageLagDiagnoser, SwitchBandwidth, SwitchDiagnoser
from prism.analysis.diagnosis.cross_group import pipeline_stages


def _steps(durations, job="j"):
    d = np.asarray(durations, dtype=float)
    return pd.DataFrame({"job_id": job, "step": np.arange(len(d)), "start_ns": np.cumsum(d).astype(np.int64), "duration_ns": d})


def test_cross_step_single_and_regime():
    rng = np.random.default_rng(1)
    d = 100e6 * rng.lognormal(0, 0.003, 80)
    d[20] *= 1.6
    d[50:] *= 1.25
    a = CrossStepDiagnoser().fit(_steps(d)).predict()
    assert list(a.columns) == ANOMALY_COLUMNS
    assert a[["kind", "step"]].values.tolist() == [["slow_step", 20], ["regime_change", 50]]
    assert a.loc[0, "score"] > 1.5 and "1.6" in a.loc[0, "explanation"]


def test_cross_step_quiet_on_noise():
    rng = np.random.default_rng(2)
    d = 100e6 * rng.lognormal(0, 0.02, 500)
    assert CrossStepDiagnoser().fit(_steps(d)).predict().empty


def test_cross_step_short_burst_is_slow_steps_not_regime():
    d = np.full(40, 100e6)
    d[10:12] = 150e6
    a = CrossStepDiagnoser().fit(_steps(d)).predict()
    assert a["kind"].tolist() == ["slow_step", "slow_step"]


def _pipeline_flows(n_pipelines=8, stages=3, steps=6, slow=None, factor=1.5):
    """First flows of hand-made pipelines: node = pipeline * stages + stage."""
    rows = []
    period = 1_000_000
    for s in range(steps):
        t0 = s * period
        for p in range(n_pipelines):
            t = t0
            for k in range(stages - 1):
                compute = 10_000 * (factor if slow == (p, k) and s >= 2 else 1)
                t += compute
                rows.append(("j", s, p * stages + k, p * stages + k + 1, t, t + 1_000))
                t += 1_000
            t += 20_000 * (factor if slow == (p, stages - 1) and s >= 2 else 1)
            rows.append(("j", s, p * stages + stages - 1, p * stages + stages - 2, t, t + 1_000))
    ff = pd.DataFrame(rows, columns=["job_id", "step", "src", "dst", "start_ns", "end_ns"])
    steps = pd.DataFrame({"job_id": "j", "step": range(steps), "start_ns": [s * period for s in range(steps)]})
    return ff, steps


def test_pipeline_stages_orders_chains():
    ff, _ = _pipeline_flows()
    st = pipeline_stages(ff)
    assert len(st) == 24
    assert (st["node"] % 3 == st["stage"]).all()
    assert (st["stages"] == 3).all()


def test_stage_lag_names_the_server():
    ff, steps = _pipeline_flows(slow=(5, 1))
    server_of = np.array([f"srv{n // 3 % 4 if n % 3 != 1 else 10 + n // 3}" for n in range(24)])
    a = StageLagDiagnoser().fit(ff, steps, server_of).predict()
    assert a["subject"].tolist() == [server_of[5 * 3 + 1]]
    assert a["step"].tolist() == [2]
    assert abs(a["score"].iloc[0] - 1.5) < 0.05


def test_stage_lag_quiet_without_fault():
    ff, steps = _pipeline_flows()
    server_of = np.array([f"srv{n}" for n in range(24)])
    assert StageLagDiagnoser().fit(ff, steps, server_of).predict().empty


def _fabric_bw(slow_spine="spine-1", factor=0.2, n=400):
    """Flows over leaf-spine-leaf paths; flows via ``slow_spine`` take 1/factor longer."""
    rng = np.random.default_rng(3)
    leaves, spines = [f"leaf-{i}" for i in range(6)], [f"spine-{i}" for i in range(4)]
    paths = [f"{a}|{s}|{b}" for a in leaves for b in leaves if a != b for s in spines]
    k = rng.integers(0, len(paths), n * len(paths))
    path = np.array(paths, dtype=object)[k]
    size = np.full(len(k), 4 << 20)
    dur = (size / 50.0 * rng.lognormal(0, 0.02, len(k))).astype(np.int64)
    if slow_spine:
        dur = np.where([f"|{slow_spine}|" in p for p in path], (dur / factor).astype(np.int64), dur)
    bw = SwitchBandwidth(window_s=60)
    start = np.sort(rng.integers(0, 50_000_000_000, len(k)))
    bw.partial_fit(start[: len(k) // 2], dur[: len(k) // 2], size[: len(k) // 2], pd.Categorical(path[: len(k) // 2]))
    bw.partial_fit(start[len(k) // 2 :], dur[len(k) // 2 :], size[len(k) // 2 :], pd.Categorical(path[len(k) // 2 :]))
    return bw


def test_switch_degraded_spine_explains_its_leaves():
    d = SwitchDiagnoser().fit(_fabric_bw())
    a = d.predict()
    assert a["kind"].tolist() == ["slow_switch"]
    assert a["subject"].tolist() == ["spine-1"]
    assert 0.15 < a["score"].iloc[0] < 0.3
    # without explaining away, every leaf would look slower than its peers... but not below the bar
    tab = d.bandwidth_
    assert set(tab.loc[tab["kind"] == "switch", "tier"]) == {"leaf", "spine"}


def _confounded_bw(slow: str):
    """Leaves with busy local traffic (which crosses no spine), and leaf-5, whose every path crosses spine-1.

    ``slow='spine'``: spine-1 is degraded, so leaf-5's flows are as slow as the spine's (slower here).
    ``slow='leaf'``: leaf-5 is degraded, so spine-1, whose traffic is mostly leaf-5's, looks slow too (slower than
    leaf-5 against its tier: the leaves' median is pulled down by their traffic to leaf-5, the spines' is not).
    """
    rng = np.random.default_rng(5)
    leaves, spines = [f"leaf-{i}" for i in range(6)], [f"spine-{i}" for i in range(4)]
    paths = [f"{a}|{s}|{b}" for a in leaves for b in leaves if a != b for s in spines if "leaf-5" not in (a, b)]
    paths += [f"{a}|spine-1|{b}" for a in leaves for b in leaves if a != b and "leaf-5" in (a, b) for _ in range(12)]
    paths += [leaf for leaf in leaves[:5] for _ in range(20)]  # local traffic (weighted): the leaves' median is a healthy leaf
    k = rng.integers(0, len(paths), 30 * len(paths))
    path = np.array(paths, dtype=object)[k]
    size = np.full(len(k), 4 << 20)
    dur = (size / 50.0 * rng.lognormal(0, 0.02, len(k))).astype(np.int64)
    via_leaf = np.array(["leaf-5" in p for p in path])
    via_spine = np.array(["|spine-1|" in p for p in path])
    if slow == "spine":
        dur = np.where(via_spine, (dur / np.where(via_leaf, 0.15, 0.2)).astype(np.int64), dur)
    else:
        dur = np.where(via_leaf, (dur / 0.2).astype(np.int64), dur)
    bw = SwitchBandwidth(window_s=60)
    bw.partial_fit(np.sort(rng.integers(0, 50_000_000_000, len(k))), dur, size, pd.Categorical(path))
    return bw


@pytest.mark.parametrize("slow, subject", [("spine", "spine-1"), ("leaf", "leaf-5")])
def test_switch_explains_a_confounded_unit_by_exclusive_traffic(slow, subject):
    """When one switch's flows all cross another slow one, both look slow, and the lower ratio is no guide (the leaf
    case blamed spine-1 before). The one whose own traffic, avoiding the other, is still slow is flagged; the other
    is explained by it."""
    a = SwitchDiagnoser().fit(_confounded_bw(slow)).predict()
    assert a["subject"].tolist() == [subject], a["explanation"].tolist()


def test_switch_quiet_when_healthy():
    assert SwitchDiagnoser().fit(_fabric_bw(slow_spine=None)).predict().empty


def test_switch_bandwidth_merges_chunks():
    bw = _fabric_bw(slow_spine=None, n=10)
    t = bw.table()
    assert t["flows"].sum() == 10 * 6 * 5 * 4
    assert len(bw.switch_names) == 10


def _senders_bw(slow_sender=None, slow_spine=None, n=30):
    """Leaf-spine-leaf flows from 8 senders per leaf; a slow sender's flows (or a slow spine's) take 5x longer."""
    rng = np.random.default_rng(4)
    leaves, spines = [f"leaf-{i}" for i in range(6)], [f"spine-{i}" for i in range(4)]
    rows = []
    for li, a in enumerate(leaves):
        for snd in range(8):
            src = li * 8 + snd
            for b in leaves:
                if b == a:
                    continue
                sp = spines[(src + leaves.index(b)) % 4]
                rows += [(src, f"{a}|{sp}|{b}")] * n
    src = np.array([r[0] for r in rows])
    path = np.array([r[1] for r in rows], dtype=object)
    size = np.full(len(rows), 4 << 20)
    dur = (size / 50.0 * rng.lognormal(0, 0.02, len(rows))).astype(np.int64)
    slow = np.zeros(len(rows), dtype=bool)
    if slow_sender is not None:
        slow |= src == slow_sender
    if slow_spine is not None:
        slow |= np.array([f"|{slow_spine}|" in p for p in path])
    dur = np.where(slow, dur * 5, dur)
    bw = SwitchBandwidth(window_s=60)
    bw.partial_fit(np.sort(rng.integers(0, 50_000_000_000, len(rows))), dur, size, pd.Categorical(path), src=src)
    return bw


def test_slow_sender_is_not_a_slow_switch():
    """A host sending slowly makes its own flows slow on every path; its leaf's other senders vote it down."""
    unvoted = SwitchDiagnoser(min_vote=0.0).fit(_senders_bw(slow_sender=8)).predict()
    assert unvoted["subject"].tolist() == ["leaf-1>spine-0"], "without the vote a link of the slow sender's leaf is blamed"
    voted = SwitchDiagnoser().fit(_senders_bw(slow_sender=8))
    assert voted.predict().empty, voted.predict()["explanation"].tolist()
    slow = SwitchDiagnoser().fit(_senders_bw(slow_spine="spine-2")).predict()
    assert slow["subject"].tolist() == ["spine-2"]
    assert "senders" in slow["explanation"].iloc[0]


def test_most_common_value_per_group_equals_value_counts():
    """The stage-0 vote without a Python call per pipeline: what pandas' value_counts().idxmax() gives, ties included."""
    from prism.analysis.diagnosis.cross_group import _most_common

    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(1, 60))
        g, v = rng.integers(0, 5, n), rng.integers(0, 6, n)
        want = pd.DataFrame({"g": g, "v": v}).groupby("g")["v"].agg(lambda s: s.value_counts().idxmax())
        got = _most_common(g, v)
        assert got.index.tolist() == want.index.tolist() and got.tolist() == want.tolist()


@pytest.mark.parametrize("seed", range(3))
def test_cross_step_equals_the_python_reference(seed):
    """Random jobs with slow runs of every length (single slow steps, regimes, a slow tail), any window and regime length."""
    from reference_cross_step import ReferenceCrossStepDiagnoser

    rng = np.random.default_rng(seed)
    kinds = set()
    for t in range(60):
        jobs = []
        for j in range(int(rng.integers(1, 4))):
            n = int(rng.integers(1, 300))
            d = rng.normal(100e6, rng.choice([0.2e6, 2e6, 8e6]), n)
            for _ in range(int(rng.integers(0, 6))):
                i, length = int(rng.integers(0, n)), int(rng.integers(1, 6)) if rng.random() < 0.7 else n
                d[i:i + length] *= rng.choice([1.2, 1.5, 2.0])
            jobs.append(pd.DataFrame({"job_id": f"j{j}", "step": np.arange(n) + 3, "start_ns": np.cumsum(d).astype(np.int64), "duration_ns": d.round()}))
        steps = pd.concat(jobs, ignore_index=True).sample(frac=1, random_state=t)  # any row order
        kw = dict(window=int(rng.integers(1, 20)), regime_steps=int(rng.integers(1, 5)), min_baseline=int(rng.integers(1, 8)))
        want, got = ReferenceCrossStepDiagnoser(**kw).fit(steps), CrossStepDiagnoser(**kw).fit(steps)
        pd.testing.assert_frame_equal(got.predict(), want.predict())
        pd.testing.assert_frame_equal(got.baseline_, want.baseline_)
        kinds |= set(got.predict()["kind"])
    assert kinds == {"slow_step", "regime_change"}  # both kinds were compared


def test_a_slow_step_needs_a_baseline_with_a_spread():
    """A daemon window's cut of a job's first steps, irregular (too few in view): a baseline of the first steps' median
    alone, or of one previous step, has no spread, and the floor alone called steps 0 and 2 slow (1.65x and 3.6x: a
    false alarm of the daemon's with 10 s windows on the real-trace flows); with the first steps as the baseline until
    it holds five, and no judgement on fewer, neither is, nor once more steps came. With enough steps before it, a slow
    step still is."""
    first = [1.9, 0.5, 1.8, 0.5]
    assert CrossStepDiagnoser().fit(_steps(np.array(first) * 1e9)).predict().empty
    assert CrossStepDiagnoser().fit(_steps(np.array(first + [2.1, 2.1, 2.2, 2.1, 2.2]) * 1e9)).predict().empty
    a = CrossStepDiagnoser().fit(_steps(np.array([1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 3.0, 1.0]) * 1e9)).predict()
    assert a[["kind", "step"]].values.tolist() == [["slow_step", 6]]
    # after a regime change its run is the baseline at once: a further slow-down two steps on is still found
    a = CrossStepDiagnoser().fit(_steps(np.array([100.0] * 20 + [130.0] * 4 + [200.0] + [130.0] * 10) * 1e6)).predict()
    assert a[["kind", "step"]].values.tolist() == [["regime_change", 20], ["slow_step", 24]]


def test_cross_step_window_must_hold_a_step():
    with pytest.raises(ValueError, match="window"):
        CrossStepDiagnoser(window=0)


def test_slow_steps_that_recur_say_so():
    """A checkpoint every 50 steps: each is reported, and its explanation says the slow steps recur every 50 steps;
    three unrelated slow steps do not."""
    d = np.full(400, 100.0)
    d[49::50] = 170.0
    steps = pd.DataFrame({"job_id": "j", "step": range(len(d)), "start_ns": range(len(d)), "duration_ns": d})
    a = CrossStepDiagnoser().fit(steps).predict()
    assert a["step"].tolist() == list(range(49, 400, 50))
    assert a["explanation"].str.contains("recur every 50 steps").all()
    d = np.full(400, 100.0)
    d[[30, 170, 250]] = 170.0
    a = CrossStepDiagnoser().fit(steps.assign(duration_ns=d)).predict()
    assert len(a) == 3 and not a["explanation"].str.contains("recur").any()


def _mixed_bw(slow_spine=None, seed=6):
    """Two kinds of flow over leaf-spine-leaf paths: all-to-all (EP) flows at a seventh of the rate of ring (DP) ones,
    each spine with its own share of EP pairs (ECMP's mix, 20% to 80%); flows via ``slow_spine`` take 5x longer.

    Returns the sums and the pair kinds (``(a, b, kind)``, as :func:`prism.analysis.analyse.pair_kinds` gives).
    """
    rng = np.random.default_rng(seed)
    leaves, spines = [f"leaf-{i}" for i in range(6)], [f"spine-{i}" for i in range(6)]
    ep_share = np.linspace(0.2, 0.8, len(spines))
    src, dst, path, kinds = [], [], [], {}
    for s in range(48):
        for d in range(48):
            if s // 8 == d // 8 or (min(s, d), max(s, d)) in kinds and kinds[min(s, d), max(s, d)][1] != s:
                continue
            sp = int(rng.integers(len(spines)))  # one spine a pair (ECMP), its kind drawn with that spine's EP share
            kinds[min(s, d), max(s, d)] = ("EP" if rng.random() < ep_share[sp] else "DP", s)
            for x, y in ((s, d), (d, s)):
                src += [x] * 8
                dst += [y] * 8
                path += [f"{leaves[x // 8]}|{spines[sp]}|{leaves[y // 8]}"] * 8
    src, dst, path = np.array(src), np.array(dst), np.array(path, dtype=object)
    ab = np.array(list(kinds), dtype=np.int64)
    kind = np.array([k for k, _ in kinds.values()], dtype=object)
    is_ep = pd.Series(dict(zip(map(tuple, ab.tolist()), kind == "EP")))[list(zip(np.minimum(src, dst).tolist(), np.maximum(src, dst).tolist()))].to_numpy()
    size = np.full(len(src), 4 << 20)
    dur = (size / np.where(is_ep, 50.0 / 7, 50.0) * rng.lognormal(0, 0.02, len(src))).astype(np.int64)
    if slow_spine is not None:
        dur = np.where([f"|{slow_spine}|" in p for p in path], dur * 5, dur)
    bw = SwitchBandwidth(window_s=60)
    bw.partial_fit(np.sort(rng.integers(0, 50_000_000_000, len(src))), dur, size, pd.Categorical(path), src=src, dst=dst)
    return bw, (ab[:, 0], ab[:, 1], kind)


def test_switch_judges_each_kind_of_flow_apart():
    """Pooled, healthy spines differ by their mix of slow (EP) and fast (ring) flows, so a 0.2x spine is not enough
    spreads below their median to be flagged; each kind's flows alone are alike on every healthy spine, and the
    degraded one stands out in each."""
    bw, kinds = _mixed_bw(slow_spine="spine-2")
    pooled = SwitchDiagnoser().fit(bw)
    assert pooled.predict().empty, pooled.predict()["explanation"].tolist()
    spines = pooled.bandwidth_.query("kind == 'switch' and tier == 'spine'").set_index("name")
    assert spines["ratio"].drop("spine-2").agg(lambda r: r.max() / r.min()) > 1.8  # the mix alone
    a = SwitchDiagnoser().fit(bw, kinds).predict()
    assert a["kind"].tolist() == ["slow_switch"] and a["subject"].tolist() == ["spine-2"], a["explanation"].tolist()
    assert 0.15 < a["score"].iloc[0] < 0.3
    assert a["explanation"].iloc[0].startswith(("switch spine-2 (spine): DP flows ", "switch spine-2 (spine): EP flows "))
    # the pooled figures stay in switches.csv (the links are judged once the spine's paths are explained away)
    sw = SwitchDiagnoser().fit(bw, kinds).bandwidth_.query("kind == 'switch'")
    assert sw.equals(pooled.bandwidth_.query("kind == 'switch'"))


def test_switch_kinds_quiet_when_healthy():
    """Judged apart, no kind of flow makes a healthy fabric slow; pairs given no kind are judged as a kind of their own."""
    bw, (a, b, kind) = _mixed_bw()
    assert SwitchDiagnoser().fit(bw, (a, b, kind)).predict().empty
    half = slice(0, len(a) // 2)
    assert SwitchDiagnoser().fit(bw, (a[half], b[half], kind[half])).predict().empty
