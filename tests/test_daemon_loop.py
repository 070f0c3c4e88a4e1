"""The daemon loop's wait for an analysis, on stand-ins for the source and the monitor (a unit test of one class;
the loop over a real broker is tested in test_daemon.py)."""
from __future__ import annotations

import threading

import pytest

from prism.serve.daemon import Daemon
from prism.serve.metrics import Health


class _Monitor:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error, self.release = error, threading.Event()
        self.s = None

    def tick(self, final: bool = False, force: bool = False):
        self.release.wait()
        if self.error is not None:
            raise self.error
        return "view"


class _Source:
    """Keeps polling while the analysis runs; releases it after a few polls."""

    def __init__(self, monitor: _Monitor, polls_before_release: int = 3) -> None:
        self.monitor, self.polls_left, self.kept_alive = monitor, polls_before_release, 0

    def keep_alive(self, timeout_ms: int = 100) -> None:
        self.kept_alive += 1
        self.polls_left -= 1
        if self.polls_left <= 0:
            self.monitor.release.set()


def _analyse_on_a_thread(daemon: Daemon) -> dict:
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = daemon._analyse(final=False, force=False)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)  # a guard against the bug this tests (a loop that never ends), not a timing
    assert not t.is_alive(), "the daemon kept waiting for an analysis that had ended"
    return out


def test_the_source_is_kept_alive_until_the_analysis_returns():
    monitor = _Monitor()
    source = _Source(monitor)
    out = _analyse_on_a_thread(Daemon(source, monitor, Health()))  # type: ignore[arg-type]
    assert out == {"result": "view"} and source.kept_alive >= 3


@pytest.mark.parametrize("error", [TimeoutError("the analysis' own"), ValueError("bad window")])
def test_an_error_of_the_analysis_reaches_the_loop(error):
    """A TimeoutError raised by the analysis itself is an error, not 'not done yet' (the same class from Python 3.11)."""
    monitor = _Monitor(error=error)
    out = _analyse_on_a_thread(Daemon(_Source(monitor), monitor, Health()))  # type: ignore[arg-type]
    assert out.get("error") is error
