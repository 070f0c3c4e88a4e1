"""The registry of compiled-kernel warm-ups.

numba loads a compiled function from its on-disk cache at its first call,
not at import. The daemon pays that at start (:mod:`prism.serve.warmup`)
by running a small fixture through the code a window takes; a kernel that
fixture does not reach (one that only a large fabric or a large window
calls) is loaded by a warm-up its own module registers here, calling it
with tiny arguments of the types the real calls pass. The module that owns
a kernel knows its argument types; the warm-up need not import its private
names.

This module imports nothing of Prism's, so any layer may register.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["register_warm_up", "registered_warm_ups", "warm_up_kernels", "cached_kernels", "log_compile_state"]

_WARM_UPS: dict[str, Callable[[], object]] = {}
_F = TypeVar("_F", bound=Callable[[], object])


def register_warm_up(fn: _F) -> _F:
    """Register ``fn`` (no arguments; calls its module's kernels on tiny examples); a decorator.

    Registering a function again (a module reloaded) replaces it.
    """
    _WARM_UPS[f"{fn.__module__}.{fn.__qualname__}"] = fn
    return fn


def registered_warm_ups() -> dict[str, Callable[[], object]]:
    """The registered warm-ups by qualified name (those of the modules imported so far)."""
    return dict(_WARM_UPS)


def warm_up_kernels() -> list[str]:
    """Run every registered warm-up, in the order registered; return their names."""
    for fn in list(_WARM_UPS.values()):
        fn()
    return list(_WARM_UPS)


def cached_kernels(packages: Iterable[str] = ("prism", "collectors")) -> int:
    """Compiled functions in numba's on-disk cache (its ``*.nbi`` index files): 0 means every kernel compiles on first use.

    The cache is ``$NUMBA_CACHE_DIR`` when set, else the ``__pycache__``
    directories beside the code of ``packages``.
    """
    import importlib.util

    where = os.environ.get("NUMBA_CACHE_DIR")
    roots = [where] if where else [os.path.dirname(spec.origin) for name in packages
                                   if (spec := importlib.util.find_spec(name)) is not None and spec.origin]
    n = 0
    for root in roots:
        for _, _, files in os.walk(root):
            n += sum(f.endswith(".nbi") for f in files)
    return n


def log_compile_state(log: logging.Logger, what: str) -> bool:
    """Say (at info) when the compiled kernels are not cached, so that the first ``what`` will compile them; True then.

    A new pod with an empty cache spends its first seconds compiling (the
    first ``prism collect`` of a fresh install took 16 s, the second 0.8 s):
    this line says why, and where the cache is.
    """
    import prism

    if prism.NUMBA_CACHE_NOTE:
        log.warning(prism.NUMBA_CACHE_NOTE)
    if cached_kernels():
        return False
    where = os.environ.get("NUMBA_CACHE_DIR") or "beside the code"
    log.info(f"no compiled kernels in numba's cache ({where}): compiling them, the {what} takes 15-30 s longer this once; "
             "keep the cache directory on a volume to skip this on the next start")
    return True
