"""Learning-curve arithmetic over seeds (numpy): points of a curve, a common grid for agents run
apart, the late mean of training, a moving mean for plots."""

from __future__ import annotations

import warnings

import numpy as np

POINTS = 10


def curve_points(returns: np.ndarray, env_steps: np.ndarray, points: int = POINTS):
    """(steps [points], mean return over seeds at each, [seeds, points]) from per-iteration
    `returns` [seeds, iters]: each point is the iteration at the end of its tenth of training."""
    iters = returns.shape[1]
    idx = np.unique(np.linspace(iters / points, iters, points).round().astype(int) - 1)
    return env_steps[idx], returns[:, idx]


def grid_points(returns: np.ndarray, env_steps: np.ndarray, episodes: np.ndarray, total_steps: int,
                points: int = POINTS):
    """(grid [points], mean return over seeds at each grid point) for a table whose columns are
    the same for every agent: grid point g reads the last iteration at or before g (0.1% slack,
    for iterations that overshoot the budget by a few steps). A seed that has not finished an
    episode by then counts as missing (its metric holds 0, not a return); NaN where no seed has
    one, or where the agent's first iteration comes after g."""
    grid = np.linspace(total_steps / points, total_steps, points)
    values = episode_returns(returns, episodes)
    out = np.full(points, np.nan)
    for j, g in enumerate(grid):
        idx = np.searchsorted(env_steps, g * 1.001, side="right") - 1
        if idx >= 0 and not np.isnan(values[:, idx]).all():
            out[j] = np.nanmean(values[:, idx])
    return grid, out


def episode_returns(returns: np.ndarray, episodes: np.ndarray) -> np.ndarray:
    """`returns` [seeds, iters] with NaN before each seed's first finished episode (where the
    metric holds 0, not a return); `episodes` [seeds, iters] the episodes finished per iteration."""
    return np.where(np.cumsum(episodes, axis=1) > 0, returns, np.nan)


def late_mean(returns: np.ndarray, env_steps: np.ndarray, episodes: np.ndarray, total_steps: int,
              share: float = 0.1) -> np.ndarray:
    """[seeds] each seed's learning curve averaged over the iterations in the last `share` of
    training (NaN where the seed has finished no episode by then). Steadier than the final
    return, which is one snapshot of each env's last episode: on Breakout-MinAtar at 1M steps a
    seed's snapshot has a standard deviation of 5-8 over the iterations of the last tenth."""
    late = env_steps > total_steps * (1.0 - share)
    values = episode_returns(returns, episodes)[:, late]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a seed with no episode yet: NaN
        return np.nanmean(values, axis=1)


def smooth(values: np.ndarray, share: float = 0.01) -> np.ndarray:
    """[seeds, iters] trailing moving mean over a window of `share` of all iterations (at least 1), ignoring
    NaN (pre-episode) entries; NaN where the window holds none. For plots only."""
    window = max(1, int(values.shape[1] * share))
    ok = ~np.isnan(values)
    total = np.cumsum(np.where(ok, values, 0.0), axis=1)
    count = np.cumsum(ok, axis=1)
    total[:, window:] = total[:, window:] - total[:, :-window]
    count[:, window:] = count[:, window:] - count[:, :-window]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)
