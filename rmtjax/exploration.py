"""ε-greedy mixed with Boltzmann exploration, the temperature driven by policy entropy.

With probability ε an action is uniform; otherwise it is drawn from softmax(Q / τ). The
temperature τ is adapted online so that the Boltzmann policy's entropy tracks a target
(a fraction of the maximum entropy log |A|): too greedy a policy raises τ, too random a
policy lowers it. Because Q grows in scale as an agent learns, a fixed τ would drift from
near-uniform to greedy by accident; tracking entropy keeps exploration where it is asked to be.

Held exploration (`max_hold` > 1, temporally extended ε-greedy): an ε-draw starts a hold of
1..`max_hold` steps (uniform), during which the same uniform action is repeated; a repeated
action wanders much further than a fresh draw each step, which is what sparse rewards behind a
long manoeuvre need (a uniformly random MountainCarContinuous policy with 3 torque bins reaches
the flag in 5% of its episodes; held for 4 steps, 60%; for 16 steps, 98%). A hold runs on across
an episode boundary (it is short).

Shapes: `q` is [B, A] (discrete) or [B, D, bins] (per-dimension heads; each dimension is an
independent draw with the same ε and τ, and holds its own action).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


def boltzmann_entropy(q: jax.Array, temperature: jax.Array) -> jax.Array:
    """Mean entropy of softmax(q / τ) over every leading axis."""
    logp = jax.nn.log_softmax(q / temperature, axis=-1)
    return -(jnp.exp(logp) * logp).sum(-1).mean()


@struct.dataclass
class Hold:
    """A held exploratory action per actor (shaped like an action): what, and for how many more
    steps after this one."""

    action: jax.Array  # int32
    left: jax.Array  # int32, 0: not holding

    @classmethod
    def empty(cls, action_shape) -> "Hold":
        return cls(jnp.zeros(action_shape, jnp.int32), jnp.zeros(action_shape, jnp.int32))


def select_action(key: jax.Array, q: jax.Array, epsilon: jax.Array, temperature: jax.Array,
                  boltzmann: bool = True, hold: Hold | None = None,
                  max_hold: int = 1) -> tuple[jax.Array, dict, Hold | None]:
    """-> (action [B] or [B, D], info, hold). `boltzmann=False` is plain ε-greedy.

    With `hold` (from `Hold.empty(action_shape)` or the previous call) and `max_hold` > 1, an
    actor still holding repeats its held action and an ε-draw starts a new hold of 1..max_hold
    steps; without, each step is a fresh draw and the returned hold is None.
    """
    num = q.shape[-1]
    # every random number of the step from one draw: the ε test, the uniform action, the hold
    # length and (Boltzmann) one Gumbel variable per action, so the draw is one generator call
    u = jax.random.uniform(key, q.shape[:-1] + (3 + (num if boltzmann else 0),), minval=jnp.finfo(jnp.float32).tiny)
    uniform = jnp.minimum((u[..., 1] * num).astype(jnp.int32), num - 1)
    if boltzmann:  # Gumbel-max: argmax(q / τ + G) is a draw from softmax(q / τ)
        exploit = jnp.argmax(q / temperature - jnp.log(-jnp.log(u[..., 3:])), axis=-1)
    else:
        exploit = jnp.argmax(q, axis=-1)
    explore = u[..., 0] < epsilon
    action = jnp.where(explore, uniform, exploit)
    if hold is not None and max_hold > 1:
        holding = hold.left > 0
        length = 1 + jnp.minimum((u[..., 2] * max_hold).astype(jnp.int32), max_hold - 1)  # incl. this step
        action = jnp.where(holding, hold.action, action)
        hold = Hold(action=jnp.where(holding | explore, action, 0),
                    left=jnp.where(holding, hold.left - 1, jnp.where(explore, length - 1, 0)))
        explore = explore | holding
    elif hold is not None:
        hold = Hold.empty(action.shape)
    greedy = jnp.argmax(q, axis=-1)
    info = {
        "explore_frac": explore.mean(),  # fresh ε-draws and held ones
        # share of actions that differ from the greedy one, from either source of exploration
        "nongreedy_frac": (action != greedy).mean(),
        "policy_entropy": boltzmann_entropy(q, temperature) if boltzmann else jnp.zeros(()),
        "max_entropy": jnp.log(jnp.float32(num)),
    }
    return action, info, hold


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
