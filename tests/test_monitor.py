"""The daemon's windowing (Monitor) on the SYNTHETIC tiny cluster, without a broker.

Delivery is emulated as a collector sends it: one message per GPU pair and
export interval, so a partition's records arrive out of event-time order.
"""
import pandas as pd
import pytest

from prism.ingest.messages import pair_keys
from prism.ingest.topology import Topology
from prism.serve.monitor import Monitor, MonitorSettings
from synthetic import preset

SETTINGS = dict(window_s=3, step_s=1, switch_window_s=2, lateness_s=0.1, idle_flush_s=3)


@pytest.fixture(scope="module")
def cluster():
    return preset("tiny", seed=0, duration_s=8.0).generate()


def messages(flows: pd.DataFrame, interval_s: float = 1.0) -> list[pd.DataFrame]:
    """One frame per (export interval, GPU pair), in the order a collector sends them."""
    flows = flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    interval = (flows["start_ns"] - flows["start_ns"].iloc[0]) // int(interval_s * 1e9)
    key = pd.Series(pair_keys(flows["src"].astype(str), flows["dst"].astype(str)))
    return [g for _, g in flows.groupby([interval, key], sort=True)]


def steps_by_job(cluster, batches, ticks_after) -> dict:
    m = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
    for i, b in enumerate(batches):
        m.ingest(b.reset_index(drop=True))
        if i in ticks_after:
            m.tick()
        while m.due():
            m.tick()
    m.tick(final=True)
    return {j: st.view.steps for j, st in m._jobs.items()}, m


def test_lateness_follows_the_collectors_interval(cluster):
    """A window is not cut while an export interval is half delivered."""
    flows = cluster.flows.sort_values("start_ns", kind="stable")
    ordered, _ = steps_by_job(cluster, [flows.iloc[i : i + 2000] for i in range(0, len(flows), 2000)], ())
    msgs = messages(cluster.flows)
    assert sum(map(len, msgs)) == len(cluster.flows)
    # half of the third interval's pairs delivered when the first window is due:
    # the others' records lie up to a whole interval behind the latest
    first = next(i for i, g in enumerate(msgs) if g["start_ns"].min() - cluster.flows["start_ns"].min() >= 2e9)
    third = [i for i, g in enumerate(msgs) if 2e9 <= g["start_ns"].min() - cluster.flows["start_ns"].min() < 3e9]
    got, m = steps_by_job(cluster, msgs, {first + len(third) // 2})
    assert 0.9e9 <= m.view.lateness_ns <= 1e9, m.view.lateness_ns  # measured, not the configured 0.1 s
    assert got == ordered
    for job, n in got.items():
        assert n > 20, (job, n)


def test_lateness_shrinks_back_on_ordered_input(cluster):
    flows = cluster.flows.sort_values("start_ns", kind="stable")
    msgs = messages(flows[flows["start_ns"] < flows["start_ns"].iloc[0] + 2e9]) + [flows[flows["start_ns"] >= flows["start_ns"].iloc[0] + 2e9]]
    _, m = steps_by_job(cluster, msgs, ())
    # the disorder of the first two seconds is forgotten a window later
    assert m.lateness_ns() == int(SETTINGS["lateness_s"] * 1e9)


def test_a_backlog_read_at_once_counts_every_step(cluster):
    """Started on a backlog (the first polls hold more than a window), the first window reaches back to the first record."""
    flows = cluster.flows.sort_values("start_ns", kind="stable")
    streamed, _ = steps_by_job(cluster, [flows.iloc[i : i + 2000] for i in range(0, len(flows), 2000)], ())
    half = len(flows) // 2
    for batches in ([flows], [flows.iloc[:half], flows.iloc[half:]]):  # 8 s at once, or 4 s twice, with a 3 s window
        got, m = steps_by_job(cluster, batches, ())
        assert got == streamed
        first = m.steps_frame().groupby("job_id")["start_ns"].min()
        truth = cluster.steps.groupby("job_id")["start_ns"].min()
        assert len(first) == len(truth)
        assert (first.to_numpy() - truth.min() < 1e9).all()  # steps from the capture's first second are reported


def test_each_window_is_logged_at_debug(cluster, caplog):
    """``--log.level debug`` shows what each window covered: how far a backlog's windows stride."""
    flows = cluster.flows.sort_values("start_ns", kind="stable")
    with caplog.at_level("DEBUG", logger="prism.monitor"):
        _, m = steps_by_job(cluster, [flows.iloc[i : i + 2000] for i in range(0, len(flows), 2000)], ())
    windows = [r.fields for r in caplog.records if r.getMessage() == "window analysed"]
    assert len(windows) == m.view.ticks > 1
    assert windows[-1]["final"] and not windows[0]["final"]
    assert sum(w["flows"] for w in windows) >= len(flows)  # windows overlap: every flow is in one or more
    assert windows[-1]["to"] == pd.Timestamp(int(flows["start_ns"].max()), unit="ns", tz="UTC").isoformat(timespec="milliseconds")


def test_a_job_without_steps_in_a_whole_window_is_warned_about_once(cluster, caplog):
    """A window too short for a job's steps yields no steps for it: the operator is told once, not every window."""
    flows = cluster.flows.sort_values("start_ns", kind="stable")

    def run(settings, seconds=None):
        caplog.clear()
        f = flows if seconds is None else flows[flows["start_ns"] < flows["start_ns"].iloc[0] + seconds * 1e9]
        m = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**settings))
        with caplog.at_level("WARNING", logger="prism.monitor"):
            for b in [f.iloc[i : i + 2000].reset_index(drop=True) for i in range(0, len(f), 2000)]:
                m.ingest(b)
                while m.due():
                    m.tick()
            m.tick(final=True)
        warned = [r.fields["job"] for r in caplog.records if r.getMessage() == "no training steps found in a whole window"]
        return warned, {j: st.view.steps for j, st in m._jobs.items()}

    # 3 s of 0.25 s windows a step of 0.05 s apart: 60 windows, each too short for the jobs' steps
    warned, steps = run({**SETTINGS, "window_s": 0.25, "step_s": 0.05, "lateness_s": 0.01}, seconds=3)
    assert len(warned) == len(set(warned))
    stepless = {j for j, n in steps.items() if n == 0}
    assert stepless and stepless <= set(warned), (warned, steps)
    warned, steps = run(SETTINGS)
    assert warned == [] and all(n > 20 for n in steps.values()), (warned, steps)


class _ScriptedSwitches:
    """A switch diagnoser that flags, at each fit, the links its script names (a unit test of the monitor's merge)."""

    def __init__(self, script):
        self.script, self.bandwidth_ = list(script), None

    def fit(self, bw, pair_kinds=None):
        self.flagged = self.script.pop(0)
        return self

    def predict(self):
        from prism.analysis.diagnosis import ANOMALY_COLUMNS

        return pd.DataFrame([("slow_link", None, -1, 0, name, 0.5, f"link {name}") for name in self.flagged], columns=ANOMALY_COLUMNS)


def test_a_slow_link_is_reported_when_still_slow_at_the_next_window(cluster):
    """A link flagged in one window only (a switch degrading mid-window: its links cross first) is not news."""
    from prism.analysis.analyse import Settings

    script = [["a>b"], [], ["c>d"], ["c>d"], ["c>d"], ["e>f"]]
    m = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS), Settings(switches=_ScriptedSwitches(script)))
    reported = []
    for tick in range(len(script)):
        m._merge_switches(final=tick == len(script) - 1)
        reported.append([e["subject"] for kind, e in m.events if kind == "anomaly"])
        m.events.clear()
    # a>b: one window only; c>d: reported at its second window, once while it stays slow; e>f: at the last window, reported
    assert reported == [[], [], [], ["c>d"], [], ["e>f"]]
    assert m.fabric_anomalies["slow_link"] == 2


def test_a_backlog_is_analysed_in_strides_of_a_window_with_the_same_steps(cluster, caplog):
    """Behind (the source has unread records), windows stride ``window_s``, not ``step_s``: fewer analyses, no step lost.

    Caught up, they step at ``step_s`` again; a window holding half of
    ``max_window_flows`` does not wait.
    """
    flows = cluster.flows.sort_values("start_ns", kind="stable")
    batches = [flows.iloc[i : i + 2000].reset_index(drop=True) for i in range(0, len(flows), 2000)]

    def run(behind_until, **settings):
        caplog.clear()
        m = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**{**SETTINGS, **settings}))
        with caplog.at_level("DEBUG", logger="prism.monitor"):
            for i, b in enumerate(batches):
                m.ingest(b)
                m.backlogged = {"0"} if i < behind_until else set()
                while m.due():
                    m.tick()
            m.tick(final=True)
        ends = [pd.Timestamp(r.fields["to"]).value for r in caplog.records if r.getMessage() == "window analysed"]
        return {j: st.view.steps for j, st in m._jobs.items()}, m.steps_frame(), ends

    live, live_steps, live_ends = run(0)
    behind, behind_steps, behind_ends = run(len(batches))
    assert behind == live and behind_steps.equals(live_steps)  # the same steps, each reported once
    strides = pd.Series(behind_ends[:-1]).diff().dropna()
    assert len(behind_ends) < len(live_ends) / 2 and (strides >= SETTINGS["window_s"] * 1e9).all(), (behind_ends, live_ends)
    # caught up after 6 s: the first window, due while behind, waited a whole window, the later ones a step
    _, _, ends = run(3 * len(batches) // 4)
    first = int(flows["start_ns"].iloc[0])
    assert ends[0] - first >= (SETTINGS["window_s"] - SETTINGS["lateness_s"]) * 1e9 > live_ends[0] - first, (ends, live_ends)
    assert (pd.Series(ends[:-1]).diff().dropna() < 1.5 * SETTINGS["step_s"] * 1e9).all(), ends
    # a window near its memory bound is analysed without waiting
    _, _, ends = run(len(batches), max_window_flows=120_000)  # half of it is about 2 s of this cluster's flows
    assert len(ends) > len(behind_ends)


def test_the_monitor_defaults_are_the_daemon_defaults():
    """MonitorSettings (the library's defaults) and the daemon's flags (serve.settings, kept light for start-up) state
    the same defaults twice; this keeps them one rule."""
    from prism.serve.monitor import MonitorSettings
    from prism.serve.settings import DAEMON_DEFAULTS, parse_duration

    m = MonitorSettings()
    pairs = {"window": m.window_s, "window_step": m.step_s, "window_lateness": m.lateness_s, "jobs_ttl": m.pair_ttl_s,
             "switch_window": m.switch_window_s}
    for key, seconds in pairs.items():
        assert parse_duration(DAEMON_DEFAULTS[key]) == seconds, key
    assert DAEMON_DEFAULTS["window_max_flows"] == m.max_window_flows


def test_flows_that_come_after_their_window_are_counted_against_it(cluster, caplog):
    """A GPU flow that comes after the window of its time is counted once, against that window, which turns incomplete,
    when the window that takes it in is cut (not when it is read: which other partitions had been read by then is the
    reading pace's); one too old for that window to keep is dropped and counted so too."""
    import logging

    flows = cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    t0 = int(flows["start_ns"].iloc[0])
    ips = set(cluster.topology["ip"])
    gpu = flows["src"].astype(str).isin(ips) & flows["dst"].astype(str).isin(ips)
    at = (flows["start_ns"] - t0) / 1e9
    kept_late = flows[gpu & (at >= 0.6) & (at < 0.9)].iloc[:50]
    dropped = flows[gpu & (at >= 4.2) & (at < 4.5)].iloc[:40]
    rest = flows.drop(kept_late.index).drop(dropped.index)
    m = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
    m.ingest(rest[rest["start_ns"] < t0 + 1.9e9].reset_index(drop=True))
    assert m.tick() is not None and m.view.incomplete is False
    assert m.windows_incomplete == 0 and m.late_flows == 0 and m.analysed_to > kept_late["start_ns"].max()
    first = m.windows[0].end
    with caplog.at_level(logging.WARNING, logger="prism.monitor"):
        m.ingest(kept_late.reset_index(drop=True))  # held: their stream time is the partition's 1.9 s, 1-1.3 s ahead
        m.ingest(kept_late.reset_index(drop=True))  # a re-delivery: a duplicate, not late twice
        assert m.late_flows == 0 and m.windows_incomplete == 0
        m.ingest(rest[rest["start_ns"] >= t0 + 1.9e9].reset_index(drop=True))
        m.ingest(dropped.reset_index(drop=True))  # held: their stream time is the partition's 8 s
        while m.due():
            m.tick()
        # the window that took them in kept them for the windows on (waiting 1.3 s, the disorder measured: complete),
        # late for the first one
        assert m.late_flows == 50 and m.windows_incomplete == 1
        assert [(w.late, w.incomplete) for w in m.windows if w.end == first] == [(50, True)]
        m.tick(final=True)  # takes in the flows of 4.2-4.5 s: older than this window reaches (5 s), dropped
    assert m.late_flows == 90 and m.windows_incomplete == 2 and m.recent_incomplete() == 2
    assert [(w.late, w.incomplete) for w in m.windows if w.end >= dropped["start_ns"].max()][0] == (40, True)  # the window of their time
    assert m.late_flows == sum(w.late for w in m.windows)
    c = m.counters_snapshot()["0"]
    assert c["ingested"] == len(flows) and c["duplicate"] == 50
    assert c["windowed"] + c["ignored:late"] + c["ignored:non_gpu_address"] + c.get("ignored:self_flow", 0) == c["ingested"]
    assert c["ignored:late"] == 40
    messages = [r.getMessage() for r in caplog.records]
    assert sum(t.startswith("window analysed before GPU flows of its time came") for t in messages) == 2


def test_in_order_input_leaves_no_window_incomplete(cluster):
    flows = cluster.flows.sort_values("start_ns", kind="stable")
    _, m = steps_by_job(cluster, messages(flows), ())
    assert m.windows_incomplete == 0 and m.late_flows == 0 and m.recent_incomplete() == 0 and len(m.windows) > 3


def test_current_anomalies_are_exported_with_their_explanations(cluster):
    """``prism_anomaly_info``: one series per anomaly the monitor raised and still keeps, its explanation in a label."""
    from prometheus_client import CollectorRegistry

    from prism.serve.metrics import ANOMALY_EXPLANATION_CHARS, PrismCollector, printable

    _, m = steps_by_job(cluster, messages(cluster.flows), ())
    raised = [e for kind, e in m.events if kind == "anomaly"]
    assert raised, "the tiny cluster has faults: some anomalies are expected"
    reg = CollectorRegistry()
    reg.register(PrismCollector(m))
    got = [s.labels for f in reg.collect() for s in f.samples if s.name == "prism_anomaly_info" and s.value == 1]
    assert len(got) == len({tuple(sorted(x.items())) for x in got}) == len(m.view.anomalies) > 0
    for labels, row in zip(got, m.view.anomalies):
        assert labels["kind"] == row["kind"] and labels["job_id"] == (row["job_id"] if isinstance(row["job_id"], str) else "")
        assert labels["explanation"] == printable(row["explanation"], ANOMALY_EXPLANATION_CHARS) and labels["explanation"]
        assert labels["step"] == (str(int(row["step"])) if row["step"] >= 0 else "")
    # the newest of each job are the ones kept, and only those of jobs still recognised
    assert {x["job_id"] for x in got} <= set(m._jobs) | {""}
    newest = {(e["kind"], str(e["subject"]), e["explanation"]) for e in raised[-len(got):]}
    assert {(x["kind"], x["subject"], x["explanation"]) for x in got} & newest


def test_the_anomalies_kept_are_bounded(cluster, monkeypatch):
    import prism.serve.monitor as monitor_mod
    from prism.serve.metrics import ANOMALY_SUBJECT_CHARS, anomaly_info

    monkeypatch.setattr(monitor_mod, "RECENT_ANOMALIES_PER_JOB", 3)
    monkeypatch.setattr(monitor_mod, "RECENT_ANOMALIES", 7)
    m = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
    from types import SimpleNamespace

    # recognised jobs (the pruning looks at the keys, the labels at the names); job-3 named by an inventory
    m._jobs = {f"job-{j}": SimpleNamespace(view=SimpleNamespace(name="llama" if j == 3 else "")) for j in range(4)}
    for i in range(100):
        job = f"job-{i % 5}"  # job-4 is not (or no longer) recognised
        m._note_anomaly({"kind": "slow_step", "job_id": job, "subject": "s" * 1000, "step": i, "start_ns": i, "score": 2.0,
                         "explanation": f"anomaly {i}\x1b[31m"})
    m._note_anomaly({"kind": "slow_switch", "job_id": float("nan"), "subject": "spine-0", "step": -1, "start_ns": 100, "score": 0.2,
                     "explanation": "fabric"})
    rows = m.recent_anomalies()
    assert len(rows) == 7
    assert [r["step"] for r in rows] == [92, 93, 95, 96, 97, 98, -1]  # the newest 7 of the last 3 of each recognised job and the fabric
    assert "job-4" not in m._recent  # forgotten with its job
    fam = anomaly_info(rows)
    assert len(fam.samples) == 7
    assert all(len(s.labels["subject"]) == ANOMALY_SUBJECT_CHARS for s in fam.samples[:-1])
    assert fam.samples[0].labels["explanation"] == "anomaly 92\\x1b[31m"  # control characters escaped
    assert [s.labels["job_name"] for s in fam.samples] == ["", "llama", "", "", "", "llama", ""]  # steps 92, 93, 95-98: jobs 2, 3, 0-3
    assert fam.samples[-1].labels == {"job_id": "", "job_name": "", "kind": "slow_switch", "subject": "spine-0", "step": "", "explanation": "fabric"}


def test_a_slow_group_found_in_a_later_window_names_the_jobs_steps():
    """A server slow from step 45 of the tiny cluster's TP 4 job (SYNTHETIC): found in a window that starts long after
    the job, whose steps the window numbers from its own start. The anomaly's step and the run of steps its explanation
    names are the job's (45 on, as the truth says), not the window's (16 on, before)."""
    from synthetic import SlowServer

    g = preset("tiny", seed=0, duration_s=8.0)
    g.faults = [SlowServer("tp4-pp2-dp4", server=1, from_step=45, factor=1.4)]
    c = g.generate()
    flows = c.flows.sort_values("start_ns", kind="stable")
    _, m = steps_by_job(c, [flows.iloc[i : i + 2000] for i in range(0, len(flows), 2000)], ())
    found = [e for kind, e in m.events if kind == "anomaly" and e["kind"] == "slow_group"]
    truth = c.faults[c.faults["kind"] == "slow_group"].iloc[0]
    assert [e["subject"] for e in found] == [truth["subject"]]
    e = found[0]
    assert abs(e["step"] - truth["step"]) <= 1
    assert f"steps {e['step']}-" in e["explanation"]


def test_input_resuming_after_a_quiet_spell_waits_for_every_partition(cluster):
    """All partitions quiet for a minute (collectors paused, a replica taking partitions over), then one partition read
    ahead of the others, as a consumer's first fetch after the pause may bring: the others are not taken for idle, so
    nothing they hold comes late, and the steps are those of the stream read in time order."""
    flows = cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    t0 = int(flows["start_ns"].iloc[0])
    part = (pd.util.hash_pandas_object(flows[["src", "dst"]].astype(str), index=False) % 4).astype(str).to_numpy()  # by GPU pair
    ordered, _ = steps_by_job(cluster, [flows.iloc[i : i + 2000] for i in range(0, len(flows), 2000)], ())
    m = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
    now = [0.0]
    m.clock = lambda: now[0]

    def feed(frame, p):
        m.ingest(frame.reset_index(drop=True), p)
        now[0] += 0.05
        while m.due():
            m.tick()

    first = flows["start_ns"] < t0 + 3.5e9
    for lo in range(t0, t0 + 3_500_000_000, 250_000_000):  # every partition in step, a quarter second at a time
        for p in "0123":
            sel = first & (part == p) & (flows["start_ns"] >= lo) & (flows["start_ns"] < lo + 250_000_000)
            feed(flows[sel], p)
    now[0] += 60.0
    m.tick(final=True)  # the daemon's idle flush
    for p in "0123":  # then partition 0's whole rest first
        feed(flows[~first & (part == p)], p)
    m.tick(final=True)
    assert m.late_flows == 0 and m.windows_incomplete == 0
    assert {j: st.view.steps for j, st in m._jobs.items()} == ordered
