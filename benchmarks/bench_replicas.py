"""Benchmark: the two-stage daemon (``--role ingest`` / ``--role analyse``) with 1, 2 and 3 replicas of each stage.

Against a local Tansu broker (:class:`prism.serve.broker.LocalBroker`), on
the SYNTHETIC demo cluster's flows (Arrow IPC, as a collector sends them),
each stage measured on its own, replicas as separate ``prism daemon``
processes:

* **ingest** -- N ``--role ingest`` replicas in a new consumer group on a
  new, empty input topic of ``--partitions`` (6) partitions; once every
  one holds its partitions, the flows' messages (produced once by
  :class:`~prism.serve.produce.FlowProducer`, read back into memory) are
  copied in, each to its partition, as fast as this process can send them.
  The replicas decode, count, recognise jobs, diagnose the fabric and
  forward each job's flows to a new job topic; timed from the start of the
  copy to the last record counted in ``prism_flows_ingested_total``.
* **analyse** -- N ``--role analyse`` replicas in a new group on a new,
  empty job topic; then the messages the first ingest run forwarded (flows
  and watermarks) are copied in the same way: timed from the copy to the first moment
  ``prism_analysed_until_timestamp_seconds`` shows, on every replica, the
  value it ends on (each replica is watched until it has been idle 4 s),
  less any stretch of a second or more in which no replica used CPU (a
  daemon waits 3 s of quiet input before analysing a backlog's tail; a
  stage that keeps up never waits so).
* **floor** -- a bare kafka-python consumer (no group, no decoding) reading
  the same topic in this process, just before each measurement: the ratio
  is the stage's wall time over the floor's.

* **steady state** -- N replicas of each stage at once while the flows
  are sent at 1x real time, so that every window step gets its window
  (a backlog is analysed in strides of a whole window): the CPU seconds
  of each stage's replicas over the stream, so records per CPU second
  when keeping up, each replica's peak RSS, and how far the analysed
  event time trails the last record when the stream ends.

For each backlog run: records per wall second, the ratio to the floor, the stage's
CPU seconds (all its replicas) and records per CPU second, and the peak RSS
of each replica (VmHWM). Every replica shares this machine's cores with the
broker and with the others, so on a small machine the wall-clock rate
cannot grow with replicas beyond the cores; the load average is printed
with each run, as other work on the machine moves the figures too.

    python benchmarks/bench_replicas.py [--records 2000000] [--replicas 1,2,3] [--quick]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from bench_daemon import assign_from_start, proc_stats, scrape

from prism.serve.broker import LocalBroker, free_port
from prism.serve.live import stream_flows
from prism.serve.produce import FlowProducer
from prism.serve.sources import ensure_topic
from synthetic import preset

WINDOW = ["--window", "10s", "--window.step", "2s", "--window.lateness", "500ms", "--switch.window", "5s"]
DEMO_RECORDS_PER_S = 2_142_893 / 30.0  # the demo preset's flow rate (seed 0, 30 s)
IDLE_S = 4.0  # a replica whose watched metric has not moved this long has finished


def start(role: str, bootstrap: str, topic: str, job_topic: str, group: str, summaries: str, topo_csv: Path, partitions: int,
          replica: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "prism", "daemon", "--role", role, "--topology", str(topo_csv), "--kafka.bootstrap-servers", bootstrap,
           "--kafka.topic", topic, "--kafka.group-id", group, "--kafka.summary-topic", summaries, "--kafka.job-topic", job_topic,
           "--kafka.job-topic-partitions", str(partitions), "--kafka.replica-id", replica,
           "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warning", *WINDOW]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port


def stop(procs) -> None:
    for p, _ in procs:
        p.terminate()
    for p, _ in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_ready(procs) -> None:
    while not all(scrape(port, ("prism_ready",)).get("prism_ready") for _, port in procs):
        for p, _ in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a replica exited with code {p.returncode} before it was ready")
        time.sleep(0.05)


def bare_consume(bootstrap: str, topic: str, idle_s: float = 3.0) -> tuple[float, int, list]:
    """A bare kafka-python consumer reading ``topic`` from the start until it has been idle ``idle_s``:
    (seconds to its last message, messages, the values)."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                      max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20)
    try:
        assign_from_start(c, topic)
        t0 = last = time.monotonic()
        got: list = []
        while time.monotonic() - last < idle_s:
            batch = c.poll(timeout_ms=200, max_records=10_000)
            if batch:
                for msgs in batch.values():
                    got.extend(msgs)
                last = time.monotonic()
        return last - t0, len(got), got
    finally:
        c.close()


def copy_in(bootstrap: str, topic: str, messages: list) -> None:
    """Send ``messages`` (as a consumer returned them) to ``topic``, each to its partition, key, value and headers unchanged."""
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=1 << 20, max_request_size=64 << 20, acks=1)
    try:
        for m in messages:
            p.send(topic, value=m.value, key=m.key, partition=m.partition, headers=list(m.headers or []))
        p.flush()
    finally:
        p.close()


class Copied(NamedTuple):
    """Where a backlog run stood when its copy started, and how long the copy took."""

    load: float  # load average (1 min) before
    cpu: float  # CPU seconds of the replicas before
    t0: float  # monotonic time the copy started
    copied: float  # seconds the copy took


def ready_then_copy(bootstrap: str, topic: str, messages: list, procs) -> Copied:
    """Once every replica is ready (holds its partitions), note the load and their CPU time, then copy ``messages`` into ``topic``."""
    wait_ready(procs)
    load0 = os.getloadavg()[0]
    cpu0 = sum(proc_stats(p.pid)[1] for p, _ in procs)
    t0 = time.monotonic()
    copy_in(bootstrap, topic, messages)
    return Copied(load0, cpu0, t0, time.monotonic() - t0)


def run_ingest(bootstrap, messages, n, topo_csv, k, partitions, tag) -> dict:
    """k ingest replicas, assigned on an empty topic; then the input copied in, timed until every record is counted."""
    topic, job_topic, group = f"flows-{tag}", f"jobs-{tag}", f"ingest-{tag}"
    ensure_topic(bootstrap, topic, partitions)
    ensure_topic(bootstrap, job_topic, partitions)
    procs = [start("ingest", bootstrap, topic, job_topic, group, f"sum-{tag}", topo_csv, partitions, f"i{i}") for i in range(k)]
    try:
        c = ready_then_copy(bootstrap, topic, messages, procs)
        while True:
            done = sum(scrape(port, ("prism_flows_ingested_total",)).get("prism_flows_ingested_total", 0) for _, port in procs)
            if done >= n:
                break
            if any(p.poll() is not None for p, _ in procs):
                raise RuntimeError(f"an ingest replica exited after {done:,.0f} of {n:,} records")
            time.sleep(0.05)
        wall = time.monotonic() - c.t0
        stats = [proc_stats(p.pid) for p, _ in procs]
        cpu = sum(s for _, s in stats) - c.cpu
        # the tail: the last windows are forwarded after the idle flush
        settle(procs, "prism_analysed_until_timestamp_seconds")
        return dict(k=k, n=n, wall=wall, cpu=cpu, rss=[h for h, _ in stats], load=(c.load, os.getloadavg()[0]), job_topic=job_topic,
                    summaries=f"sum-{tag}", topic=topic, copied=c.copied)
    finally:
        stop(procs)


def settle(procs, metric: str, t0: float | None = None) -> tuple[float, list, float]:
    """Watch ``metric`` and the CPU time of every replica until each shows the metric and none has moved for IDLE_S.

    Returns the monotonic time by which every replica first showed its final
    value, the values, and the seconds after ``t0`` (until then) in stretches
    of 1 s or more in which no replica used CPU (5% of a core or less each):
    the wait for quiet input before a daemon analyses the tail, not work.
    """
    seen: list[tuple[float, float | None]] = [(time.monotonic(), None) for _ in procs]
    samples: list[tuple[float, float]] = []
    while True:
        now = time.monotonic()
        samples.append((now, sum(proc_stats(p.pid)[1] for p, _ in procs)))
        for i, (_, port) in enumerate(procs):
            v = scrape(port, (metric,)).get(metric)
            if v != seen[i][1]:
                seen[i] = (now, v)
        if all(v is not None and now - t >= IDLE_S for t, v in seen):
            break
        time.sleep(0.05)
    end = max(t for t, _ in seen)
    quiet = run = 0.0
    for (ta, ca), (tb, cb) in zip(samples, samples[1:]):
        if t0 is not None and ta >= t0 and tb <= end and (cb - ca) <= 0.05 * len(procs) * (tb - ta):
            run += tb - ta
        else:
            quiet += run if run >= 1.0 else 0.0
            run = 0.0
    quiet += run if run >= 1.0 else 0.0
    return end, [v for _, v in seen], quiet


def run_analyse(bootstrap, topic, messages, summaries, flows, topo_csv, k, partitions, tag) -> dict:
    """k analyse replicas, assigned on an empty job topic; then the ingest run's job topic copied in, timed until analysed."""
    group, job_topic = f"analyse-{tag}", f"jobs-copy-{tag}"
    ensure_topic(bootstrap, job_topic, partitions)
    procs = [start("analyse", bootstrap, topic, job_topic, group, summaries, topo_csv, partitions, f"a{i}") for i in range(k)]
    try:
        c = ready_then_copy(bootstrap, job_topic, messages, procs)
        t_end, ends, quiet = settle(procs, "prism_analysed_until_timestamp_seconds", c.t0)
        stats = [proc_stats(p.pid) for p, _ in procs]
        jobs = sum(scrape(port, ("prism_jobs",)).get("prism_jobs", 0) for _, port in procs)
        # the last window waits for IDLE_FLUSH_S of quiet input (the end of a backlog looks like that) before it is
        # analysed: when the rest was analysed sooner, that wait is time with no replica working, not counted
        return dict(k=k, n=flows, wall=t_end - c.t0 - quiet, quiet=quiet, cpu=sum(s for _, s in stats) - c.cpu, rss=[h for h, _ in stats],
                    load=(c.load, os.getloadavg()[0]), jobs=jobs, ends=ends, copied=c.copied)
    finally:
        stop(procs)


def run_steady(bootstrap, cluster, topo_csv, k, partitions, tag) -> dict:
    """k ingest and k analyse replicas while the flows are sent at 1x real time: CPU per stage, peak RSS, how far behind."""
    topic, job_topic = f"live-{tag}", f"livejobs-{tag}"
    ensure_topic(bootstrap, topic, partitions)
    ensure_topic(bootstrap, job_topic, partitions)
    ing = [start("ingest", bootstrap, topic, job_topic, f"live-{tag}", f"sum-live-{tag}", topo_csv, partitions, f"i{i}") for i in range(k)]
    ana = [start("analyse", bootstrap, topic, job_topic, f"live-{tag}", f"sum-live-{tag}", topo_csv, partitions, f"a{i}") for i in range(k)]
    try:
        wait_ready(ing + ana)
        load0 = os.getloadavg()[0]
        cpu0 = [sum(proc_stats(p.pid)[1] for p, _ in s) for s in (ing, ana)]
        p = FlowProducer(bootstrap, topic, fmt="arrow")
        t0 = time.monotonic()
        stream_flows(p, cluster.flows, speed=1.0)
        p.close()
        wall = time.monotonic() - t0
        end_s = cluster.flows["start_ns"].max() / 1e9
        behind = end_s - max(scrape(port, ("prism_analysed_until_timestamp_seconds",)).get("prism_analysed_until_timestamp_seconds", 0)
                             for _, port in ana)
        cpu1 = [sum(proc_stats(p.pid)[1] for p, _ in s) for s in (ing, ana)]
        load1 = os.getloadavg()[0]
        settle(ana, "prism_analysed_until_timestamp_seconds")
        rss = [[proc_stats(p.pid)[0] for p, _ in s] for s in (ing, ana)]
        jobs = sum(scrape(port, ("prism_jobs",)).get("prism_jobs", 0) for _, port in ana)
        return dict(k=k, n=len(cluster.flows), wall=wall, cpu=[b - a for a, b in zip(cpu0, cpu1)], rss=rss, behind=behind,
                    load=(load0, load1), jobs=jobs)
    finally:
        stop(ing + ana)


def job_topic_contents(values) -> tuple[int, int, int, dict]:
    """(flows, flow messages, control messages, {partition: flows}) of the job topic's messages (decoded after the floor, not timed)."""
    import pyarrow as pa

    flows = data = control = 0
    by_partition: dict[int, int] = {}
    for m in values:
        if any(h[0] == "prism-control" for h in (m.headers or [])):
            control += 1
            continue
        data += 1
        with pa.ipc.open_stream(m.value) as r:
            rows = sum(b.num_rows for b in r)
        flows += rows
        by_partition[m.partition] = by_partition.get(m.partition, 0) + rows
    return flows, data, control, by_partition


def row(stage: str, r: dict, floor: float) -> str:
    rss = ", ".join(f"{x:,.0f}" for x in r["rss"])
    return (f"| {stage} | {r['k']} | {r['n']:,} | {r['wall']:.1f} | {r['n'] / r['wall']:,.0f} | {r['wall'] / floor:.1f}x | {r['cpu']:.1f} | "
            f"{r['n'] / max(r['cpu'], 1e-9):,.0f} | {rss} | {r['load'][0]:.1f} -> {r['load'][1]:.1f} | {r['copied']:.1f} | {r.get('quiet', 0):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000, help="about this many flow records (the demo cluster for as long as it takes)")
    ap.add_argument("--replicas", default="1,2,3", help="replica counts to measure, for each stage")
    ap.add_argument("--partitions", type=int, default=6, help="partitions of the input topic and of the job topic")
    ap.add_argument("--quick", action="store_true", help="1,000,000 records (14 s of the demo cluster): a few minutes")
    args = ap.parse_args()
    records = 1_000_000 if args.quick else args.records
    counts = [int(x) for x in args.replicas.split(",")]
    if not counts or min(counts) < 1 or max(counts) > args.partitions:
        ap.error(f"--replicas: between 1 and --partitions ({args.partitions})")
    cluster = preset("demo", seed=0, duration_s=max(records / DEMO_RECORDS_PER_S, 5.0)).generate()
    n = len(cluster.flows)
    gpus = cluster.jobs["ip"].nunique()
    span = (cluster.flows["start_ns"].max() - cluster.flows["start_ns"].min()) / 1e9
    tmp = Path(tempfile.mkdtemp(prefix="prism-bench-"))
    topo_csv = tmp / "topology.csv"
    cluster.topology.to_csv(topo_csv, index=False)
    print(f"SYNTHETIC 'demo': {n:,} flows over {span:.1f} s, {gpus} GPUs in jobs ({n / span / gpus:.0f} records per GPU per second); "
          f"{args.partitions} partitions; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; daemon flags {' '.join(WINDOW)}\n")
    tag = str(time.time_ns())
    with LocalBroker() as b:
        source = f"flows-{tag}"
        ensure_topic(b.bootstrap, source, args.partitions)
        p = FlowProducer(b.bootstrap, source, fmt="arrow")
        stream_flows(p, cluster.flows, speed=0)
        p.flush()
        p.close()
        _, _, inputs = bare_consume(b.bootstrap, source)
        in_bytes, in_messages = sum(len(m.value) for m in inputs), len(inputs)
        print("Backlog: the replicas assigned on empty topics, then the records copied in from this process as fast as it can "
              "(the copy's own time in the last column):\n")
        print("| stage | replicas | records | wall s | records/s | x bare consumer | CPU s (all replicas) | records per CPU s | "
              "peak RSS per replica, MiB | load average | copy s | idle wait left out, s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        ingest_runs = []
        for k in counts:
            floor, _, _ = bare_consume(b.bootstrap, source)
            r = run_ingest(b.bootstrap, inputs, n, topo_csv, k, args.partitions, f"{tag}-i{k}")
            ingest_runs.append(r)
            print(row("ingest", r, floor), flush=True)
        del inputs
        first = ingest_runs[0]
        floor, _, forwarded = bare_consume(b.bootstrap, first["job_topic"])
        flows, data, control, by_partition = job_topic_contents(forwarded)
        job_bytes = sum(len(m.value) for m in forwarded)
        for k in counts:
            if k != counts[0]:
                floor, _, _ = bare_consume(b.bootstrap, first["job_topic"])
            r = run_analyse(b.bootstrap, first["topic"], forwarded, first["summaries"], flows, topo_csv, k, args.partitions, f"{tag}-a{k}")
            print(row("analyse", r, floor), flush=True)
        del forwarded
        print("\nSteady state: both stages at once, the flows sent at 1x real time (a window at every 2 s step, each flow in 5 windows):\n")
        print("| replicas per stage | records | ingest CPU s | ingest records per CPU s | analyse CPU s | analyse records per CPU s | "
              "peak RSS per replica, MiB (ingest; analyse) | analysed-until behind at the end | jobs | load average |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k in counts:
            r = run_steady(b.bootstrap, cluster, topo_csv, k, args.partitions, f"{tag}-{k}")
            (ci, ca), (ri, ra) = r["cpu"], r["rss"]
            print(f"| {k} | {r['n']:,} | {ci:.1f} | {r['n'] / max(ci, 1e-9):,.0f} | {ca:.1f} | {r['n'] / max(ca, 1e-9):,.0f} | "
                  f"{', '.join(f'{x:,.0f}' for x in ri)}; {', '.join(f'{x:,.0f}' for x in ra)} | {r['behind']:.1f} s | {r['jobs']:.0f} | "
                  f"{r['load'][0]:.1f} -> {r['load'][1]:.1f} |", flush=True)
        windows = span / 10.0  # --window 10s
        print(f"\nInput topic: {n:,} records in {in_messages:,} messages (one per GPU pair and 1 s slice, "
              f"{n / in_messages:,.0f} records each), {in_bytes / n:.0f} bytes a record.")
        print(f"Job topic of the {first['k']}-replica ingest run: {flows:,} GPU flows in {data:,} flow messages "
              f"({flows / max(data, 1):,.0f} flows each, {job_bytes / max(flows, 1):.0f} bytes a flow) and {control:,} control messages (watermarks, retires), "
              f"about {(data + control) / windows:,.0f} messages per 10 s window of event time. Flows by job-topic partition "
              f"(a job's flows are all in one): {', '.join(f'{p}: {by_partition.get(p, 0):,}' for p in range(args.partitions))}; "
              f"an analyse replica's share is its partitions' (the range assignor gives replica i of N consecutive partitions).")


if __name__ == "__main__":
    main()
