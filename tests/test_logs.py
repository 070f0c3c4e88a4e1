"""Logging setup: which library messages reach the operator."""
from __future__ import annotations

import io
import logging

import pytest

from prism.common.logs import setup_logging


@pytest.fixture
def restore_logging():
    loggers = [logging.getLogger(name) for name in ("", "kafka", "kafka.net.selector")]
    saved = [(lg, lg.level, list(lg.handlers)) for lg in loggers]
    yield
    for lg, level, handlers in saved:
        lg.setLevel(level)
        lg.handlers[:] = handlers


@pytest.mark.parametrize("level, slow_task_shown", [("info", False), ("warning", False), ("debug", True)])
def test_kafka_slow_task_warning_only_in_debug(restore_logging, level, slow_task_shown):
    """kafka-python 3's "blocking the event loop" warning is GIL contention on a busy machine: debug only; its errors
    and kafka-python's other warnings still show."""
    out = io.StringIO()
    setup_logging(level, stream=out)
    logging.getLogger("kafka.net.selector").warning("Task <t> ran for 0.194s (>0.100s threshold). It is blocking the event loop")
    logging.getLogger("kafka.net.selector").error("selector failed")
    logging.getLogger("kafka.conn").warning("Connection lost")
    text = out.getvalue()
    assert ("blocking the event loop" in text) is slow_task_shown
    assert "selector failed" in text and "Connection lost" in text
