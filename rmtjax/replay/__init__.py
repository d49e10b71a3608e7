"""Replay buffers as pure functions over typed states: `ring` (uniform), `tiered`
(hot/warm/cold keyed on TD error) and `prioritized` (sum-tree baseline).

`make_replay(kind, ...)` wraps each in the one interface the value-based agents use:
`init(example)`, `add(state, batch, td_abs)`, `sample(state, key, batch_size, beta) ->
(batch, info)` with `info.weight` the importance weights, `update(state, info, td_abs,
active=True)` (with `active` False the write-back changes nothing, so a caller can mask it
instead of branching around it), and the diagnostics `batch_stats` / `buffer_stats`.
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


def write_td(state, slot: jax.Array, td_abs: jax.Array, active=True):
    """A buffer whose items carry their last |TD| as `data["td"]` (ring, sum-tree), with it set
    at `slot` — or left as it is where `active` is False."""
    slot = jnp.where(active, slot, state.capacity)  # past the end: dropped
    return state.replace(data={**state.data, "td": state.data["td"].at[slot].set(td_abs, mode="drop")})


@struct.dataclass
class UniformInfo:
    slot: jax.Array
    weight: jax.Array
    td: jax.Array  # |TD| stored for the sampled items when they were drawn


class UniformReplay:
    """The ring buffer with each item's last |TD error| kept beside it (for diagnostics only)."""

    def __init__(self, capacity: int):
        self.capacity = capacity

    def init(self, example):
        return ring.init({"item": example, "td": jnp.zeros((), jnp.float32)}, self.capacity)

    def add(self, state, batch, td_abs):
        return ring.add(state, {"item": batch, "td": td_abs})

    def sample(self, state, key, batch_size, beta):
        data, slots = ring.sample(state, key, batch_size)
        return data["item"], UniformInfo(slots, jnp.ones(batch_size), data["td"])

    def update(self, state, info, td_abs, active=True):
        return write_td(state, info.slot, td_abs, active)

    def batch_stats(self, state, info, key):
        _, pool = ring.sample(state, key, _POOL)
        return {"top_td_share": top_share(state.data["td"][pool], info.td)}

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
