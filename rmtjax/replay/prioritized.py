"""Proportional prioritised replay (Schaul et al., 2016) on a sum-tree, as pure functions.

The baseline the tiered buffer is compared against. Items live in a ring of `capacity` rows
(oldest overwritten first, like `ring`). Item i is drawn with probability
P(i) = p_i^alpha / sum_j p_j^alpha, where p_i is the priority the caller gives (typically
|TD error| plus a small constant: a zero priority is never drawn) and alpha is an array in the
state, so it can be swept or annealed.

The sum-tree is one array of 2P float32 nodes, P the smallest power of two >= capacity: node 1
is the root, node k has children 2k and 2k+1, the leaves P..P+capacity-1 hold p_i^alpha and the
rest are 0. Writes set leaves and then recompute each ancestor level from its two children
(rather than adding deltas), so the tree stays exactly consistent and never drifts. A batch is
drawn by stratified sampling: draw b looks up the prefix sum (b + U_b) / B * total by descending
from the root. Everything costs O(batch * log capacity). Within one batch of writes, duplicate
slots resolve to the last occurrence.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax.replay.util import last_occurrence


@struct.dataclass
class PrioritizedState:
    data: Any  # pytree of arrays [capacity, ...]
    tree: jax.Array  # [2P] float32 sum-tree; leaves P.. hold priority ** alpha
    cursor: jax.Array  # next slot to write
    size: jax.Array  # filled slots, <= capacity
    alpha: jax.Array  # float32 priority exponent

    @property
    def capacity(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[0]

    @property
    def num_leaves(self) -> int:
        return self.tree.shape[-1] // 2


@struct.dataclass
class PrioritizedInfo:
    slot: jax.Array  # [B] int32
    weight: jax.Array  # [B] float32 importance weight, max 1 over the batch
    valid: jax.Array  # [B] bool, False when nothing can be drawn (empty buffer or all priorities 0)
    probability: jax.Array  # [B] float32 P(i)


def init(example: Any, capacity: int, alpha: float = 0.6) -> PrioritizedState:
    """An empty buffer for items shaped like `example` (one transition, no batch axis)."""
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0 (0 is uniform sampling), got {alpha}")
    leaves = 1 << max(capacity - 1, 0).bit_length()
    data = jax.tree.map(lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype), example)
    return PrioritizedState(
        data=data,
        tree=jnp.zeros((2 * leaves,), jnp.float32),
        cursor=jnp.zeros((), jnp.int32),
        size=jnp.zeros((), jnp.int32),
        alpha=jnp.asarray(alpha, jnp.float32),
    )


def _set_leaves(state: PrioritizedState, slots: jax.Array, priority: jax.Array, mask: jax.Array) -> jax.Array:
    """The tree with leaves `slots` (distinct where masked in) set to priority ** alpha."""
    leaves = state.num_leaves
    out_of_range = 2 * leaves
    value = jnp.asarray(priority, jnp.float32) ** state.alpha
    node = jnp.where(mask, leaves + slots, out_of_range)
    tree = state.tree.at[node].set(value, mode="drop")
    for _ in range(leaves.bit_length() - 1):
        node = jnp.where(mask, node // 2, out_of_range)
        parent = jnp.minimum(node, leaves - 1)  # masked-out entries read a valid node, write nothing
        tree = tree.at[node].set(tree[2 * parent] + tree[2 * parent + 1], mode="drop")
    return tree


def add(state: PrioritizedState, batch: Any, priority: jax.Array) -> PrioritizedState:
    """Write a batch (leading axis B <= capacity) at the cursor with priorities priority[B] (>= 0)."""
    capacity = state.capacity
    b = jax.tree.leaves(batch)[0].shape[0]
    if b > capacity:
        raise ValueError(f"a batch of {b} items does not fit a prioritised buffer of capacity {capacity}")
    slots = (state.cursor + jnp.arange(b)) % capacity
    data = jax.tree.map(lambda buf, x: buf.at[slots].set(jnp.asarray(x).astype(buf.dtype)), state.data, batch)
    tree = _set_leaves(state, slots, priority, jnp.ones((b,), bool))
    return state.replace(
        data=data, tree=tree, cursor=(state.cursor + b) % capacity, size=jnp.minimum(state.size + b, capacity)
    )


def sample(
    state: PrioritizedState, key: jax.Array, batch_size: int, beta: jax.Array | float
) -> tuple[Any, PrioritizedInfo]:
    """`batch_size` items drawn in proportion to priority ** alpha, with importance weights.

    weight = (N * P(i)) ** -beta, normalised by the batch maximum; N the number of filled slots.
    """
    leaves = state.num_leaves
    total = state.tree[1]
    u = (jnp.arange(batch_size) + jax.random.uniform(key, (batch_size,))) / batch_size * total
    node = jnp.ones((batch_size,), jnp.int32)
    mass = jnp.broadcast_to(total, (batch_size,))  # the sum under `node`
    for _ in range(leaves.bit_length() - 1):
        left, right = state.tree[2 * node], state.tree[2 * node + 1]
        # an empty right subtree is never entered, even when rounding leaves u past the left sum
        go_right = (u >= left) & (right > 0)
        u = jnp.where(go_right, u - left, u)
        node = 2 * node + go_right
        mass = jnp.where(go_right, right, left)
    slot = (node - leaves).astype(jnp.int32)
    valid = jnp.broadcast_to(total > 0, (batch_size,))
    # the leaf's value comes from the descent: reading the tree again here could outlive an
    # in-place update of it and make XLA copy the whole tree
    probability = jnp.where(valid, mass / jnp.where(total > 0, total, 1.0), 0.0)
    raw = jnp.where(valid, (state.size * probability) ** (-jnp.asarray(beta, jnp.float32)), 0.0)
    weight = raw / jnp.maximum(raw.max(), 1e-30)
    batch = jax.tree.map(lambda buf: buf[slot], state.data)
    return batch, PrioritizedInfo(slot=slot, weight=weight, valid=valid, probability=probability)


def update(
    state: PrioritizedState, slots: jax.Array, priority: jax.Array, valid: jax.Array | None = None
) -> PrioritizedState:
    """Set new priorities priority[B] for `slots`; duplicates resolve to the last occurrence.

    Entries with `valid` False, and slots that hold no item yet, are ignored.
    """
    if valid is None:
        valid = jnp.ones(slots.shape, bool)
    winner = last_occurrence(slots, valid & (slots >= 0) & (slots < state.size), state.capacity)
    return state.replace(tree=_set_leaves(state, slots, priority, winner))


def priorities(state: PrioritizedState) -> jax.Array:
    """[capacity] float32 stored priority ** alpha of every slot (0 where empty)."""
    return state.tree[state.num_leaves : state.num_leaves + state.capacity]
