"""Do a Monitor's outputs depend on how the partitions' reads interleave?

The same flows, partitioned as the broker partitions them (murmur2 of the
pair key, 4 partitions), each partition in its own fixed order, fed to a
Monitor in several interleavings (batch sizes, round-robin or skewed, whole
partitions one after another), as a source would: ``ingest(batch,
partition)``, then ``tick()`` while one is due, and a final tick. The wall
clock is frozen, so no partition goes idle. Compared: window ends, late and
dropped counts, incomplete windows, steps and anomalies.

    PYTHONPATH=$PWD python benchmarks/late_interleaving.py [--order time|pairs|both] [--mode known|backlog]

The daemon's Monitor judges late records, windows and their lateness by each
partition's own stream time, so every interleaving should give the first
one's answers (``= ref``); a line with ``!=`` is a read-order dependence.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time

import numpy as np
import pandas as pd
from kafka.partitioner.default import murmur2

from prism.ingest.messages import pair_keys
from prism.ingest.topology import Topology
from prism.serve.monitor import Monitor, MonitorSettings
from synthetic import preset

SETTINGS = dict(window_s=3, step_s=1, switch_window_s=2, lateness_s=0.1, idle_flush_s=3)
PARTITIONS = 4


def partitioned(flows: pd.DataFrame, order: str) -> dict[str, pd.DataFrame]:
    """Each partition's records in the order it holds them: ``time`` (start order) or ``pairs`` (a dump re-imported in key order)."""
    keys = pair_keys(flows["src"].astype(str), flows["dst"].astype(str))
    part = np.array([(murmur2(k) & 0x7FFFFFFF) % PARTITIONS for k in keys])
    flows = flows.assign(_key=keys, _part=part)
    by = ["start_ns"] if order == "time" else ["_key", "start_ns"]
    flows = flows.sort_values(by, kind="stable")
    return {str(p): g.drop(columns=["_key", "_part"]).reset_index(drop=True) for p, g in flows.groupby("_part", sort=True)}


def interleave(parts: dict[str, pd.DataFrame], kind: str, batch: int, seed: int = 0) -> list[tuple[str, pd.DataFrame]]:
    """The batches ``(partition, frame)`` in reading order; each partition's own order kept."""
    chunks = {p: [f.iloc[i : i + batch] for i in range(0, len(f), batch)] for p, f in parts.items()}
    out: list[tuple[str, pd.DataFrame]] = []
    if kind == "sequential":  # whole partitions one after another
        for p, cs in chunks.items():
            out += [(p, c) for c in cs]
    elif kind == "reverse":
        for p, cs in reversed(list(chunks.items())):
            out += [(p, c) for c in cs]
    elif kind == "roundrobin":
        for group in itertools.zip_longest(*[[(p, c) for c in cs] for p, cs in chunks.items()]):
            out += [x for x in group if x is not None]
    elif kind == "skewed":  # partition 0 read four batches for each of the others'
        its = {p: iter(cs) for p, cs in chunks.items()}
        while its:
            for p in list(its):
                for _ in range(4 if p == "0" else 1):
                    c = next(its[p], None)
                    if c is None:
                        its.pop(p)
                        break
                    out.append((p, c))
    elif kind == "random":
        rng = np.random.default_rng(seed)
        its = {p: list(cs) for p, cs in chunks.items()}
        pos = dict.fromkeys(its, 0)
        while its:
            p = list(its)[rng.integers(len(its))]
            out.append((p, its[p][pos[p]]))
            pos[p] += 1
            if pos[p] == len(its[p]):
                its.pop(p)
    else:
        raise ValueError(kind)
    return out


def run(topology: Topology, batches: list[tuple[str, pd.DataFrame]], mode: str) -> dict:
    """``mode``: how the source's ``backlogged`` is kept: ``backlog`` (the Kafka source on a full topic: every partition with
    unread records), ``known`` (only those not heard from yet: the assignment is known, the input is read as it comes)."""
    m = Monitor(topology, MonitorSettings(**SETTINGS))
    m.clock = lambda: 0.0  # wall time frozen: no partition idle
    left = {p: 0 for p, _ in batches}
    for p, _ in batches:
        left[p] += 1
    lateness = []
    heard: set[str] = set()
    for p, b in batches:
        # as the Kafka source: the batch's partition is among them while it is ingested
        m.backlogged = {q for q, k in left.items() if k and (mode == "backlog" or q not in heard)} | {p}
        m.ingest(b, p)
        heard.add(p)
        left[p] -= 1
        m.backlogged = {q for q, k in left.items() if k and (mode == "backlog" or q not in heard)}
        while m.due():
            m.tick()
            lateness.append(m.view.lateness_ns)
    m.backlogged = set()
    while m.due():
        m.tick()
        lateness.append(m.view.lateness_ns)
    m.tick(final=True)
    counts = pd.DataFrame(m.counters_snapshot()).T.fillna(0).sum()
    anomalies = sorted((e["kind"], str(e.get("job_id")), str(e.get("subject")), int(e.get("start_ns") or 0)) for k, e in m.events if k == "anomaly")
    return {
        "windows": [(w.begin, w.end, w.late, w.incomplete) for w in m.windows],
        "late": m.late_flows, "dropped": int(counts.get("ignored:late", 0)), "incomplete": m.windows_incomplete,
        "lateness": lateness, "steps": m.steps_frame().sort_values(["job_id", "step"]).reset_index(drop=True),
        "anomalies": anomalies,
    }


def compare(name: str, ref: dict, got: dict, t0: int) -> str:
    ends = [round((w[1] - t0) / 1e9, 3) for w in got["windows"]]
    st_ref, st = ref["steps"], got["steps"]
    same_steps = st_ref[["job_id", "start_ns", "end_ns"]].equals(st[["job_id", "start_ns", "end_ns"]]) if len(st_ref) == len(st) else False
    common = st_ref.merge(st, on=["job_id", "start_ns", "end_ns"]) if len(st) and len(st_ref) else st[:0]
    return (f"{name:28s} windows {len(got['windows']):2d} incomplete {got['incomplete']:2d} late {got['late']:7d} dropped {got['dropped']:7d} "
            f"steps {len(st):4d} (same as ref: {'all' if same_steps else len(common)}) anomalies {len(got['anomalies']):2d} "
            f"{'=' if got['anomalies'] == ref['anomalies'] else '!='} ref  windows {'=' if got['windows'] == ref['windows'] else '!='} ref  ends {ends}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--order", default="both")
    ap.add_argument("--mode", default="known", choices=["known", "backlog"])
    ap.add_argument("--kinds", default="roundrobin:500,roundrobin:5000,roundrobin:50000,skewed:500,skewed:5000,random:2000,sequential:5000,reverse:5000")
    a = ap.parse_args()
    cluster = preset("tiny", seed=0, duration_s=8.0).generate()
    topology = Topology.from_frame(cluster.topology)
    t0 = int(cluster.flows["start_ns"].min())
    for order in (["time", "pairs"] if a.order == "both" else [a.order]):
        parts = partitioned(cluster.flows, order)
        print(f"== order {order}, {len(cluster.flows)} flows, partitions {[len(f) for f in parts.values()]}, mode={a.mode}", flush=True)
        ref = None
        for spec in a.kinds.split(","):
            kind, size = spec.split(":")
            t = time.perf_counter()
            got = run(topology, interleave(parts, kind, int(size)), a.mode)
            ref = ref or got
            print(compare(spec, ref, got, t0), f"[{time.perf_counter() - t:.0f} s]", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
