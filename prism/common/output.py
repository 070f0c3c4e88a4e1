"""What the commands print and return: ``-o text|json``, ``--strict`` warnings, and the exit codes.

Exit codes, the same for every command:

==  ===========================================================================
0   done (warnings, if any, on stderr)
1   done but failed: with ``--strict``, any warning; ``prism demo``, results
    that differ from the ground truth; Kafka unreachable or refusing us
2   usage or input error: a bad flag or setting, a file that cannot be read
    or parsed (the message names the flag, file, line or field)
130 interrupted (Ctrl-C)
==  ===========================================================================
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_BAD_INPUT", "add_output_flags", "finish"]

EXIT_OK = 0
EXIT_FAILED = 1  # findings or failed checks (demo: results differ from the truth; Kafka unreachable)
EXIT_BAD_INPUT = 2  # usage or input error: a bad flag, a file that cannot be read or parsed


def add_output_flags(p: argparse.ArgumentParser, warning_example: str = "a topology that matches no flow") -> None:
    """``-o text|json`` and ``--strict``, for the commands scripts run; ``warning_example`` is one of the command's warnings."""
    p.add_argument("-o", "--output", choices=["text", "json"], default="text",
                   help="text (default) or json: the summary as one JSON document on stdout, for scripts")
    p.add_argument("--strict", action="store_true", help=f"exit 1 when there are warnings (e.g. {warning_example})")


def finish(args: argparse.Namespace, command: str, summary: dict, warnings: list[str], text: Callable[[], str] | None = None) -> int:
    """Print the result (text or JSON) and the warnings; the exit status (1 on warnings with --strict)."""
    if args.output == "json":
        print(json.dumps({**summary, "warnings": warnings}, default=str))
    else:
        for w in warnings:
            print(f"prism {command}: warning: {w}", file=sys.stderr)
        if text is not None and not getattr(args, "quiet", False):
            print(text())
    return EXIT_FAILED if args.strict and warnings else EXIT_OK
