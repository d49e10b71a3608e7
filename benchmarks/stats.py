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


def iqm_along(x, axis: int = -1) -> np.ndarray:
    """`iqm` of every slice of `x` along `axis`, vectorised (the same fractional trimming)."""
    x = np.sort(np.asarray(x, np.float64), axis=axis)
    n = x.shape[axis]
    if n == 0:
        raise ValueError("iqm of no values")
    idx = np.arange(n)
    w = np.clip(np.minimum(idx + 1, 3 * n / 4) - np.maximum(idx, n / 4), 0.0, 1.0)
    shape = [1] * x.ndim
    shape[axis] = n
    return (x * w.reshape(shape)).sum(axis=axis) / w.sum()


def stratified_iqm_ci(scores, *, reps: int = 2000, confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(IQM, low, high) of `scores` [seeds, tasks] pooled over all runs, with a stratified
    percentile bootstrap: each resample draws the seeds again within every task (rliable's
    aggregate IQM interval). NaN entries (a task an agent did not run) are left out."""
    s = np.asarray(scores, np.float64)
    if s.ndim == 1:
        s = s[:, None]
    cols = [c[np.isfinite(c)] for c in s.T]
    cols = [c for c in cols if c.size]
    if not cols:
        raise ValueError("stratified_iqm_ci of no values")
    rng = np.random.default_rng(seed)
    # every task's seeds resampled with replacement, [reps, n_task] per task, pooled per resample
    pooled = np.concatenate([c[rng.integers(0, c.size, size=(reps, c.size))] for c in cols], axis=1)
    stats = iqm_along(pooled, axis=1)
    alpha = (1 - confidence) / 2
    return iqm(np.concatenate(cols)), float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def bootstrap_band(curves, *, reps: int = 1000, confidence: float = 0.95, seed: int = 0):
    """(IQM, low, high), each [points], of learning curves `curves` [seeds, points]: the IQM over
    seeds at every point with a percentile-bootstrap interval (seeds resampled as whole curves)."""
    c = np.asarray(curves, np.float64)
    rng = np.random.default_rng(seed)
    samples = c[rng.integers(0, c.shape[0], size=(reps, c.shape[0]))]  # [reps, seeds, points]
    stats = iqm_along(samples, axis=1)
    alpha = (1 - confidence) / 2
    return iqm_along(c, axis=0), np.quantile(stats, alpha, axis=0), np.quantile(stats, 1 - alpha, axis=0)
