"""Craftax environments (`craftax:<id>`): `Craftax-Symbolic-v1`, `Craftax-Classic-Symbolic-v1`,
and their `-Pixels-` versions.

Craftax ends an episode when the player dies (or, in full Craftax, defeats the final boss) and
when `timestep` reaches `max_timesteps` (100,000 for Craftax, 10,000 for Classic), and reports
both as one `done`. This adapter tells them apart: a step is a **termination** when the game
is over with the clock set aside (`is_terminal` of the state with `timestep` 0), and a
**truncation** when only the clock ended it. It uses craftax's reset-free `step_env` and resets
from the step's key the moment an episode ends.

The reward is craftax's (achievements unlocked, plus the change of health / 10). The
achievements craftax reports in its `info` are not carried.

`env.params`: fields of craftax's `EnvParams` (`max_timesteps`, `day_length`, ...), checked
against the defaults like gymnax parameters. `render(state)` draws the game as craftax's pixel
renderer does (uint8 [H, W, 3], 16-pixel blocks).
"""

from __future__ import annotations

import jax.numpy as jnp

from rmtjax.envs.functional import SuiteEnv, as_uint8_frame, check_names

IDS = ("Craftax-Symbolic-v1", "Craftax-Pixels-v1", "Craftax-Classic-Symbolic-v1", "Craftax-Classic-Pixels-v1")
RENDER_BLOCK_PIXELS = 16


class CraftaxEnv(SuiteEnv):
    suite = "craftax"

    def __init__(self, env, params, classic: bool):
        self.env = env
        self.classic = classic
        self.obs_shape = tuple(env.observation_space(params).shape)
        self.num_actions = int(env.action_space(params).n)
        self.max_episode_steps = int(params.max_timesteps)
        self._renderer = None

    def _reset(self, key, params):
        return self.env.reset_env(key, params)

    def _step(self, key, state, action, params):
        obs, nxt, reward, done, _ = self.env.step_env(key, state, action, params)
        over = self.env.is_terminal(nxt.replace(timestep=jnp.zeros_like(nxt.timestep)), params)
        terminated = done & over
        return obs, nxt, reward, terminated, done & ~terminated

    def render(self, state):
        import jax

        if self._renderer is None:
            if self.classic:
                from craftax.craftax_classic.renderer import make_craftax_pixel_renderer
            else:
                from craftax.craftax.renderer import make_craftax_pixel_renderer
            self._renderer = jax.jit(make_craftax_pixel_renderer(RENDER_BLOCK_PIXELS))
        return as_uint8_frame(self._renderer(state))


def names() -> list[str]:
    return list(IDS)


def has(name: str) -> bool:
    return name in IDS


def make(name: str, env_cfg):
    from craftax.craftax_env import make_craftax_env_from_name

    from rmtjax.envs import check_env_params
    from rmtjax.envs.vec import VecEnv

    check_names("craftax", name, IDS)
    env = make_craftax_env_from_name(name, auto_reset=False)
    params = env.default_params
    if env_cfg.params:
        params = params.replace(**check_env_params(f"craftax:{name}", params, env_cfg.params))
    return VecEnv(CraftaxEnv(env, params, "Classic" in name), params, env_cfg)
