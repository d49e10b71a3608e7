"""Replay buffers as pure functions over typed states: `ring` (uniform), `tiered`
(hot/warm/cold keyed on TD error) and `prioritized` (sum-tree baseline).

`make_replay(kind, ...)` wraps each in the one interface the value-based agents use:

- `init(example)`, `add(state, batch, td_abs)` (`td_abs` is ignored where `needs_td` is False:
  a uniform buffer keeps no priority, so the agent need not compute one at insertion);
- `sample(state, key, batch_size, beta) -> (batch, info)` with `info.weight` the importance
  weights, and `update(state, info, td_abs)`, the write-back of the drawn items' new |TD|;
- diagnostics: `batch_stats(state, info)` (cheap, every iteration), `key_share(state, info,
  key)` (the top-TD share; it costs a quantile over a pool of items, so agents compute it every
  few iterations) and `buffer_stats(state)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax.replay import ring

TOP_QUANTILE = 0.9  # "key samples": the top 10% of |TD error| in the buffer
_POOL = 1024  # buffer items drawn to estimate that quantile, so the diagnostic costs O(pool)


def top_share(td_pool: jax.Array, td_batch: jax.Array) -> jax.Array:
    """Share of a sampled batch whose |TD| is at or above the buffer's 90th percentile, the
    percentile estimated from `td_pool`, a uniform draw of the buffer's items."""
    threshold = jnp.quantile(td_pool, TOP_QUANTILE)
    return (td_batch >= threshold).mean()


def write_td(state, slot: jax.Array, td_abs: jax.Array):
    """A buffer whose items carry their last |TD| as `data["td"]` (ring, sum-tree), with it set at `slot`."""
    return state.replace(data={**state.data, "td": state.data["td"].at[slot].set(td_abs)})


@struct.dataclass
class UniformInfo:
    slot: jax.Array
    weight: jax.Array
    td: jax.Array  # |TD| stored for the sampled items when they were drawn


class UniformReplay:
    """The ring buffer with each item's last |TD error| kept beside it, for the top-TD-share
    diagnostic only. No TD is computed at insertion: a new item's |TD| is 0 until it is first
    drawn (at these replay ratios an item is drawn several times in its life)."""

    needs_td = False

    def __init__(self, capacity: int):
        self.capacity = capacity

    def init(self, example):
        return ring.init({"item": example, "td": jnp.zeros((), jnp.float32)}, self.capacity)

    def add(self, state, batch, td_abs=None):
        b = jax.tree.leaves(batch)[0].shape[0]
        return ring.add(state, {"item": batch, "td": jnp.zeros((b,), jnp.float32)})

    def sample(self, state, key, batch_size, beta):
        data, slots = ring.sample(state, key, batch_size)
        return data["item"], UniformInfo(slots, jnp.ones(batch_size), data["td"])

    def update(self, state, info, td_abs):
        return write_td(state, info.slot, td_abs)

    def batch_stats(self, state, info):
        return {}

    def key_share(self, state, info, key):
        _, pool = ring.sample(state, key, _POOL)
        return top_share(state.data["td"][pool], info.td)

    def buffer_stats(self, state):
        return {"replay_size": state.size}


def make_replay(kind: str, capacity: int, fractions=(0.01, 0.1, 0.89), proportions=(0.25, 0.35, 0.4), alpha=0.6):
    if kind == "uniform":
        return UniformReplay(capacity)
    if kind == "tiered":
        from rmtjax.replay.adapters import TieredReplay

        return TieredReplay(capacity, fractions, proportions)
    if kind == "prioritized":
        from rmtjax.replay.adapters import PrioritizedReplay

        return PrioritizedReplay(capacity, alpha)
    raise ValueError(f"unknown replay {kind!r}; choose uniform, tiered or prioritized")
