"""Log-densities of the policies' Gaussians, in one place (PPO's Gaussian, SAC's tanh-squashed
Gaussian); hand-checked formulas, float32 in and out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

LOG_2PI = float(np.log(2 * np.pi))
LOG_2 = float(np.log(2.0))


def gaussian_log_density(mean, log_std, x):
    """Per-dimension log N(x; mean, exp(log_std)²), elementwise (no sum over dimensions)."""
    z = (x - mean) * jnp.exp(-log_std)
    return -0.5 * z**2 - log_std - 0.5 * LOG_2PI


def gaussian_log_prob(mean, log_std, x):
    """Log density of `x` [B, A] under independent Gaussians per dimension: [B]."""
    return jnp.sum(gaussian_log_density(mean, log_std, x), axis=-1)


def gaussian_entropy(log_std):
    """Entropy of independent Gaussians per dimension [B, A]: [B]."""
    return jnp.sum(log_std + 0.5 * (1.0 + LOG_2PI), axis=-1)


def tanh_gaussian_log_prob(mean, log_std, pre_tanh, half_range):
    """Log density of `center + half_range * tanh(u)` at `u = pre_tanh`, u ~ N(mean, exp(log_std)^2)
    per dimension; [B, A] inputs, [B] output (independent dimensions summed)."""
    log_gauss = gaussian_log_density(mean, log_std, pre_tanh)
    # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), which stays finite where tanh(u) rounds to ±1
    log_dtanh = 2.0 * (LOG_2 - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh))
    return jnp.sum(log_gauss - log_dtanh - jnp.log(half_range), axis=-1)
