"""The daemon loop's wait for an analysis, on stand-ins for the source and the monitor (a unit test of one class;
the loop over a real broker is tested in test_daemon.py)."""
from __future__ import annotations

import threading

import pytest

from prism.serve.daemon import Daemon
from prism.serve.metrics import Health
from prism.serve.monitor import MonitorSettings


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


# -- the idle flush: the tail is analysed as final once the input is quiet, and only then ----------------------------

class _Tail:
    """A monitor with input past its last analysis and no window due: only the idle flush analyses it."""

    def __init__(self) -> None:
        self.s = MonitorSettings(idle_flush_s=3.0)
        self.ticks: list[tuple[float, bool]] = []  # (the loop's clock, final) of each analysis
        self.clock = lambda: 0.0

    def due(self) -> bool:
        return False

    def pending(self) -> bool:
        return not self.ticks

    def recent_incomplete(self) -> int:
        return 0

    def counters_snapshot(self) -> dict:
        return {}

    def tick(self, final: bool = False, force: bool = False):
        self.ticks.append((self.clock(), final))


class _Script:
    """A source read through a script, one entry a poll of one second of the loop's clock: (messages read, caught up);
    the daemon stops at its end. ``caught_up`` is left off with ``knows=False`` (a source that cannot tell)."""

    ready = True

    def __init__(self, daemon_clock: list, script: list[tuple[int, bool]], knows: bool = True) -> None:
        self.now, self.script, self.daemon = daemon_clock, list(script), None
        self._caught_up = True
        if knows:
            self.caught_up = lambda: self._caught_up

    def poll(self, monitor, timeout_ms: int = 500) -> int:
        self.now[0] += 1.0
        if not self.script:
            self.daemon.stop()
            return 0
        got, self._caught_up = self.script.pop(0)
        return got

    def lag(self):
        return None

    def publish(self, only=None) -> None:
        pass

    def commit(self, only=None) -> None:
        pass


def _flushes(script: list[tuple[int, bool]], knows: bool = True) -> list[tuple[float, bool]]:
    now = [0.0]
    monitor = _Tail()
    monitor.clock = lambda: now[0]
    source = _Script(now, script, knows)
    daemon = Daemon(source, monitor, Health())  # type: ignore[arg-type]
    daemon.clock = lambda: now[0]
    source.daemon = daemon
    daemon.run()
    return monitor.ticks


def test_quiet_input_is_flushed_after_the_idle_wait():
    """Records at 1 s, then polls that read nothing with the source caught up: the tail goes at the first poll more
    than 3 s later (5 s), as final; with a source that cannot tell (a directory), the same."""
    script = [(10, True)] + [(0, True)] * 6
    assert _flushes(script) == [(5.0, True)]
    assert _flushes(script, knows=False) == [(5.0, True)]


def test_a_source_not_caught_up_is_not_quiet_input():
    """A consumer that reads nothing because it is rejoining its group (no partition held, or revoked and not yet
    assigned) or is behind its high watermarks has input still to read: the tail waits (the bundled broker's group
    churn has lasted 38 s; a flush meanwhile made everything read after it late). Quiet counts from when it is
    caught up again: records at 1 s, 20 s not caught up (2-21 s), caught up from 22 s: the flush comes at 25 s."""
    script = [(10, True)] + [(0, False)] * 20 + [(0, True)] * 6
    assert _flushes(script) == [(25.0, True)]
