"""XLand-MiniGrid environments (`xminigrid:<id>`, e.g. `xminigrid:MiniGrid-Empty-5x5`,
`xminigrid:XLand-MiniGrid-R1-9x9`).

xminigrid's `step` does not reset; its time step reports `LAST` at the goal (discount 0: a
termination) or when `step_num` reaches `max_steps` (discount 1: a truncation). This adapter
keeps the two apart and resets from the step's key the moment an episode ends. Observations
are the agent's view, uint8 [view_size, view_size, 2] (tile and colour ids).

XLand ids (`XLand-MiniGrid-*`) are meta-RL envs that need a ruleset from a benchmark file that
xminigrid downloads; without one they run with xminigrid's default (empty) rules. Only the
`MiniGrid-*` ids are tested here.

`env.params`: fields of the env's `EnvParams` (`max_steps`, `view_size`, ...), checked against
its defaults like gymnax parameters.
"""

from __future__ import annotations

import numpy as np

from rmtjax.envs.functional import SuiteEnv, as_uint8_frame, check_names, raw_key


class XMiniGridEnv(SuiteEnv):
    suite = "xminigrid"

    def __init__(self, env, params):
        import jax

        self.env = env
        self.obs_shape = tuple(env.observation_shape(params))
        self.num_actions = int(env.num_actions(params))
        self.max_episode_steps = None if params.max_steps is None else int(params.max_steps)
        self.params = params
        jax.eval_shape(env.reset, params, jax.random.PRNGKey(0))  # fails early on a bad parameter

    def _reset(self, key, params):
        ts = self.env.reset(params, raw_key(key))
        return ts.observation, ts

    def _step(self, key, ts, action, params):
        nxt = self.env.step(params, ts, action)
        last = nxt.step_type == 2  # StepType.LAST
        terminated = last & (nxt.discount == 0.0)
        return nxt.observation, nxt, nxt.reward, terminated, last & ~terminated

    def render(self, ts):
        from xminigrid.rendering.rgb_render import render

        return as_uint8_frame(render(np.asarray(ts.state.grid), ts.state.agent, self.params.view_size))


def names() -> list[str]:
    import xminigrid

    return sorted(xminigrid.registered_environments())


def has(name: str) -> bool:
    return name in names()


def make(name: str, env_cfg):
    import xminigrid

    from rmtjax.envs import check_env_params
    from rmtjax.envs.vec import VecEnv

    check_names("xminigrid", name, names())
    env, params = xminigrid.make(name)
    if env_cfg.params:
        params = params.replace(**check_env_params(f"xminigrid:{name}", params, env_cfg.params))
    return VecEnv(XMiniGridEnv(env, params), params, env_cfg)
