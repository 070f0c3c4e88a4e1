"""Control messages among a job's data-parallel flows: the receivers' clear-to-sends.

NCCL's network transport runs a collective as a rendezvous: before a ring
edge moves data, its receiver writes the address of its buffer into the
sender's FIFO (an RDMA write of tens to a few hundred bytes) as it enters
the collective. On the wire that is one tiny message a ring edge and
collective, from receiver to sender, at the receiver's own entry: while
the others wait for a late member, the early members' clear-to-sends
land in the middle of what is otherwise idle time. They say who entered
when (:mod:`prism.analysis.diagnosis.arrival`), but they are no data: a
step's pause or a collective's end is where the data stops, and a
clear-to-send in a pause neither fills it nor splits it
(:class:`prism.analysis.timeline.StepTimeline`).

A flow is such a message when it is far smaller than the messages that
carry the job's data: under :data:`CONTROL_SHARE` of the size that carries
the median byte of the job's DP flows (:func:`control_messages`).
"""
from __future__ import annotations

import numpy as np

__all__ = ["CONTROL_SHARE", "data_size", "control_messages"]

#: a control message is under this share of the job's data message (:func:`data_size`). A data message is a
#: chunk of a collective: NCCL's are 512 KiB and up (its 4 MiB buffer in 8 steps), the SYNTHETIC generator's
#: 3 to 16 MiB; a clear-to-send is tens to a few hundred bytes. 1% of a 512 KiB chunk is 5 KiB, 20 times a
#: 256-byte clear-to-send and 100 times under the chunk: a margin both ways, from the job's own sizes
#: (the same share the pair typing and the hang diagnosis take for control traffic beside a pair's transfers)
CONTROL_SHARE = 0.01


def data_size(size: np.ndarray, key: np.ndarray | None = None) -> np.ndarray:
    """Per key (a job), the size of the messages that carry its flows' data: the power of two below which half its bytes lie.

    A byte-weighted median, to a factor of 2 (a histogram of log2 sizes
    weighted by bytes: O(n), no sort): however many tiny messages there
    are, they hold almost none of the bytes. ``key``: small non-negative
    integers (default: one key, 0); 0 for a key without bytes.

    >>> data_size(np.array([256] * 1000 + [4 << 20] * 100)).tolist()  # a thousand clear-to-sends beside a hundred 4 MiB messages
    [4194304.0]
    >>> data_size(np.array([256, 4 << 20, 300, 300]), np.array([0, 0, 1, 1])).tolist()
    [4194304.0, 256.0]
    """
    s = np.asarray(size, dtype=np.int64)
    g = np.zeros(len(s), dtype=np.int64) if key is None else np.asarray(key, dtype=np.int64)
    n = int(g.max()) + 1 if len(g) else 1
    pos = s > 0
    k = np.floor(np.log2(s[pos].astype(np.float64))).astype(np.int64)  # s in [2^k, 2^(k+1))
    w = np.bincount(g[pos] * 64 + k, weights=s[pos].astype(np.float64), minlength=64 * n).reshape(n, 64)
    cum = np.cumsum(w, axis=1)
    half = np.argmax(cum >= 0.5 * cum[:, -1:], axis=1)  # the first bin holding the median byte
    return np.where(cum[:, -1] > 0, 2.0 ** half, 0.0)


def control_messages(size: np.ndarray, key: np.ndarray | None = None, share: float = CONTROL_SHARE) -> np.ndarray:
    """Per DP flow: is it a control message, under ``share`` of its job's :func:`data_size` (``key``: the job, default one)?

    A job whose flows are all alike has none: the bar is relative to the
    job's own data, so no constant decides what a small job's messages are.

    >>> control_messages(np.array([256, 4 << 20, 4 << 20, 300, 1 << 20])).tolist()
    [True, False, False, True, False]
    >>> control_messages(np.array([256, 256, 300])).tolist()
    [False, False, False]
    """
    s = np.asarray(size, dtype=np.int64)
    g = np.zeros(len(s), dtype=np.int64) if key is None else np.asarray(key, dtype=np.int64)
    return s < share * data_size(s, g)[g] if len(s) else np.zeros(0, dtype=bool)
