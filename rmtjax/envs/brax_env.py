"""brax environments (`brax:<name>`, e.g. `brax:ant`, `brax:halfcheetah`), as pure JAX.

`BraxEnv` gives a raw brax env (`brax.envs.get_environment`, no brax wrappers) gymnax's
interface, so `VecEnv` vmaps it over `num_envs` and the driver over seeds exactly like a
gymnax env. The episode bookkeeping brax's training wrappers would do is done here:

- **termination** is brax's `done` (e.g. the ant falls over);
- **truncation** is the time limit `max_steps_in_episode` (brax's `episode_length`, 1000 by
  default), counted here, and never reported on a step that also terminates;
- **auto-reset** draws a fresh initial state from the step's key (brax's own auto-reset
  replays one cached initial state instead), and the observation that ended the episode is
  returned as `final_observation`.

`env.params` takes `max_steps_in_episode` (dynamic, like a gymnax parameter) and any keyword
argument of the env's constructor (static), e.g. `backend: positional`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

DEFAULT_EPISODE_LENGTH = 1000  # brax's own default episode_length


@struct.dataclass
class BraxParams:
    max_steps_in_episode: int = DEFAULT_EPISODE_LENGTH


@struct.dataclass
class BraxEnvState:
    brax_state: Any  # brax.envs.State
    time: jax.Array  # steps taken in the current episode


@dataclasses.dataclass(frozen=True)
class BoxSpace:
    """The action box, with the attributes VecEnv reads (`low`, `high`, `shape`)."""

    low: np.ndarray
    high: np.ndarray
    shape: tuple


def _raw_key(key: jax.Array) -> jax.Array:
    # brax predates typed keys and indexes/splits raw uint32 keys in places
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


class BraxEnv:
    """One brax env with gymnax's interface: `reset(key, params) -> (obs, state)`,
    `step(key, state, action, params) -> (obs, state, reward, terminated, truncated,
    {"final_observation": ...})`. Actions are in [-1, 1]^action_size, as brax expects."""

    def __init__(self, env):
        self.env = env
        obs = jax.eval_shape(env.reset, jax.random.PRNGKey(0)).obs
        if not isinstance(obs, jax.ShapeDtypeStruct):
            raise TypeError(f"brax observations that are not one array ({type(obs).__name__}) are not supported")
        self.obs_shape = tuple(obs.shape)
        self.num_actions = int(env.action_size)

    def action_space(self, params=None) -> BoxSpace:
        ones = np.ones(self.num_actions, np.float32)
        return BoxSpace(-ones, ones, (self.num_actions,))

    def reset(self, key, params: BraxParams):
        s = self.env.reset(_raw_key(key))
        return s.obs, BraxEnvState(s, jnp.zeros((), jnp.int32))

    def step(self, key, state: BraxEnvState, action, params: BraxParams):
        nxt = self.env.step(state.brax_state, action)
        time = state.time + 1
        terminated = nxt.done > 0.5
        truncated = jnp.logical_and(time >= params.max_steps_in_episode, ~terminated)
        done = terminated | truncated
        fresh = self.env.reset(_raw_key(key))
        if jax.tree.structure(fresh) == jax.tree.structure(nxt):
            after = jax.tree.map(lambda f, n: jnp.where(done, f, n), fresh, nxt)
        else:  # metrics/info differ between reset and step: restart the physics and observation only
            after = nxt.replace(pipeline_state=jax.tree.map(lambda f, n: jnp.where(done, f, n),
                                                            fresh.pipeline_state, nxt.pipeline_state),
                                obs=jnp.where(done, fresh.obs, nxt.obs))
        after = after.replace(done=jnp.zeros_like(nxt.done))
        new = BraxEnvState(after, jnp.where(done, 0, time))
        return after.obs, new, nxt.reward, terminated, truncated, {"final_observation": nxt.obs}


# -- the adapter's registry interface ------------------------------------------------------
def names() -> list[str]:
    from brax import envs

    return sorted(envs._envs)  # brax keeps its registry private; there is no public listing


def has(name: str) -> bool:
    return name in names()


def make(name: str, env_cfg):
    """A `VecEnv` over `BraxEnv(name)`."""
    from brax import envs

    from rmtjax.schema import ConfigError
    from rmtjax.envs.vec import VecEnv

    kwargs = dict(env_cfg.params)
    steps = kwargs.pop("max_steps_in_episode", DEFAULT_EPISODE_LENGTH)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(f"env.params.max_steps_in_episode: expected a positive integer, got {steps!r}")
    try:
        raw = envs.get_environment(name, **kwargs)
    except TypeError as e:
        raise ConfigError(f"env.params: brax env {name!r} does not take {kwargs}: {e}") from None
    try:
        env = BraxEnv(raw)
    except TypeError as e:
        raise ConfigError(f"env.id: brax:{name}: {e}") from None
    return VecEnv(env, BraxParams(steps), env_cfg)
