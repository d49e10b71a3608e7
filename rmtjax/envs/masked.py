"""rmtjax's own partially observable variants of gymnax environments (ids without a prefix).

`CartPole-masked-v1`: gymnax's CartPole-v1 with the velocities hidden — the observation is the
cart's position and the pole's angle only, so a policy must infer the velocities from what it
saw before (a memory task; `agent.torso: lstm | gru`). Dynamics, rewards, termination, time
limit and parameters (`env.params`) are CartPole-v1's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from gymnax.environments import spaces
from gymnax.environments.classic_control.cartpole import CartPole


class MaskedCartPole(CartPole):
    """CartPole-v1 observing (x, θ) and not (ẋ, θ̇)."""

    def get_obs(self, state, params=None, key=None) -> jax.Array:
        return jnp.array([state.x, state.theta])

    def observation_space(self, params) -> spaces.Box:
        high = jnp.array([params.x_threshold * 2, params.theta_threshold_radians * 2])
        return spaces.Box(-high, high, (2,), dtype=jnp.float32)

    @property
    def name(self) -> str:
        return "CartPole-masked-v1"
