"""The ``prism`` command line: a thin front door, one module per command.

Flags follow Prometheus' style (``--web.listen-address``) where they name a
setting of a long-running component; one-shot commands take plain options.
"""
from __future__ import annotations

import argparse
import atexit
import os
import sys
from collections.abc import Sequence

from prism import __version__
from prism.cli import alerts, collect, daemon, demo, replay, synth, whatif
from prism.common.allocator import tune_for_batch
from prism.common.logs import add_log_flags, setup_logging
from prism.common.output import EXIT_BAD_INPUT

__all__ = ["BATCH_COMMANDS", "QUICK_EXIT_COMMANDS", "build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prism",
        description="Prism: black-box performance diagnosis of LLM training jobs from mirrored RoCEv2 network flows.",
        epilog="Run 'prism COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"prism {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # in the order data flows: capture -> daemon or replay -> what-if; then deployment and test data
    demo.add_command(sub)
    collect.add_command(sub)
    daemon.add_command(sub)
    replay.add_command(sub)
    whatif.add_command(sub)
    alerts.add_command(sub)
    synth.add_command(sub)
    for name, p in sub.choices.items():
        if name != "daemon":  # the daemon's come with its other settings (flags or --config.file)
            add_log_flags(p)
    return parser


# Short-lived commands that allocate and free large arrays: they get the
# allocator settings of prism.common.allocator. The daemon and `collect --follow`
# run for months and keep the defaults, which give memory back after a burst.
BATCH_COMMANDS = frozenset({"replay", "whatif", "synth", "demo"})


# Commands after which the `prism` command skips the interpreter's teardown (see run()).
QUICK_EXIT_COMMANDS = frozenset({"replay", "whatif", "synth"})


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status (the `prism` command calls :func:`run`, tests call this)."""
    return _execute(build_parser().parse_args(argv))


def run() -> None:
    """The `prism` command and ``python -m prism``: :func:`main`, then the process's exit.

    A replay, what-if or synth that has written its outputs exits without
    the interpreter's teardown: disposing of every compiled kernel's LLVM
    objects and freeing each object one by one took 0.2-0.3 s after the
    work was done, a twentieth of a large replay. Exit handlers still run
    (logging's flush among them) and the standard streams are flushed
    first.
    """
    args = build_parser().parse_args()
    rc = _execute(args)
    exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if getattr(args, "command", None) in QUICK_EXIT_COMMANDS and exit_handlers is not None:
        exit_handlers()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more to say
                pass
        os._exit(rc)
    raise SystemExit(rc)


def _execute(args: argparse.Namespace) -> int:
    if not getattr(args, "func", None):
        build_parser().print_help()
        return EXIT_BAD_INPUT
    if args.command != "daemon":
        setup_logging(args.log_level, args.log_format)
    if args.command in BATCH_COMMANDS:
        tune_for_batch()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into head
        return 0


if __name__ == "__main__":
    run()
