"""What-if replay: execution graphs from observed timelines, simulated under scenarios.

:mod:`.graph` holds the graph and the simulator; :mod:`.optrace`,
:mod:`.netreplay` and :mod:`.kineto` build graphs from op-level traces,
from ``prism replay`` output and from PyTorch profiler traces of every
rank; :mod:`.scenarios` changes durations; :mod:`.run` is the front-end
of ``prism whatif``.
"""
__all__ = ["ExecutionGraph", "GraphCycleError", "SimResult", "simulate"]


def __getattr__(name):
    # loaded when used: the CLI imports .scenarios for its --help text, and
    # .graph brings numba (half a second at every start of every command)
    if name in __all__:
        from prism.whatif import graph

        return getattr(graph, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
