"""Load the daemon's compiled kernels before its first window.

numba loads a compiled function from its on-disk cache at the function's
first call, not at import: a tenth of a second for the Arrow header walk,
tens of milliseconds for each of the others. A daemon that did not warm up
would pay that inside its first poll and its first window, while it is
behind on a backlog or a live stream (and a benchmark would count it as
ingest time). :func:`warm_up` pays it at start instead: a few seconds of
the embedded SYNTHETIC ``tiny`` cluster are encoded as Kafka messages,
decoded, ingested and analysed twice by a throwaway monitor, through the
same code a real window takes. Nothing of it is kept, logged or counted.
"""
from __future__ import annotations

import logging
import time

import numpy as np

__all__ = ["warm_up"]


def warm_up(seconds: float = 3.0) -> float:
    """Run a small made-up cluster through decoding and analysis; return the wall seconds it took.

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
    from synthetic import preset

    from prism.ingest.messages import decode_messages, encode_arrow, encode_jsonl
    from prism.serve.monitor import Monitor, MonitorSettings
    from prism.ingest.records import RejectCounter
    from prism.ingest.topology import Topology

    cluster = preset("tiny", seed=0, with_faults=False, duration_s=seconds).generate()
    flows = cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    for c in ("src", "dst", "switches"):
        flows[c] = flows[c].astype(str)  # as a producer writes them: plain text, one schema for every message
    monitor = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(window_s=seconds / 2, step_s=seconds / 4, lateness_s=0))
    second = flows["start_ns"] >= flows["start_ns"].median()
    halves = (flows[~second], flows[second])
    for half in halves:
        messages = [(encode_arrow(half.iloc[i : i + 2000]), [], f"warm-up@{i}") for i in range(0, len(half), 2000)]
        for frame in decode_messages(messages, RejectCounter(), "warm-up"):
            monitor.ingest(frame)
        monitor.tick(final=True)
    decode_messages(messages[:1], RejectCounter(), "warm-up")  # a poll of one message: read on its own
    decode_messages([(encode_jsonl(flows.iloc[:20]), [], "warm-up@jsonl")], RejectCounter(), "warm-up")  # a producer of JSON Lines
    # dictionary-encoded text (Parquet files under --source, a producer's dictionary arrays), the rows using
    # part of each dictionary, as a file's chunks do
    import pyarrow as pa

    from prism.ingest.records import validate_flows

    row = pa.Table.from_pandas(flows.iloc[:1], preserve_index=False)
    one_of_two = {c: pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), pa.array([row.column(c)[0].as_py(), row.column(c)[0].as_py() + "~"]))
                  for c in ("src", "dst", "switches")}
    validate_flows(pa.table({c: one_of_two.get(c, row.column(c)) for c in row.column_names}), RejectCounter(), "warm-up")
    # the switch sums' table grows (a rehash) once a fabric has more keys than the tiny one
    from prism.analysis.diagnosis.switches import _KeySums

    one = np.zeros(3, dtype=np.int64)
    _KeySums(capacity=2).add(np.arange(3), one, one, one, one)
    # a window of 65,536 pairs or more (a large fabric) has the job recogniser mark them in a table
    from prism.analysis.jobs import _mark_pairs

    _mark_pairs(np.zeros(4, dtype=bool), one, one, 2)
