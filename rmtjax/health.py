"""Signs, checked between chunks, that a run has stopped learning although it goes on.

- **Every update skipped.** The precision guard (`rmtjax.precision`) skips an update whose
  loss or gradients are not finite, and each iteration reports `skipped_frac`, the share of
  its updates skipped (0 before learning starts). When a seed skipped all of its updates in
  each of the last `window` iterations, its parameters have not changed in that time.
- **Non-finite observation statistics.** With `env.normalize_obs`, one non-finite
  observation makes the running mean/variance non-finite, and they stay so for the rest of
  the run: every normalised observation the agent sees is then NaN.

Each is said once with a `HealthWarning` when it first appears, and (if it still holds at the
end) in the run's summary line and in `summary.json` under `warnings`.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np

WINDOW = 10  # iterations


class HealthWarning(UserWarning):
    """The run goes on but is no longer learning (the message says why)."""


def _seeds(mask: np.ndarray) -> str:
    idx = np.flatnonzero(mask)
    shown = ", ".join(str(i) for i in idx[:8]) + (", ..." if idx.size > 8 else "")
    return f"seed(s) {shown}"


def skipped_everything(chunks: list[dict[str, np.ndarray]], window: int = WINDOW) -> str | None:
    """A message when some seed skipped every update of the last `window` iterations (all of
    them, if fewer were done), from the metric chunks (name -> [iterations, num_seeds])."""
    if not chunks or "skipped_frac" not in chunks[-1]:
        return None
    tail, need = [], window
    for c in reversed(chunks):
        tail.append(np.asarray(c["skipped_frac"])[-need:])
        need -= tail[-1].shape[0]
        if need <= 0:
            break
    frac = np.concatenate(tail[::-1], axis=0)
    stuck = np.all(frac >= 1.0, axis=0)
    if not np.any(stuck):
        return None
    return (f"{_seeds(stuck)} skipped every update of the last {frac.shape[0]} iteration(s) (non-finite losses or "
            f"gradients; metric skipped_frac): their parameters did not change. Lower agent.lr, check the rewards "
            f"and observations (env.reward_scale, env.normalize_obs), or use precision.compute: fp32")


def nonfinite_obs_stats(state) -> str | None:
    """A message when the observation-normalisation statistics in `state` are not finite."""
    env_state = getattr(state, "env_state", None)
    stats = getattr(env_state, "obs_stats", None)
    if stats is None:
        return None
    bad = None
    for leaf in jax.tree.leaves(stats):
        if not getattr(leaf, "is_fully_addressable", True):
            return None  # another process's shard: that process checks it
        arr = np.asarray(jax.device_get(leaf))
        if arr.dtype.kind != "f":
            continue
        per_seed = ~np.all(np.isfinite(arr.reshape(arr.shape[0], -1)), axis=1) if arr.ndim else ~np.isfinite(arr)[None]
        bad = per_seed if bad is None else bad | per_seed
    if bad is None or not np.any(bad):
        return None
    return (f"the observation statistics (env.normalize_obs) of {_seeds(bad)} are not finite: an observation was "
            f"NaN or ±inf, or too large for float32, and every normalised observation is NaN from then on. Check "
            f"the environment's observations (env.params) or set env.normalize_obs: false")


class Watch:
    """Checks a run after each chunk; warns once per kind; `notes()` for the summary."""

    def __init__(self, window: int = WINDOW):
        self.window = window
        self._warned: set[str] = set()
        self._now: dict[str, str] = {}

    def after_chunk(self, state, chunks) -> None:
        found = {"skipped": skipped_everything(chunks, self.window), "obs_stats": nonfinite_obs_stats(state)}
        self._now = {k: v for k, v in found.items() if v is not None}
        for kind, message in self._now.items():
            if kind not in self._warned:
                self._warned.add(kind)
                warnings.warn(message, HealthWarning, stacklevel=3)

    def notes(self) -> list[str]:
        """What still holds after the last chunk."""
        return list(self._now.values())
