"""SYNTHETIC data: a seeded LLM-training cluster generator with ground truth.

Everything this package writes is synthetic and labelled as such (the
``manifest.json`` of every output says ``"synthetic": true``). It models a
rail-optimised leaf/spine RoCE fabric, Megatron-style jobs (TP inside a
server, PP and DP across servers), a 1F1B pipeline schedule, DP ring
all-reduce in buckets and NCCL-sized messages, storage noise, and injected
faults (slow steps, slow servers, degraded switches, slow NICs), and writes flows,
topology and the ground truth for every later stage of Prism.
"""
from .fabric import Fabric
from .faults import DegradedLink, DegradedSwitch, Hang, Restart, SlowNic, SlowServer, SlowStep
from .generator import ClusterGenerator, GeneratedCluster
from .presets import PRESETS, preset
from .workload import JobSpec, one_f_one_b

__all__ = [
    "Fabric",
    "JobSpec",
    "one_f_one_b",
    "SlowStep",
    "SlowServer",
    "DegradedSwitch",
    "DegradedLink",
    "SlowNic",
    "Hang",
    "Restart",
    "ClusterGenerator",
    "GeneratedCluster",
    "PRESETS",
    "preset",
]
