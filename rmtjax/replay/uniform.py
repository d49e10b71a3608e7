"""The uniform buffer behind the agents' replay interface (see `rmtjax.replay.make_replay`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax.replay import ring
from rmtjax.replay.util import POOL, top_share, write_td


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

    def update(self, state, info, td_abs, keep=None):
        return write_td(state, info.slot, td_abs, keep)

    def batch_stats(self, state, info):
        return {}

    def key_share(self, state, info, key):
        _, pool = ring.sample(state, key, POOL)
        return top_share(state.data["td"][pool], info.td)

    def buffer_stats(self, state):
        return {"replay_size": state.size}
