"""Flows spilled to disk come back as the in-memory batches of whole jobs."""
import builtins

import numpy as np
import pytest

import prism.offline.spill
from prism.analysis.batches import plan_job_batches
from prism.cli import main
from prism.common.ordering import order_by
from prism.offline.spill import SpilledFlows


def _flows(rng, n, n_nics):
    return [rng.integers(0, n_nics, n), rng.integers(0, n_nics, n), np.sort(rng.integers(0, 10**9, n)),
            rng.integers(1, 10**6, n), rng.integers(1, 10**8, n)]


@pytest.mark.parametrize("seed", range(4))
def test_job_batches_are_the_grouped_capture_sliced(seed, tmp_path, monkeypatch):
    rng = np.random.default_rng(seed)
    n_nics, n = 40, 5_000
    labels = rng.integers(-1, 9, n_nics)  # some NICs in no job
    cols = _flows(rng, n, n_nics)
    monkeypatch.setattr(prism.offline.spill, "SLICE_ROWS", int(rng.integers(100, 2_000)))
    with SpilledFlows(n_nics, tmp_path) as s:
        cuts = np.sort(rng.integers(0, n, 6))
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, n]):  # chunks of any size, empty ones too
            s.add(*(c[lo:hi] for c in cols))
        assert len(s) == n
        for got, want in zip(s.read_all(), cols):
            np.testing.assert_array_equal(got, want)
        job = labels[cols[0]]
        counts = np.bincount(job + 1)
        np.testing.assert_array_equal(s.flows_per_label(labels), counts)
        plan = plan_job_batches(counts, max_flows=int(rng.integers(1, n // 2)))
        # what analyse_by_jobs does in memory: every flow grouped by job (stable), then sliced per batch
        order = order_by([job], np.arange(n, dtype=np.int64))
        grouped = [c[order] for c in cols]
        f0, seen = 0, 0
        for (batch_labels, got), want_labels in zip(s.job_batches(labels, plan), plan):
            np.testing.assert_array_equal(batch_labels, want_labels)
            f1 = f0 + int(counts[want_labels + 1].sum())
            for g, w in zip(got, grouped):
                np.testing.assert_array_equal(g, w[f0:f1])
            f0, seen = f1, seen + 1
        assert (f0, seen) == (n, len(plan))
        directory = s.dir
    assert not directory.exists()


def test_a_flow_of_no_planned_batch_is_an_error(tmp_path):
    with SpilledFlows(4, tmp_path) as s:
        s.add(np.array([0, 3]), np.array([1, 2]), np.array([1, 2]), np.array([1, 1]), np.array([5, 5]))
        labels = np.array([0, 0, 1, 1])
        with pytest.raises(ValueError, match="no batch"):
            list(s.job_batches(labels, [np.array([0])]))  # label 1's flow is in no batch


def test_a_full_disk_is_a_clear_error_and_leaves_nothing(tiny_dir, tmp_path, monkeypatch, capsys):
    """Writing the spill fails (ENOSPC from /dev/full): the replay says where and why, exits 1, and removes its directory."""
    real_open = builtins.open
    monkeypatch.setattr(prism.offline.spill, "open", lambda path, mode="r": real_open("/dev/full", mode) if "w" in mode else real_open(path, mode), raising=False)
    spill = tmp_path / "spill"
    spill.mkdir()
    rc = main(["replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--out", str(tmp_path / "o"),
               "--spill-above", "0", "--spill-dir", str(spill)])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"spilling GPU flows to {spill}" in err and "MiB free there" in err and "--spill-dir" in err
    assert not any(spill.iterdir())
