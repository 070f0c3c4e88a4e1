"""Tail probabilities of the binomial, the hypergeometric and the normal, from ``scipy.special`` and ``math``.

The analyses' significance tests need three numbers: P(X >= k) of a
binomial and of a hypergeometric, and the normal's upper tail.
``scipy.stats`` gives them all, but importing it costs every process 1.2 s at start (its distributions are
built at import), which each replica, each ``prism`` command and each
test subprocess paid. ``scipy.special`` holds the same functions:
``binom.sf`` is the regularized incomplete beta ``betainc`` (both Boost's,
equal to the last bit) and ``norm.sf(z)`` is ``ndtr(-z)``. The
hypergeometric's tail is a sum of ``math.lgamma`` terms (``hypergeom.sf``
to about 1e-12 relative).

This module imports nothing of Prism's, so any layer may import it.
"""
from __future__ import annotations

from math import exp, lgamma

from scipy.special import betainc, ndtr

__all__ = ["binomial_at_least", "hypergeometric_at_least", "normal_above"]


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


def hypergeometric_at_least(k: int, total: int, marked: int, drawn: int) -> float:
    """P(X >= k) for X the marked items among ``drawn`` taken without replacement from ``total``, ``marked`` of them marked.

    ``scipy.stats.hypergeom.sf(k - 1, total, marked, drawn)``, summed in
    log space (binomial coefficients of thousands overflow a float).

    >>> hypergeometric_at_least(0, 10, 3, 4), hypergeometric_at_least(4, 10, 3, 4)
    (1.0, 0.0)
    >>> round(1 / hypergeometric_at_least(9, 36, 9, 9))  # the 9 marked are the 9 drawn: one way in C(36, 9)
    94143280
    """
    least, most = max(0, drawn - (total - marked)), min(marked, drawn)  # the fewest and most marked a draw can hold
    if k <= least:
        return 1.0
    if k > most:
        return 0.0

    def log_choose(a: int, b: int) -> float:
        return lgamma(a + 1) - lgamma(b + 1) - lgamma(a - b + 1)

    base = log_choose(total, drawn)
    logs = [log_choose(marked, i) + log_choose(total - marked, drawn - i) - base for i in range(k, most + 1)]
    top = max(logs)
    return min(1.0, exp(top) * sum(exp(v - top) for v in logs))


def normal_above(z: float) -> float:
    """P(Z > z) for a standard normal Z: ``scipy.stats.norm.sf(z)``.

    >>> normal_above(0.0)
    0.5
    """
    return float(ndtr(-z))
