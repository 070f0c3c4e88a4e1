"""Benchmark: the daemon against a local Tansu broker.

Prints a Markdown table:

* **sustained ingest** -- a topic pre-filled with a SYNTHETIC cluster's
  flows (Arrow IPC, or JSON Lines), consumed by ``prism daemon`` in its own
  process, windows analysed as it goes; records per wall second and per
  CPU second of the daemon, and its peak RSS (VmHWM, which is per process
  image, so the benchmark's own memory does not leak into it); best of
  ``--runs`` (3), each run a new consumer group reading from the start;
* **analysis at every step** -- the monitor alone (no Kafka, input decoded
  beforehand) with a window at every step of event time: a backlog is
  analysed in fewer, longer windows, so this is the cost per record when
  keeping up at 1x real time;
* **floor** -- a bare kafka-python consumer (no group, no decoding) reading
  the same topic in this process, best of ``--runs``, each run just
  before one of the daemon's: the daemon's ingest row shows its time as a
  multiple of it, and a line under the table each run's ratio to the
  floor run before it;
* **produce-to-metric latency** -- the same cluster streamed at real time;
  for each one-second slice, the time from its send to the daemon's
  ``prism_analysed_until_timestamp_seconds`` passing its end (median, p95).

    python benchmarks/bench_daemon.py [--preset demo] [--formats arrow,jsonl] [--runs 3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from prism.serve.broker import LocalBroker, free_port
from prism.serve.live import stream_flows
from prism.serve.produce import FlowProducer
from prism.serve.sources import ensure_topic
from synthetic import preset

WINDOW = ["--window", "10s", "--window.step", "2s", "--window.lateness", "500ms", "--switch.window", "5s"]


def scrape(port: int, names: tuple[str, ...] | None = None) -> dict:
    """Each metric's samples summed, by sample name; {} while the daemon does not answer.

    ``names`` reads only those samples' lines: the full exposition parser
    costs this process about 5 ms a scrape, CPU that the daemon and the
    broker share with it on a small machine while ingest is timed.
    """
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict = {}
    if names is not None:
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in names:
                value = line.rsplit("}", 1)[1] if "}" in line else line.split(" ", 1)[1]
                out[name] = out.get(name, 0.0) + float(value.split()[0])
        return out
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def start_daemon(bootstrap, topic, topo_csv, port, group=None, cwd=None):
    """A ``prism daemon`` process on ``topic`` (its own consumer group); ``cwd`` picks the checkout whose ``prism`` runs."""
    import subprocess

    group = group or f"bench-{topic}"
    cmd = [sys.executable, "-m", "prism", "daemon", "--topology", str(topo_csv), "--kafka.bootstrap-servers", bootstrap,
           "--kafka.topic", topic, "--kafka.group-id", group, "--kafka.summary-topic", f"sum-{group}",
           "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warning", *WINDOW]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)


def proc_stats(pid: int) -> tuple[float, float]:
    """(peak RSS MiB, CPU seconds) of a live process."""
    hwm = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    import os

    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return hwm, cpu


def assign_from_start(consumer, topic: str, timeout_s: float = 60.0) -> None:
    """Assign a group-less ``consumer`` every partition of ``topic`` (waiting for its metadata) and seek to their start.

    Shared by the benchmarks' bare consumers (the floor): this one's and bench_replicas.py's.
    """
    from kafka import TopicPartition

    deadline = time.monotonic() + timeout_s
    parts = consumer.partitions_for_topic(topic)
    while not parts:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} has no partitions after {timeout_s:.0f} s")
        time.sleep(0.05)
        parts = consumer.partitions_for_topic(topic)
    consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
    consumer.seek_to_beginning()


def bare_consume(bootstrap, topic, messages: int) -> float:
    """Seconds a bare kafka-python consumer takes to read ``messages`` messages of ``topic`` (the floor)."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        assign_from_start(c, topic)
        t0, got = time.monotonic(), 0
        while got < messages:
            got += sum(len(v) for v in c.poll(timeout_ms=500, max_records=10_000).values())
        return time.monotonic() - t0
    finally:
        c.close()


def fill_topic(bootstrap, cluster, fmt) -> tuple[str, int]:
    """A new topic holding the cluster's flows (as fast as possible); returns (topic, messages)."""
    topic = f"ingest-{fmt}-{time.time_ns()}"
    ensure_topic(bootstrap, topic, 4)
    p = FlowProducer(bootstrap, topic, fmt=fmt)
    stream_flows(p, cluster.flows, speed=0)
    p.flush()
    p.close()
    return topic, p.messages_sent


def ingest(bootstrap, cluster, topo_csv, fmt, runs: int = 3):
    """The floor and the daemon on one topic, ``runs`` times each, alternating: the best of each, and each pair's ratio.

    Both sides take their best run: this machine's speed drifts within
    minutes, and a best floor against one daemon run would count the
    drift against the daemon.
    """
    topic, messages = fill_topic(bootstrap, cluster, fmt)
    floors, daemons = [], []
    for r in range(runs):
        floors.append(bare_consume(bootstrap, topic, messages))
        daemons.append(time_daemon(bootstrap, topic, len(cluster.flows), topo_csv, group=f"bench-{topic}-{r}"))
    best = min(daemons, key=lambda d: d["wall"])
    return dict(best, floor=min(floors), pairs=[d["wall"] / f for d, f in zip(daemons, floors)])


def time_daemon(bootstrap, topic, n, topo_csv, group=None, cwd=None) -> dict:
    """Wall and CPU seconds, peak RSS and windows of a daemon reading the ``n`` records of ``topic`` from the start."""
    port = free_port()
    proc = start_daemon(bootstrap, topic, topo_csv, port, group=group, cwd=cwd)
    try:
        while not scrape(port).get("prism_ready"):
            if proc.poll() is not None:
                raise RuntimeError(f"prism daemon exited with code {proc.returncode} before it was ready (cwd {cwd or '.'})")
            time.sleep(0.05)
        _, cpu0 = proc_stats(proc.pid)
        t0 = time.monotonic()
        while True:
            m = scrape(port, ("prism_flows_ingested_total", "prism_windows_total", "prism_jobs"))
            if m.get("prism_flows_ingested_total", 0) >= n:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"prism daemon exited with code {proc.returncode} after {m.get('prism_flows_ingested_total', 0):,.0f} of {n:,} records")
            time.sleep(0.05)
        wall = time.monotonic() - t0
        hwm, cpu1 = proc_stats(proc.pid)
        windows = m.get("prism_windows_total", 0)
        return dict(n=n, wall=wall, cpu=cpu1 - cpu0, rss=hwm, windows=windows, jobs=m.get("prism_jobs", 0))
    finally:
        proc.terminate()
        proc.wait()


def every_step(cluster, topo_csv, batch: int = 36_000):
    """The monitor alone, a window at every ``--window.step`` of event time, as at 1x real time.

    A backlog is analysed in fewer, longer strides (the daemon reads ahead
    while a window is analysed, so the next one covers more): this row is
    the cost per record when every step gets its window. Input decoded
    beforehand (not timed), one thread.
    """
    import pyarrow as pa

    from prism.ingest.records import RejectCounter, validate_flows
    from prism.ingest.topology import Topology
    from prism.serve.monitor import Monitor, MonitorSettings

    flows = cluster.flows.sort_values("start_ns", kind="stable")
    frames = [validate_flows(pa.Table.from_pandas(flows.iloc[i:i + batch], preserve_index=False), RejectCounter(), "bench")
              for i in range(0, len(flows), batch)]
    m = Monitor(Topology.from_csv(topo_csv), MonitorSettings(window_s=10, step_s=2, lateness_s=0.5, switch_window_s=5))
    t0 = time.process_time()
    for f in frames:
        m.ingest(f)
        if m.due():
            m.tick()
    m.tick(final=True)
    return dict(n=len(flows), cpu=time.process_time() - t0, windows=m.view.ticks)


def latency(bootstrap, cluster, topo_csv):
    topic = f"latency-{time.time_ns()}"
    ensure_topic(bootstrap, topic, 4)
    port = free_port()
    proc = start_daemon(bootstrap, topic, topo_csv, port)
    sent: list[tuple[int, float]] = []
    seen: list[tuple[float, float]] = []  # (wall, analysed-until event time)
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            a = scrape(port).get("prism_analysed_until_timestamp_seconds")
            if a:
                seen.append((time.monotonic(), a * 1e9))
            time.sleep(0.05)

    try:
        while not scrape(port).get("prism_ready"):
            time.sleep(0.05)
        w = threading.Thread(target=watch, daemon=True)
        w.start()
        p = FlowProducer(bootstrap, topic, fmt="arrow")
        stream_flows(p, cluster.flows, speed=1.0, on_slice=lambda ev, t: sent.append((ev, t)))
        p.close()
        time.sleep(8)
        stop.set()
        w.join()
        _, _ = proc_stats(proc.pid)
    finally:
        proc.terminate()
        proc.wait()
    lat = []
    seen_t = np.array([s[0] for s in seen])
    seen_ev = np.array([s[1] for s in seen])
    for ev, t in sent[:-2]:  # the tail is analysed by the idle flush, not the window step
        i = np.flatnonzero((seen_ev >= ev) & (seen_t >= t))
        if len(i):
            lat.append(seen_t[i[0]] - t)
    return np.array(lat)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--formats", default="arrow,jsonl")
    ap.add_argument("--runs", type=int, default=3, help="runs of the floor and of the daemon per format, alternating; the table shows the best of each")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error(f"--runs must be 1 or more, not {args.runs}")
    cluster = preset(args.preset, seed=0, duration_s=args.duration).generate()
    gpus = cluster.jobs["ip"].nunique()
    rate = len(cluster.flows) / (cluster.flows["start_ns"].max() - cluster.flows["start_ns"].min()) * 1e9
    tmp = Path(tempfile.mkdtemp(prefix="prism-bench-"))
    topo_csv = tmp / "topology.csv"
    cluster.topology.to_csv(topo_csv, index=False)
    print(f"SYNTHETIC '{args.preset}': {len(cluster.flows):,} flows, {gpus:,} GPUs, {rate:,.0f} flows/s of capture; "
          f"daemon flags {' '.join(WINDOW)}\n")
    with LocalBroker() as b:
        print("| measurement | records | wall s | records/s (wall) | x bare consumer | daemon CPU s | records per CPU s | windows | daemon peak RSS |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        pairs = {}
        for fmt in args.formats.split(","):
            r = ingest(b.bootstrap, cluster, topo_csv, fmt, args.runs)
            pairs[fmt] = r["pairs"]
            print(f"| floor: bare kafka-python consumer, {fmt} messages | {r['n']:,} | {r['floor']:.1f} | {r['n'] / r['floor']:,.0f} | 1x | | | | |")
            print(f"| sustained ingest, {fmt} | {r['n']:,} | {r['wall']:.1f} | {r['n'] / r['wall']:,.0f} | {r['wall'] / r['floor']:.1f}x | {r['cpu']:.1f} | "
                  f"{r['n'] / max(r['cpu'], 1e-9):,.0f} | {r['windows']:.0f} | {r['rss']:,.0f} MiB |")
        r = every_step(cluster, topo_csv)
        print(f"| analysis at every window step (no Kafka, decoded input) | {r['n']:,} | | | | {r['cpu']:.1f} | {r['n'] / r['cpu']:,.0f} | {r['windows']} | |")
        print("\nEach daemon run against the floor run before it: " + "; ".join(f"{fmt} {', '.join(f'{x:.1f}x' for x in p)}" for fmt, p in pairs.items()))
        lat = latency(b.bootstrap, cluster, topo_csv)
        if len(lat):
            print(f"\nproduce-to-metric latency at 1x real time ({len(lat)} one-second slices): median {np.median(lat):.2f} s, "
                  f"p95 {np.percentile(lat, 95):.2f} s, max {lat.max():.2f} s (window step 2 s + lateness 0.5 s + analysis)")


if __name__ == "__main__":
    main()
