"""Network building blocks (flax linen): torsos and heads chosen by config."""

from rmtjax.networks.heads import PerDimQHead, QHead, QNetwork
from rmtjax.networks.init import orthogonal
from rmtjax.networks.torsos import MLP, FractalBlock, FractalTorso, MinAtarCNN, ResidualMLP, activation_fn

TORSOS = ("mlp", "fractal", "residual", "cnn")

__all__ = ["MLP", "FractalBlock", "FractalTorso", "MinAtarCNN", "PerDimQHead", "QHead", "QNetwork", "ResidualMLP",
           "TORSOS", "activation_fn", "make_torso", "orthogonal"]


def make_torso(kind: str, hidden, activation: str, layer_norm: bool, dtype, cnn_channels: int = 16):
    """A torso by name; `hidden` gives the widths (MLP) or `(width,) * num_blocks` (fractal, residual)."""
    if kind == "mlp":
        return MLP(tuple(hidden), activation, layer_norm, dtype)
    if kind == "fractal":
        return FractalTorso(hidden[0], len(hidden), activation, layer_norm, dtype)
    if kind == "residual":
        return ResidualMLP(hidden[0], len(hidden), activation, layer_norm, dtype)
    if kind == "cnn":
        return MinAtarCNN(cnn_channels, hidden[0], activation, dtype, layer_norm)
    raise ValueError(f"unknown torso {kind!r}; choose one of {TORSOS}")
