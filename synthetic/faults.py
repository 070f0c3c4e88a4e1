"""Injectable faults (SYNTHETIC), recorded in the ground truth."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SlowStep", "SlowServer", "DegradedSwitch", "DegradedLink", "SlowNic", "Hang", "Restart"]


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
    The window is given as fractions of the capture window. Each transfer
    through it runs at ``factor`` of the link's speed whatever else crosses
    it, unless ``shared``.
    """

    switch: str = "auto"
    start_frac: float = 0.4
    end_frac: float = 1.0
    factor: float = 0.25
    #: the jobs crossing the switch contend for it: ``factor`` is then its capacity while degraded, in units of
    #: one job's traffic at full speed, split equally between the k jobs whose DP or pipeline transfers cross it
    #: (each at ``min(1, factor / k)``), as if their transfers always overlapped. Recorded in the truth with
    #: that share as its factor.
    shared: bool = False
    #: jobs whose traffic is routed around the switch (a spine: ECMP's pick replaced by the next spine), as if
    #: moved off it: they do not cross it, nor count among the jobs sharing it (the truth of the what-if's
    #: ``move-job`` scenario)
    moved: tuple[str, ...] = ()


@dataclass(frozen=True)
class DegradedLink:
    """One link between two switches passes traffic at ``factor`` of its bandwidth for a while.

    ``link`` is ``"A>B"`` in the direction traffic crosses it, as
    ``switches.csv`` names links: a leaf's uplink ``leaf-g00-r0>spine-00``,
    a downlink ``spine-00>leaf-g00-r0``. Only the transfers whose path
    takes that hop are slowed; the rest of both switches is healthy. The
    window is given as fractions of the capture window. Recorded in the
    truth as a ``slow_link`` fault naming the link.
    """

    link: str
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


@dataclass(frozen=True)
class Hang:
    """``job`` hangs in the collective of whole step ``step``: server ``member`` never joins it.

    ``member`` is the position of the server within the job's servers. The
    step's pipeline traffic runs as usual; at its gradient collective the
    member's GPUs send nothing, the others send their first message on
    each ring edge and wait: the job sends nothing more. The hung step is
    not whole, so it is not in ``steps.csv``; ``faults.csv`` has a
    ``hang`` row: its step, when the collective began (``start_ns``), the
    capture's end (``end_ns``) and the server that never joined
    (``subject``). The job needs DP > 1 (a collective on the network).
    """

    job: str
    step: int
    member: int = 0


@dataclass(frozen=True)
class Restart:
    """``job`` stops in the middle of whole step ``step`` (or of the first step to begin ``after_s`` into the capture)
    and restarts from a checkpoint ``outage_s`` later.

    The step's traffic is cut halfway through its compute (before its
    collective); the job is silent for ``outage_s``, then runs on from a
    new step on the same servers, except server ``replaced_server`` (its
    position within the job's servers), replaced by an idle server of the
    fabric. Neither the broken step nor the first step after the restart
    (its start, the checkpoint load and first compute, sends nothing) is
    whole: ``steps.csv`` skips both and numbers on. ``faults.csv`` has a
    ``restart`` row: the broken step, the stop (``start_ns``), the restart
    (``end_ns``) and ``old>new`` server names (``subject``).
    """

    job: str
    step: int = -1
    outage_s: float = 30.0
    replaced_server: int = 0
    after_s: float | None = None
