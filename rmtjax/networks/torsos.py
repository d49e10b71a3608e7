"""Torsos: map an observation batch [B, *obs_shape] to features [B, width].

All take a `dtype` for their compute (parameters stay float32), so a precision policy can
run them in bfloat16 without touching their code.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

ACTIVATIONS = {"relu": nn.relu, "tanh": nn.tanh, "gelu": nn.gelu, "silu": nn.silu, "elu": nn.elu}


def activation_fn(name: str):
    return ACTIVATIONS[name]


def _dense(width, dtype, scale=np.sqrt(2)):
    return nn.Dense(width, kernel_init=nn.initializers.orthogonal(scale), dtype=dtype)


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
            x = _dense(width, self.dtype)(x)
            if self.layer_norm:
                x = nn.LayerNorm(dtype=self.dtype)(x)
            x = act(x)
        return x


class FractalBlock(nn.Module):
    """`x + f1(x) + f2(f1(x))`: two nested paths of depth one and two beside the identity,
    so the block mixes a shallow and a deeper transform of the same features."""

    width: int
    activation: str = "relu"
    layer_norm: bool = True
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        act = activation_fn(self.activation)

        def path(h, name):
            h = _dense(self.width, self.dtype)(h)
            if self.layer_norm:
                h = nn.LayerNorm(dtype=self.dtype, name=f"{name}_norm")(h)
            return act(h)

        f1 = path(x, "f1")
        f2 = path(f1, "f2")
        return x + f1 + f2


class FractalTorso(nn.Module):
    """A projection to `width`, then `num_blocks` fractal residual blocks."""

    width: int = 128
    num_blocks: int = 2
    activation: str = "relu"
    layer_norm: bool = True
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1)).astype(self.dtype)
        x = activation_fn(self.activation)(_dense(self.width, self.dtype)(x))
        for _ in range(self.num_blocks):
            x = FractalBlock(self.width, self.activation, self.layer_norm, self.dtype)(x)
        return x


class ResidualMLP(nn.Module):
    """The plain residual baseline for the fractal block: `x + f(x)` with one dense path."""

    width: int = 128
    num_blocks: int = 2
    activation: str = "relu"
    layer_norm: bool = True
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        act = activation_fn(self.activation)
        x = x.reshape((x.shape[0], -1)).astype(self.dtype)
        x = act(_dense(self.width, self.dtype)(x))
        for _ in range(self.num_blocks):
            h = _dense(self.width, self.dtype)(x)
            if self.layer_norm:
                h = nn.LayerNorm(dtype=self.dtype)(h)
            x = x + act(h)
        return x


class MinAtarCNN(nn.Module):
    """A small CNN for 10×10×C MinAtar-sized images, then a dense layer."""

    channels: int = 16
    width: int = 128
    activation: str = "relu"
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        act = activation_fn(self.activation)
        x = x.astype(self.dtype)
        x = act(nn.Conv(self.channels, (3, 3), padding="VALID", dtype=self.dtype,
                        kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        x = x.reshape((x.shape[0], -1))
        return act(_dense(self.width, self.dtype)(x))
