"""A batch of `num_envs` environments with the standard wrappers, as pure JAX.

The wrappers run in this order on every step:

1. the environment itself (gymnax, or an adapter from `rmtjax.envs`; auto-resets a finished
   episode and reports `terminated` and `truncated` apart, with the pre-reset observation),
2. episode statistics on the *raw* rewards (return, length, last completed episode),
3. frame stacking (the last `frame_stack` observations concatenated on the last axis),
4. observation normalisation (running or sliding-window mean/variance shared by the batch),
5. reward transformation (normalisation by the std of the discounted return, scale, clip).

`step` returns `info["final_obs"]`: the observation that ended the step *before* any reset,
passed through the same stacking and normalisation, so an agent can bootstrap through a
time-limit truncation. Agents must never bootstrap through `terminated`.

The environment is either a single functional env with gymnax's interface (`reset(key,
params)`, `step(key, state, action, params)`, `action_space(params)`), which `VecEnv` vmaps
over `num_envs`, or a *batched* one (`env.batched = True`, e.g. a host env) whose `reset` and
`step` already take and return the whole `[num_envs]` batch, with one key for the batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

OBS_CLIP = 10.0  # normalised observations are clipped to [-10, 10], as is usual for PPO-style agents


@struct.dataclass
class RunningStats:
    """Mean and variance over every sample seen (Chan's parallel update)."""

    count: jax.Array
    mean: jax.Array
    var: jax.Array

    @classmethod
    def create(cls, shape):
        return cls(jnp.zeros((), jnp.float32), jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32))

    def update(self, batch: jax.Array) -> "RunningStats":
        batch = batch.astype(jnp.float32)
        n = batch.shape[0]
        b_mean, b_var = batch.mean(0), batch.var(0)
        total = self.count + n
        delta = b_mean - self.mean
        mean = self.mean + delta * n / total
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / total
        return RunningStats(total, mean, m2 / total)

    def moments(self):
        return self.mean, self.var


@struct.dataclass
class WindowStats:
    """Mean and variance over the last `window` steps: a ring of per-step batch moments."""

    means: jax.Array  # [window, *shape]
    sq_means: jax.Array  # [window, *shape]
    index: jax.Array
    filled: jax.Array

    @classmethod
    def create(cls, shape, window: int):
        z = jnp.zeros((window, *shape), jnp.float32)
        return cls(z, z, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))

    def update(self, batch: jax.Array) -> "WindowStats":
        batch = batch.astype(jnp.float32)
        window = self.means.shape[0]
        means = self.means.at[self.index].set(batch.mean(0))
        sq_means = self.sq_means.at[self.index].set((batch**2).mean(0))
        return WindowStats(means, sq_means, (self.index + 1) % window, jnp.minimum(self.filled + 1, window))

    def moments(self):
        valid = (jnp.arange(self.means.shape[0]) < self.filled).astype(jnp.float32)
        valid = valid.reshape((-1,) + (1,) * (self.means.ndim - 1))
        n = jnp.maximum(self.filled, 1).astype(jnp.float32)
        mean = (self.means * valid).sum(0) / n
        var = jnp.maximum((self.sq_means * valid).sum(0) / n - mean**2, 0.0)
        return mean, jnp.where(self.filled > 0, var, 1.0)


@struct.dataclass
class VecEnvState:
    """Everything the batch of environments carries from one step to the next."""

    inner: Any  # the environments' own states, batched [num_envs]
    params: Any  # the environments' parameters (shared by the batch; dynamic, so a curriculum may move them)
    episode_return: jax.Array  # [N] raw return of the episode in progress
    episode_length: jax.Array  # [N]
    last_return: jax.Array  # [N] raw return of each env's most recently completed episode
    last_length: jax.Array  # [N]
    episodes_done: jax.Array  # [N] completed episodes so far
    stack: Any  # [N, *obs_shape] stacked observations, or None without frame stacking
    obs_stats: Any  # RunningStats | WindowStats | None
    return_stats: Any  # RunningStats of the discounted return, or None
    discounted_return: Any  # [N] or None


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about the (wrapped) environment."""

    obs_shape: tuple
    obs_dtype: Any
    discrete: bool
    num_actions: int  # discrete: number of actions; continuous: 0
    action_shape: tuple  # continuous: shape of an action; discrete: ()
    action_low: np.ndarray | None
    action_high: np.ndarray | None
    max_episode_steps: int | None


class VecEnv:
    """`num_envs` copies of one environment plus the wrappers chosen in `EnvConfig`."""

    def __init__(self, env, env_params, env_cfg, action_space=None, obs_space=None):
        self.env = env
        self.default_params = env_params
        self.cfg = env_cfg
        self.num_envs = env_cfg.num_envs
        self.batched = bool(getattr(env, "batched", False))
        action_space = action_space if action_space is not None else env.action_space(env_params)
        self.discrete = hasattr(action_space, "n")
        raw = jax.eval_shape(lambda k: self._env_reset(k, env_params)[0], jax.random.key(0))
        self.raw_obs_shape = tuple(raw.shape[1:])
        self.raw_obs_dtype = raw.dtype
        max_steps = _max_steps(env_params)
        if max_steps is None:
            max_steps = getattr(env, "max_episode_steps", None)
        k = env_cfg.frame_stack
        obs_shape = self.raw_obs_shape[:-1] + (self.raw_obs_shape[-1] * k,) if self.raw_obs_shape else (k,)
        if self.discrete:
            self.spec = EnvSpec(obs_shape, jnp.float32 if env_cfg.normalize_obs else raw.dtype, True,
                                int(action_space.n), (), None, None, max_steps)
        else:
            low = np.broadcast_to(np.asarray(action_space.low, np.float32), action_space.shape)
            high = np.broadcast_to(np.asarray(action_space.high, np.float32), action_space.shape)
            self.spec = EnvSpec(obs_shape, jnp.float32 if env_cfg.normalize_obs else raw.dtype, False, 0,
                                tuple(action_space.shape), low, high, max_steps)

    # -- the pieces ---------------------------------------------------------------------
    def _env_reset(self, key, params):
        if self.batched:
            return self.env.reset(key, params)
        return jax.vmap(self.env.reset, in_axes=(0, None))(jax.random.split(key, self.num_envs), params)

    def _env_step(self, key, inner, action, params):
        if self.batched:
            return self.env.step(key, inner, action, params)
        keys = jax.random.split(key, self.num_envs)
        return jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(keys, inner, action, params)

    def _stack_reset(self, obs):
        if self.cfg.frame_stack == 1:
            return None
        return jnp.concatenate([obs] * self.cfg.frame_stack, axis=-1) if obs.ndim > 1 else obs[:, None].repeat(self.cfg.frame_stack, 1)

    def _stack_push(self, stack, obs):
        if obs.ndim == 1:  # scalar observations: the stack is [N, k]
            return jnp.concatenate([stack[:, 1:], obs[:, None]], axis=1)
        c = obs.shape[-1]
        return jnp.concatenate([stack[..., c:], obs], axis=-1)

    def _normalise(self, stats, obs):
        if stats is None:
            return obs
        mean, var = stats.moments()
        return jnp.clip((obs.astype(jnp.float32) - mean) / jnp.sqrt(var + 1e-8), -OBS_CLIP, OBS_CLIP)

    # -- the interface ------------------------------------------------------------------
    def reset(self, key: jax.Array, params=None, *, obs_stats=None):
        """-> (obs [N, *obs_shape], state).

        `obs_stats`: normalise with these statistics (e.g. a trained agent's, for evaluation)
        instead of starting new ones; pair it with `step(..., frozen=True)`.
        """
        params = self.default_params if params is None else params
        obs, inner = self._env_reset(key, params)
        zeros = jnp.zeros(self.num_envs, jnp.float32)
        izeros = jnp.zeros(self.num_envs, jnp.int32)
        stack = self._stack_reset(obs)
        view = obs if stack is None else stack
        if not self.cfg.normalize_obs:
            obs_stats = None
        elif obs_stats is None:
            shape = view.shape[1:]
            w = self.cfg.obs_norm_window
            obs_stats = (WindowStats.create(shape, w) if w > 0 else RunningStats.create(shape)).update(view)
        state = VecEnvState(
            inner=inner, params=params, episode_return=zeros, episode_length=izeros, last_return=zeros,
            last_length=izeros, episodes_done=izeros, stack=stack, obs_stats=obs_stats,
            return_stats=RunningStats.create(()) if self.cfg.normalize_reward else None,
            discounted_return=zeros if self.cfg.normalize_reward else None,
        )
        return self._normalise(obs_stats, view), state

    def step(self, key: jax.Array, state: VecEnvState, action: jax.Array, *, frozen: bool = False):
        """-> (obs, state, reward, terminated, truncated, info); arrays are batched [N].

        `info` holds `final_obs` (pre-reset, wrapped like `obs`), `raw_reward` and `done`.
        `frozen=True` leaves the observation and reward normalisation statistics as they are
        (evaluation of a trained agent sees its training statistics, unchanged).
        """
        if not self.discrete:
            action = jnp.clip(action, self.spec.action_low, self.spec.action_high)
        obs, inner, reward, terminated, truncated, info = self._env_step(key, state.inner, action, state.params)
        final_raw = info["final_observation"]
        reward = reward.astype(jnp.float32)
        terminated = terminated.astype(bool)
        truncated = jnp.logical_and(truncated.astype(bool), ~terminated)  # a terminal step is never a truncation
        done = terminated | truncated

        # episode statistics, on the raw reward
        ep_ret = state.episode_return + reward
        ep_len = state.episode_length + 1
        last_return = jnp.where(done, ep_ret, state.last_return)
        last_length = jnp.where(done, ep_len, state.last_length)
        episodes_done = state.episodes_done + done.astype(jnp.int32)
        ep_ret = jnp.where(done, 0.0, ep_ret)
        ep_len = jnp.where(done, 0, ep_len)

        # frame stacking: the final observation extends the old stack; a reset refills it
        stack, final_view, view = None, final_raw, obs
        if state.stack is not None:
            final_view = self._stack_push(state.stack, final_raw)
            fresh = self._stack_reset(obs)
            mask = done.reshape((-1,) + (1,) * (final_view.ndim - 1))
            stack = jnp.where(mask, fresh, self._stack_push(state.stack, obs))
            view = stack

        obs_stats = state.obs_stats
        if obs_stats is not None and not frozen:
            obs_stats = obs_stats.update(view)
        out_obs = self._normalise(obs_stats, view)
        out_final = self._normalise(obs_stats, final_view)

        # reward transformation
        raw_reward = reward
        return_stats, disc = state.return_stats, state.discounted_return
        if return_stats is not None:
            disc = disc * self.cfg.reward_gamma + reward
            if not frozen:
                return_stats = return_stats.update(disc)
            reward = reward / jnp.sqrt(return_stats.var + 1e-8)
            disc = jnp.where(done, 0.0, disc)
        reward = reward * self.cfg.reward_scale
        if self.cfg.reward_clip > 0:
            reward = jnp.clip(reward, -self.cfg.reward_clip, self.cfg.reward_clip)

        state = state.replace(
            inner=inner, episode_return=ep_ret, episode_length=ep_len, last_return=last_return,
            last_length=last_length, episodes_done=episodes_done, stack=stack, obs_stats=obs_stats,
            return_stats=return_stats, discounted_return=disc,
        )
        info = {"final_obs": out_final, "raw_reward": raw_reward, "done": done}
        return out_obs, state, reward, terminated, truncated, info


    def render(self, state: VecEnvState, index: int = 0) -> np.ndarray:
        """The frame of environment `index` of the batch, uint8 [H, W, 3], drawn on the host.

        `state` is this VecEnv's state, batched [num_envs] (for a training run's state, which is
        batched over seeds too, pick a seed first: `jax.tree.map(lambda x: x[s], state)`; a
        host env's batch holds every seed, seed `s` owning `s·N … s·N+N-1`). Raises
        `NotImplementedError` when the suite offers no frames (gymnax ids, brax).
        """
        if self.batched:
            draw = getattr(self.env, "render_index", None)
            if draw is None:
                raise NotImplementedError(f"{type(self.env).__name__}: no frames to render")
            return draw(state.inner, index)
        draw = getattr(self.env, "render", None)
        if draw is None:
            raise NotImplementedError(f"{self.cfg.id}: this suite offers no frames to render")
        if not 0 <= index < self.num_envs:
            raise IndexError(f"env index {index} is outside the batch of {self.num_envs}")
        return draw(jax.tree.map(lambda x: x[index], state.inner))


def episode_metrics(before: VecEnvState, after: VecEnvState) -> dict:
    """Scalars for one iteration: `episode_return` is the mean over envs of each env's most
    recently completed episode (0 until one completes; never NaN), `episode_count` the
    episodes completed between `before` and `after`."""
    seen = after.episodes_done > 0
    mean_last = jnp.sum(jnp.where(seen, after.last_return, 0.0)) / jnp.maximum(seen.sum(), 1)
    mean_len = jnp.sum(jnp.where(seen, after.last_length, 0)) / jnp.maximum(seen.sum(), 1)
    return {
        "episode_return": mean_last,
        "episode_length": mean_len.astype(jnp.float32),
        "episode_count": (after.episodes_done - before.episodes_done).sum(),
    }


def final_return(state: VecEnvState) -> jax.Array:
    """Mean return of each env's last completed episode (NaN if no episode ever completed)."""
    seen = state.episodes_done > 0
    return jnp.where(seen.any(), jnp.sum(jnp.where(seen, state.last_return, 0.0)) / jnp.maximum(seen.sum(), 1), jnp.nan)


def _max_steps(params) -> int | None:
    v = getattr(params, "max_steps_in_episode", None)
    return None if v is None else int(v)

