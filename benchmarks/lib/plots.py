"""Plots (matplotlib, file-only): pyplot when it is installed, and learning curves of several agents."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from benchmarks.lib.curves import episode_returns, smooth


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or None (with a line saying so) when
    matplotlib is not installed: the experiments then write their tables without plots."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'rmtjax[bench]'): no plot")
        return None
    return plt


def plot_curves(path: Path, title: str, curves: dict) -> None:
    """One panel of learning curves, {label: (returns [seeds, iters], env steps [iters], episodes
    [seeds, iters])}: each the mean over seeds of a moving mean over 1% of training, the band
    from the lowest to the highest seed; written to `path`."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for algo, (ret, x, episodes) in curves.items():
        ret = smooth(episode_returns(ret, episodes))
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before any episode
            ax.plot(x, np.nanmean(ret, 0), label=f"{algo} (mean of {ret.shape[0]})")
            ax.fill_between(x, np.nanmin(ret, 0), np.nanmax(ret, 0), alpha=0.2)
    ax.set_xlabel("env steps per seed (curves: moving mean over 1% of training)")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
