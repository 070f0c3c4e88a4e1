"""Which steps of overlapping pieces of a job's traffic count, and their numbers.

A job's flows are analysed a piece at a time in two places: the daemon's
sliding windows (:mod:`prism.serve.monitor`) and the replay's time slices
of a job too long to analyse at once (:mod:`prism.analysis.slices`). Each
piece reaches back over the one before and cuts its steps anew, so a step
near an overlap is cut twice (its boundaries a little apart), and a step
near a piece's end may not have ended yet. Both take a piece's steps by
the one rule here, so that a step counts once and the numbers run on:

* **settled** -- a step is taken once it ends ``hold_steps`` median steps
  before the piece's end: a straggling stage can pause the traffic inside
  a step for longer than the gap between steps, and the piece then cuts
  the step at the pause. Later steps wait for the next piece, which
  re-cuts them with what follows. The last piece takes them all;
* **new** -- a step is new if it ends past the last taken step's end and
  does not start before it, both within :data:`TOLERANCE_STEPS` of a
  median step (the same step cut by two pieces);
* **numbered** -- the taken steps get the next numbers, in start order;
* **median** -- that of the steps taken so far (the caller keeps the
  recent ones it wants), or of the piece's own before any is taken.

The pieces differ in how long the hold is (the daemon reports steps soon,
so half a step; a slice can afford two) and in which recent steps the
median spans (the daemon's step history; a slice's last takes).
"""
from __future__ import annotations

import numpy as np

__all__ = ["TOLERANCE_STEPS", "StepStitcher", "median_step_ns"]

#: median steps within which two pieces' cuts of one step's boundary are the same boundary
TOLERANCE_STEPS = 0.25


def median_step_ns(recent: np.ndarray | None, piece: np.ndarray) -> float:
    """The median step (ns) the rule measures in: of ``recent`` taken steps' durations, else of the piece's; 0 if none.

    >>> median_step_ns(None, np.array([4, 6])), median_step_ns(np.array([10]), np.array([4, 6]))
    (5.0, 10.0)
    """
    d = recent if recent is not None and len(recent) else piece
    return float(np.median(d)) if len(d) else 0.0


class StepStitcher:
    """The steps taken so far from a job's pieces: where the last ended, and the next number.

    Parameters
    ----------
    hold_steps : float
        Median steps before a piece's end within which a step waits for
        the next piece.

    Examples
    --------
    >>> s = StepStitcher(hold_steps=1)
    >>> keep, numbers = s.take(np.array([0, 10, 20]), np.array([9, 19, 29]), median_ns=10, settle_ns=30)
    >>> keep.tolist(), numbers.tolist(), s.last_end
    ([True, True, False], [0, 1], 19)
    >>> keep, numbers = s.take(np.array([11, 20, 30]), np.array([19, 29, 39]), median_ns=10)  # re-cut, then new
    >>> keep.tolist(), numbers.tolist(), s.last_end
    ([False, True, True], [2, 3], 39)
    """

    def __init__(self, hold_steps: float):
        self.hold_steps = hold_steps
        self.last_end: int | None = None  # end of the last taken step (ns); None before the first
        self.next_step = 0

    def take(self, start: np.ndarray, end: np.ndarray, median_ns: float, settle_ns: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Take a piece's settled new steps; return which (a mask) and their numbers.

        Parameters
        ----------
        start, end : numpy.ndarray
            The piece's steps, in start order (ns).
        median_ns : float
            The median step (:func:`median_step_ns`).
        settle_ns : int, optional
            The piece's end (its last flow, or the window's end); None
            for the last piece, which takes every new step.
        """
        keep = np.ones(len(start), dtype=bool)
        if settle_ns is not None:
            keep &= end <= settle_ns - self.hold_steps * median_ns
        if self.last_end is not None:
            tol = TOLERANCE_STEPS * median_ns
            keep &= (end > self.last_end + tol) & (start >= self.last_end - tol)
        n = int(keep.sum())
        numbers = np.arange(self.next_step, self.next_step + n)
        if n:
            self.next_step += n
            self.last_end = int(end[keep][-1])
        return keep, numbers
