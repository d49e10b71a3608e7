"""Aggregate statistics over seeds: interquartile mean and percentile-bootstrap intervals (numpy).

IQM (Agarwal et al., 2021, "Deep RL at the edge of the statistical precipice") is the mean of
the middle 50% of the values: robust to a few failed or lucky seeds, less noisy than the median.
"""

from __future__ import annotations

import numpy as np


def iqm(values) -> float:
    """Mean of the middle 50% of `values` (1-D). With n values sorted, the lowest and highest
    n/4 are dropped; where n/4 is fractional, the boundary values count with fractional weight
    (so IQM is the trimmed mean of the 25%-75% range for any n)."""
    x = np.sort(np.asarray(values, np.float64).ravel())
    n = x.size
    if n == 0:
        raise ValueError("iqm of no values")
    # weight of each sorted value: the length of [i, i+1] inside [n/4, 3n/4]
    lo, hi = n / 4, 3 * n / 4
    idx = np.arange(n)
    w = np.clip(np.minimum(idx + 1, hi) - np.maximum(idx, lo), 0.0, 1.0)
    return float((w * x).sum() / w.sum())


def bootstrap_ci(values, stat=iqm, *, reps: int = 2000, confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat` over resamples (with replacement) of the seeds."""
    x = np.asarray(values, np.float64).ravel()
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(reps, x.size))]
    stats = np.array([stat(s) for s in samples])
    alpha = (1 - confidence) / 2
    return float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def iqm_ci(values, **kw) -> tuple[float, float, float]:
    """(IQM, low, high) with the percentile-bootstrap interval."""
    lo, hi = bootstrap_ci(values, iqm, **kw)
    return iqm(values), lo, hi
