"""Aggregate statistics over seeds: interquartile mean, percentile-bootstrap intervals and ratios of IQMs (numpy).

IQM (Agarwal et al., 2021, "Deep RL at the edge of the statistical precipice") is the mean of
the middle 50% of the values: robust to a few failed or lucky seeds, less noisy than the median.
"""

from __future__ import annotations

import numpy as np


# iqm, iqm_along, bootstrap_ci and iqm_ci live in the package (sweeps use them)
from rmtjax.stats import bootstrap_ci, iqm, iqm_along, iqm_ci  # noqa: E402,F401


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


def speedup_cell(scratch, scratch_budget: int, other, other_budget: int) -> str:
    """The speed-up cell: IQM(scratch) / IQM(other) [95% CI] where both are measured; with censored
    seeds the IQM may be a bound: a scratch IQM at its budget makes the ratio a lower bound (≥),
    a variant's IQM at its budget an upper bound (≤), both: nothing can be said. Both are first
    censored at the shorter budget, so that a ratio never comes from the budgets alone."""
    horizon = min(scratch_budget, other_budget)
    a, b = np.minimum(scratch, horizon), np.minimum(other, horizon)
    a_cut, b_cut = iqm(a) >= horizon, iqm(b) >= horizon
    if a_cut and b_cut:
        return f"– (neither IQM reaches it within {horizon:,})"
    r, lo, hi = ratio_ci(a, b)
    if a_cut:
        return f"≥ {r:.2f} (scratch's IQM cut at {horizon:,})"
    if b_cut:
        return f"≤ {r:.2f} (this IQM cut at {horizon:,})"
    return f"{r:.2f} [{lo:.2f}, {hi:.2f}]"


def ratio_ci(scratch, other, reps: int = 2000, seed: int = 0):
    """(IQM(scratch) / IQM(other), low, high): the seeds of each resampled independently."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(scratch, float), np.asarray(other, float)
    ra = a[rng.integers(0, a.size, size=(reps, a.size))]
    rb = b[rng.integers(0, b.size, size=(reps, b.size))]
    stats = iqm_along(ra, axis=1) / np.maximum(iqm_along(rb, axis=1), 1.0)
    return iqm(a) / max(iqm(b), 1.0), float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))
