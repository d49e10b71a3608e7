"""A uniform ring buffer as pure functions over a typed state.

Memory is fixed at `capacity` items, allocated up front; each field keeps the dtype of the
example it was created from (uint8/bool observations stay compact). `add` writes a batch at
the cursor, wrapping around and overwriting the oldest items; `sample` draws uniformly from
the filled slots only. Both cost O(batch), not O(capacity).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class RingState:
    data: Any  # pytree of arrays [capacity, ...]
    cursor: jax.Array  # next slot to write
    size: jax.Array  # filled slots, <= capacity

    @property
    def capacity(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[0]


def init(example: Any, capacity: int) -> RingState:
    """An empty buffer for items shaped like `example` (a pytree of one transition, no batch axis)."""
    data = jax.tree.map(lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype), example)
    return RingState(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def add(state: RingState, batch: Any) -> RingState:
    """Write a batch (leading axis B <= capacity) at the cursor, wrapping around."""
    capacity = state.capacity
    b = jax.tree.leaves(batch)[0].shape[0]
    if b > capacity:
        raise ValueError(f"a batch of {b} items does not fit a ring buffer of capacity {capacity}")
    slots = (state.cursor + jnp.arange(b)) % capacity
    data = jax.tree.map(lambda buf, x: buf.at[slots].set(x.astype(buf.dtype)), state.data, batch)
    return RingState(data, (state.cursor + b) % capacity, jnp.minimum(state.size + b, capacity))


def sample(state: RingState, key: jax.Array, batch_size: int) -> tuple[Any, jax.Array]:
    """`batch_size` items drawn uniformly (with replacement) from the filled slots, and their slots.

    On an empty buffer the slots are all 0 (zeros); callers gate learning on `state.size`.
    """
    slots = jax.random.randint(key, (batch_size,), 0, jnp.maximum(state.size, 1))
    # the filled slots are [0, size) until the first wrap, and all of them after it
    return jax.tree.map(lambda buf: buf[slots], state.data), slots


def gather(state: RingState, slots: jax.Array) -> Any:
    return jax.tree.map(lambda buf: buf[slots], state.data)
