"""The common shape of the pure-JAX suite adapters (playground, craftax, navix, jumanji, xminigrid).

Each suite steps one environment as a pure function but differs in how it reports the end of
an episode and whether it resets by itself. `SuiteEnv` turns such an env into gymnax's
interface, which `VecEnv` vmaps over `num_envs` and the driver over seeds. A subclass gives

- `_reset(key, params) -> (obs, suite_state)`: a fresh episode;
- `_step(key, suite_state, action, params) -> (obs, suite_state, reward, terminated, truncated)`:
  one step of the suite's own dynamics, **without** any reset;

and `SuiteEnv.step` does the episode bookkeeping the same way for every suite:

- **termination** and **truncation** (a time limit) are kept apart, as the suite reports them
  (or, where a suite counts no time, `max_steps_in_episode` counted here, as for brax);
- **auto-reset** draws a fresh episode from the step's key the moment one ends, and the
  observation that ended it is returned as `final_observation` (agents bootstrap from it
  through a truncation).

The step key is split in two: the first half goes to the suite's step (if it takes one), the
second to the reset. `render(state) -> uint8 [H, W, 3]` draws one environment's state (not a
batch), where the suite can draw; see `VecEnv.render`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@dataclasses.dataclass(frozen=True)
class DiscreteSpace:
    """`n` actions 0..n-1 (VecEnv reads `n`)."""

    n: int


@dataclasses.dataclass(frozen=True)
class BoxSpace:
    """A box of continuous actions (VecEnv reads `low`, `high`, `shape`)."""

    low: np.ndarray
    high: np.ndarray
    shape: tuple


@struct.dataclass
class TimeLimit:
    """The dynamic parameter of a suite whose episodes rmtjax times itself."""

    max_steps_in_episode: int


@struct.dataclass
class TimedState:
    """A suite state plus the steps taken in its episode (for suites that count no time)."""

    inner: Any
    time: jax.Array


def tree_where(cond, on_true, on_false):
    """Leafwise `where(cond, a, b)` over two pytrees of one structure (`cond` a scalar)."""
    return jax.tree.map(lambda a, b: jnp.where(cond, a, b), on_true, on_false)


def raw_key(key: jax.Array) -> jax.Array:
    """A raw uint32 key from a typed one: most suites predate typed keys."""
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


def as_uint8_frame(frame, max_value: float = 255.0) -> np.ndarray:
    """An image [H, W, 3] (or RGBA [H, W, 4], whose alpha is dropped) whose full intensity is
    `max_value`, as uint8 [H, W, 3]."""
    a = np.asarray(frame)
    if a.ndim == 3 and a.shape[-1] == 4:
        a = a[..., :3]
    if a.ndim != 3 or a.shape[-1] != 3:
        raise ValueError(f"expected an RGB frame [H, W, 3], got shape {a.shape}")
    if a.dtype.kind == "f" or max_value != 255.0:
        a = np.clip(np.rint(a.astype(np.float64) * (255.0 / max_value)), 0, 255)
    return a.astype(np.uint8)


class SuiteEnv:
    """A pure-JAX suite env with gymnax's interface: `reset(key, params) -> (obs, state)`,
    `step(key, state, action, params) -> (obs, state, reward, terminated, truncated,
    {"final_observation": obs before any reset})`. Subclasses set `obs_shape`, `num_actions`
    (discrete) or `action_box` (continuous), `max_episode_steps`, and implement `_reset`, `_step`."""

    suite = "suite"  # the id prefix, for messages
    action_box: BoxSpace | None = None
    num_actions: int = 0
    max_episode_steps: int | None = None

    def action_space(self, params=None):
        return self.action_box if self.action_box is not None else DiscreteSpace(self.num_actions)

    def reset(self, key, params):
        return self._reset(key, params)

    def step(self, key, state, action, params):
        k_step, k_reset = jax.random.split(key)
        obs, nxt, reward, terminated, truncated = self._step(k_step, state, action, params)
        terminated = jnp.asarray(terminated, bool)
        truncated = jnp.logical_and(jnp.asarray(truncated, bool), ~terminated)
        done = terminated | truncated
        fresh_obs, fresh = self._reset(k_reset, params)
        after = tree_where(done, fresh, nxt)
        after_obs = jnp.where(done, fresh_obs, obs)
        return after_obs, after, jnp.asarray(reward, jnp.float32), terminated, truncated, {"final_observation": obs}

    def render(self, state) -> np.ndarray:
        """One environment's frame, uint8 [H, W, 3]; `state` is that env's state (unbatched)."""
        raise NotImplementedError(f"{self.suite}: this suite offers no frames to render")

    def _reset(self, key, params):
        raise NotImplementedError

    def _step(self, key, state, action, params):
        raise NotImplementedError


def pop_time_limit(kwargs: dict, default: int, what: str) -> int:
    """Take `max_steps_in_episode` out of `kwargs` (default `default`), checked."""
    from rmtjax.schema import ConfigError

    steps = kwargs.pop("max_steps_in_episode", default)
    if isinstance(steps, float) and steps.is_integer():
        steps = int(steps)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(f"env.params.max_steps_in_episode: expected a positive integer (the time limit of "
                          f"{what} in steps), got {steps!r}")
    return steps


def check_names(prefix: str, name: str, known) -> None:
    """A `ConfigError` naming close matches when `name` is not one of `known`."""
    from rmtjax.schema import ConfigError, close_matches

    if name not in known:
        raise ConfigError(f"env.id: {prefix} has no environment {name!r}.{close_matches(name, list(known))}")
