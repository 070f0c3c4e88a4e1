"""``prism replay``: captured flow dumps analysed offline."""
from __future__ import annotations

import argparse
import sys
from concurrent.futures.process import BrokenProcessPool

from prism.analysis.analyse import DEFAULT_SLICE_FLOWS
from prism.common.argtypes import bounded_int, existing_directory, non_negative_int, output_directory, seconds, slice_size
from prism.common.output import EXIT_BAD_INPUT, EXIT_FAILED, add_output_flags, finish
from prism.ingest.formats import by_name, formats, suffixes
from prism.ingest.readers import DEFAULT_CHUNK_ROWS, STDIN_FORMAT
from prism.offline.spill import DEFAULT_SPILL_ABOVE, SpillError

#: --chunk-rows at most: 16 Mi rows, about 20 GiB at peak (beyond that a chunk bounds no memory, and Arrow's
#: slicing takes a C long: a larger number overflowed it)
MAX_CHUNK_ROWS = 1 << 24
#: --workers at most (more processes than that is a typo on any machine this runs on)
MAX_WORKERS = 1024


def _read_formats() -> str:
    """The formats replay reads, from the format registry: ``Parquet, CSV or JSON Lines``."""
    titles = [f.title for f in formats()]
    return ", ".join(titles[:-1]) + " or " + titles[-1] if len(titles) > 1 else titles[0]


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="analyse captured flow dumps offline",
        description=(
            f"Read flow records ({_read_formats()}, optionally .gz; - for {by_name(STDIN_FORMAT).title} on stdin), "
            "recognise jobs, tell DP from PP pairs, reconstruct every job's training steps, diagnose slow steps, "
            "slow servers and slow switches, and write jobs.csv, pairs.csv, steps.csv, phases.csv, anomalies.csv, "
            "switches.csv, timeline.json (open it in ui.perfetto.dev) and summary.json to --out. Malformed rows "
            "are counted by reason and skipped; traffic to or from addresses not in the topology (storage, "
            "management) is counted and kept out of jobs."
        ),
    )
    p.add_argument("flows", nargs="+", metavar="FLOWS", help=f"flow files ({', '.join(suffixes())}, each optionally .gz), in time order")
    p.add_argument("--topology", required=True, help="CSV with ip,server (optional rail,leaf): one row per GPU NIC")
    p.add_argument("--out", required=True, type=output_directory, help="output directory (made if missing)")
    p.add_argument("--chunk-rows", type=bounded_int(1, MAX_CHUNK_ROWS), default=DEFAULT_CHUNK_ROWS,
                   help=f"rows per chunk; bounds memory, about 1.2 KiB per row at peak, {MAX_CHUNK_ROWS:,} at most (default: %(default)s)")
    p.add_argument("--progress", dest="progress", action="store_true", default=None, help="always show a progress bar")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    add_output_flags(p)
    p.add_argument(
        "--stop-after", choices=["jobs", "pairs", "steps", "diagnosis"], default="diagnosis",
        help="last analysis to run: 'jobs' is a quick job inventory whose memory does not grow with the flows; "
        "'pairs' adds DP/PP types, 'steps' the step timelines, 'diagnosis' the anomalies (default: %(default)s)",
    )
    p.add_argument("--plots", action="store_true", help="also write steps.png (step time per job, anomalies marked) and switches.png (bandwidth heat map)")
    p.add_argument(
        "--switch-window", type=seconds, default=None, metavar="SECONDS",
        help="window of the switch bandwidth comparison, aligned to the epoch, at most 7 days (default: 300; LLMPrism used 3600)",
    )
    p.add_argument(
        "--spill-above", type=non_negative_int, default=DEFAULT_SPILL_ABOVE, metavar="FLOWS",
        help="GPU flows held in memory (32 B each) at most; past it they are written to --spill-dir and analysed a "
        "batch of whole jobs at a time, with the same results, so memory no longer grows with the capture "
        "(0: always; default: %(default)s)",
    )
    p.add_argument("--spill-dir", type=existing_directory, default=None, metavar="DIR",
                   help="where spilled flows go, up to 64 B per GPU flow (default: the system's temporary directory, $TMPDIR)")
    p.add_argument(
        "--slice-flows", type=slice_size, default=DEFAULT_SLICE_FLOWS, metavar="FLOWS",
        help="a job with more GPU flows is analysed this many at a time, in time slices that overlap by a few steps, "
        "the results stitched: memory then follows the slice, not the job's length (with --spill-above, a capture "
        "of any length fits). A slice must hold ten or more of the job's steps (default: %(default)s)",
    )
    p.add_argument(
        "--workers", type=bounded_int(1, MAX_WORKERS), default=1, metavar="N",
        help="processes that analyse the jobs once every flow is read and the jobs are recognised (a process pool on this "
        "machine, sharing the flows in memory); the outputs are the same, byte for byte (default: %(default)s)",
    )
    p.add_argument(
        "--scheduler", default=None, metavar="ADDRESS",
        help="analyse the jobs on Dask distributed instead (pip install 'prism-netdiag[distributed]'): a scheduler's "
        "tcp://HOST:PORT, or 'local' for a local cluster of --workers processes. This process then keeps no flow: each "
        "task reads its jobs' flows from the FLOWS Parquet files, which every worker must open at the same paths",
    )
    p.add_argument(
        "--job-names", default=None, metavar="CSV",
        help="an inventory of the scheduler's job names: CSV with job_name and server (or ip, a GPU NIC of --topology), one "
        "row each; a job is named by what most of its servers carry, in jobs.csv (a job_name column) and the summary",
    )
    p.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    from prism.analysis.analyse import Settings
    from prism.ingest.inventory import JobNames
    from prism.ingest.records import FlowFormatError
    from prism.ingest.topology import Topology
    from prism.offline.replay import format_summary, replay
    from prism.offline.workers import EngineError

    try:
        topo = Topology.from_csv(args.topology)
        names = JobNames.from_csv(args.job_names, topo) if args.job_names else None
        kw = {"switch_window_s": args.switch_window} if args.switch_window else {}
        progress = False if args.output == "json" and args.progress is None else args.progress
        res = replay(args.flows, topo, out_dir=args.out, chunk_rows=args.chunk_rows, progress=progress, stop_after=args.stop_after, plots=args.plots,
                     spill_above=args.spill_above, spill_dir=args.spill_dir, settings=Settings(slice_flows=args.slice_flows),
                     workers=args.workers, scheduler=args.scheduler, job_names=names, **kw)
    except EngineError as e:  # --scheduler: not installed, not reachable, or inputs its workers cannot read
        print(f"prism replay: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenProcessPool as e:  # a --workers process was killed (the kernel's OOM killer, say)
        print(f"prism replay: error: a worker process died before its jobs were analysed ({e}); each holds its jobs' flows and "
              "their analysis: fewer --workers need less memory", file=sys.stderr)
        return EXIT_FAILED
    except SpillError as e:  # the disk, not the input
        print(f"prism replay: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except (FlowFormatError, FileNotFoundError) as e:
        print(f"prism replay: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    summary = res.summary()
    warnings = summary.pop("warnings")
    return finish(args, "replay", {**summary, "out": str(args.out)}, warnings, text=lambda: f"{format_summary(res)}\nresults in {args.out}")
