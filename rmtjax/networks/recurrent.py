"""Recurrent torsos (`agent.torso: lstm | gru`) and the networks built on them.

A recurrent network reads a sequence: `net(carry, obs [T, B, ...], reset [T, B])` returns
`(carry, out, carries)`, where `out` is the head's output for every step ([T, B, ...]) and
`carries[t]` the hidden state after step t (every leaf [T, B, width]). `reset[t]` True means
`obs[t]` is the first observation of an episode: the hidden state is set to zeros before the
cell reads it, so no memory crosses an episode boundary, whether the boundary is inside the
sequence or at its start.

The torso is dense layers of widths `hidden` (applied to every step at once), then one LSTM or
GRU cell of width `width` scanned over time (`flax.linen.scan`). The cells' recurrent kernels
use rmtjax's orthogonal initialiser (`rmtjax.networks.init`), not flax's default, which runs a
batched LAPACK QR under `vmap` (see docs/guides/compile-cache.md: the jax CPU deadlock).

The carry is float32 whatever the compute dtype (its leaves: [B, width]; LSTM's is the pair
(c, h)), so a bf16 step and an fp32 step hand each other the same carry.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from rmtjax.networks.init import orthogonal
from rmtjax.networks.torsos import MLP

RNN_TORSOS = ("lstm", "gru")


def initial_carry(kind: str, width: int, batch: int):
    """Zeros: the hidden state of `batch` sequences before their first step."""
    if kind not in RNN_TORSOS:
        raise ValueError(f"unknown recurrent torso {kind!r}; choose one of {RNN_TORSOS}")
    z = jnp.zeros((batch, width), jnp.float32)
    return (z, z) if kind == "lstm" else z


def reset_carry(carry, reset):
    """`carry` with the rows where `reset` [B] is True set to zeros."""
    return jax.tree.map(lambda c: jnp.where(reset.reshape((-1,) + (1,) * (c.ndim - 1)), 0.0, c).astype(c.dtype),
                        carry)


class ResetCell(nn.Module):
    """One step of an LSTM or GRU cell whose carry is zeroed where an episode starts."""

    kind: str
    width: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, carry, inputs):
        x, reset = inputs
        carry = reset_carry(carry, reset)
        common = dict(features=self.width, recurrent_kernel_init=orthogonal(), dtype=self.dtype,
                      param_dtype=jnp.float32)
        cell = nn.OptimizedLSTMCell(**common) if self.kind == "lstm" else nn.GRUCell(**common)
        carry, y = cell(jax.tree.map(lambda c: c.astype(self.dtype), carry), x)
        carry = jax.tree.map(lambda c: c.astype(jnp.float32), carry)
        return carry, (y, carry)


class RecurrentTorso(nn.Module):
    """(carry, obs [T, B, ...], reset [T, B]) -> (carry, features [T, B, width], carries)."""

    kind: str
    width: int
    hidden: Sequence[int] = ()
    activation: str = "relu"
    layer_norm: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, carry, obs, reset):
        T, B = obs.shape[:2]
        x = MLP(tuple(self.hidden), self.activation, self.layer_norm, self.dtype)(obs.reshape((T * B,) + obs.shape[2:]))
        x = x.reshape((T, B, -1))
        scan = nn.scan(ResetCell, variable_broadcast="params", split_rngs={"params": False}, in_axes=0, out_axes=0)
        carry, (y, carries) = scan(self.kind, self.width, self.dtype, name="cell")(carry, (x, reset))
        return carry, y, carries


class RecurrentNet(nn.Module):
    """A recurrent torso and a head that maps features [B, F] to its output (any pytree of [B, ...]
    arrays): (carry, obs [T, B, ...], reset [T, B]) -> (carry, head output [T, B, ...], carries)."""

    torso: nn.Module
    head: nn.Module

    def __call__(self, carry, obs, reset):
        carry, feats, carries = self.torso(carry, obs, reset)
        T, B = feats.shape[:2]
        out = self.head(feats.reshape((T * B, -1)))
        return carry, jax.tree.map(lambda x: x.reshape((T, B) + x.shape[1:]), out), carries


class PolicyHead(nn.Module):
    """features [B, F] -> (logits [B, A], None), or (mean [B, A], log_std [B, A]) of a Gaussian
    with a state-independent learned log std: `ActorNet`'s output layer."""

    out_dim: int
    continuous: bool
    init_log_std: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        out = nn.Dense(self.out_dim, kernel_init=orthogonal(0.01), dtype=self.dtype)(x).astype(jnp.float32)
        if self.continuous:
            log_std = self.param("log_std", nn.initializers.constant(self.init_log_std), (self.out_dim,))
            return out, jnp.broadcast_to(log_std, out.shape)
        return out, None


class ValueHead(nn.Module):
    """features [B, F] -> V [B]: `CriticNet`'s output layer."""

    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        return nn.Dense(1, kernel_init=orthogonal(1.0), dtype=self.dtype)(x)[:, 0].astype(jnp.float32)


def after(net, params, carries, next_obs):
    """The output for `next_obs[t]` [T, B, ...] read from the hidden state `carries[t]` (after step
    t), every (t, b) at once: what a bootstrap needs for the observation a step ended in (before
    any reset), whether or not the episode went on. [T, B, ...]."""
    T, B = next_obs.shape[:2]
    flat = jax.tree.map(lambda c: c.reshape((T * B,) + c.shape[2:]), carries)
    _, out, _ = net.apply(params, flat, next_obs.reshape((1, T * B) + next_obs.shape[2:]),
                          jnp.zeros((1, T * B), bool))
    return jax.tree.map(lambda x: x.reshape((T, B) + x.shape[2:]), out)

