"""Named cluster presets (SYNTHETIC): ``tiny`` for unit tests, ``demo``, ``large``."""
from __future__ import annotations

from .fabric import Fabric
from .faults import DegradedSwitch, SlowServer, SlowStep
from .generator import ClusterGenerator
from .workload import JobSpec

__all__ = ["PRESETS", "preset", "shared_spine"]

MiB = 1 << 20


def _tiny(seed, with_faults, duration_s):
    jobs = [
        JobSpec("tp8-pp2-dp2", tp=8, pp=2, dp=2, microbatches=4, fwd_ms=8, grad_bytes=96 * MiB, bucket_bytes=40 * MiB),
        JobSpec("tp8-dp4", tp=8, pp=1, dp=4, microbatches=4, fwd_ms=6, grad_bytes=64 * MiB, bucket_bytes=24 * MiB),
        JobSpec("tp4-pp2-dp4", tp=4, pp=2, dp=4, microbatches=4, fwd_ms=7, grad_bytes=64 * MiB, bucket_bytes=24 * MiB),
        JobSpec("tp8-pp3", tp=8, pp=3, dp=1, microbatches=6, fwd_ms=5),
    ]
    faults = [
        SlowStep("tp8-pp2-dp2", step=5, factor=1.8),
        SlowServer("tp4-pp2-dp4", server=1, from_step=10, factor=1.4),
        DegradedSwitch("auto", start_frac=0.5, end_frac=1.0, factor=0.2),
    ]
    fabric = Fabric(servers=16, servers_per_group=4, spines=4)
    return ClusterGenerator(fabric, jobs, duration_s=duration_s or 4.0, faults=faults, seed=seed, with_faults=with_faults, storage_flows_per_s=40)


def _demo(seed, with_faults, duration_s):
    jobs = [
        JobSpec("llama-70b", tp=8, pp=4, dp=4, microbatches=8, fwd_ms=14, grad_bytes=256 * MiB, bucket_bytes=100 * MiB),
        JobSpec("gpt-13b", tp=8, pp=2, dp=4, microbatches=8, fwd_ms=10, grad_bytes=256 * MiB, bucket_bytes=64 * MiB),
        JobSpec("bert-dp", tp=8, pp=1, dp=8, microbatches=8, fwd_ms=8, grad_bytes=96 * MiB, bucket_bytes=40 * MiB, message_bytes=8 * MiB),
        JobSpec("moe-tp4", tp=4, pp=2, dp=4, microbatches=8, fwd_ms=9, grad_bytes=128 * MiB, bucket_bytes=48 * MiB),
        JobSpec("pp-only", tp=8, pp=4, dp=1, microbatches=8, fwd_ms=6),
    ]
    faults = [
        SlowStep("gpt-13b", step=20, factor=1.7),
        SlowServer("llama-70b", server=5, from_step=30, factor=1.35),
        DegradedSwitch("auto", start_frac=0.5, end_frac=1.0, factor=0.2),
    ]
    fabric = Fabric(servers=48, servers_per_group=8, spines=8)
    return ClusterGenerator(fabric, jobs, duration_s=duration_s or 30.0, faults=faults, seed=seed, with_faults=with_faults, storage_flows_per_s=200)


def _large(seed, with_faults, duration_s):
    # about 2,900 GPUs and ~13M flows in 40 s: the benchmark preset
    big = dict(message_bytes=16 * MiB)
    jobs = [
        JobSpec("llama-405b", tp=8, pp=8, dp=16, microbatches=16, fwd_ms=18, grad_bytes=128 * MiB, bucket_bytes=64 * MiB, **big),
        JobSpec("llama-70b", tp=8, pp=4, dp=16, microbatches=16, fwd_ms=14, grad_bytes=128 * MiB, bucket_bytes=48 * MiB, **big),
        JobSpec("gpt-13b", tp=8, pp=2, dp=16, microbatches=16, fwd_ms=10, grad_bytes=128 * MiB, bucket_bytes=48 * MiB, **big),
        JobSpec("moe-tp4", tp=4, pp=4, dp=16, microbatches=16, fwd_ms=9, grad_bytes=64 * MiB, bucket_bytes=32 * MiB, **big),
        JobSpec("bert-dp", tp=8, pp=1, dp=32, microbatches=16, fwd_ms=8, grad_bytes=96 * MiB, bucket_bytes=40 * MiB, **big),
        JobSpec("pp-only", tp=8, pp=8, dp=1, microbatches=16, fwd_ms=6),
    ]
    faults = [
        SlowStep("gpt-13b", step=20, factor=1.7),
        SlowServer("llama-70b", server=9, from_step=30, factor=1.3),
        DegradedSwitch("auto", start_frac=0.5, end_frac=1.0, factor=0.2),
    ]
    fabric = Fabric(servers=384, servers_per_group=32, spines=16)
    return ClusterGenerator(fabric, jobs, duration_s=duration_s or 40.0, faults=faults, seed=seed, with_faults=with_faults, storage_flows_per_s=2000)


def _accuracy(seed, with_faults, duration_s):
    """DP/PP accuracy: realistic step times (1-2 s) and the noise that fools
    the size rule: 10% of DP ring edges with one message size, split PP
    messages, and a job whose buckets split evenly into messages (every DP
    message the same size)."""
    jobs = [
        JobSpec("tp8-pp4-dp2", tp=8, pp=4, dp=2, microbatches=8, fwd_ms=40, grad_bytes=512 * MiB, bucket_bytes=100 * MiB, message_bytes=16 * MiB),
        JobSpec("tp8-pp2-dp4", tp=8, pp=2, dp=4, microbatches=8, fwd_ms=45, grad_bytes=384 * MiB, bucket_bytes=100 * MiB, message_bytes=16 * MiB),
        JobSpec("tp4-pp2-dp4", tp=4, pp=2, dp=4, microbatches=8, fwd_ms=35, grad_bytes=256 * MiB, bucket_bytes=90 * MiB, message_bytes=16 * MiB),
        JobSpec("tp8-dp8", tp=8, pp=1, dp=8, microbatches=8, fwd_ms=30, grad_bytes=384 * MiB, bucket_bytes=100 * MiB, message_bytes=16 * MiB),
        JobSpec("tp8-pp4", tp=8, pp=4, dp=1, microbatches=8, fwd_ms=40),
        JobSpec("tp8-pp2-dp2-even", tp=8, pp=2, dp=2, microbatches=8, fwd_ms=40, grad_bytes=256 * MiB, bucket_bytes=64 * MiB, message_bytes=16 * MiB),
    ]
    faults = [SlowStep("tp8-pp2-dp4", step=10, factor=1.6), DegradedSwitch("auto", start_frac=0.5, end_frac=1.0, factor=0.3)]
    fabric = Fabric(servers=40, servers_per_group=8, spines=8)
    return ClusterGenerator(
        fabric, jobs, duration_s=duration_s or 600.0, faults=faults, seed=seed, with_faults=with_faults,
        uniform_dp_share=0.10, split_pp_prob=0.002, storage_flows_per_s=100,
    )


def shared_spine(capacity: float = 1.0, moved: tuple[str, ...] = (), with_faults: bool = True, seed: int = 0) -> ClusterGenerator:
    """Two pure-DP jobs, ``dp-a`` and ``dp-b`` (TP 8 x DP 4, one server a leaf group), whose rings cross spine-00,
    sharing it from the middle of a 5 s capture at ``capacity`` (in units of one job at full speed; each of two at
    ``capacity / 2``); ``moved`` jobs routed around it. Jobs contending for a switch, for the what-if's
    ``move-job`` (``tests/test_whatif.py``, ``benchmarks/bench_whatif.py``).

    >>> [(f.switch, f.factor, f.shared, f.moved) for f in shared_spine(0.6, ("dp-b",)).faults]
    [('spine-00', 0.6, True, ('dp-b',))]
    """
    jobs = [JobSpec("dp-a", tp=8, pp=1, dp=4, microbatches=4, fwd_ms=10, grad_bytes=1 << 30, bucket_bytes=64 * MiB),
            JobSpec("dp-b", tp=8, pp=1, dp=4, microbatches=4, fwd_ms=12, grad_bytes=768 * MiB, bucket_bytes=64 * MiB)]
    faults = [DegradedSwitch("spine-00", 0.5, 1.0, capacity, shared=True, moved=moved)]
    return ClusterGenerator(Fabric(servers=10, servers_per_group=1, spines=4), jobs, duration_s=5.0, faults=faults, seed=seed,
                            with_faults=with_faults, storage_flows_per_s=20)


PRESETS = {"tiny": _tiny, "demo": _demo, "large": _large, "accuracy": _accuracy}


def preset(name: str, seed: int = 0, with_faults: bool = True, duration_s: float | None = None) -> ClusterGenerator:
    """A :class:`ClusterGenerator` for a named preset.

    >>> preset("tiny", seed=1).fabric.servers
    16
    """
    try:
        make = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
    return make(seed, with_faults, duration_s)
