"""``prism daemon``: the long-running service, as a command.

Its settings (flags, defaults, checks, ``--config.file``) are in
:mod:`prism.serve.settings` and its wiring in :mod:`prism.serve.build`;
this module turns the flags into argparse arguments, and owns what only a
process has: logging set up, signals, the exit code.
"""
from __future__ import annotations

import argparse
import sys

from prism.common.logs import setup_logging
from prism.common.output import EXIT_BAD_INPUT, EXIT_OK
from prism.serve.settings import DAEMON_FLAGS

__all__ = ["add_command", "cmd_daemon"]


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``daemon`` subcommand, one argument per daemon setting (all default to None: see :func:`prism.serve.settings.resolve_settings`)."""
    p = sub.add_parser(
        "daemon",
        help="the monitoring daemon: flow records from Kafka (or a directory) in, Prometheus metrics out",
        description=(
            "Consume flow records from a Kafka topic (consumer group; JSON Lines or Arrow IPC messages) or tail a "
            "directory of flow dumps, keep a sliding window of GPU flows, and every --window.step of event time run "
            "the same analyses as 'prism replay' on the window: jobs, DP/PP pairs, step timelines, slow steps, "
            "lagging pipeline groups, slow switches. Results are served as Prometheus metrics on "
            "--web.listen-address (/metrics, /healthz, /readyz). Offsets are committed after each window's results "
            "are published. Every flag can also be set in --config.file (YAML, same keys without the dashes)."
        ),
    )
    for flag, kw in DAEMON_FLAGS.items():
        p.add_argument(flag, **kw)
    p.set_defaults(func=cmd_daemon)


def cmd_daemon(args: argparse.Namespace) -> int:
    """Resolve the settings, build the daemon, run it until SIGTERM or Ctrl-C; the exit code."""
    import signal

    from prism.serve.settings import resolve_settings

    try:
        settings = resolve_settings(vars(args))
    except ValueError as e:
        print(f"prism daemon: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    setup_logging(settings.log_level, settings.log_format)
    from prism.serve.build import StartupError, build_daemon

    def exit_while_starting(*_):  # SIGTERM before the loop runs (Kafka still connecting, say): a clean exit
        raise SystemExit(EXIT_OK)  # the web server's thread is a daemon thread: it ends with the process

    signal.signal(signal.SIGTERM, exit_while_starting)
    try:
        service = build_daemon(settings, log_startup=True)
    except StartupError as e:
        print(f"prism daemon: error: {e}", file=sys.stderr)
        return e.exit_code
    signal.signal(signal.SIGTERM, lambda *_: service.daemon.stop())
    try:
        service.run()
    except KeyboardInterrupt:
        pass
    return EXIT_OK
