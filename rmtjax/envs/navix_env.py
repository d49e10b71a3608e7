"""Navix environments (`navix:<id>`, e.g. `navix:Navix-Empty-5x5-v0`, `navix:Navix-DoorKey-8x8-v0`):
MiniGrid re-implemented in JAX.

Navix reports each step as a transition, a truncation (its time limit `max_steps`) or a
termination (goal reached, lava); rmtjax keeps the last two apart. Navix's own `step` resets
lazily, on the step *after* an episode ended, so this adapter calls its reset-free `_step`
and resets from the step's key the moment an episode ends (`rmtjax.envs.functional`).

`env.params`: `max_steps_in_episode` (navix's `max_steps`, default 100, as `navix.make`) and
`observation`, one of navix's observation functions by name (default `symbolic`, the
MiniGrid-style [H, W, 3] uint8 grid of object, colour and state ids; `rgb` and the
`_first_person` variants give images).
"""

from __future__ import annotations

import jax.numpy as jnp

from rmtjax.envs.functional import SuiteEnv, as_uint8_frame, check_names, pop_time_limit, raw_key

DEFAULT_MAX_STEPS = 100  # navix.make's default
OBSERVATIONS = ("symbolic", "symbolic_first_person", "categorical", "categorical_first_person", "rgb",
                "rgb_first_person")


class NavixEnv(SuiteEnv):
    suite = "navix"

    def __init__(self, env):
        self.env = env
        self.obs_shape = tuple(env.observation_space.shape)
        self.num_actions = int(env.action_space.maximum) + 1
        self.max_episode_steps = int(env.max_steps)

    def _reset(self, key, params):
        ts = self.env.reset(raw_key(key))
        return ts.observation, ts

    def _step(self, key, ts, action, params):
        # navix draws its randomness from the key inside its state, not from a step key
        nxt = self.env._step(ts, jnp.asarray(action, jnp.int32))
        return nxt.observation, nxt, nxt.reward, nxt.is_termination(), nxt.is_truncation()

    def render(self, ts):
        from navix import observations

        return as_uint8_frame(observations.rgb(ts.state))


def names() -> list[str]:
    import navix

    return sorted(navix.registry())


def has(name: str) -> bool:
    return name in names()


def make(name: str, env_cfg):
    import navix

    from rmtjax.schema import ConfigError, close_matches
    from rmtjax.envs.vec import VecEnv

    check_names("navix", name, names())
    kwargs = dict(env_cfg.params)
    steps = pop_time_limit(kwargs, DEFAULT_MAX_STEPS, "a navix episode")
    obs_name = kwargs.pop("observation", "symbolic")
    if obs_name not in OBSERVATIONS:
        raise ConfigError(f"env.params.observation: navix has no observation {obs_name!r}."
                          f"{close_matches(str(obs_name), OBSERVATIONS)} Choose one of {', '.join(OBSERVATIONS)}")
    if kwargs:
        raise ConfigError(f"env.params: navix ids take max_steps_in_episode and observation, not "
                          f"{', '.join(sorted(map(str, kwargs)))}")
    from navix import observations

    env = navix.make(name, max_steps=steps, observation_fn=getattr(observations, obs_name))
    return VecEnv(NavixEnv(env), None, env_cfg)
