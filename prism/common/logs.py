"""Prometheus-style logging: ``--log.level`` and ``--log.format=logfmt|json`` on every command.

Records go to stderr as one line each, the way Prometheus and its exporters
log (go-kit style)::

    ts=2026-11-23T06:10:00.123Z level=info logger=prism.daemon msg="starting" window=120s step=15s gpus=2048

or, with ``--log.format=json``, as one JSON object per line with the same
keys. Fields beyond the message are passed as ``extra={"fields": {...}}``.

>>> import io
>>> stream = io.StringIO()
>>> setup_logging("info", "logfmt", stream=stream)
>>> logging.getLogger("prism.test").info("starting up", extra={"fields": {"window": "120s", "note": 'has "quotes"'}})
>>> line = stream.getvalue()
>>> line.split(" ", 1)[1].strip()
'level=info logger=prism.test msg="starting up" window=120s note="has \\\\"quotes\\\\""'
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import IO

__all__ = ["setup_logging", "add_log_flags", "LOG_LEVELS", "LOG_FORMATS", "LogfmtFormatter", "JsonFormatter"]

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("logfmt", "json")
_LEVEL_NAMES = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error", "CRITICAL": "error"}


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict:
    out = {"ts": _timestamp(record), "level": _LEVEL_NAMES.get(record.levelname, record.levelname.lower()),
           "logger": record.name, "msg": record.getMessage()}
    out.update(getattr(record, "fields", None) or {})
    if record.exc_info:
        out["err"] = logging.Formatter().formatException(record.exc_info)
    return out


def _logfmt_value(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value) if isinstance(value, (bool, type(None))) else str(value)
    if text == "" or any(c in text for c in ' ="\\\n\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'
    return text


class LogfmtFormatter(logging.Formatter):
    """``key=value`` pairs, values quoted when they hold spaces, ``=`` or quotes."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record).items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


class _CliHandler(logging.StreamHandler):
    """The handler :func:`setup_logging` adds: marked, so a later call replaces it and leaves a host program's be."""

    prism_cli = True


def setup_logging(level: str = "info", fmt: str = "logfmt", stream: IO[str] | None = None) -> None:
    """Route every logger (Prism's and its libraries') to one stderr handler in ``fmt`` (replacing the one an earlier call added)."""
    level, fmt = str(level).lower(), str(fmt).lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"--log.level: expected one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if fmt not in LOG_FORMATS:
        raise ValueError(f"--log.format: expected one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    handler = _CliHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "prism_cli", False):  # ours from an earlier call; other handlers (a host program's) stay
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # kafka-python logs each reconnect attempt at INFO/WARNING with a traceback; its errors still show
    logging.getLogger("kafka").setLevel(max(root.level, logging.WARNING) if level != "debug" else logging.DEBUG)
    # kafka-python 3's network thread warns "Task ... ran for 0.2s ... blocking the event loop" whenever one of its steps
    # takes over 0.1 s of wall time. In Prism that is the analysis holding the GIL on a busy machine, not a stuck client;
    # the operator's signal is prism_consumer_lag_records. Shown with --log.level debug.
    logging.getLogger("kafka.net.selector").setLevel(logging.ERROR if level != "debug" else logging.DEBUG)


def add_log_flags(parser: argparse.ArgumentParser, defaults: bool = True) -> None:
    """Add ``--log.level`` and ``--log.format`` to a command's parser."""
    g = parser.add_argument_group("logging")
    g.add_argument("--log.level", dest="log_level", default="info" if defaults else None, choices=LOG_LEVELS if defaults else None,
                   metavar="LEVEL", help=f"{', '.join(LOG_LEVELS)} (default: info)")
    g.add_argument("--log.format", dest="log_format", default="logfmt" if defaults else None, choices=LOG_FORMATS if defaults else None,
                   metavar="FORMAT", help="logfmt or json, one record per line on stderr (default: logfmt)")
