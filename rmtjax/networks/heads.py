"""Heads on top of a torso's features, and the Q-network that joins the two."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp


class QHead(nn.Module):
    """Q(s, ·) for `num_actions` actions: [B, F] -> [B, A]."""

    num_actions: int
    dueling: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        adv = nn.Dense(self.num_actions, dtype=self.dtype)(x)
        if not self.dueling:
            return adv.astype(jnp.float32)
        value = nn.Dense(1, dtype=self.dtype)(x)
        return (value + adv - adv.mean(-1, keepdims=True)).astype(jnp.float32)


class PerDimQHead(nn.Module):
    """One Q head per action dimension over `bins` discrete values: [B, F] -> [B, D, bins].

    The joint value is the mean over dimensions, Q(s, a) = mean_d Q_d(s, a_d), so the greedy
    action is the per-dimension argmax and the cost is linear in the number of dimensions.
    """

    num_dims: int
    bins: int
    dueling: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        adv = nn.Dense(self.num_dims * self.bins, dtype=self.dtype)(x).reshape(x.shape[0], self.num_dims, self.bins)
        if not self.dueling:
            return adv.astype(jnp.float32)
        value = nn.Dense(1, dtype=self.dtype)(x)[:, :, None]
        return (value + adv - adv.mean(-1, keepdims=True)).astype(jnp.float32)


class QNetwork(nn.Module):
    torso: Any
    head: Any

    def __call__(self, obs):
        return self.head(self.torso(obs))
