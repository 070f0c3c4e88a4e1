"""Training jobs (SYNTHETIC): parallel layout, the 1F1B pipeline schedule and periodic checkpoints.

A checkpoint (``JobSpec.checkpoint_every``) is modelled as a pause with no
network traffic after the DP collective of every Nth step (the ranks write
their state to local or remote storage, which the generator does not
model): the step it falls into is slower, and recurs every N steps. Real
jobs also pause for evaluation and at epoch ends; the inference must read
all of these as slow steps of the same period, not as a longer period.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["JobSpec", "one_f_one_b"]


@dataclass(frozen=True)
class JobSpec:
    """A Megatron-style job.

    Rank order is Megatron's default (TP innermost, then DP, then PP):
    ``rank = t + tp * (d + dp * p)``; rank ``i`` runs on the job's server
    ``i // gpus_per_server``, local GPU ``i % gpus_per_server``.

    Parameters
    ----------
    name : str
        Ground-truth name.
    tp, pp, dp : int
        Parallel sizes; ``tp`` must divide the GPUs per server.
    microbatches : int
        Microbatches per step (per DP replica).
    fwd_ms : float
        Forward compute of one microbatch on one stage.
    bwd_ratio : float
        Backward / forward compute.
    optimizer_ms : float
        Optimizer step after the gradient all-reduce (no network traffic).
    activation_bytes : int
        Size of one PP message (activations forward, their gradients back).
    grad_bytes : int
        Gradient buffer all-reduced by each rank every step.
    bucket_bytes : int
        DDP bucket size; the last bucket holds the remainder, so buckets
        differ in size, and so do the messages they produce.
    message_bytes : int
        Largest RDMA message NCCL sends; a ring chunk is split into these.
    jitter : float
        Log-normal sigma of compute time noise.
    rank_order : {"tp-dp-pp", "tp-pp-dp"}
        Megatron's rank order (innermost first).
    embedding_bytes : int
        Embedding gradients all-reduced between the first and last stage of
        each replica every step (0: none; needs ``pp > 1``).
    clip_allreduce : bool
        The grad-norm clip: a tiny all-reduce over the stages of each
        replica after the DP collective (rides the pipeline pairs).
    pp_size_spread : float
        Pipeline messages vary per micro-batch (variable sequence lengths):
        each is ``activation_bytes`` times a factor drawn from
        ``[1 - pp_size_spread, 1]``.
    dp_overlap : bool
        Gradient buckets are reduced during the last micro-batch's backward
        as they become ready, not after it.
    distributed_optimizer : bool
        The DP collective is a reduce-scatter at the end of the step and an
        all-gather of the parameters at the start of the next (forward waits
        for it), instead of one all-reduce.
    checkpoint_every : int
        A checkpoint after every this many steps (0: none): a pause of
        ``checkpoint_pause`` times the nominal step compute
        (:meth:`lower_bound_step_ns`) after the step's DP collective, with
        no network traffic. It makes the next step in the ground truth
        (which ends at its own collective) that much longer.
    checkpoint_pause : float
        The pause, as a share of the nominal step compute.
    checkpoint_phase : int
        The first checkpoint follows simulated step
        ``checkpoint_every - 1 - checkpoint_phase`` (mod ``checkpoint_every``;
        the job runs before the capture window, so its first step in the
        window is simulated step 1).
    """

    name: str
    tp: int = 8
    pp: int = 1
    dp: int = 2
    microbatches: int = 8
    fwd_ms: float = 10.0
    bwd_ratio: float = 2.0
    optimizer_ms: float = 3.0
    activation_bytes: int = 8 << 20
    grad_bytes: int = 384 << 20
    bucket_bytes: int = 100 << 20
    message_bytes: int = 4 << 20
    jitter: float = 0.01
    rank_order: str = "tp-dp-pp"
    embedding_bytes: int = 0
    clip_allreduce: bool = False
    pp_size_spread: float = 0.0
    dp_overlap: bool = False
    distributed_optimizer: bool = False
    checkpoint_every: int = 0
    checkpoint_pause: float = 0.7
    checkpoint_phase: int = 0

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def n_servers(self, gpus_per_server: int = 8) -> int:
        return -(-self.world // gpus_per_server)

    def check(self, gpus_per_server: int = 8) -> None:
        if min(self.tp, self.pp, self.dp, self.microbatches) < 1:
            raise ValueError(f"{self.name}: tp, pp, dp and microbatches must be >= 1")
        if gpus_per_server % self.tp:
            raise ValueError(f"{self.name}: tp={self.tp} must divide {gpus_per_server} GPUs per server")
        if self.world % gpus_per_server:
            raise ValueError(f"{self.name}: tp*pp*dp={self.world} must fill whole servers of {gpus_per_server} GPUs")
        if self.rank_order not in ("tp-dp-pp", "tp-pp-dp"):
            raise ValueError(f"{self.name}: rank_order must be tp-dp-pp or tp-pp-dp, not {self.rank_order!r}")
        if self.checkpoint_every < 0 or self.checkpoint_pause < 0:
            raise ValueError(f"{self.name}: checkpoint_every and checkpoint_pause must be >= 0")
        if self.world == gpus_per_server:
            raise ValueError(f"{self.name}: a one-server job has no network traffic")

    def rank(self, t: np.ndarray, d: np.ndarray, p: np.ndarray) -> np.ndarray:
        if self.rank_order == "tp-pp-dp":
            return t + self.tp * (p + self.pp * d)
        return t + self.tp * (d + self.dp * p)

    def bucket_sizes(self) -> np.ndarray:
        full, rem = divmod(self.grad_bytes, self.bucket_bytes)
        sizes = [self.bucket_bytes] * full + ([rem] if rem else [])
        return np.array(sizes, dtype=np.int64)

    def lower_bound_step_ns(self) -> float:
        per = self.fwd_ms * (1 + self.bwd_ratio) * 1e6
        return (self.microbatches + self.pp - 1) * per

    def checkpoint_ns(self, sim_step: int) -> float:
        """The checkpoint pause after simulated step ``sim_step`` (0 when it writes none).

        A function of the step count alone (no random draw), so a job with
        checkpoints sees the same random numbers as one without.

        >>> s = JobSpec("j", checkpoint_every=3, fwd_ms=1, microbatches=1, bwd_ratio=1, checkpoint_pause=0.5)
        >>> [s.checkpoint_ns(k) for k in range(6)]
        [0.0, 0.0, 1000000.0, 0.0, 0.0, 1000000.0]
        """
        if self.checkpoint_every <= 0 or (sim_step + 1 + self.checkpoint_phase) % self.checkpoint_every:
            return 0.0
        return self.checkpoint_pause * self.lower_bound_step_ns()


def one_f_one_b(F: np.ndarray, B: np.ndarray, xf: np.ndarray, xb: np.ndarray, t0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Times of every forward and backward under the 1F1B schedule.

    Stage ``p`` of ``P`` runs ``min(P - p - 1, M)`` warm-up forwards, then
    alternates one forward and one backward, then drains the remaining
    backwards. A forward waits for the previous stage's forward of the same
    microbatch plus the transfer; a backward waits for the next stage's
    backward plus the transfer. All DP replicas are computed at once.

    Parameters
    ----------
    F, B : arrays (M, D, P)
        Forward / backward durations per microbatch, replica and stage (ns).
    xf, xb : arrays (D, P - 1)
        Transfer time of a forward (p -> p+1) / backward (p+1 -> p) message.
    t0 : float
        Step start (ns).

    Returns
    -------
    (sF, eF, sB, eB) : arrays (M, D, P)
        Start and end of every forward and backward.

    Notes
    -----
    O(M * P) vectorised operations over D replicas.

    Examples
    --------
    Two stages, two microbatches, unit compute, no transfer time:

    >>> F = np.ones((2, 1, 2)); B = 2 * F; x = np.zeros((1, 1))
    >>> sF, eF, sB, eB = one_f_one_b(F, B, x, x, 0.0)
    >>> eB[:, 0, 0].tolist()   # stage 0 backwards end
    [6.0, 9.0]
    """
    M, D, P = F.shape
    sF = np.full((M, D, P), np.nan)
    eF = np.full((M, D, P), np.nan)
    sB = np.full((M, D, P), np.nan)
    eB = np.full((M, D, P), np.nan)
    doneF = np.zeros((M, P), dtype=bool)
    doneB = np.zeros((M, P), dtype=bool)
    orders = []
    for p in range(P):
        w = min(P - p - 1, M)
        ops = [(0, m) for m in range(w)]
        for i in range(M - w):
            ops += [(0, w + i), (1, i)]
        ops += [(1, m) for m in range(M - w, M)]
        orders.append(ops)
    ptr = [0] * P
    free = np.full((P, D), float(t0))
    remaining = 2 * M * P
    while remaining:
        progressed = False
        for p in range(P):
            ops = orders[p]
            while ptr[p] < len(ops):
                kind, m = ops[ptr[p]]
                if kind == 0:
                    if p == 0:
                        ready = free[p]
                    elif doneF[m, p - 1]:
                        ready = eF[m, :, p - 1] + xf[:, p - 1]
                    else:
                        break
                    start = np.maximum(free[p], ready)
                    sF[m, :, p] = start
                    eF[m, :, p] = start + F[m, :, p]
                    free[p] = eF[m, :, p]
                    doneF[m, p] = True
                else:
                    if p == P - 1:
                        ready = eF[m, :, p]
                    elif doneB[m, p + 1]:
                        ready = eB[m, :, p + 1] + xb[:, p]
                    else:
                        break
                    start = np.maximum(free[p], ready)
                    sB[m, :, p] = start
                    eB[m, :, p] = start + B[m, :, p]
                    free[p] = eB[m, :, p]
                    doneB[m, p] = True
                ptr[p] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - the schedule above cannot deadlock
            raise RuntimeError("1F1B schedule deadlocked")
    return sF, eF, sB, eB
