"""Tail probabilities of the binomial and the normal, from ``scipy.special``.

The analyses' significance tests need two numbers: P(X >= k) of a
binomial and the normal's upper tail. ``scipy.stats`` gives both, but
importing it costs every process 1.2 s at start (its distributions are
built at import), which each replica, each ``prism`` command and each
test subprocess paid. ``scipy.special`` holds the same functions:
``binom.sf`` is the regularized incomplete beta ``betainc`` (both Boost's,
equal to the last bit) and ``norm.sf(z)`` is ``ndtr(-z)``.

This module imports nothing of Prism's, so any layer may import it.
"""
from __future__ import annotations

from scipy.special import betainc, ndtr

__all__ = ["binomial_at_least", "normal_above"]


def binomial_at_least(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): ``scipy.stats.binom.sf(k - 1, n, p)``.

    >>> binomial_at_least(0, 10, 0.3), binomial_at_least(11, 10, 0.3)
    (1.0, 0.0)
    >>> round(binomial_at_least(2, 2, 0.5), 6)
    0.25
    """
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return float(betainc(k, n - k + 1, p))


def normal_above(z: float) -> float:
    """P(Z > z) for a standard normal Z: ``scipy.stats.norm.sf(z)``.

    >>> normal_above(0.0)
    0.5
    """
    return float(ndtr(-z))
