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

The modern scenarios ``moe-<confounder>`` and ``cp-<confounder>`` (every
scenario above) run the mixture-of-experts or ring-attention jobs of
:mod:`synthetic.modern` with the same confounders, beside 3D jobs of the
matrix in one cluster (:data:`MODERN_SCENARIOS`, :func:`modern_scenario_generator`).

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

__all__ = ["SCENARIOS", "MODERN_SCENARIOS", "scenario_generator", "modern_scenario_generator", "scenario_cluster", "BASE_JOBS"]

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


#: the modern families: family -> (its modern jobs, the 3D jobs of BASE_JOBS beside them, servers of the fabric)
MODERN_FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], int]] = {
    # the DeepSeek-V3-like job (32 servers, 2 EP domains a stage) and its one-domain twin (16), four small 3D jobs: 62 of 64
    "moe": (("moe", "moe-flat"), ("tp8-pp2-dp2", "tp4-pp2-dp4", "tp8-pp4", "tp8-dp2"), 64),
    # the matrix's cluster with ring attention (16 servers) in place of its DP 4 x PP 4 job: 42 of 48
    "cp": (("cp",), ("tp8-pp2-dp2", "tp4-pp2-dp4", "tp8-dp8", "tp8-pp4", "tp2-pp2-dp8", "tp8-dp2"), 48),
}

#: ``moe-<scenario>`` and ``cp-<scenario>``: the modern jobs beside 3D jobs, with that scenario's confounders
MODERN_SCENARIOS: tuple[str, ...] = tuple(f"{fam}-{name}" for fam in MODERN_FAMILIES for name in SCENARIOS)


def _with_confounders(job: JobSpec, spec_kw: dict) -> JobSpec:
    return replace(job, **{k: v for k, v in spec_kw.items() if k != "embedding_bytes" or job.pp > 1})


def modern_scenario_generator(name: str, seed: int = 0, duration_s: float = 60.0, with_faults: bool = True) -> tuple[ClusterGenerator, bool]:
    """A modern scenario's generator (``moe-all``, ``cp-clip``, ...) and whether collector noise applies.

    Every job, modern and 3D, takes the scenario's confounders (the modern
    jobs are PP = 2: the grad-norm clip and the embedding all-reduce ride
    their pipeline pairs). Faults: in ``moe-*`` a slow server of the MoE job
    from step 10 (1.4x) and a slow step of the one-domain MoE job (step 12,
    1.7x); in ``cp-*`` a slow step of the ring-attention job (step 8, 1.7x)
    and a slow server of it from step 20 (1.4x); in both a spine at 0.2x
    bandwidth for the second half (the one most edges of the modern job's
    first collective cross).

    >>> g, noisy = modern_scenario_generator("cp-all")
    >>> [j.name for j in g.jobs][:2], g.jobs[0].rank_order, g.jobs[0].clip_allreduce, noisy
    (['ring-cp4', 'tp8-pp2-dp2'], 'tp-pp-dp', True, True)
    """
    from .modern import modern_job

    family, _, scenario = name.partition("-")
    if family not in MODERN_FAMILIES or scenario not in SCENARIOS:
        raise ValueError(f"unknown modern scenario {name!r}; choose one of {', '.join(MODERN_SCENARIOS)}")
    spec_kw, gen_kw, noisy = SCENARIOS[scenario]
    kinds, neighbours, servers = MODERN_FAMILIES[family]
    base = {j.name: j for j in BASE_JOBS}
    jobs = [_with_confounders(j, spec_kw) for j in [*(modern_job(k) for k in kinds), *(base[n] for n in neighbours)]]
    if family == "moe":
        faults = [SlowServer("moe-ep8", server=5, from_step=10, factor=1.4), SlowStep("moe-flat-ep8", step=12, factor=1.7)]
    else:
        faults = [SlowStep("ring-cp4", step=8, factor=1.7), SlowServer("ring-cp4", server=5, from_step=20, factor=1.4)]
    faults.append(DegradedSwitch("auto", start_frac=0.5, end_frac=1.0, factor=0.2))
    fabric = Fabric(servers=servers, servers_per_group=8, spines=8)
    kw = dict(uniform_dp_share=0.05, split_pp_prob=0.002, storage_flows_per_s=100)
    kw.update(gen_kw)
    return ClusterGenerator(fabric, jobs, duration_s=duration_s, faults=faults, seed=seed, with_faults=with_faults, **kw), noisy


def scenario_generator(name: str, seed: int = 0, duration_s: float = 60.0, with_faults: bool = True) -> tuple[ClusterGenerator, bool]:
    """The generator of a scenario and whether collector noise applies.

    >>> g, noisy = scenario_generator("embedding")
    >>> g.jobs[0].embedding_bytes > 0, noisy
    (True, False)
    """
    if name in MODERN_SCENARIOS:
        return modern_scenario_generator(name, seed, duration_s, with_faults)
    try:
        spec_kw, gen_kw, noisy = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join([*SCENARIOS, *MODERN_SCENARIOS])}") from None
    jobs = [_with_confounders(j, spec_kw) for j in BASE_JOBS]
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
