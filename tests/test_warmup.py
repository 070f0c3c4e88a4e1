"""The daemon's warm-up: every compiled kernel on its path loaded before the first window, silently."""
import json
import subprocess
import sys
import textwrap

# compiled functions no daemon window calls: the replay's phases and its grouping by job (the daemon analyses
# a window at once), the what-if simulator, and pair_episodes (public; the classifier finds episodes in its own pass)
NOT_ON_THE_DAEMONS_PATH = {"prism.analysis.analyse._group_sums", "prism.whatif.graph._topo_order", "prism.common.ordering._places", "prism.common.ordering._scatter",
                           "prism.analysis.parallelism._new_episode"}


def test_warm_up_loads_every_kernel_of_the_daemons_path_and_says_nothing():
    # a fresh interpreter: in this one, earlier tests have called the kernels already
    script = textwrap.dedent("""
        import io, json, logging, sys
        import numba
        import prism, prism.cli, prism.serve.daemon, prism.serve.sources  # what `prism daemon` imports
        log = io.StringIO()
        logging.basicConfig(stream=log, level=logging.DEBUG, force=True)
        logging.getLogger("prism").setLevel(logging.INFO)
        from prism.serve.warmup import warm_up
        seconds = warm_up()
        kernels = {f"{name}.{attr}": obj for name, mod in sorted(sys.modules.items()) if name.startswith("prism")
                   for attr, obj in vars(mod).items() if isinstance(obj, numba.core.registry.CPUDispatcher) and obj.__module__ == name}
        # helpers called only from compiled code are compiled into their callers: no signature of their own
        inner = {f"{k.rsplit('.', 1)[0]}.{n}" for k, d in kernels.items() for n in d.py_func.__code__.co_names}
        cold = [k for k, d in kernels.items() if not d.signatures and k not in inner]
        from prism.common.kernels import registered_warm_ups
        print(json.dumps({"cold": sorted(cold), "log": log.getvalue(), "seconds": seconds, "generator": "synthetic" in sys.modules,
                          "registered": sorted(registered_warm_ups())}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True).stdout
    got = json.loads(out.splitlines()[-1])
    cold = set(got["cold"])
    assert cold <= NOT_ON_THE_DAEMONS_PATH, f"compiled on first use in a window, not at start: {sorted(cold - NOT_ON_THE_DAEMONS_PATH)}"
    assert "prism.ingest.ipc_headers._walk_many" not in cold and "prism.serve.window._insert" not in cold
    assert "prism" not in got["log"]  # the throwaway monitor's warnings are not the daemon's
    assert got["seconds"] > 0
    assert not got["generator"]  # the daemon's start does not depend on the test-data generator
    # the kernels the fixture cannot reach are warmed by their own modules
    assert {"prism.analysis.jobs.warm_up", "prism.analysis.diagnosis.switches.warm_up", "prism.serve.window.warm_up",
            "prism.analysis.timeline.warm_up"} <= set(got["registered"])


def test_the_fixture_is_training_traffic_the_monitor_finds_steps_in():
    # a fixture that no longer looked like a job (no steps, no pairs typed) would warm less than the daemon's path
    from prism.ingest.topology import Topology
    from prism.serve.monitor import Monitor, MonitorSettings
    from prism.serve.warmup import warm_up_flows

    topology, flows = warm_up_flows(3.0)
    assert 1000 <= len(flows) <= 2000 and flows["start_ns"].is_monotonic_increasing
    monitor = Monitor(Topology.from_frame(topology), MonitorSettings(window_s=3.0, step_s=1.5, lateness_s=0))
    monitor.ingest(flows)
    view = monitor.tick(final=True)
    assert monitor.counters["0"]["ignored:non_gpu_address"] == 0
    (job,) = view.jobs.values()
    assert job.gpus == 8 and job.servers == 4 and job.steps >= 20
    assert (job.dp, job.pp) == (2, 2) and {t for t, _ in job.pairs} == {"DP", "PP"}


def test_an_empty_numba_cache_is_logged_before_compiling(tmp_path, monkeypatch, caplog):
    """A new pod whose cache volume is empty says that it compiles, and where the cache is; a warm one says nothing."""
    import logging

    from prism.common.kernels import cached_kernels, log_compile_state

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    log = logging.getLogger("prism.test")
    with caplog.at_level(logging.INFO, logger="prism.test"):
        assert cached_kernels() == 0 and log_compile_state(log, "first capture") is True
    assert "no compiled kernels in numba's cache (" + str(tmp_path) + ")" in caplog.text and "first capture" in caplog.text
    caplog.clear()
    (tmp_path / "prism" / "ingest").mkdir(parents=True)
    (tmp_path / "prism" / "ingest" / "records.decode-415.py311.nbi").write_bytes(b"")
    with caplog.at_level(logging.INFO, logger="prism.test"):
        assert cached_kernels() == 1 and log_compile_state(log, "first capture") is False
    assert caplog.text == ""


def test_an_unwritable_numba_cache_falls_back_to_a_scratch_directory(tmp_path):
    """numba raises at import when it has nowhere to cache: Prism moves NUMBA_CACHE_DIR before it imports numba, and says so."""
    import os
    import subprocess
    import sys

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    code = "import os, prism, prism.ingest.records; print(os.environ['NUMBA_CACHE_DIR']); print(prism.NUMBA_CACHE_NOTE)"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NUMBA_CACHE_DIR": str(blocked / "numba")},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    where, note = r.stdout.splitlines()
    assert where != str(blocked / "numba") and "prism-numba" in where
    assert note.startswith(f"NUMBA_CACHE_DIR {blocked / 'numba'} cannot be written") and where in note
