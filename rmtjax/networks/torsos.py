"""Torsos: map an observation batch [B, *obs_shape] to features [B, width]."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

ACTIVATIONS = {"relu": nn.relu, "tanh": nn.tanh, "gelu": nn.gelu, "silu": nn.silu, "elu": nn.elu}


def activation_fn(name: str):
    return ACTIVATIONS[name]


class MLP(nn.Module):
    """Dense layers with orthogonal init; the input is flattened and cast to float."""

    hidden: Sequence[int]
    activation: str = "relu"
    layer_norm: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1)).astype(self.dtype)
        act = activation_fn(self.activation)
        for width in self.hidden:
            x = nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)), dtype=self.dtype)(x)
            if self.layer_norm:
                x = nn.LayerNorm(dtype=self.dtype)(x)
            x = act(x)
        return x
