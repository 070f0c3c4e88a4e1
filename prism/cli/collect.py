"""``prism collect``: the collectors' command line (it lives in :mod:`collectors.cli`)."""
from __future__ import annotations

import argparse


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from collectors.cli import DESCRIPTION, add_arguments, run

    p = sub.add_parser("collect", help="captures (ERSPAN-mirrored or host-side RoCEv2 pcaps) to flow records", description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)
