"""``prism collect`` (also ``python -m collectors``): capture files to flow records."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from prism.common.argtypes import non_negative_float, positive_int
from prism.common.output import EXIT_BAD_INPUT, EXIT_FAILED, add_output_flags, finish
from prism.ingest.formats import formats

DESCRIPTION = (
    "Decode pcap/pcapng captures of ERSPAN-mirrored (Type I, II, III) or plain host-side RoCEv2 traffic, assemble RDMA "
    "messages (FIRST..LAST or ONLY, keyed by source, destination and destination QP; mirror copies merged into one flow "
    "whose switches list the path, go-back-N retransmissions merged, sizes from IP/UDP lengths or RETH) and write one "
    f"flow record per message to a file ({', '.join(f.title for f in formats())}) or to Kafka in the daemon's format. ACKs, CNPs (per "
    "switch), READ requests and non-RoCE traffic are counted, not turned into flows. A file that is not a capture is "
    "counted and skipped; a capture cut short keeps its whole packets."
)


def _written() -> str:
    """The flow files --out writes, from the format registry: ``.parquet, .csv[.gz], ...``."""
    return ", ".join(f.suffixes[0] + ("[.gz]" if f.writes_gzip else "") for f in formats())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("captures", nargs="*", metavar="PCAP", help="capture files (pcap or pcapng) or directories of them, in time order")
    p.add_argument("--out", required=True, help=f"FILE ({_written()}) or kafka://HOST:PORT/TOPIC")
    p.add_argument("--switch-map", metavar="YAML", help="ERSPAN session id and/or mirror source address -> switch name: "
                   "{sessions: {17: leaf-03}, sources: {10.0.0.3: leaf-03}}; unmapped mirrors are named mirror-<address>/s<session>")
    p.add_argument("--follow", metavar="DIR", help="keep reading new capture files as they appear in DIR (rotated pcaps); "
                   "a file is read once it has not grown for --settle seconds. Stops on SIGTERM/SIGINT. With a file --out, flows are "
                   "written when it stops: use kafka:// for a long-running collector")
    p.add_argument("--settle", type=non_negative_float, default=2.0, metavar="SECONDS", help="with --follow: how long a file must be unchanged (default: %(default)s)")
    p.add_argument("--stats", metavar="FILE", help="write the counters (packets by status, CNPs per switch, messages) as JSON")
    p.add_argument("--batch-packets", type=positive_int, default=1 << 18, metavar="N", help="packets decoded per slice; about 250 bytes each (default: %(default)s)")
    p.add_argument("--web.listen-address", dest="listen", default=None, metavar="HOST:PORT",
                   help="with --follow: serve the counters as Prometheus metrics (prism_collector_*)")
    p.add_argument("--web.config.file", dest="web_config", default=None, metavar="YAML",
                   help="TLS and basic auth for --web.listen-address, in the Prometheus exporter-toolkit format")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    add_output_flags(p, "packets read but no RoCEv2 message became a flow")
    from prism.serve.kafkaconf import add_security_flags

    add_security_flags(p)  # for --out kafka://


def run(args) -> int:
    from prism.serve.kafkaconf import KafkaConnectError, check_connection, security_from_args

    from .assemble import SwitchMap
    from .collect import Collector, capture_files, open_sink, packets_hint

    if not args.captures and not args.follow:
        print("prism collect: give capture files (or --follow DIR)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        switch_map = SwitchMap.load(args.switch_map) if args.switch_map else SwitchMap()
        files = capture_files(args.captures)
        missing = [f for f in files if not Path(f).exists()]
        if missing:
            raise ValueError(f"no such file: {', '.join(missing)}")
        if args.web_config:
            if not (args.follow and args.listen):
                raise ValueError("--web.config.file needs --follow and --web.listen-address (it secures the metrics endpoint)")
            from prism.serve.webconfig import load_web_config

            load_web_config(args.web_config)
        security = security_from_args(args)
        sink = open_sink(args.out, security, check=check_connection)
    except ValueError as e:
        print(f"prism collect: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KafkaConnectError as e:
        print(f"prism collect: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    import logging

    from prism.common.kernels import log_compile_state

    log_compile_state(logging.getLogger("prism.collect"), "first capture")
    bar = None
    if not args.quiet and not args.follow and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=packets_hint(files), unit="pkt", unit_scale=True, file=sys.stderr)
    collector = Collector(sink, switch_map, args.batch_packets, progress=bar.update if bar else None)
    server, beat = None, (lambda: None)
    if args.follow and args.listen:
        server, beat = _serve_metrics(collector, args.listen, args.web_config)
    try:
        for f in files:
            collector.add_file(f)
        if args.follow:
            _follow(collector, Path(args.follow), args.settle, quiet=args.quiet, beat=beat)
    finally:
        if bar is not None:
            bar.close()
        collector.close()
        if server is not None:
            server.stop()
    summary = collector.summary()
    if args.stats:
        Path(args.stats).write_text(json.dumps(summary, indent=2) + "\n")
    return finish(args, "collect", {**summary, "out": args.out}, _warnings(args, summary), text=lambda: _format_summary(summary, args.out))


def _warnings(args, s: dict) -> list[str]:
    """Results that are probably not what the user meant (exit 1 with --strict)."""
    from .collect import CAPTURE_SUFFIXES, capture_files

    out = [f"{d}: no capture files (*{', *'.join(CAPTURE_SUFFIXES)}) in this directory" for d in args.captures
           if Path(d).is_dir() and not capture_files([d])]
    out += [f"not a capture, skipped: {line}" for line in s["bad_files"]]
    out += [f"cut short: {line}" for line in s["truncated_files"]]
    if s["files"] and s["packets"] and not s["flows"]:
        out.append("packets were read but no RoCEv2 message became a flow record (is this ERSPAN-mirrored or host RoCEv2 traffic?)")
    if s["unmapped_mirrors"]:
        out.append(f"mirrors not in --switch-map, named by address: {', '.join(s['unmapped_mirrors'][:8])}")
    return out


def _format_summary(s: dict, out: str) -> str:
    rate = f", {s['packets_per_second']:,} packets/s" if s["packets_per_second"] else ""
    lines = [f"read {s['files']} capture(s), {s['packets']:,} packets in {s['seconds']:.2f}s{rate}"]
    for name, n in sorted(s["packets_by_status"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:<22} {n:>12,}")
    lines.append(f"wrote {s['flows']:,} flows to {out}: {s.get('mirror_copies', 0):,} mirror copies merged, "
                 f"{s.get('retransmitted_packets', 0):,} retransmitted packets, {s.get('incomplete_messages', 0):,} incomplete messages"
                 + (f", {s['bad_timestamp_messages']:,} with impossible timestamps (dropped)" if s.get("bad_timestamp_messages") else ""))
    if s["cnp_by_switch"]:
        top = sorted(s["cnp_by_switch"].items(), key=lambda kv: -kv[1])[:5]
        lines.append("CNPs (congestion) by switch: " + ", ".join(f"{k or '(host)'} {v:,}" for k, v in top))
    return "\n".join(lines)


def _follow(collector, directory: Path, settle: float, quiet: bool, beat) -> None:
    from .collect import CAPTURE_SUFFIXES

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    seen: dict[str, tuple[int, float]] = {}
    done: set[str] = set()
    while not stop:
        beat()
        now = time.monotonic()
        for f in sorted(directory.iterdir()) if directory.is_dir() else []:
            if f.suffix not in CAPTURE_SUFFIXES or str(f) in done:
                continue
            size = f.stat().st_size
            prev = seen.get(str(f))
            if prev is None or prev[0] != size:
                seen[str(f)] = (size, now)
            elif now - prev[1] >= settle:
                n = collector.add_file(f)
                done.add(str(f))
                if not quiet:
                    print(f"{f.name}: {n:,} packets, {int(collector.stats.counts['messages']):,} flows so far", file=sys.stderr)
        time.sleep(0.2)


def _serve_metrics(collector, address: str, web_config: str | None = None):
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily

    from prism.serve.metrics import Health, MetricsServer

    class CollectorMetrics:
        def collect(self):
            s = collector.stats
            pk = CounterMetricFamily("prism_collector_packets", "Packets decoded, by status.", labels=["status"])
            for k, v in sorted(s.packets.items()):
                pk.add_metric([k], v)
            yield pk
            cnp = CounterMetricFamily("prism_collector_cnp", "RoCE congestion notification packets, by mirroring switch.", labels=["switch"])
            for k, v in sorted(s.cnp_by_switch.items()):
                cnp.add_metric([k], v)
            yield cnp
            for name, help_ in [("messages", "RDMA messages written as flow records."),
                                ("incomplete_messages", "Messages whose first or last packet was never seen."),
                                ("bad_timestamp_messages", "Messages dropped for impossible timestamps (before 1970, or packets over 60 s apart): a corrupt capture clock."),
                                ("retransmitted_packets", "Packets seen again at the same mirror (go-back-N)."),
                                ("mirror_copies", "Copies of a packet from further mirror points, merged."),
                                ("bad_files", "Files that were not readable captures.")]:
                yield CounterMetricFamily(f"prism_collector_{name}", help_, value=s.counts[name])

    registry = CollectorRegistry()
    registry.register(CollectorMetrics())
    health = Health()
    health.ready = True
    server = MetricsServer(registry, health, address, web_config=web_config)
    server.start()
    print(f"metrics on {server.url}", file=sys.stderr)
    return server, health.beat


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m collectors", description=DESCRIPTION)
    add_arguments(p)
    return run(p.parse_args(argv))
