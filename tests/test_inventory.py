"""The job inventory: the scheduler's names of the jobs Prism recognises, in replay's outputs and on /metrics.

Ground truth is the SYNTHETIC tiny cluster's: its job ids are the names the
inventory is built from, so every recognised job must come back with its
generator's name.
"""
import json
import os

import pandas as pd
import pytest

from prism.cli import main
from prism.ingest.formats.common import MAX_LINE_BYTES
from prism.ingest.inventory import JobNames
from prism.ingest.records import FlowFormatError
from prism.ingest.topology import Topology
from prism.serve.metrics import PrismCollector
from prism.serve.monitor import Monitor, MonitorSettings
from synthetic import preset


@pytest.fixture(scope="module")
def cluster():
    return preset("tiny", seed=0, duration_s=8.0).generate()


def _inventory(cluster, by: str = "server", rename=lambda n: n) -> pd.DataFrame:
    """The truth's job of every server (or NIC), as a scheduler export would list it."""
    m = cluster.jobs.merge(cluster.topology, on="ip")
    cols = ["ip", "job_id"] if by == "ip" else ["server", "job_id"]
    return m[cols].drop_duplicates().rename(columns={"job_id": "job_name"}).assign(job_name=lambda d: d["job_name"].map(rename))


def _truth_names(cluster) -> set[frozenset]:
    return {frozenset(g["ip"]) for _, g in cluster.jobs.groupby("job_id")}


def test_names_by_server_and_by_nic_and_the_majority(tmp_path, cluster):
    topo = Topology.from_frame(cluster.topology)
    for by in ("server", "ip"):
        path = tmp_path / f"by-{by}.csv"
        _inventory(cluster, by).to_csv(path, index=False)
        names = JobNames.from_csv(str(path), topo)
        for job, g in cluster.jobs.merge(cluster.topology, on="ip").groupby("job_id"):
            assert names.name(set(g["server"])) == job
    names = JobNames({"a": "x", "b": "y", "c": "y", "d": "x"})
    assert names.name(["a", "b", "c"]) == "y" and names.name(["a", "b"]) == "x" and names.name(["z"]) == ""  # tie: alphabetical


@pytest.mark.parametrize("text, needle", [
    ("server\nsrv0001\n", "needs columns job_name and server"),
    ("server,job_name\nsrv0001,\n", "line 2: field job_name is empty"),
    ("server,job_name\n,llama\n", "line 2: field server is empty"),
    ("server,job_name\nsrv1,a\nsrv1,b\n", "line 3: server srv1 is job 'a' on line 2, here 'b'"),
    ("ip,job_name\n10.9.9.9,a\n", "line 2: field ip: 10.9.9.9 is no GPU NIC of the topology"),
    ("ip,job_name\nnot-an-ip,a\n", "line 2: field ip: 'not-an-ip' is not an IPv4/IPv6 address"),
    ("", "the job inventory is empty"),
])
def test_a_bad_inventory_names_file_line_and_field(tmp_path, cluster, text, needle):
    path = tmp_path / "inventory.csv"
    path.write_text(text)
    with pytest.raises(FlowFormatError) as e:
        JobNames.from_csv(str(path), Topology.from_frame(cluster.topology))
    assert str(path) in str(e.value) and needle in str(e.value)



@pytest.mark.parametrize("problem, needle", [
    ("directory", "is a directory; "),
    ("latin-1", "not UTF-8 text (byte 22 of the file)"),
    ("truncated gzip", "cannot read the "),
    ("long field", ":line 3: not a readable CSV file: field larger than field limit"),
])
def test_the_inventory_and_the_topology_read_a_bad_file_alike(tmp_path, cluster, problem, needle):
    """One reader (prism.ingest.csvrows) for both files: the same errors, each naming its file (and the CSV line)."""
    import gzip

    good = "server,ip,job_name\nsrv1,10.0.0.1,a\n"
    for reader, what in ((lambda p: JobNames.from_csv(p), "job inventory"), (Topology.from_csv, "topology")):
        path = tmp_path / what.replace(" ", "-") / ("t.csv.gz" if problem == "truncated gzip" else "t.csv")
        path.parent.mkdir(exist_ok=True)
        if problem == "directory":
            path.mkdir()
        elif problem == "latin-1":
            path.write_bytes("server,ip,job_name\nsrv\xe9,10.0.0.1,a\n".encode("latin-1"))
        elif problem == "truncated gzip":
            path.write_bytes(gzip.compress(good.encode() * 50)[:30])
        else:
            path.write_text(good + "srv2,10.0.0.2," + "x" * (MAX_LINE_BYTES + 1) + "\n")
        with pytest.raises(FlowFormatError) as e:
            reader(str(path))
        msg = str(e.value)
        assert msg.startswith(str(path)) and needle in msg, msg
        if problem == "truncated gzip":
            assert f"cannot read the {what}: " in msg
    with pytest.raises(FileNotFoundError, match="no such job inventory file"):
        JobNames.from_csv(str(tmp_path / "missing.csv"))

def test_replay_carries_the_names_and_is_unchanged_without(tmp_path, cluster, capsys):
    cluster.write(tmp_path / "c")
    _inventory(cluster).to_csv(tmp_path / "inventory.csv", index=False)
    args = ["replay", str(tmp_path / "c" / "flows.parquet"), "--topology", str(tmp_path / "c" / "topology.csv"), "--no-progress", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "plain")]) == 0
    assert main(args + ["--out", str(tmp_path / "named"), "--job-names", str(tmp_path / "inventory.csv")]) == 0
    plain, named = pd.read_csv(tmp_path / "plain" / "jobs.csv"), pd.read_csv(tmp_path / "named" / "jobs.csv")
    assert list(plain.columns) == ["job_id", "ip"] and list(named.columns) == ["job_id", "ip", "job_name"]
    assert plain.equals(named[["job_id", "ip"]])
    by_name = {frozenset(g["ip"]) for _, g in named.groupby("job_name")}
    assert by_name == _truth_names(cluster)  # each recognised job named as the generator named it
    for name, g in named.groupby("job_name"):
        assert set(g["ip"]) == set(cluster.jobs.loc[cluster.jobs["job_id"] == name, "ip"])
    id_to_name = dict(zip(named["job_id"], named["job_name"]))
    for f in ("pairs.csv", "steps.csv", "phases.csv", "anomalies.csv", "collectives.csv"):  # every per-job file carries the name
        p, n = pd.read_csv(tmp_path / "plain" / f), pd.read_csv(tmp_path / "named" / f, keep_default_na=False, dtype={"job_name": str})
        assert "job_name" not in p and list(n.columns) == list(p.columns) + ["job_name"], f
        assert len(n) == len(p) and n["job_name"].tolist() == [id_to_name.get(j, "") for j in n["job_id"]], f
        if f in ("steps.csv", "anomalies.csv"):
            assert (n["job_name"] != "").any(), f
    summary = json.loads((tmp_path / "named" / "summary.json").read_text())
    assert sorted(j["job_name"] for j in summary["jobs"]) == sorted(cluster.jobs["job_id"].unique())
    assert main(args + ["--out", str(tmp_path / "bad"), "--job-names", str(tmp_path / "missing.csv")]) == 2
    assert "no such job inventory file" in capsys.readouterr().err


def test_the_daemon_labels_its_jobs_and_reads_a_changed_inventory(tmp_path, cluster):
    path = tmp_path / "inventory.csv"
    _inventory(cluster).to_csv(path, index=False)
    topo = Topology.from_frame(cluster.topology)
    m = Monitor(topo, MonitorSettings(window_s=3, step_s=1, switch_window_s=2, lateness_s=0.1), job_names=JobNames.from_csv(str(path), topo))
    flows = cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    half = len(flows) // 2
    m.ingest(flows.iloc[:half])
    while m.due():
        m.tick()
    truth = {j: set(g["ip"]) for j, g in cluster.jobs.groupby("job_id")}
    named = {st.view.name for st in m._jobs.values()}
    assert named == set(truth)
    # the events the daemon logs carry the name too, and their log lines show it
    from prism.serve.daemon import format_event

    events = list(m.events)
    jobs = [e for k, e in events if k == "job"]
    assert {e["job_name"] for e in jobs} == set(truth)
    assert all(f"{e['job_id']} ({e['job_name']})" in format_event("job", e) for e in jobs)
    names = {st.view.job_id: st.view.name for st in m._jobs.values()}
    of_jobs = [e for k, e in events if k == "anomaly" and isinstance(e.get("job_id"), str) and e["job_id"] in names]
    assert of_jobs  # the tiny cluster's faults: a slow step, a regime change and a slow group by now
    for e in of_jobs:
        assert e["job_name"] == names[e["job_id"]] and f"({e['job_name']})" in format_event("anomaly", e)
    info = {tuple(s.labels[k] for k in ("job_id", "job_name")) for f in PrismCollector(m).collect() if f.name == "prism_job_info" for s in f.samples}
    assert {n for _, n in info} == set(truth)
    # the current anomalies carry it too: an alert on them names the job as the scheduler does
    current = [s.labels for f in PrismCollector(m).collect() if f.name == "prism_anomaly_info" for s in f.samples]
    assert any(x["job_id"] for x in current)
    for x in current:
        assert x["job_name"] == names.get(x["job_id"], ""), x
    # the scheduler's export is rewritten: the next window takes the new names; a broken one keeps the last good
    _inventory(cluster, rename=lambda n: "team-" + n).to_csv(path, index=False)
    os.utime(path, (os.stat(path).st_atime, os.stat(path).st_mtime + 10))
    m.ingest(flows.iloc[half:])
    while m.due():
        m.tick()
    assert {st.view.name for st in m._jobs.values()} == {"team-" + n for n in truth}
    path.write_text("server\nsrv0001\n")
    os.utime(path, (os.stat(path).st_atime, os.stat(path).st_mtime + 20))
    m.tick(final=True)
    assert {st.view.name for st in m._jobs.values()} == {"team-" + n for n in truth}
