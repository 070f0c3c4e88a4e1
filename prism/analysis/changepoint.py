"""Bayesian online change-point detection (Adams & MacKay 2007).

A Normal-Gamma prior on each segment's mean and precision gives a Student-t
posterior predictive, updated per point; a constant hazard ``1/lam`` is the
prior probability that a new segment starts at any point. Everything is in
log space, in float64.

Two choices follow from how BOCD behaves in practice:

- **Truncation with a merged tail.** The run-length posterior is kept to
  ``max_run`` bins to bound the cost per point. Mass that would grow past the
  last bin is *added to* the last bin, whose statistics are those of a
  sliding window of the last ``max_run - 1`` points. Cutting the tail off
  instead (renormalising without it) makes the MAP run length sawtooth, and
  every reset looks like a change point: about 20x more false alarms.
- **Detection from the MAP run length.** With a constant hazard,
  ``P(r_t = 0 | x_1..t)`` equals the hazard whatever the data, so it cannot
  signal anything. A change shows as the MAP run length dropping (from a long
  run to a short one); the new segment starts ``r_t`` points back.

The prior scale comes from the data: each series is centred on its median
and scaled by its noise (MAD of first differences, with a floor), so one set
of settings fits signals of any unit.

:class:`BOCD` follows ruptures' conventions: settings in the constructor,
``fit(signal)`` then ``predict()`` returning breakpoints (segment ends, the
last being ``len(signal)``); ``update(x)`` is the online form. Many series
are processed together with :meth:`BOCD.fit_many`, which advances all of them
one point at a time over ``(series x run length)`` arrays: the per-point
Python overhead is shared by every series, which is what makes BOCD over
thousands of GPU pairs fast.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["BOCD"]

_LOG_2PI = np.log(2 * np.pi)


class BOCD:
    """Bayesian online change-point detector.

    Parameters
    ----------
    lam : float, default 1000
        Expected segment length in points; the hazard is ``1 / lam``.
    max_run : int, default 64
        Run-length bins kept (cost per point is O(max_run)); the last bin
        holds the merged tail.
    mu0, kappa0, alpha0, beta0 : float
        Normal-Gamma prior on standardised data: prior mean, pseudo-count
        of the mean, shape and rate of the precision.
    min_drop : int, default 3
        A change is reported when the MAP run length falls by at least this
        much; smaller drops are posterior jitter.
    short_run : int, default 24
        ...and lands on a run no longer than this. Once runs reach the
        merged tail, the MAP wanders between the tail and mid-length runs;
        only a fall to a *short* run means the data changed.
    min_size : int, default 2
        Shortest segment reported.
    scale_floor : float, default 1e-3
        Floor on the standardising scale (a constant series has MAD 0).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = np.concatenate([rng.normal(0, 1, 100), rng.normal(6, 1, 100)])
    >>> BOCD().fit(x).predict()
    [100, 200]
    """

    def __init__(
        self,
        lam: float = 1000.0,
        max_run: int = 64,
        mu0: float = 0.0,
        kappa0: float = 1.0,
        alpha0: float = 1.0,
        beta0: float = 1.0,
        min_drop: int = 3,
        short_run: int = 24,
        min_size: int = 2,
        scale_floor: float = 1e-3,
    ):
        if lam <= 1:
            raise ValueError("lam must be > 1")
        if max_run < 2:
            raise ValueError("max_run must be >= 2")
        self.lam = float(lam)
        self.max_run = int(max_run)
        self.mu0, self.kappa0, self.alpha0, self.beta0 = float(mu0), float(kappa0), float(alpha0), float(beta0)
        self.min_drop = int(min_drop)
        self.short_run = int(short_run)
        self.min_size = int(min_size)
        self.scale_floor = float(scale_floor)
        R = self.max_run
        r = np.arange(R, dtype=np.float64)
        # run length r has seen r points (the last bin: a window of R - 1)
        self._kappa = self.kappa0 + r
        self._alpha = self.alpha0 + r / 2
        nu = 2 * self._alpha
        # Student-t log-density constant per bin, and the scale factor
        # sigma^2 = beta * (kappa + 1) / (alpha * kappa)
        from scipy.special import gammaln  # imported when a detector is made: it costs a replay's start 0.06 s otherwise

        self._const = gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * np.log(nu * np.pi)
        self._s2_factor = (self._kappa + 1) / (self._alpha * self._kappa)
        # per-bin constants of the predictive and of the posterior update
        self._inv_nu_f = 1.0 / (nu * self._s2_factor)
        self._neg_half_nu1 = -(nu + 1) / 2
        self._const_f = self._const - 0.5 * np.log(self._s2_factor)
        self._mu_gain = 1.0 / (self._kappa + 1)
        self._beta_gain = self._kappa / (2 * (self._kappa + 1))
        self._log_h = np.log(1 / self.lam)
        self._log_1mh = np.log1p(-1 / self.lam)
        self._online: dict[str, Any] | None = None

    # -- batch over many series -------------------------------------------
    def fit_many(self, series: list[np.ndarray]) -> list[list[int]]:
        """Breakpoints of each series (ruptures convention: segment ends).

        Parameters
        ----------
        series : list of 1-d arrays
            Any lengths; each is standardised on its own.

        Returns
        -------
        list of list of int
            Per series, sorted segment ends, the last being its length.

        Notes
        -----
        O(total points x max_run) arithmetic, with O(max series length)
        numpy calls: all series advance together, sorted by length so that
        the ones still running are always a prefix of the arrays. Memory is
        O(total points + series x max_run).
        """
        n = len(series)
        if n == 0:
            return []
        lengths = np.array([len(s) for s in series], dtype=np.int64)
        order = np.argsort(-lengths, kind="stable")
        T = int(lengths.max())
        # series laid end to end, longest first: no padding, so memory is
        # O(total points) however unequal the lengths are
        flat = np.concatenate([self._standardise(np.asarray(series[k], dtype=np.float64)) for k in order] or [np.empty(0)])
        offsets = np.concatenate([[0], np.cumsum(lengths[order])[:-1]])
        n_active = np.searchsorted(-lengths[order], -np.arange(T), side="left")  # rows with length > t
        maps = np.empty(len(flat), dtype=np.int64)
        state = self._init_state(n)
        for t in range(T):
            m = int(n_active[t])
            idx = offsets[:m] + t
            maps[idx] = self._step(state, flat[idx], m)
        out: list[list[int]] = [None] * n  # type: ignore[list-item]
        for i, k in enumerate(order):
            out[k] = self._breakpoints(maps[offsets[i] : offsets[i] + lengths[k]])
        return out

    def fit(self, signal: ArrayLike) -> "BOCD":
        """Run the detector over one series; results via :meth:`predict`."""
        signal = np.asarray(signal, dtype=np.float64).ravel()
        self._bkps = self.fit_many([signal])[0]
        self.n_samples = len(signal)
        return self

    def predict(self) -> list[int]:
        """Breakpoints of the fitted series: segment ends, the last = n."""
        if not hasattr(self, "_bkps"):
            raise RuntimeError("call fit() first")
        return list(self._bkps)

    def fit_predict(self, signal: ArrayLike) -> list[int]:
        return self.fit(signal).predict()

    # -- online ------------------------------------------------------------
    def update(self, x: float, loc: float = 0.0, scale: float = 1.0) -> int | None:
        """Feed one point; return the start index of a new segment if one is detected.

        Online use cannot standardise on the whole series: give ``loc`` and
        ``scale`` (e.g. from a warm-up window); they must stay fixed.
        """
        if self._online is None:
            self._online = {"state": self._init_state(1), "t": 0, "prev": 0, "last_cp": 0}
        o = self._online
        z = np.array([(float(x) - loc) / max(scale, self.scale_floor)])
        r = int(self._step(o["state"], z, 1)[0])
        t, prev = o["t"], o["prev"]
        o["t"], o["prev"] = t + 1, r
        if r <= prev - self.min_drop and r <= self.short_run:
            start = t - r + 1
            if start - o["last_cp"] >= self.min_size:
                o["last_cp"] = start
                return start
        return None

    # -- internals -----------------------------------------------------------
    def _standardise(self, x: np.ndarray) -> np.ndarray:
        """Centre on the median; scale by the noise, not by the spread.

        The scale is the MAD of first differences / sqrt(2): on a piecewise
        constant signal the differences are noise except at the few change
        points, so this estimates the within-segment noise. The MAD of the
        values themselves would measure the spread of the levels, shrinking
        the noise below the prior's and hiding real shifts.
        """
        if len(x) == 0:
            return x
        med = np.median(x)
        scale = 0.0
        if len(x) > 2:
            dx = np.diff(x)
            scale = np.median(np.abs(dx - np.median(dx))) * 1.4826 / np.sqrt(2)
        if scale < self.scale_floor:
            sd = np.std(x)
            scale = sd if sd >= self.scale_floor else 1.0
        return (x - med) / scale

    def _init_state(self, n: int) -> dict:
        R = self.max_run
        log_r = np.full((n, R), -np.inf)
        log_r[:, 0] = 0.0
        return {
            "log_r": log_r,
            "mu": np.full((n, R), self.mu0),
            "beta": np.full((n, R), self.beta0),
            "buf_d": np.empty((n, R)),
            "buf_q": np.empty((n, R)),
            "buf_lp": np.empty((n, R)),
        }

    def _step(self, st: dict, x: np.ndarray, m: int) -> np.ndarray:
        """Advance the first m series by one point x (shape (m,)); return MAP run lengths.

        Written as few full passes over the (m, R) arrays as possible, in
        preallocated buffers: this loop is the whole cost of BOCD.
        """
        log_r = st["log_r"][:m]
        mu = st["mu"][:m]
        beta = st["beta"][:m]
        d = st["buf_d"][:m]
        q = st["buf_q"][:m]
        lp = st["buf_lp"][:m]
        xc = x[:, None]
        # predictive log-density of x under every run length:
        # const - log(s2)/2 - (nu+1)/2 * log1p(d^2 / (nu s2)), s2 = beta * factor
        np.subtract(xc, mu, out=d)
        np.multiply(d, d, out=q)  # d^2, reused by the beta update
        np.divide(q, beta, out=lp)
        lp *= self._inv_nu_f
        np.log1p(lp, out=lp)
        lp *= self._neg_half_nu1
        lp -= 0.5 * np.log(beta)
        lp += self._const_f
        lp += log_r  # log joint
        mx = lp.max(axis=1, keepdims=True)
        np.subtract(lp, mx, out=log_r)  # scratch: log_r is rewritten below
        np.exp(log_r, out=log_r)
        log_evidence = mx[:, 0] + np.log(log_r.sum(axis=1))
        # growth (times 1 - h), the merged tail, the change point (times h)
        tail = lp[:, -1].copy()
        log_r[:, 1:] = lp[:, :-1]
        log_r[:, -1] = np.logaddexp(log_r[:, -1], tail)
        log_r[:, 1:] += self._log_1mh
        log_r[:, 0] = log_evidence + self._log_h
        log_r -= log_evidence[:, None]  # normalise: log P(r_t | x_1..t)
        # posterior statistics after x, shifted one bin (bin r+1 from bin r)
        # mu' = mu + d / (k + 1); beta' = beta + k d^2 / (2 (k + 1))
        q *= self._beta_gain
        q += beta
        d *= self._mu_gain
        d += mu
        mu[:, 1:] = d[:, :-1]
        beta[:, 1:] = q[:, :-1]
        mu[:, 0] = self.mu0
        beta[:, 0] = self.beta0
        return log_r.argmax(axis=1)

    def _breakpoints(self, maps: np.ndarray) -> list[int]:
        """Segment ends from the MAP run-length path of one series."""
        n = len(maps)
        if n == 0:
            return [0]
        drops = np.flatnonzero((maps[1:] <= maps[:-1] - self.min_drop) & (maps[1:] <= self.short_run)) + 1
        starts = drops - maps[drops] + 1  # run length r after x_t: the run began at t - r + 1
        bkps = []
        last = 0
        for s in np.unique(starts):
            if s - last >= self.min_size and n - s >= 1:
                bkps.append(int(s))
                last = int(s)
        return bkps + [n]
