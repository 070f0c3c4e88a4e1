"""Megatron's non-interleaved 1F1B schedule, call by call (``microbatches:M``, ``scale-pp:N``).

Stage k of P warms up with ``min(P - k - 1, M)`` forwards, alternates one
forward and one backward, and cools down with the remaining backwards; in
the steady phase a send and the next receive are one batched call (as
Megatron's ``send_forward_recv_backward`` / ``send_backward_recv_forward``).
:mod:`.repartition` lays each rank's step out from these calls.
"""
from __future__ import annotations

__all__ = ["one_f_one_b_calls"]


def one_f_one_b_calls(stage: int, stages: int, m: int) -> list[list[tuple[str, int]]]:
    """The calls of one stage, in order; each call is a list of (optype, micro-batch) issued together.

    >>> one_f_one_b_calls(1, 2, 2)
    [[('forward-recv', 0)], [('forward-compute', 0)], [('backward-compute', 0)], [('backward-send', 0), ('forward-recv', 1)], [('forward-compute', 1)], [('backward-compute', 1)], [('backward-send', 1)]]
    """
    first, last = stage == 0, stage == stages - 1
    warm = min(stages - stage - 1, m)
    calls: list[list[tuple[str, int]]] = []
    for i in range(warm):
        if not first:
            calls.append([("forward-recv", i)])
        calls.append([("forward-compute", i)])
        if not last:
            calls.append([("forward-send", i)])
    steady = m - warm
    if steady > 0 and not first:
        calls.append([("forward-recv", warm)])
    for j in range(steady):
        f = warm + j
        calls.append([("forward-compute", f)])
        if not last:
            calls.append([("forward-send", f), ("backward-recv", j)])
        calls.append([("backward-compute", j)])
        if not first:
            if j == steady - 1:
                calls.append([("backward-send", j)])
            else:
                calls.append([("backward-send", j), ("forward-recv", f + 1)])
    for i in range(steady, m):
        if not last:
            calls.append([("backward-recv", i)])
        calls.append([("backward-compute", i)])
        if not first:
            calls.append([("backward-send", i)])
    return calls
