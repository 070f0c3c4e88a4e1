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

from collections.abc import Callable
from typing import TypeVar

__all__ = ["register_warm_up", "registered_warm_ups", "warm_up_kernels"]

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
