"""Injectable faults (SYNTHETIC), recorded in the ground truth."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SlowStep", "SlowServer", "DegradedSwitch", "SlowNic"]


@dataclass(frozen=True)
class SlowStep:
    """Every rank of ``job`` computes ``factor`` times slower in one step.

    ``step`` counts whole steps inside the capture window from 0 (the
    numbering of the ground-truth ``steps.csv``).
    """

    job: str
    step: int
    factor: float = 1.6


@dataclass(frozen=True)
class SlowServer:
    """One server of ``job`` computes ``factor`` times slower from ``from_step`` on.

    ``server`` is the position of the server within the job's servers; its
    whole DP replica (and so, at the collective, the whole job) waits for it.
    """

    job: str
    server: int
    from_step: int
    factor: float = 1.3


@dataclass(frozen=True)
class DegradedSwitch:
    """A switch passes traffic at ``factor`` of its bandwidth for a while.

    ``switch`` is a switch name or ``"auto"`` (the switch carrying the most
    DP ring edges of the first multi-replica job: a fault that matters).
    The window is given as fractions of the capture window.
    """

    switch: str = "auto"
    start_frac: float = 0.4
    end_frac: float = 1.0
    factor: float = 0.25


@dataclass(frozen=True)
class SlowNic:
    """One server of ``job`` moves its network transfers ``factor`` times slower, on every link it uses.

    A slow NIC (or a host that paces its own traffic): the server's flows,
    sent and received, take ``factor`` times as long whatever switches and
    links they cross; nothing in the fabric is degraded. ``server`` is the
    position of the server within the job's servers, as for
    :class:`SlowServer`. For the whole capture; recorded in the truth as a
    ``slow_nic`` fault naming the server.
    """

    job: str
    server: int
    factor: float = 2.0
