"""The batch commands' allocator settings (prism.common.allocator), each in a fresh interpreter: they are process-wide."""
import json
import os
import platform
import subprocess
import sys

import pytest

from prism.common.allocator import GLIBC_VARIABLES

PROBE = """
import json
from prism.common.allocator import tune_for_batch
applied = tune_for_batch()
try:
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:
    from numpy.core.multiarray import _set_madvise_hugepage
print(json.dumps({"applied": applied, "hugepage_was": bool(_set_madvise_hugepage(True))}))
"""


def probe(**env) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", "NUMPY_MADVISE"))}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_batch_settings_apply_on_glibc():
    got = probe()
    assert got["applied"] == {"malloc": True, "no_hugepage": True}
    assert got["hugepage_was"] is False  # numpy no longer asks for huge pages


def test_an_operators_own_settings_win():
    got = probe(MALLOC_TRIM_THRESHOLD_="131072", NUMPY_MADVISE_HUGEPAGE="1")
    assert got["applied"] == {"malloc": False, "no_hugepage": False}
    assert got["hugepage_was"] is True


def test_only_batch_commands_tune():
    from prism.cli import BATCH_COMMANDS, build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert BATCH_COMMANDS <= commands
    assert "daemon" not in BATCH_COMMANDS and "collect" not in BATCH_COMMANDS


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_chunks_go_back_to_the_kernel():
    """release_free_memory hands back the pages of many small freed arrays (a replay's read chunks)."""
    probe = """
import numpy as np
from prism.common.allocator import release_free_memory, tune_for_batch
tune_for_batch()  # the replay's settings: freed memory is kept unless released
def rss():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS:")][0].split()[1]) // 1024
chunks = [np.ones(1 << 18) for _ in range(400)]  # 800 MiB in 2 MiB arrays
keep = np.ones(1 << 10)  # allocated last: the heap's top stays in use
held = rss()
del chunks
kept = rss()
release_free_memory()
print(held, kept, rss())
"""
    # without the glibc variables, which tune_for_batch leaves to whoever set them: a dask LocalCluster's nanny
    # (tests/test_replay_workers.py) sets MALLOC_TRIM_THRESHOLD_ in its parent's environment and never unsets it
    env = {k: v for k, v in os.environ.items() if k not in GLIBC_VARIABLES}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env)
    held, kept, released = map(int, out.stdout.split())
    assert kept > held - 100  # without it, the freed chunks stay resident
    assert released < held - 600
