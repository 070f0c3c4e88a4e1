"""The scenario matrix (SYNTHETIC): one cluster, each real-world confounder alone and all combined.

A generator is one guess about reality, so the inference is judged on many
variations of it, each modelling something real Megatron traffic has and
the plain generator lacks (see :class:`synthetic.workload.JobSpec`):

========== ==================================================================
scenario   what changes
========== ==================================================================
baseline   the plain generator
clip       grad-norm all-reduce of a few bytes over each replica's stages
embedding  64 MiB embedding all-reduce between the first and last stage
pp-sizes   pipeline messages vary per micro-batch (variable sequence length);
           5% of them split in two
tp-pp-dp   Megatron's other rank order (replicas of a stage far apart)
overlap    gradient buckets reduced during the last backward
dist-opt   distributed optimizer: reduce-scatter at the end, all-gather at
           the start of the next step
collector  microsecond timestamps, 2 us jitter, 5 us clock offsets per
           capture point, 0.2% of records lost
all        every one of the above at once
========== ==================================================================

The cluster mixes the layouts that matter: DP > 2 rings, a DP = 2 x PP = 2
job (its DP and PP pairs look alike by structure), TP = 4 and TP = 2 jobs
whose DP rings run partly or wholly over NVLink, pure DP jobs of 8 and of 2
replicas, and a pure PP job. Faults: a slow step, a slow server from step 10, a degraded switch in
the second half; ``with_faults=False`` is the same cluster with none.
"""
from __future__ import annotations

from dataclasses import replace

from .fabric import Fabric
from .faults import DegradedSwitch, SlowServer, SlowStep
from .fromtrace import CollectorNoise, collector_view
from .generator import ClusterGenerator, GeneratedCluster
from .workload import JobSpec

__all__ = ["SCENARIOS", "scenario_generator", "scenario_cluster", "BASE_JOBS"]

MiB = 1 << 20

BASE_JOBS = [
    JobSpec("tp8-pp4-dp4", tp=8, pp=4, dp=4, microbatches=8, fwd_ms=12, grad_bytes=256 * MiB, bucket_bytes=100 * MiB, message_bytes=16 * MiB),
    JobSpec("tp8-pp2-dp2", tp=8, pp=2, dp=2, microbatches=8, fwd_ms=15, grad_bytes=256 * MiB, bucket_bytes=64 * MiB, message_bytes=16 * MiB),
    JobSpec("tp4-pp2-dp4", tp=4, pp=2, dp=4, microbatches=8, fwd_ms=10, grad_bytes=128 * MiB, bucket_bytes=48 * MiB, message_bytes=16 * MiB),
    JobSpec("tp8-dp8", tp=8, pp=1, dp=8, microbatches=8, fwd_ms=8, grad_bytes=96 * MiB, bucket_bytes=40 * MiB, message_bytes=8 * MiB),
    JobSpec("tp8-pp4", tp=8, pp=4, dp=1, microbatches=8, fwd_ms=9),
    JobSpec("tp2-pp2-dp8", tp=2, pp=2, dp=8, microbatches=8, fwd_ms=11, grad_bytes=128 * MiB, bucket_bytes=64 * MiB, message_bytes=16 * MiB),
    JobSpec("tp8-dp2", tp=8, pp=1, dp=2, microbatches=8, fwd_ms=10, grad_bytes=128 * MiB, bucket_bytes=48 * MiB, message_bytes=16 * MiB),
]

#: scenario -> (JobSpec changes, generator changes, collector noise)
SCENARIOS: dict[str, tuple[dict, dict, bool]] = {
    "baseline": ({}, {}, False),
    "clip": ({"clip_allreduce": True}, {}, False),
    "embedding": ({"embedding_bytes": 64 * MiB}, {}, False),
    "pp-sizes": ({"pp_size_spread": 0.5}, {"split_pp_prob": 0.05}, False),
    "tp-pp-dp": ({"rank_order": "tp-pp-dp"}, {}, False),
    "overlap": ({"dp_overlap": True}, {}, False),
    "dist-opt": ({"distributed_optimizer": True}, {}, False),
    "collector": ({}, {}, True),
    "all": ({"clip_allreduce": True, "embedding_bytes": 64 * MiB, "pp_size_spread": 0.5, "rank_order": "tp-pp-dp",
             "dp_overlap": True, "distributed_optimizer": True}, {"split_pp_prob": 0.05}, True),
}


def scenario_generator(name: str, seed: int = 0, duration_s: float = 60.0, with_faults: bool = True) -> tuple[ClusterGenerator, bool]:
    """The generator of a scenario and whether collector noise applies.

    >>> g, noisy = scenario_generator("embedding")
    >>> g.jobs[0].embedding_bytes > 0, noisy
    (True, False)
    """
    try:
        spec_kw, gen_kw, noisy = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}") from None
    jobs = [replace(j, **{k: v for k, v in spec_kw.items() if k != "embedding_bytes" or j.pp > 1}) for j in BASE_JOBS]
    faults = [
        SlowStep("tp8-pp2-dp2", step=12, factor=1.7),
        SlowServer("tp8-pp4-dp4", server=5, from_step=10, factor=1.4),
        DegradedSwitch("auto", start_frac=0.5, end_frac=1.0, factor=0.2),
    ]
    fabric = Fabric(servers=48, servers_per_group=8, spines=8)
    kw = dict(uniform_dp_share=0.05, split_pp_prob=0.002, storage_flows_per_s=100)
    kw.update(gen_kw)
    return ClusterGenerator(fabric, jobs, duration_s=duration_s, faults=faults, seed=seed, with_faults=with_faults, **kw), noisy


def scenario_cluster(name: str, seed: int = 0, duration_s: float = 60.0, with_faults: bool = True) -> GeneratedCluster:
    """Generate a scenario's cluster (flows through the collector model where it applies)."""
    gen, noisy = scenario_generator(name, seed, duration_s, with_faults)
    c = gen.generate()
    c.meta["scenario"] = name
    if noisy:
        c.flows = collector_view(c.flows, CollectorNoise(), seed)
    return c
