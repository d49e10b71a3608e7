"""Network building blocks (flax linen): torsos and heads chosen by config."""

from rmtjax.networks.torsos import MLP, activation_fn

__all__ = ["MLP", "activation_fn"]
