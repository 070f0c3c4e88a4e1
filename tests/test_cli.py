"""The prism command line, end to end."""
import json
import os
import sys

import pandas as pd
import pytest

from prism.cli import main
from prism.ingest.records import FlowFormatError
from prism.offline.replay import OUTPUT_COLUMNS


def test_replay_writes_the_output_contract(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--out", str(out), "--no-progress"])
    assert rc == 0
    for name, cols in OUTPUT_COLUMNS.items():
        assert list(pd.read_csv(out / name).columns) == cols
    jobs = pd.read_csv(out / "jobs.csv")
    assert jobs["job_id"].nunique() == 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["flows_gpu"] + summary["flows_ignored"] + summary["rows_rejected"] == summary["rows_read"]
    trace = json.loads((out / "timeline.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == set(jobs["job_id"]) | {"fabric"}
    steps = pd.read_csv(out / "steps.csv")
    assert set(steps["job_id"]) == set(jobs["job_id"]) and len(steps) > 100
    anomalies = pd.read_csv(out / "anomalies.csv")
    assert set(anomalies["kind"]) == {"slow_step", "slow_group", "regime_change", "slow_switch"}
    assert anomalies["explanation"].str.len().min() > 20
    assert {j["job_id"]: j["anomalies"] for j in summary["jobs"]} == anomalies[anomalies["job_id"].notna()].groupby("job_id").size().reindex(jobs["job_id"].unique(), fill_value=0).to_dict()
    printed = capsys.readouterr().out
    assert "jobs: 4" in printed and "non_gpu_address" in printed
    assert "anomalies: 4" in printed and "median" in printed and "DP4 x PP1" in printed


def test_replay_plots(tiny_dir, tmp_path):
    out = tmp_path / "out"
    assert main(["replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--out", str(out), "--plots", "--quiet"]) == 0
    for name in ("steps.png", "switches.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / name).stat().st_size > 10_000


def test_plots_read_in_real_time_with_every_anomaly_marked(tiny_dir, tmp_path):
    import matplotlib.dates as mdates

    from prism.ingest.topology import Topology
    from prism.offline.plots import steps_figure, switches_figure
    from prism.offline.replay import replay

    res = replay([str(tiny_dir / "flows.parquet")], Topology.from_csv(tiny_dir / "topology.csv"), out_dir=tmp_path / "out", progress=False)
    an = res.analysis
    fig = steps_figure(an.steps, an.anomalies, res.switch_window_ns)
    axes = fig.axes
    assert len(axes) == an.steps["job_id"].nunique()
    job_marks = sum(len(c.get_offsets()) for ax in axes for c in ax.collections)
    assert job_marks == (an.anomalies["job_id"].fillna("") != "").sum() > 0  # each job anomaly on its step
    switch = an.anomalies[an.anomalies["kind"] == "slow_switch"]
    assert len(switch) > 0 and all(len(ax.patches) == len(switch) for ax in axes)  # shaded in every panel
    for ax in axes:
        assert ax.get_ylim()[0] == 0  # jitter is not magnified
    t0 = mdates.num2date(axes[-1].get_xlim()[0]).timestamp()
    assert abs(t0 - an.steps["end_ns"].min() / 1e9) < 60  # the x axis is wall-clock time
    sw = an.switch_bandwidth[an.switch_bandwidth["kind"] == "switch"]
    first = pd.Timestamp(int(sw["window_start_ns"].min()), unit="ns")
    heat = switches_figure(an.switch_bandwidth, res.switch_window_ns)
    if sw["window_start_ns"].nunique() == 1:  # a capture within one window: a bar per switch, the window in the title
        assert len(heat.axes[0].patches) == sw["name"].nunique()
        assert first.strftime("%H:%M:%S") in heat.axes[0].get_title() and "--switch-window" in heat.axes[0].get_title()
    # with a shorter window, a heat map whose columns are the windows, labelled in UTC
    short = replay([str(tiny_dir / "flows.parquet")], Topology.from_csv(tiny_dir / "topology.csv"), progress=False, switch_window_s=1.0)
    heat = switches_figure(short.analysis.switch_bandwidth, short.switch_window_ns)
    labels = [t.get_text() for t in heat.axes[0].get_xticklabels()]
    first = pd.Timestamp(int(short.analysis.switch_bandwidth["window_start_ns"].min()), unit="ns")
    assert labels and labels[0] == first.strftime("%H:%M:%S") and len(labels) <= 13


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "soon"])
def test_replay_rejects_a_bad_switch_window(tiny_dir, tmp_path, capsys, value):
    with pytest.raises(SystemExit) as e:  # argparse's usage error
        main(["replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--out", str(tmp_path), "--switch-window", value])
    assert e.value.code == 2
    assert "--switch-window" in capsys.readouterr().err


def test_replay_bad_input_is_exit_2_with_the_reason(tmp_path, data_dir, capsys):
    bad = tmp_path / "flows.csv"
    bad.write_text("start_ns,src,dst,size,switches\n1,10.0.0.1,10.0.1.1,1,\n")
    rc = main(["replay", str(bad), "--topology", str(data_dir / "topology.csv"), "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "'duration_ns'" in err


def test_replay_reports_rejects(tmp_path, data_dir, capsys):
    rc = main(["replay", str(data_dir / "malformed.csv"), str(data_dir / "malformed.jsonl"), "--topology", str(data_dir / "topology.csv"), "--out", str(tmp_path)])
    assert rc == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["rows_read"] == 17 and s["rows_rejected"] == 10
    assert s["rejected_by_reason"] == {"bad_address": 1, "bad_number": 2, "empty_address": 2, "malformed_row": 3, "negative_duration": 1, "negative_size": 1}
    assert pd.read_csv(tmp_path / "jobs.csv")["job_id"].nunique() == 1
    assert "e.g. bad_number" in capsys.readouterr().out


def test_topology_errors_name_the_line(tmp_path, data_dir):
    topo = tmp_path / "t.csv"
    topo.write_text("ip,server\n10.0.0.1,s0\n10.0.0.1,s1\n")
    with pytest.raises(FlowFormatError) as err:
        from prism.ingest.topology import Topology

        Topology.from_csv(topo)
    assert "line 3" in str(err.value) and "line 2" in str(err.value)


@pytest.mark.parametrize("kind, match", [("latin-1", "not UTF-8"), ("directory", "is a directory"), ("truncated gzip", "cannot read")])
def test_unreadable_topologies_are_clear_errors(tmp_path, data_dir, capsys, kind, match):
    import gzip

    if kind == "latin-1":
        topo = tmp_path / "t.csv"
        topo.write_bytes("ip,server\n10.0.0.1,s\xe9\n".encode("latin-1"))
    elif kind == "directory":
        topo = tmp_path / "t"
        topo.mkdir()
    else:
        topo = tmp_path / "t.csv.gz"
        topo.write_bytes(gzip.compress((data_dir / "topology.csv").read_bytes())[:40])
    rc = main(["replay", str(data_dir / "malformed.csv"), "--topology", str(topo), "--out", str(tmp_path / "o")])
    assert rc == 2 and match in capsys.readouterr().err


def test_synth_cli(tmp_path, capsys):
    assert main(["synth", "--preset", "tiny", "--out", str(tmp_path), "--format", "csv", "--duration", "2"]) == 0
    assert (tmp_path / "flows.csv").exists()
    assert "flows" in capsys.readouterr().out


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "replay" in capsys.readouterr().out


def test_demo_matches_truth(tmp_path, capsys):
    assert main(["demo", "--offline", "--preset", "tiny", "--out", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "jobs MATCH the ground truth" in out
    assert "DP/PP pair types MATCH the ground truth: 112 of 112 pairs correct" in out
    assert out.count("FOUND") == 3 and "MISSED" not in out
    assert "0 unexplained" in out and "0 spurious" in out


def test_live_demo_through_the_local_broker(capsys):
    # the README's main command, on the tiny cluster streamed as fast as possible
    assert main(["demo", "--preset", "tiny", "--speed", "0", "--web.listen-address", "127.0.0.1:0"]) == 0
    out = capsys.readouterr().out
    assert "broker   Tansu (Kafka protocol) on 127.0.0.1:" in out
    assert "metrics  http://127.0.0.1:" in out
    assert "ingested (all)" in out and "jobs MATCH the ground truth" in out
    assert out.count("FOUND") == 3 and "MISSED" not in out
    assert "0 unexplained" in out and "0 spurious" in out
    assert ".venv/bin/prism replay FLOWS" in out  # a passing demo says where to go next


@pytest.mark.parametrize("stage", ["pairs", "steps"])
def test_stop_after_prints_a_summary(stage, tiny_dir, tmp_path, capsys):
    """--stop-after pairs/steps used to crash in the summary (no anomalies to count)."""
    from prism.cli import main

    rc = main(["replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--out", str(tmp_path), "--stop-after", stage])
    out = capsys.readouterr().out
    assert rc == 0
    assert "DP" in out and "anomalies" not in out.split("jobs:")[1]
    assert ("steps, median" in out) == (stage == "steps")
    pairs = pd.read_csv(tmp_path / "pairs.csv")
    assert {"confidence", "evidence"} <= set(pairs.columns) and pairs["confidence"].between(0, 1).all()


@pytest.mark.parametrize("flags, match", [
    (["--web.listen-address", "127.0.0.1:99999"], "port 99999 is out of range"),
    (["--log.level", "verbose"], "--log.level: expected one of debug, info, warning, error"),
    (["--window.max-flows", "0"], "--window.max-flows: expected a whole number >= 1"),
    (["--window.max-flows", "-1"], "--window.max-flows: expected a whole number >= 1"),
    (["--kafka.max-message-bytes", "1.5"], "--kafka.max-message-bytes: expected a whole number"),
    (["--window", "0s"], "--window: must be > 0"),
    (["--window.step", "soon"], "--window.step: not a duration"),
])
def test_daemon_refuses_bad_settings_before_starting(tmp_path, data_dir, capsys, flags, match):
    """Each was accepted and crashed (or looped) later; now exit 2 with the flag named, before binding or reading."""
    assert main(["daemon", "--topology", str(data_dir / "topology.csv"), "--source", str(tmp_path), *flags]) == 2
    assert match in capsys.readouterr().err


def test_replay_spilled_to_disk_writes_the_same_files(tiny_dir, tmp_path):
    """--spill-above 0: every GPU flow goes to --spill-dir and comes back a batch at a time; the files are the same."""
    args = [str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--quiet"]
    spill = tmp_path / "spill"
    spill.mkdir()
    assert main(["replay", *args, "--out", str(tmp_path / "mem")]) == 0
    assert main(["replay", *args, "--out", str(tmp_path / "disk"), "--spill-above", "0", "--spill-dir", str(spill)]) == 0
    for name in [*OUTPUT_COLUMNS, "switches.csv", "timeline.json"]:
        assert (tmp_path / "disk" / name).read_bytes() == (tmp_path / "mem" / name).read_bytes(), name
    summary = json.loads((tmp_path / "disk" / "summary.json").read_text())
    assert summary["flows_spilled"] == summary["flows_gpu"] > 0
    assert json.loads((tmp_path / "mem" / "summary.json").read_text())["flows_spilled"] == 0
    assert not any(spill.iterdir())


@pytest.mark.parametrize("value, match", [("missing", "not a directory"), ("file", "not a directory")])
def test_replay_spill_dir_must_be_a_directory(tiny_dir, tmp_path, capsys, value, match):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        main(["replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--out", str(tmp_path / "o"),
              "--spill-dir", str(tmp_path / value)])
    assert e.value.code == 2 and match in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["replay", "X", "--topology", "T", "--out", "O", "--chunk-rows", "0"],
                                  ["replay", "X", "--topology", "T", "--out", "O", "--spill-above", "-1"],
                                  ["collect", "X", "--out", "o.csv", "--batch-packets", "0"],
                                  ["collect", "X", "--out", "o.csv", "--settle", "-1"],
                                  ["demo", "--speed", "-2"], ["synth", "--out", "O", "--duration", "nan"]])
def test_numeric_flags_are_range_checked(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "must be" in capsys.readouterr().err


# ------------------------------------------------------- output for scripts, warnings, exit codes

def test_replay_json_output_for_scripts(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--out", str(out), "-o", "json", "--strict"])
    assert rc == 0
    printed = capsys.readouterr()
    doc = json.loads(printed.out)  # stdout is exactly one JSON document
    assert doc == {**json.loads((out / "summary.json").read_text()), "out": str(out)} | {"seconds": doc["seconds"], "seconds_by_stage": doc["seconds_by_stage"], "peak_rss_mib": doc["peak_rss_mib"]}
    assert doc["warnings"] == [] and len(doc["jobs"]) == 4


def test_topology_matching_no_flow_warns_and_fails_with_strict(tiny_dir, tmp_path, capsys):
    other = tmp_path / "other-cluster.csv"
    other.write_text("ip,server\n192.168.77.1,x1\n192.168.77.2,x2\n")
    args = ["replay", str(tiny_dir / "flows.parquet"), "--topology", str(other), "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "warning: no flow is between two GPU NICs of the topology" in err and "non_gpu_address" in err
    assert main(args + ["--strict"]) == 1
    capsys.readouterr()
    assert main(args + ["--strict", "-o", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["flows_gpu"] == 0 and "is --topology this cluster's?" in doc["warnings"][0]


def test_collect_warns_on_a_folder_without_captures(tmp_path, capsys):
    empty = tmp_path / "captures"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a capture")
    out = str(tmp_path / "flows.parquet")
    assert main(["collect", str(empty), "--out", out]) == 0
    assert "no capture files" in capsys.readouterr().err
    assert main(["collect", str(empty), "--out", out, "--strict", "-o", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["flows"] == 0 and "no capture files" in doc["warnings"][0]
    # a file that is not a capture is skipped and named
    assert main(["collect", str(empty / "notes.txt"), "--out", out, "--strict"]) == 1
    assert "not a capture, skipped" in capsys.readouterr().err


def test_log_format_json_on_the_daemon_startup_line(tmp_path, data_dir):
    import subprocess
    import sys

    src = tmp_path / "in"
    src.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "prism", "daemon", "--topology", str(data_dir / "topology.csv"), "--source", str(src),
                             "--web.listen-address", "127.0.0.1:0", "--log.format", "json", "--window", "30s"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        line = proc.stderr.readline()  # blocks until the first record: no clock involved
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    rec = json.loads(line)
    assert rec["level"] == "info" and rec["msg"] == "starting" and rec["logger"] == "prism.daemon"
    assert rec["window"] == "30s" and rec["topology_nics"] == 4 and rec["source"] == str(src) and rec["web"].startswith("http://")
    assert proc.returncode == 0


def test_every_command_takes_the_logging_flags():
    from prism.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        flags = {s for a in p._actions for s in a.option_strings}
        assert {"--log.level", "--log.format"} <= flags, name


def test_detection_delay_is_measured_from_the_fault_start(tiny_cluster, tiny_dir, tmp_path):
    """The live demo's time-to-detect, on anomalies stamped with the stream time they appeared at."""
    from prism.analysis.evaluation import detection_delays, job_name_map, score_anomalies
    from prism.ingest.topology import Topology
    from prism.offline.replay import replay

    res = replay([str(tiny_dir / "flows.parquet")], Topology.from_csv(tiny_dir / "topology.csv"), out_dir=tmp_path / "out", progress=False)
    names = job_name_map(res.jobs, tiny_cluster.jobs)
    an = res.analysis.anomalies
    faults, _ = score_anomalies(an, tiny_cluster.faults, names, res.analysis.steps)
    stamped = an.assign(detected_ns=an["start_ns"] + 2_500_000_000)  # each reported 2.5 s after its own start
    delays = detection_delays(stamped, tiny_cluster.faults, names)
    assert len(delays) == len(faults) and delays["delay_s"].notna().tolist() == faults["matched"].tolist()
    truth_job = stamped["job_id"].map(names).fillna("")
    for d, f in zip(delays.itertuples(index=False), tiny_cluster.faults.itertuples(index=False)):
        same = stamped["kind"].isin(["slow_switch", "slow_link"]) if f.kind == "slow_switch" else (stamped["kind"] == f.kind) & (truth_job == f.job_id)
        assert same.sum() == 1  # on tiny, one anomaly of each fault's kind and job: the one that finds it
        assert d.delay_s == pytest.approx((stamped.loc[same, "detected_ns"].iloc[0] - f.start_ns) / 1e9)
        assert d.delay_s > 0
    # an anomaly never reported (no time) finds nothing
    assert detection_delays(an.assign(detected_ns=None), tiny_cluster.faults, names)["delay_s"].isna().all()


def test_the_prism_command_exits_quickly_after_a_replay_with_everything_said(tiny_dir, tmp_path):
    """`python -m prism replay` skips the interpreter's teardown once done: its report still arrives whole through
    a pipe, its outputs are complete, and a failure keeps its exit status."""
    import subprocess

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout to a pipe is then block-buffered
    r = subprocess.run([sys.executable, "-m", "prism", "replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"),
                        "--out", str(out), "--no-progress"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith(f"results in {out}")  # the last line of the report, after everything else
    assert json.loads((out / "summary.json").read_text())["rows_read"] > 0
    assert all((out / name).stat().st_size > 0 for name in ("jobs.csv", "pairs.csv", "steps.csv", "timeline.json"))
    bad = subprocess.run([sys.executable, "-m", "prism", "replay", str(tmp_path / "missing.parquet"), "--topology", str(tiny_dir / "topology.csv"),
                          "--out", str(tmp_path / "o2"), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "missing.parquet" in bad.stderr
