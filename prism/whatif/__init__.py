"""What-if replay: execution graphs from observed timelines, simulated under scenarios.

:mod:`.graph` holds the graph and the simulator, :mod:`.optrace` and
:mod:`.netreplay` build graphs from op-level traces and from ``prism
replay`` output, :mod:`.scenarios` changes durations, :mod:`.run` is the
front-end of ``prism whatif``.
"""
from .graph import ExecutionGraph, GraphCycleError, SimResult, simulate

__all__ = ["ExecutionGraph", "GraphCycleError", "SimResult", "simulate"]
