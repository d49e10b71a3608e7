"""Network building blocks (flax linen): torsos and heads chosen by config, the actors and
critics of PPO and SAC, their Gaussian log-densities (`distributions`), and `per_dtype`."""

import jax.numpy as jnp

from rmtjax.networks.actor_critic import ActorNet, CriticNet, QNet, TanhGaussianActor
from rmtjax.networks.heads import PerDimQHead, QHead, QNetwork
from rmtjax.networks.init import orthogonal
from rmtjax.networks.torsos import MLP, ConvFractalBlock, ConvFractalTorso, FractalBlock, FractalTorso, MinAtarCNN, NatureCNN, ResidualMLP, activation_fn, \
    check_image_torso

TORSOS = ("mlp", "fractal", "dense_fractal", "residual", "cnn", "nature_cnn")

__all__ = ["MLP", "ConvFractalBlock", "ConvFractalTorso", "ActorNet", "CriticNet", "FractalBlock", "FractalTorso", "MinAtarCNN", "NatureCNN", "PerDimQHead", "QHead",
           "QNet", "QNetwork", "ResidualMLP", "TORSOS", "TanhGaussianActor", "activation_fn", "check_image_torso", "make_torso",
           "orthogonal", "per_dtype"]


def make_torso(kind: str, hidden, activation: str, layer_norm: bool, dtype, cnn_channels: int = 16,
               image: bool = False):
    """A torso by name; `hidden` gives the widths (MLP; the dense layers after the Nature CNN's
    convolutions), `(width,) * num_blocks` (fractal, residual) or the MinAtar CNN's one width.
    `fractal` on image observations (`image`: [H, W, C]) is the convolutional fractal torso:
    `len(hidden)` blocks of `cnn_channels` channels, then a dense layer of `hidden[0]`;
    `dense_fractal` is the dense fractal torso on any input (images flattened)."""
    if kind == "mlp":
        return MLP(tuple(hidden), activation, layer_norm, dtype)
    if kind == "fractal" and image:  # the design's own block is convolutional: 3×3 paths over the image
        return ConvFractalTorso(cnn_channels, len(hidden), hidden[0], activation, layer_norm, dtype)
    if kind in ("fractal", "dense_fractal"):
        return FractalTorso(hidden[0], len(hidden), activation, layer_norm, dtype)
    if kind == "residual":
        return ResidualMLP(hidden[0], len(hidden), activation, layer_norm, dtype)
    if kind == "cnn":
        return MinAtarCNN(cnn_channels, hidden[0], activation, dtype, layer_norm)
    if kind == "nature_cnn":
        return NatureCNN(tuple(hidden), activation, dtype, layer_norm)
    raise ValueError(f"unknown torso {kind!r}; choose one of {TORSOS}")


def per_dtype(build, dtypes) -> dict:
    """`{jnp.dtype: build(dtype)}`: one module per compute dtype in `dtypes` and float32 (always
    there: acting, evaluation and the fp32 fallback use it). The modules share the same float32
    parameters; the precision policy (`Precision.dtypes`) says which dtypes a run may use."""
    return {jnp.dtype(dt): build(dt) for dt in {*dtypes, jnp.float32}}
