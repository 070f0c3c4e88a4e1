"""timeline.json: Chrome Trace Event format, checked by structure and, where
Perfetto's trace processor can be had, by Perfetto itself."""
import json
import os
from collections import defaultdict

import pytest

from prism.ingest.topology import Topology
from prism.offline.replay import replay


@pytest.fixture(scope="module")
def traced(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    res = replay([str(tiny_dir / "flows.parquet")], Topology.from_csv(tiny_dir / "topology.csv"), out_dir=out, progress=False)
    return res, out / "timeline.json"


def test_trace_structure(traced):
    res, path = traced
    trace = json.loads(path.read_text())
    ev = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    # a process per job, plus the fabric (the tiny preset degrades a switch)
    assert set(procs.values()) == set(res.jobs["job_id"]) | {"fabric"}
    steps = [e for e in ev if e["ph"] == "X" and e.get("cat") == "step"]
    assert len(steps) == len(res.analysis.steps)
    for e in ev:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], (int, float)) and {"pid", "tid", "name"} <= set(e)
    # slices on one track never overlap partially (Perfetto would nest or drop them)
    tracks = defaultdict(list)
    for e in ev:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-3 or e1 <= e0, (s0, e0, s1, e1)
    # per-server tracks, named after servers of the topology
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(n.startswith("srv") and n.endswith(" DP") for n in names)
    anomalies = [e for e in ev if e.get("cat") == "anomaly"]
    assert len(anomalies) == len(res.analysis.anomalies)


def _trace_processor():
    """Perfetto's TraceProcessor, or a skip saying why it cannot run here."""
    tp_mod = pytest.importorskip("perfetto.trace_processor")
    binary = os.environ.get("PRISM_TRACE_PROCESSOR")
    cfg = tp_mod.TraceProcessorConfig(bin_path=binary) if binary else tp_mod.TraceProcessorConfig()
    return tp_mod, cfg


def test_trace_loads_in_perfetto(traced):
    res, path = traced
    tp_mod, cfg = _trace_processor()
    try:
        tp = tp_mod.TraceProcessor(trace=str(path), config=cfg)
    except Exception as e:  # the binary is downloaded on first use; CI has no route to it
        pytest.skip(f"Perfetto trace_processor_shell unavailable (set PRISM_TRACE_PROCESSOR to a binary): {e}")
    try:
        n = tp.query("select count(*) as n from slice where name like 'step %' and category = 'step'").as_pandas_dataframe()["n"][0]
        assert n == len(res.analysis.steps)
        procs = set(tp.query("select name from process").as_pandas_dataframe()["name"].dropna())
        assert set(res.jobs["job_id"]) <= procs
    finally:
        tp.close()
