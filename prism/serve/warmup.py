"""Load the daemon's compiled kernels before its first window.

numba loads a compiled function from its on-disk cache at the function's
first call, not at import: a tenth of a second for the Arrow header walk,
tens of milliseconds for each of the others. A daemon that did not warm up
would pay that inside its first poll and its first window, while it is
behind on a backlog or a live stream (and a benchmark would count it as
ingest time). :func:`warm_up` pays it at start instead, in two parts:

* a small fixture built here (:func:`warm_up_flows`: one made-up training
  job of two pipeline stages and two data-parallel replicas on four
  servers, a few seconds of steps) is encoded as Kafka messages, decoded,
  ingested and analysed twice by a throwaway monitor, through the same
  code a real window takes;
* the kernels such a small cluster does not reach (a large fabric's, a
  large window's, a window's hash-table rebuild) are loaded by the warm-ups their modules register in
  :mod:`prism.common.kernels`.

The fixture is built in code, not drawn from the synthetic generator: the
daemon's start does not depend on the test-data generator. Nothing of it
is kept, logged or counted.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

__all__ = ["warm_up", "warm_up_flows"]

#: the fixture's job: servers (two pipeline stages x two replicas), rails (NICs a server), and its schedule
_SERVERS, _RAILS, _MICROBATCHES = 4, 2, 4
_MS = 1_000_000
#: 2026-01-01T00:00:00Z, as the synthetic captures: any time works
_EPOCH_NS = 1_767_225_600_000_000_000


def warm_up_flows(seconds: float = 3.0, step_ms: int = 100) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A made-up cluster's topology and flows (as validated records): the warm-up's fixture.

    One job, two pipeline stages by two data-parallel replicas, on four
    servers of two NICs (rails) each; servers 0-1 and 2-3 share a leaf per
    rail, the replicas talk over a spine. Each step: a forward and a
    backward message per micro-batch between the stages, then a ring
    all-reduce between the replicas, then a pause. About 50 flows a step.

    Parameters
    ----------
    seconds : float
        Event time covered.
    step_ms : int
        Step period (ms).

    Returns
    -------
    topology : pandas.DataFrame
        ``ip, server, rail, leaf``.
    flows : pandas.DataFrame
        ``start_ns, duration_ns, src, dst, size, switches`` by start.
    """
    rng = np.random.default_rng(0)  # the same fixture every start
    ips = [f"10.1.{s}.{10 + r}" for s in range(_SERVERS) for r in range(_RAILS)]
    leaves = [f"leaf-g{s // 2}-r{r}" for s in range(_SERVERS) for r in range(_RAILS)]
    topology = pd.DataFrame({"ip": ips, "server": [f"srv{s:04d}" for s in range(_SERVERS) for _ in range(_RAILS)],
                             "rail": [r for _ in range(_SERVERS) for r in range(_RAILS)], "leaf": leaves})

    def nic(server: int, rail: int) -> int:
        return server * _RAILS + rail

    rows: list[tuple[int, int, int, int, int]] = []  # start, duration, src NIC, dst NIC, size
    mb = step_ms * _MS // 25  # a micro-batch's slot
    for k in range(int(seconds * 1000) // step_ms):
        t0 = k * step_ms * _MS
        for replica in range(2):
            first, second = 2 * replica, 2 * replica + 1  # its two stages' servers
            for r in range(_RAILS):
                for m in range(_MICROBATCHES):
                    rows.append((t0 + m * mb, mb // 3, nic(first, r), nic(second, r), 8 << 20))  # activations forward
                    rows.append((t0 + (_MICROBATCHES + m) * mb, mb // 3, nic(second, r), nic(first, r), 8 << 20))  # gradients back
        ring = t0 + (2 * _MICROBATCHES + 1) * mb
        for stage in range(2):
            a, b = stage, 2 + stage  # the two replicas' servers of this stage
            for r in range(_RAILS):
                for chunk in range(2):
                    rows.append((ring + chunk * mb, mb // 2, nic(a, r), nic(b, r), 32 << 20))
                    rows.append((ring + chunk * mb, mb // 2, nic(b, r), nic(a, r), 32 << 20))
    start, duration, src, dst, size = (np.array(c, dtype=np.int64) for c in zip(*rows))
    start = _EPOCH_NS + start + rng.integers(0, mb // 20, len(start))  # a little jitter: no two steps alike
    duration = duration + rng.integers(0, mb // 20, len(start))
    order = np.argsort(start, kind="stable")
    ip, leaf = np.array(ips), np.array(leaves)
    path = np.where(leaf[src] == leaf[dst], leaf[src], np.char.add(np.char.add(leaf[src], "|spine-00|"), leaf[dst]))
    flows = pd.DataFrame({"start_ns": start, "duration_ns": duration, "src": ip[src], "dst": ip[dst], "size": size, "switches": path})
    return topology, flows.iloc[order].reset_index(drop=True)


def warm_up(seconds: float = 3.0) -> float:
    """Run a small made-up cluster through decoding and analysis, then the registered warm-ups; return the wall seconds.

    Parameters
    ----------
    seconds : float
        Event time of the made-up traffic: two windows of half that, so
        that the second one evicts what the first one held.

    Notes
    -----
    Never raises: a failure here (which would be a bug) only means the
    first real window loads the kernels itself; it is logged at debug
    level. About half a second on one core, once per process.
    """
    t0 = time.perf_counter()
    prism_log = logging.getLogger("prism")
    level = prism_log.level
    prism_log.setLevel(logging.CRITICAL + 1)  # the throwaway monitor's warnings are not the daemon's
    try:
        _run(seconds)
    except Exception as e:  # noqa: BLE001 - a start-up nicety must not stop the daemon
        prism_log.setLevel(level)  # so that this line is not silenced too
        logging.getLogger("prism.warmup").debug("warm-up failed (the first window loads the kernels instead): %s: %s", type(e).__name__, e)
    finally:
        prism_log.setLevel(level)
    return time.perf_counter() - t0


def _run(seconds: float) -> None:
    import pyarrow as pa

    from prism.common.kernels import warm_up_kernels
    from prism.ingest.messages import decode_messages, encode_arrow, encode_jsonl
    from prism.ingest.records import RejectCounter, validate_flows
    from prism.ingest.topology import Topology
    from prism.serve.monitor import Monitor, MonitorSettings

    topology, flows = warm_up_flows(seconds)
    monitor = Monitor(Topology.from_frame(topology), MonitorSettings(window_s=seconds / 2, step_s=seconds / 4, lateness_s=0))
    second = flows["start_ns"] >= flows["start_ns"].median()
    messages: list[tuple[bytes, list, str]] = []  # (value, headers, where), as a Kafka poll gives them
    for half in (flows[~second], flows[second]):
        messages = [(encode_arrow(half.iloc[i : i + 500]), [], f"warm-up@{i}") for i in range(0, len(half), 500)]
        for frame in decode_messages(messages, RejectCounter(), "warm-up"):
            monitor.ingest(frame)
        monitor.tick(final=True)
    decode_messages(messages[:1], RejectCounter(), "warm-up")  # a poll of one message: read on its own
    decode_messages([(encode_jsonl(flows.iloc[:20]), [], "warm-up@jsonl")], RejectCounter(), "warm-up")  # a producer of JSON Lines
    # dictionary-encoded text (Parquet files under --source, a producer's dictionary arrays), the rows using
    # part of each dictionary, as a file's chunks do
    row = pa.Table.from_pandas(flows.iloc[:1], preserve_index=False)
    one_of_two = {c: pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), pa.array([row.column(c)[0].as_py(), row.column(c)[0].as_py() + "~"]))
                  for c in ("src", "dst", "switches")}
    validate_flows(pa.table({c: one_of_two.get(c, row.column(c)) for c in row.column_names}), RejectCounter(), "warm-up")
    # what else the fixture does not reach: the kernels of a large fabric or a large window, by their modules' warm-ups
    warm_up_kernels()
