"""Aggregate statistics over seeds (numpy): interquartile mean and percentile-bootstrap intervals.

IQM (Agarwal et al., 2021, "Deep RL at the edge of the statistical precipice") is the mean of
the middle 50% of the values: robust to a few failed or lucky seeds, less noisy than the median.
Used by sweeps (`rmtjax.sweep`) and the benchmarks (`benchmarks/lib/stats.py` builds on these).
"""

from __future__ import annotations

import numpy as np


def iqm_along(x, axis: int = -1) -> np.ndarray:
    """The IQM of every slice of `x` along `axis`. With n values sorted, the lowest and highest
    n/4 are dropped; where n/4 is fractional, the boundary values count with fractional weight
    (so the IQM is the trimmed mean of the 25%-75% range for any n)."""
    x = np.sort(np.asarray(x, np.float64), axis=axis)
    n = x.shape[axis]
    if n == 0:
        raise ValueError("iqm of no values")
    idx = np.arange(n)
    # weight of each sorted value: the length of [i, i+1] inside [n/4, 3n/4]
    w = np.clip(np.minimum(idx + 1, 3 * n / 4) - np.maximum(idx, n / 4), 0.0, 1.0)
    shape = [1] * x.ndim
    shape[axis] = n
    return (x * w.reshape(shape)).sum(axis=axis) / w.sum()


def iqm(values) -> float:
    """Mean of the middle 50% of `values` (flattened)."""
    return float(iqm_along(np.asarray(values, np.float64).ravel()))


def bootstrap_ci(values, stat=iqm, *, reps: int = 2000, confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat` over resamples (with replacement) of the seeds."""
    x = np.asarray(values, np.float64).ravel()
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(reps, x.size))]
    stats = iqm_along(samples, axis=1) if stat is iqm else np.array([stat(s) for s in samples])
    alpha = (1 - confidence) / 2
    return float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def iqm_ci(values, **kw) -> tuple[float, float, float]:
    """(IQM, low, high) with the percentile-bootstrap interval."""
    lo, hi = bootstrap_ci(values, iqm, **kw)
    return iqm(values), lo, hi
