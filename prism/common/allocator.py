"""Memory allocator settings for the batch commands (replay, what-if, synth).

Why this exists: a replay allocates and frees arrays of tens to hundreds of
MB hundreds of times. With glibc's defaults every array above the mmap
threshold (dynamic, at most 32 MiB) is a fresh ``mmap``; freeing it hands the
pages back to the kernel, and the next array faults them in again, zeroed.
NumPy also asks for transparent huge pages on large arrays
(``madvise(MADV_HUGEPAGE)``); where THP is in ``madvise`` mode and memory is
fragmented, the kernel compacts memory inside the page fault to find 2 MiB
pages. On the 13.6M-flow replay benchmark, 7 s of 18.6 s wall time was
system time; with both settings below it is 1.5 s of 11 s, for 6% more peak
RSS (freed memory is reused instead of returned).

Both are process-wide, so only the short-lived batch commands call
:func:`tune_for_batch`; the daemon keeps the defaults, where returning memory
after a burst matters more than the page faults. An operator who set the
glibc or NumPy variables themselves keeps their settings.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

__all__ = ["tune_for_batch", "release_free_memory", "GLIBC_VARIABLES"]

# mallopt(3) parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# Arrays up to this size come from the heap, and the heap is not trimmed
# until this much is free at its top: far above the replay's arrays, so a
# freed array's pages are reused by the next one instead of faulted again.
# mallopt takes a C int, so 2 GiB - 1 is the most either can be.
_THRESHOLD = 2**31 - 1

# the environment variables that set glibc's allocator thresholds; one set, :func:`tune_for_batch` leaves them alone
GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def tune_for_batch() -> dict[str, bool]:
    """Apply the batch allocator settings; return which ones took effect.

    A no-op (both False) off glibc, and for each setting whose environment
    variable the user set (``MALLOC_*_THRESHOLD_``/``GLIBC_TUNABLES``,
    ``NUMPY_MADVISE_HUGEPAGE``).
    """
    applied = {"malloc": False, "no_hugepage": False}
    if not any(v in os.environ for v in GLIBC_VARIABLES):
        applied["malloc"] = _set_glibc_thresholds()
    if "NUMPY_MADVISE_HUGEPAGE" not in os.environ:
        applied["no_hugepage"] = _numpy_hugepage_off()
    return applied


def release_free_memory() -> bool:
    """Give the heap's free pages back to the kernel (glibc ``malloc_trim``); False where unavailable.

    Many chunk-sized arrays freed at once (a replay joining its read
    chunks into whole columns) leave holes in the heap that no larger
    array can use; their pages would count in the peak until the end.
    """
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim(0)
    return True


@functools.lru_cache(maxsize=None)
def _libc():
    name = ctypes.util.find_library("c")  # runs ldconfig: once per process
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _set_glibc_thresholds() -> bool:
    mallopt = getattr(_libc(), "mallopt", None)  # musl has none
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, _THRESHOLD) == 1
    ok &= mallopt(_M_TRIM_THRESHOLD, _THRESHOLD) == 1
    return bool(ok)


def _numpy_hugepage_off() -> bool:
    try:  # numpy >= 2
        from numpy._core.multiarray import _set_madvise_hugepage  # type: ignore[attr-defined]  # private, not in numpy's stubs
    except ImportError:  # numpy 1.x
        try:
            from numpy.core.multiarray import _set_madvise_hugepage  # type: ignore[no-redef]  # the same, before numpy 2
        except ImportError:
            return False
    _set_madvise_hugepage(False)
    return True
