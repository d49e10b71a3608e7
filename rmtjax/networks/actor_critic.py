"""Actors and critics of the policy-gradient agents (PPO: `ActorNet`, `CriticNet`; SAC:
`TanhGaussianActor`, `QNet`). Each takes a compute `dtype`; parameters and outputs are float32."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from rmtjax.networks.init import orthogonal
from rmtjax.networks.torsos import MLP, NatureCNN

PPO_TORSOS = ("mlp", "nature_cnn")


def _torso(kind: str, hidden, activation: str, dtype):
    """mlp: dense layers of widths `hidden`; nature_cnn: the Nature DQN convolutions, then `hidden`."""
    return NatureCNN(tuple(hidden), activation, dtype) if kind == "nature_cnn" else MLP(hidden, activation, dtype=dtype)


class ActorNet(nn.Module):
    """obs [B, ...] -> (logits [B, A], None) for discrete actions, or (mean [B, A], log_std [B, A])
    of a Gaussian whose log std is a learned state-independent parameter."""

    hidden: tuple
    activation: str
    out_dim: int
    continuous: bool
    init_log_std: float
    dtype: Any = jnp.float32  # compute dtype; parameters and outputs are float32
    torso: str = "mlp"  # one of PPO_TORSOS

    @nn.compact
    def __call__(self, obs):
        x = _torso(self.torso, self.hidden, self.activation, self.dtype)(obs)
        out = nn.Dense(self.out_dim, kernel_init=orthogonal(0.01), dtype=self.dtype)(x)
        out = out.astype(jnp.float32)
        if self.continuous:
            log_std = self.param("log_std", nn.initializers.constant(self.init_log_std), (self.out_dim,))
            return out, jnp.broadcast_to(log_std, out.shape)
        return out, None


class CriticNet(nn.Module):
    """obs [B, ...] -> V [B]."""

    hidden: tuple
    activation: str
    dtype: Any = jnp.float32  # compute dtype; parameters and output are float32
    torso: str = "mlp"  # one of PPO_TORSOS

    @nn.compact
    def __call__(self, obs):
        x = _torso(self.torso, self.hidden, self.activation, self.dtype)(obs)
        return nn.Dense(1, kernel_init=orthogonal(1.0), dtype=self.dtype)(x)[:, 0].astype(jnp.float32)


class TanhGaussianActor(nn.Module):
    """obs [B, ...] -> (mean, log_std) of the pre-tanh Gaussian, each [B, A]."""

    hidden: tuple
    activation: str
    action_dim: int
    log_std_min: float
    log_std_max: float
    dtype: Any = jnp.float32  # compute dtype; parameters and outputs are float32

    @nn.compact
    def __call__(self, obs):
        x = MLP(self.hidden, self.activation, dtype=self.dtype)(obs)
        mean = nn.Dense(self.action_dim, dtype=self.dtype)(x).astype(jnp.float32)
        # a smooth squash into [min, max] keeps a gradient at the bounds, unlike a clip
        raw = nn.Dense(self.action_dim, dtype=self.dtype)(x).astype(jnp.float32)
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (jnp.tanh(raw) + 1.0)
        return mean, log_std


class QNet(nn.Module):
    """(obs [B, ...], action [B, A]) -> Q [B]."""

    hidden: tuple
    activation: str
    dtype: Any = jnp.float32  # compute dtype; parameters and output are float32

    @nn.compact
    def __call__(self, obs, action):
        x = jnp.concatenate([obs.reshape((obs.shape[0], -1)).astype(jnp.float32), action], axis=-1)
        x = MLP(self.hidden, self.activation, dtype=self.dtype)(x)
        return nn.Dense(1, dtype=self.dtype)(x)[:, 0].astype(jnp.float32)
