"""Jumanji environments (`jumanji:<id>`, e.g. `jumanji:Snake-v1`, `jumanji:Game2048-v1`).

Jumanji's `step(state, action) -> (state, timestep)` does not reset; a timestep of type
`LAST` ends an episode: with discount 0 it is a termination, with discount 1 a truncation.
This adapter reports what jumanji reports and resets from the step's key the moment an episode
ends. Note that most jumanji envs (Snake among them) end an episode at their `time_limit`
with discount 0 — a termination, not a truncation, so agents do not bootstrap through it (their
observations usually hold the step count, which makes the limit part of the task); only
envs that call jumanji's `truncation` (LevelBasedForaging) report truncations.

Jumanji observations are structures (a grid, a step count, an action mask, ...). The agents
here take one array, so every field is flattened to float32 and concatenated, in the
structure's order (`jax.tree.leaves`), into one vector; an action mask becomes part of the
observation and is not enforced (an env that masks actions treats a masked one as its own
rules say). Only envs with one discrete action (`specs.DiscreteArray`) are supported; an env
with several (`MultiDiscreteArray`, e.g. BinPack, RubiksCube) or continuous actions is refused
with a `ConfigError`.

`env.params`: keyword arguments of `jumanji.make` (e.g. `num_rows`, `time_limit` for Snake).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rmtjax.envs.functional import SuiteEnv, as_uint8_frame, check_names, raw_key


def flatten_observation(obs) -> jax.Array:
    """A jumanji observation (any pytree) as one float32 vector."""
    return jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in jax.tree.leaves(obs)])


class JumanjiEnv(SuiteEnv):
    suite = "jumanji"

    def __init__(self, env, name: str):
        from jumanji import specs

        from rmtjax.schema import ConfigError

        self.env = env
        spec = env.action_spec
        if not isinstance(spec, specs.DiscreteArray):
            raise ConfigError(f"env.id: jumanji:{name} has actions {type(spec).__name__} {spec.shape}; only one "
                              f"discrete action (DiscreteArray) is supported")
        self.num_actions = int(spec.num_values)
        obs = jax.eval_shape(lambda k: self._reset(k, None)[0], jax.random.PRNGKey(0))
        self.obs_shape = tuple(obs.shape)
        limit = getattr(env, "time_limit", None)
        self.max_episode_steps = int(limit) if isinstance(limit, int) else None

    def _reset(self, key, params):
        state, ts = self.env.reset(raw_key(key))
        return flatten_observation(ts.observation), state

    def _step(self, key, state, action, params):
        nxt, ts = self.env.step(state, jnp.asarray(action, jnp.int32))
        last = ts.step_type == 2  # StepType.LAST
        terminated = last & (ts.discount == 0.0)
        return flatten_observation(ts.observation), nxt, ts.reward, terminated, last & ~terminated

    def render(self, state):
        # jumanji's envs draw through their matplotlib viewer, whose render_mode="rgb_array" makes
        # it return the figure's pixels (env.render itself discards them)
        viewer = getattr(self.env, "_viewer", None)
        if viewer is None or not hasattr(viewer, "_display_rgb_array"):
            raise NotImplementedError("jumanji: this env's viewer cannot return frames")
        viewer._display = viewer._display_rgb_array
        frame = viewer.render(state)
        if frame is None:
            raise NotImplementedError("jumanji: this env's viewer returned no frame")
        return as_uint8_frame(frame)


def names() -> list[str]:
    import jumanji

    return sorted(jumanji.registered_environments())


def has(name: str) -> bool:
    return name in names()


def make(name: str, env_cfg):
    import jumanji

    from rmtjax.schema import ConfigError
    from rmtjax.envs.vec import VecEnv

    check_names("jumanji", name, names())
    try:
        env = jumanji.make(name, **env_cfg.params)
    except TypeError as e:
        raise ConfigError(f"env.params: jumanji env {name!r} does not take {dict(env_cfg.params)}: {e}") from None
    return VecEnv(JumanjiEnv(env, name), None, env_cfg)
