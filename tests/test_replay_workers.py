"""``prism replay --workers`` and ``--scheduler``: the jobs analysed in other processes give the files one process gives, byte for byte."""
import builtins
import json
import os
import socket

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from prism.analysis.batches import RowRange
from prism.analysis.jobs import JobRecogniser
from prism.cli import main
from prism.ingest.gpu_traffic import gpu_traffic
from prism.ingest.readers import FlowReader
from prism.ingest.topology import Topology
from prism.offline.replay import replay
from prism.offline.workers import ParquetJobs

#: the tiny preset's three biggest jobs in time slices (see tests/test_slices.py)
SLICE = "12000"
#: summary.json's fields that time the run (the rest must be equal)
TIMINGS = ("seconds", "seconds_by_stage", "peak_rss_mib")


@pytest.fixture(scope="module")
def split(tiny_cluster, tmp_path_factory):
    """The tiny cluster's flows in two Parquet files, one after the other, as a collector rotates them."""
    d = tmp_path_factory.mktemp("split")
    tiny_cluster.write(d / "c")
    flows = pd.read_parquet(d / "c" / "flows.parquet")
    half = len(flows) // 2
    files = [str(d / "part-0.parquet"), str(d / "part-1.parquet")]
    flows.iloc[:half].to_parquet(files[0], index=False, row_group_size=20_000)
    flows.iloc[half:].to_parquet(files[1], index=False, row_group_size=20_000)
    return d, files, str(d / "c" / "topology.csv")


def _replay(split, out, *flags):
    d, files, topology = split
    assert main(["replay", *files, "--topology", topology, "--out", str(d / out), "--quiet", *flags]) == 0
    return d / out


@pytest.fixture(scope="module")
def one_process(split):
    """The reference: every job analysed in this process, whole and in time slices."""
    return {"whole": _replay(split, "ref-whole"), "sliced": _replay(split, "ref-sliced", "--slice-flows", SLICE)}


def _assert_same_outputs(got, want, spilled=False):
    names = sorted(p.name for p in want.iterdir())
    assert names == sorted(p.name for p in got.iterdir())
    for name in names:
        if name != "summary.json":
            assert (got / name).read_bytes() == (want / name).read_bytes(), name
    g, w = (json.loads((p / "summary.json").read_text()) for p in (got, want))
    for k in TIMINGS:
        g.pop(k), w.pop(k)
    if spilled:
        assert g.pop("flows_spilled") == g["flows_gpu"] > 0
        w.pop("flows_spilled")
    assert g == w
    assert len(g["jobs"]) == 4 and g["anomalies"]


@pytest.mark.parametrize("case, flags, batch", [
    ("whole", [], None),
    ("whole", [], 20_000),  # a task's jobs analysed in batches of their own (the results of batches of batches, combined)
    ("sliced", ["--slice-flows", SLICE, "--spill-above", "0"], None),  # spilled: each worker reads its batch's file, a sliced job its time buckets
], ids=["in-memory", "batches-in-a-task", "spilled-and-sliced"])
def test_a_process_pool_gives_the_files_of_one_process(split, one_process, case, flags, batch, tmp_path, monkeypatch):
    if batch:
        import prism.analysis.batches

        monkeypatch.setattr(prism.analysis.batches, "JOB_BATCH_FLOWS", batch)  # the forked workers see it too
    out = _replay(split, f"pool-{case}-{batch}", "--workers", "2", "--spill-dir", str(tmp_path), *flags)
    _assert_same_outputs(out, one_process[case], spilled="--spill-above" in flags)
    assert not any(tmp_path.iterdir())  # the spill's files are gone


def test_the_pool_reports_progress_and_the_workers_stage_times(split, one_process, capsys):
    d, files, topology = split
    res = replay(files, Topology.from_csv(topology), progress=True, workers=2)
    err = capsys.readouterr().err
    assert "analyse: 3/3 batches of jobs" in err  # the tiny preset's four jobs, in batches for two workers
    assert {"analyse", "pairs", "steps", "phases", "diagnosis"} <= set(res.stage_seconds)
    assert len(res.analysis.steps) == len(pd.read_csv(one_process["whole"] / "steps.csv"))


def _killed(*args):
    os._exit(137)  # as the kernel's OOM killer leaves a worker


def test_a_worker_that_dies_is_a_clear_error(split, monkeypatch, capsys):
    import prism.analysis.batches

    monkeypatch.setattr(prism.analysis.batches, "analyse_batch", _killed)
    d, files, topology = split
    assert main(["replay", *files, "--topology", topology, "--out", str(d / "x"), "--workers", "2"]) == 1
    assert "a worker process died before its jobs were analysed" in capsys.readouterr().err


def test_a_row_range_read_where_the_rows_are_not_shared_says_why():
    with pytest.raises(RuntimeError, match="forked after the flows were grouped"):
        RowRange(0, 10, False)()


@pytest.mark.parametrize("by_source", [False, True], ids=["files-in-time-order", "row-groups-by-source"])
def test_a_parquet_task_reads_only_its_jobs_flows(split, by_source, tmp_path, monkeypatch):
    """What a Dask task holds: its job's GPU flows, exactly those (and in the order) the replay's own pass took.

    Row groups of other jobs' sources only (files written per rack, say) are not decoded past their ``src`` column.
    """
    d, files, topology = split
    topo = Topology.from_csv(topology)
    decoded = []
    if by_source:
        flows = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        flows = flows.sort_values("src", kind="stable")
        files = [str(tmp_path / "by-source.parquet")]
        flows.to_parquet(files[0], index=False, row_group_size=5_000)
        real = pq.ParquetFile.read_row_group
        monkeypatch.setattr(pq.ParquetFile, "read_row_group", lambda self, i, columns=None, **kw: (
            decoded.append(i) if columns and len(columns) > 1 else None) or real(self, i, columns=columns, **kw))
    rec, taken = JobRecogniser(topo), []
    for f in files:
        for chunk in FlowReader(f):
            t = gpu_traffic(topo, chunk["src"], chunk["dst"])
            rec.partial_fit_pairs(t.a[t.gpu], t.b[t.gpu])
            taken.append([t.a[t.gpu], t.b[t.gpu], chunk["start_ns"].to_numpy()[t.gpu]])
    labels = rec.labels()
    a, b, start = (np.concatenate(c) for c in zip(*taken))
    jobs = rec.predict()
    assert jobs["job_id"].nunique() == 4
    for _, g in jobs.groupby("job_id"):
        label = np.unique(labels[topo.ips.get_indexer(g["ip"])])
        mine = np.isin(labels[a], label)
        got = ParquetJobs(files, topo, labels, label, False, int(mine.sum()))()
        for col, want in zip(got, (a[mine], b[mine], start[mine])):
            np.testing.assert_array_equal(col, want)
    if by_source:  # four jobs, each read its own row groups (and the few a source of two jobs' shares): about a quarter each
        n_groups = pq.ParquetFile(files[0]).num_row_groups
        assert len(decoded) < 1.5 * n_groups


@pytest.mark.parametrize("workers, match", [("0", "--workers: must be >= 1, got 0"), ("two", "--workers: expected a whole number, got 'two'")])
def test_bad_workers_is_a_usage_error(split, workers, match, capsys):
    d, files, topology = split
    with pytest.raises(SystemExit) as e:
        main(["replay", *files, "--topology", topology, "--out", str(d / "x"), "--workers", workers])
    assert e.value.code == 2 and match in capsys.readouterr().err


def test_dask_missing_is_a_clear_error(split, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_dask(name, *args, **kw):
        if name == "distributed" or name.startswith("distributed."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    d, files, topology = split
    assert main(["replay", *files, "--topology", topology, "--out", str(d / "x"), "--scheduler", "local"]) == 2
    assert "pip install 'prism-netdiag[distributed]'" in capsys.readouterr().err


# --- Dask distributed ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dask_cluster():
    """A local Dask cluster of two worker processes (one thread each), as a remote scheduler would be reached: by its address."""
    distributed = pytest.importorskip("distributed", reason="Dask distributed is not installed (pip install 'prism-netdiag[distributed]')")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", worker_dashboard_address=None)
    yield cluster
    cluster.close()


def test_dask_scheduler_gives_the_files_of_one_process(split, one_process, dask_cluster):
    out = _replay(split, "dask-whole", "--scheduler", dask_cluster.scheduler_address)
    _assert_same_outputs(out, one_process["whole"])


def test_dask_local_cluster_gives_the_files_of_one_process_in_slices(split, one_process, dask_cluster):
    """``--scheduler local``: a local cluster of --workers processes, started and closed by the replay; sliced jobs read in time order."""
    out = _replay(split, "dask-sliced", "--scheduler", "local", "--workers", "2", "--slice-flows", SLICE)
    _assert_same_outputs(out, one_process["sliced"])


def test_an_unreachable_scheduler_is_a_clear_error_at_once(split, dask_cluster, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d, files, topology = split
    assert main(["replay", *files, "--topology", topology, "--out", str(d / "x"), "--scheduler", f"tcp://127.0.0.1:{port}"]) == 2
    assert f"--scheduler tcp://127.0.0.1:{port}: cannot reach the scheduler: Connection refused" in capsys.readouterr().err
    assert main(["replay", *files, "--topology", topology, "--out", str(d / "x"), "--scheduler", "http://127.0.0.1:1"]) == 2
    assert "expected tcp://HOST:PORT" in capsys.readouterr().err


def test_dask_reads_parquet_files_only(tiny_dir, tmp_path, dask_cluster, capsys):
    csv = tmp_path / "flows.csv"
    pd.read_parquet(tiny_dir / "flows.parquet").to_csv(csv, index=False)
    assert main(["replay", str(csv), "--topology", str(tiny_dir / "topology.csv"), "--out", str(tmp_path / "o"), "--scheduler", "local"]) == 2
    assert "--scheduler reads Parquet files" in capsys.readouterr().err
