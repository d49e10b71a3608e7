"""The tiered and prioritised buffers behind the agents' one replay interface
(see `rmtjax.replay.make_replay`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax.replay import prioritized, tiered
from rmtjax.replay.util import POOL, top_share, write_td


@struct.dataclass
class PrioritizedDraw:
    slot: jax.Array
    weight: jax.Array
    valid: jax.Array
    td: jax.Array  # |TD| stored for the drawn items


class TieredReplay:
    """Hot/warm/cold tiers keyed on |TD error|, sampled in fixed proportions."""

    needs_td = True

    def __init__(self, capacity: int, fractions, proportions):
        self.capacity, self.fractions = capacity, tuple(fractions)
        self.proportions = jnp.asarray(proportions, jnp.float32)

    def init(self, example):
        return tiered.init(example, self.capacity, self.fractions)

    def add(self, state, batch, td_abs):
        return tiered.add(state, batch, td_abs)

    def sample(self, state, key, batch_size, beta):
        return tiered.sample(state, key, batch_size, self.proportions, beta)

    def update(self, state, info, td_abs, keep=None):
        if keep is not None:
            info = info.replace(valid=info.valid & keep)
        return tiered.update(state, info, td_abs)

    def batch_stats(self, state, info):
        return {"hot_share": (info.tier == tiered.HOT).mean(), "warm_share": (info.tier == tiered.WARM).mean(),
                "cold_share": (info.tier == tiered.COLD).mean()}

    def key_share(self, state, info, key):
        counts = tiered.tier_sizes(state).astype(jnp.float32)
        _, pool = tiered.sample(state, key, POOL, counts / jnp.maximum(counts.sum(), 1.0), 0.0)
        return top_share(pool.abs_td_error, info.abs_td_error)

    def buffer_stats(self, state):
        counts = tiered.tier_sizes(state)
        return {"replay_size": counts.sum(), "hot_size": counts[0], "warm_size": counts[1], "cold_size": counts[2],
                "hot_threshold": state.thresholds[0], "warm_threshold": state.thresholds[1]}


class PrioritizedReplay:
    """Proportional prioritised replay (sum-tree), priority = |TD error|."""

    EPS = 1e-3  # keeps every item drawable
    needs_td = True

    def __init__(self, capacity: int, alpha: float):
        self.capacity, self.alpha = capacity, alpha

    def init(self, example):
        return prioritized.init({"item": example, "td": jnp.zeros((), jnp.float32)}, self.capacity, self.alpha)

    def add(self, state, batch, td_abs=None):
        """New items at `td_abs`, or (None) at the largest |TD| held: drawn soon, as PER inserts them."""
        if td_abs is None:
            b = jax.tree.leaves(batch)[0].shape[0]
            td_abs = jnp.full((b,), jnp.maximum(state.data["td"].max(), 1.0), jnp.float32)
        return prioritized.add(state, {"item": batch, "td": td_abs}, td_abs + self.EPS)

    def sample(self, state, key, batch_size, beta):
        data, info = prioritized.sample(state, key, batch_size, beta)
        return data["item"], PrioritizedDraw(info.slot, info.weight, info.valid, data["td"])

    def update(self, state, info, td_abs, keep=None):
        valid = info.valid if keep is None else info.valid & keep
        state = prioritized.update(state, info.slot, td_abs + self.EPS, valid)
        return write_td(state, info.slot, td_abs, keep)

    def batch_stats(self, state, info):
        return {}

    def key_share(self, state, info, key):
        pool = jax.random.randint(key, (POOL,), 0, jnp.maximum(state.size, 1))
        return top_share(state.data["td"][pool], info.td)

    def buffer_stats(self, state):
        return {"replay_size": state.size}
