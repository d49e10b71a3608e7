"""MuJoCo Playground environments (`playground:<name>`, e.g. `playground:CartpoleBalance`,
`playground:CheetahRun`): the DeepMind Control Suite tasks in MJX, the maintained successor of
brax's envs.

A playground env is a pure function `step(state, action) -> state` with no time limit and no
reset of its own (playground's training wrapper adds both); this adapter adds them as brax's
does: **termination** is the env's `done` (the DM Control tasks end only on a non-finite
physics state), **truncation** is `max_steps_in_episode` agent steps (default: the task's
`episode_length` / `action_repeat`, 1000 for the suite) counted here, and a finished episode
restarts from a fresh reset drawn from the step's key. `action_repeat` > 1 steps the physics
that many times per action and sums the rewards, as playground's wrapper does.

Physics runs in MJX's pure-JAX implementation (`impl: jax`), which vmaps over envs and seeds
like any JAX env; `env.params.impl: warp` chooses playground's own default (MuJoCo Warp),
which this adapter does not check. `env.params`: `max_steps_in_episode` and any key of the
task's default config (`registry.get_default_config(name)`: `impl`, `ctrl_dt`, `sim_dt`,
`action_repeat`, ...). Only the DM Control suite is offered: the locomotion and manipulation
envs load robot models from `mujoco_menagerie`, which playground fetches with git.

`render(state)` draws the scene with MuJoCo's renderer (uint8 [240, 320, 3]). It needs an
OpenGL context: on a machine without a display, start Python with `MUJOCO_GL=egl` (or
`osmesa`); mujoco reads it when it is first imported.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rmtjax.envs.functional import BoxSpace, SuiteEnv, TimedState, TimeLimit, as_uint8_frame, check_names, \
    pop_time_limit, raw_key

DEFAULT_IMPL = "jax"  # MJX in JAX: vmaps like any JAX env
RENDER_SIZE = (240, 320)


class PlaygroundEnv(SuiteEnv):
    suite = "playground"

    def __init__(self, env, action_repeat: int, max_steps: int):
        self.env = env
        self.action_repeat = action_repeat
        obs = jax.eval_shape(lambda k: self._obs(env.reset(k).obs), jax.random.PRNGKey(0))
        self.obs_shape = tuple(obs.shape)
        ones = np.ones(int(env.action_size), np.float32)
        self.action_box = BoxSpace(-ones, ones, ones.shape)
        self.max_episode_steps = max_steps

    @staticmethod
    def _obs(obs):
        """playground observations: an array, or a dict whose `state` entry is the policy's."""
        return obs["state"] if isinstance(obs, dict) else obs

    def _reset(self, key, params: TimeLimit):
        s = self.env.reset(raw_key(key))
        return self._obs(s.obs), TimedState(s, jnp.zeros((), jnp.int32))

    def _step(self, key, state: TimedState, action, params: TimeLimit):
        def physics(s, _):
            n = self.env.step(s, action)
            return n, (n.reward, n.done)

        nxt, (rewards, dones) = jax.lax.scan(physics, state.inner, None, length=self.action_repeat)
        time = state.time + 1
        terminated = jnp.any(dones > 0.5)
        truncated = time >= params.max_steps_in_episode
        nxt = nxt.replace(done=jnp.zeros_like(nxt.done))
        return self._obs(nxt.obs), TimedState(nxt, time), rewards.sum(), terminated, truncated

    def step(self, key, state, action, params):
        # reset and step states can differ in their `metrics`/`info` entries; carry the step's
        # structure, with the physics and observation of the fresh episode after a reset
        k_step, k_reset = jax.random.split(key)
        obs, nxt, reward, terminated, truncated = self._step(k_step, state, action, params)
        truncated = truncated & ~terminated
        done = terminated | truncated
        fresh_obs, fresh = self._reset(k_reset, params)
        if jax.tree.structure(fresh) == jax.tree.structure(nxt):
            after = jax.tree.map(lambda f, n: jnp.where(done, f, n), fresh, nxt)
        else:
            inner = nxt.inner.replace(
                data=jax.tree.map(lambda f, n: jnp.where(done, f, n), fresh.inner.data, nxt.inner.data),
                obs=jax.tree.map(lambda f, n: jnp.where(done, f, n), fresh.inner.obs, nxt.inner.obs))
            after = TimedState(inner, jnp.where(done, 0, nxt.time))
        return (jnp.where(done, fresh_obs, obs), after, reward.astype(jnp.float32), terminated, truncated,
                {"final_observation": obs})

    def render(self, state: TimedState):
        frames = self.env.render([jax.device_get(state.inner)], height=RENDER_SIZE[0], width=RENDER_SIZE[1])
        return as_uint8_frame(frames[0])


def names() -> list[str]:
    from mujoco_playground import registry

    return sorted(registry.dm_control_suite.ALL_ENVS)


def has(name: str) -> bool:
    return name in names()


def make(name: str, env_cfg):
    from mujoco_playground import registry

    from rmtjax.schema import ConfigError, close_matches
    from rmtjax.envs.vec import VecEnv

    check_names("playground", name, names())
    defaults = registry.get_default_config(name)
    kwargs = dict(env_cfg.params)
    overrides = {"impl": DEFAULT_IMPL}
    for k in list(kwargs):
        if k == "max_steps_in_episode":
            continue
        if k not in defaults:
            raise ConfigError(f"env.params.{k}: playground:{name} has no config key {k!r}."
                              f"{close_matches(str(k), list(defaults.keys()) + ['max_steps_in_episode'])}")
        overrides[k] = kwargs.pop(k)
    try:
        env = registry.load(name, config_overrides=overrides)
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"env.params: playground:{name} with {overrides}: {e}") from None
    repeat = int(env._config.action_repeat) if "action_repeat" in env._config else 1
    if repeat < 1:
        raise ConfigError(f"env.params.action_repeat: expected an integer ≥ 1, got {repeat}")
    steps = pop_time_limit(kwargs, math.ceil(int(env._config.episode_length) / repeat), "a playground episode")
    return VecEnv(PlaygroundEnv(env, repeat, steps), TimeLimit(steps), env_cfg)
