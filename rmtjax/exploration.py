"""ε-greedy mixed with Boltzmann exploration, the temperature driven by policy entropy.

With probability ε an action is uniform; otherwise it is drawn from softmax(Q / τ). The
temperature τ is adapted online so that the Boltzmann policy's entropy tracks a target
(a fraction of the maximum entropy log |A|): too greedy a policy raises τ, too random a
policy lowers it. Because Q grows in scale as an agent learns, a fixed τ would drift from
near-uniform to greedy by accident; tracking entropy keeps exploration where it is asked to be.

Shapes: `q` is [B, A] (discrete) or [B, D, bins] (per-dimension heads; each dimension is an
independent draw with the same ε and τ).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def boltzmann_entropy(q: jax.Array, temperature: jax.Array) -> jax.Array:
    """Mean entropy of softmax(q / τ) over every leading axis."""
    logp = jax.nn.log_softmax(q / temperature, axis=-1)
    return -(jnp.exp(logp) * logp).sum(-1).mean()


def select_action(key: jax.Array, q: jax.Array, epsilon: jax.Array, temperature: jax.Array,
                  boltzmann: bool = True) -> tuple[jax.Array, dict]:
    """-> (action [B] or [B, D], info). `boltzmann=False` is plain ε-greedy."""
    k_eps, k_uni, k_boltz = jax.random.split(key, 3)
    num = q.shape[-1]
    uniform = jax.random.randint(k_uni, q.shape[:-1], 0, num)
    if boltzmann:
        exploit = jax.random.categorical(k_boltz, q / temperature, axis=-1)
    else:
        exploit = jnp.argmax(q, axis=-1)
    explore = jax.random.uniform(k_eps, q.shape[:-1]) < epsilon
    action = jnp.where(explore, uniform, exploit)
    greedy = jnp.argmax(q, axis=-1)
    info = {
        "explore_frac": explore.mean(),
        # share of actions that differ from the greedy one, from either source of exploration
        "nongreedy_frac": (action != greedy).mean(),
        "policy_entropy": boltzmann_entropy(q, temperature) if boltzmann else jnp.zeros(()),
        "max_entropy": jnp.log(jnp.float32(num)),
    }
    return action, info


def adapt_temperature(log_temperature: jax.Array, entropy: jax.Array, target_entropy: jax.Array,
                      rate: jax.Array) -> jax.Array:
    """One step of log τ towards the entropy target: log τ += rate · (target − H).

    Entropy increases with τ, so this is a stable fixed-point iteration at H = target.
    Bounded to τ in [1e-3, 1e3] so a degenerate Q (all equal) cannot push it to inf.
    """
    return jnp.clip(log_temperature + rate * (target_entropy - entropy), jnp.log(1e-3), jnp.log(1e3))


def linear_schedule(start: jax.Array, end: jax.Array, fraction_done: jax.Array, decay_fraction: float) -> jax.Array:
    """`start` → `end` linearly over the first `decay_fraction` of training, then `end`."""
    t = jnp.clip(fraction_done / max(decay_fraction, 1e-8), 0.0, 1.0)
    return start + t * (end - start)
