"""Torsos: map an observation batch [B, *obs_shape] to features [B, width].

All take a `dtype` for their compute (parameters stay float32), so a precision policy can
run them in bfloat16 without touching their code.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rmtjax.networks.init import orthogonal

ACTIVATIONS = {"relu": nn.relu, "tanh": nn.tanh, "gelu": nn.gelu, "silu": nn.silu, "elu": nn.elu}


def activation_fn(name: str):
    return ACTIVATIONS[name]


def _dense(width, dtype, scale=np.sqrt(2)):
    return nn.Dense(width, kernel_init=orthogonal(scale), dtype=dtype)


def _flat(x, dtype):
    """[B, *shape] -> [B, prod(shape)] in the compute dtype."""
    return x.reshape((x.shape[0], -1)).astype(dtype)


def _conv_layer(x, features, kernel, stride, act, layer_norm, dtype):
    """unpadded conv -> (LayerNorm over each position's channels) -> activation; called inside a
    compact module, so its layers take the module's automatic names."""
    x = nn.Conv(features, (kernel, kernel), strides=(stride, stride), padding="VALID", dtype=dtype,
                kernel_init=orthogonal(np.sqrt(2)))(x)
    if layer_norm:
        x = nn.LayerNorm(dtype=dtype)(x)
    return act(x)


def _layer(h, width, act, layer_norm, dtype, norm_name=None):
    """dense -> (LayerNorm) -> activation; called inside a compact module, so its layers
    take the module's automatic names (or `norm_name` for the norm)."""
    h = _dense(width, dtype)(h)
    if layer_norm:
        h = nn.LayerNorm(dtype=dtype, name=norm_name)(h)
    return act(h)


class MLP(nn.Module):
    """Dense layers with orthogonal init; the input is flattened and cast to float."""

    hidden: Sequence[int]
    activation: str = "relu"
    layer_norm: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = _flat(x, self.dtype)
        for width in self.hidden:
            x = _layer(x, width, activation_fn(self.activation), self.layer_norm, self.dtype)
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
        f1 = _layer(x, self.width, act, self.layer_norm, self.dtype, norm_name="f1_norm")
        f2 = _layer(f1, self.width, act, self.layer_norm, self.dtype, norm_name="f2_norm")
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
        x = _layer(_flat(x, self.dtype), self.width, activation_fn(self.activation), False, self.dtype)
        for _ in range(self.num_blocks):
            x = FractalBlock(self.width, self.activation, self.layer_norm, self.dtype)(x)
        return x


class Conv3x3(nn.Module):
    """A padded 3×3 convolution (stride 1) computed as one matrix product over the nine shifted
    copies of the input: [B, H, W, C] -> [B, H, W, features]. The same function and parameters
    (`kernel` [3, 3, C, features], `bias`) as `nn.Conv(features, (3, 3), padding="SAME")`; on
    XLA:CPU its gradient step is ~6× faster than the convolution op's on MinAtar's 10×10 grids
    (`benchmarks/results/rmt_torsos/`), since a dense product is the best-optimised op there.
    `op`: compute it with lax's convolution instead (the same function; kept to measure the two)."""

    features: int
    dtype: jnp.dtype = jnp.float32
    op: bool = False

    @nn.compact
    def __call__(self, x):
        b, h, w, c = x.shape
        kernel = self.param("kernel", orthogonal(np.sqrt(2)), (3, 3, c, self.features), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
        x = x.astype(self.dtype)
        if self.op:
            return jax.lax.conv_general_dilated(x, kernel.astype(self.dtype), (1, 1), "SAME",
                                                dimension_numbers=("NHWC", "HWIO", "NHWC")) + bias.astype(self.dtype)
        padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        shifted = jnp.concatenate([padded[:, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=-1)
        return shifted @ kernel.reshape(9 * c, self.features).astype(self.dtype) + bias.astype(self.dtype)


class ConvFractalBlock(nn.Module):
    """The fractal block on images: `x + f1(x) + f2(f1(x))` with f1, f2 3×3 convolutions
    (padded, so every path keeps the image's size and `channels`), each followed by a LayerNorm
    over the channels of a position (optional) and the activation."""

    channels: int
    activation: str = "relu"
    layer_norm: bool = True
    dtype: jnp.dtype = jnp.float32
    conv_op: bool = False  # Conv3x3.op

    @nn.compact
    def __call__(self, x):
        act = activation_fn(self.activation)

        def path(h, i):
            h = Conv3x3(self.channels, self.dtype, self.conv_op, name=f"Conv_{i}")(h)
            if self.layer_norm:
                h = nn.LayerNorm(dtype=self.dtype, name=f"f{i + 1}_norm")(h)
            return act(h)

        f1 = path(x, 0)
        return x + f1 + path(f1, 1)


class ConvFractalTorso(nn.Module):
    """For image observations [B, H, W, C]: a 3×3 convolution to `channels`, `num_blocks`
    convolutional fractal blocks, then one dense layer of `width` on the flattened features.
    uint8 inputs are pixels (divided by 255)."""

    channels: int = 16
    num_blocks: int = 1
    width: int = 128
    activation: str = "relu"
    layer_norm: bool = True
    dtype: jnp.dtype = jnp.float32
    conv_op: bool = False  # Conv3x3.op

    @nn.compact
    def __call__(self, x):
        act = activation_fn(self.activation)
        x = x.astype(self.dtype) / 255.0 if x.dtype == jnp.uint8 else x.astype(self.dtype)
        x = act(Conv3x3(self.channels, self.dtype, self.conv_op, name="Conv_0")(x))
        for _ in range(self.num_blocks):
            x = ConvFractalBlock(self.channels, self.activation, self.layer_norm, self.dtype, self.conv_op)(x)
        return _layer(x.reshape((x.shape[0], -1)), self.width, act, self.layer_norm, self.dtype)


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
        x = _layer(_flat(x, self.dtype), self.width, act, False, self.dtype)
        for _ in range(self.num_blocks):
            x = x + _layer(x, self.width, act, self.layer_norm, self.dtype)
        return x


class MinAtarCNN(nn.Module):
    """A small CNN for 10×10×C MinAtar-sized images, then a dense layer: [B, H, W, C] -> [B, width].

    `layer_norm` puts a LayerNorm after the convolution (over the channels of each position) and
    after the dense layer, before each activation, as PQN's network has; off by default, so the
    agents that build this torso through `make_torso` keep their network.
    """

    channels: int = 16
    width: int = 128
    activation: str = "relu"
    dtype: jnp.dtype = jnp.float32
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x):
        act = activation_fn(self.activation)
        x = _conv_layer(x.astype(self.dtype), self.channels, 3, 1, act, self.layer_norm, self.dtype)
        x = x.reshape((x.shape[0], -1))
        return _layer(x, self.width, act, self.layer_norm, self.dtype)


NATURE_MIN_SIZE = 36  # the smallest height/width the three unpadded convolutions leave ≥ 1 position of


class NatureCNN(nn.Module):
    """The DQN network of Mnih et al. (2015, Nature) up to its last hidden layer: 32 filters
    8×8 stride 4, 64 4×4 stride 2, 64 3×3 stride 1 (unpadded, each followed by the activation),
    then one dense layer per width in `hidden` ([512] in the paper): [B, H, W, C] -> [B, hidden[-1]].

    uint8 inputs are pixels and are divided by 255 (so an Atari frame stack enters in [0, 1]);
    other dtypes are used as they are. `layer_norm` puts a LayerNorm before every activation
    (over the channels of each position after a convolution), as PQN's network has.
    """

    hidden: Sequence[int] = (512,)
    activation: str = "relu"
    dtype: jnp.dtype = jnp.float32
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x):
        act = activation_fn(self.activation)
        x = x.astype(self.dtype) / 255.0 if x.dtype == jnp.uint8 else x.astype(self.dtype)
        for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = _conv_layer(x, features, kernel, stride, act, self.layer_norm, self.dtype)
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden:
            x = _layer(x, width, act, self.layer_norm, self.dtype)
        return x


def check_image_torso(torso: str, obs_shape, env_id: str) -> None:
    """The `ConfigError` for a CNN torso on observations it cannot take (not [H, W, C], or, for
    the Nature CNN, smaller than 36 × 36)."""
    from rmtjax.schema import ConfigError

    if torso not in ("cnn", "nature_cnn"):
        return
    if len(obs_shape) != 3:
        raise ConfigError(f"agent.torso: {torso!r} needs image observations [H, W, C]; {env_id}'s have shape "
                          f"{list(obs_shape)}. Use torso: mlp")
    if torso == "nature_cnn" and min(obs_shape[:2]) < NATURE_MIN_SIZE:
        raise ConfigError(f"agent.torso: 'nature_cnn' needs images of at least {NATURE_MIN_SIZE}×{NATURE_MIN_SIZE} "
                          f"(its unpadded 8×8/4, 4×4/2, 3×3/1 convolutions); {env_id}'s are "
                          f"{obs_shape[0]}×{obs_shape[1]}. Use torso: cnn (the MinAtar CNN) for small grids")
