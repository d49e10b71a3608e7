"""Tiered replay: hot, warm and cold tiers keyed on |TD error|, as pure functions over a typed state.

Storage. One ring of `capacity` items in insertion order (the oldest is overwritten first,
whatever its tier). Every slot also holds the item's |TD error|, its tier (0 hot, 1 warm, 2 cold;
`EMPTY` for a slot never written) and a unique id (`uid`), so a write-back can tell whether a slot
still holds the item that was drawn. A tier is a label: moving an item between tiers rewrites
one byte, never the item.

Routing. An item is hot if |TD| > thresholds[0], else warm if |TD| > thresholds[1], else cold.
The thresholds track quantiles of the running |TD| distribution — by default the 0.99 and 0.89
quantiles, so hot, warm and cold hold about 1%, 10% and 89% of the items (`fractions`). Every
`add` and every `update` moves them by an exponential moving average towards the batch's
quantiles, `threshold += threshold_step * (batch_quantile - threshold)`; the first batch sets
them outright. In an `update` batch each |TD| is weighted by 1 / P(drawn), so the weighted batch
quantile estimates the buffer's distribution rather than the skewed sampling distribution.
Batch quantiles are the inverse-CDF ones (no interpolation). Non-finite TD errors are left out
of the tracking (and, failing every comparison, are routed to cold).

Sampling. The batch is split across tiers by systematic sampling on the given proportions, so
each tier gets floor or ceil of `batch_size * proportion` draws; an empty tier's share is spread
over the non-empty ones in proportion (if none of those has a share, over the items in
proportion to the tiers' sizes). Within a tier, draws are uniform over its items, with
replacement. Item i of tier t is drawn with probability P(i) = p_t / count_t per draw, and its
importance weight is (N * P(i))^-beta / max over the batch, N the number of items.

The index that makes a uniform draw within a tier cheap: the ring is cut into blocks of
`block` consecutive slots, and `block_count[b, t]` counts the items of tier t in block b. A
draw of the r-th item of tier t finds its block with a prefix sum over the blocks' counts and
its slot with a prefix sum over that one block's labels. `add` and `update` recount the blocks
they touched from the labels, so the counts never drift. Costs: `sample` O(batch × (capacity /
block + block)), `add` O(items), `update` O(batch × block); with `block` near √capacity that is
O(batch × √capacity) elementwise work in a handful of operations, and nothing is ever moved.

Write-back. `update` writes the new |TD| errors of the drawn items and relabels those whose tier
changed. Entries whose slot no longer holds the drawn item (uid changed) are ignored. Within one
batch, duplicates of an item (draws are with replacement) carry the same TD error when they come
from one learner step; if they do not, one of them is kept.

All of it is jit/vmap-able: the capacity and block size are static, everything else is an array
in the state. Every operation reads what it needs and then writes each buffer once, so XLA
updates the buffers in place inside a jitted loop.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

HOT, WARM, COLD = 0, 1, 2
NUM_TIERS = 3
EMPTY = 3  # the tier label of a slot that holds no item
_UID_BITS = 0x7FFFFFFF  # uids wrap within int32's positive range; -1 marks an empty slot


@struct.dataclass
class TieredState:
    data: Any  # pytree of arrays [capacity, ...]
    abs_td_error: jax.Array  # [capacity] float32, |TD error| of the item in each slot
    tier: jax.Array  # [num_blocks * block] int8, the item's tier; EMPTY past the end and where unwritten
    uid: jax.Array  # [capacity] int32, the item's unique id, -1 where no item
    block_count: jax.Array  # [num_blocks, 3] int32, items of each tier in each block
    cursor: jax.Array  # int32, next slot to write
    size: jax.Array  # int32, items held (<= capacity)
    thresholds: jax.Array  # [2] float32, |TD| above [0] -> hot, above [1] -> warm, else cold
    quantiles: jax.Array  # [2] float32, the quantiles the thresholds track
    threshold_step: jax.Array  # float32, step of the thresholds' moving average
    seeded: jax.Array  # bool, whether any TD error has been seen yet
    next_uid: jax.Array  # int32
    block: int = struct.field(pytree_node=False)  # slots per block

    @property
    def capacity(self) -> int:
        return self.uid.shape[-1]

    @property
    def num_blocks(self) -> int:
        return self.block_count.shape[-2]


@struct.dataclass
class SampleInfo:
    tier: jax.Array  # [B] int32, 0 hot, 1 warm, 2 cold
    slot: jax.Array  # [B] int32, the item's slot in the ring
    weight: jax.Array  # [B] float32, importance weight, max 1 over the valid entries
    valid: jax.Array  # [B] bool, False only when the buffer is empty
    uid: jax.Array  # [B] int32, the drawn item's id
    probability: jax.Array  # [B] float32, P(i): the chance the item had per draw
    abs_td_error: jax.Array  # [B] float32, the stored |TD| at the time of drawing


def default_block(capacity: int) -> int:
    """A power of two near √capacity (16 to 4096): balances the two prefix sums of a draw."""
    return int(min(4096, max(16, 2 ** round(math.log2(max(math.sqrt(capacity), 1.0))))))


def check_fractions(fractions) -> tuple[float, float, float]:
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) != NUM_TIERS or any(not f > 0 for f in fractions):
        raise ValueError(f"fractions must be three positive numbers (hot, warm, cold), got {fractions}")
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"fractions must sum to 1, got {fractions} (sum {sum(fractions):.6g})")
    return fractions


def init(
    example: Any,
    capacity: int,
    fractions=(0.01, 0.1, 0.89),
    threshold_step: float = 0.05,
    block: int | None = None,
) -> TieredState:
    """An empty buffer for items shaped like `example` (one transition, no batch axis).

    `fractions` are the shares of the items the hot, warm and cold tiers aim at: the thresholds
    track the (1 - hot) and (1 - hot - warm) quantiles of |TD|.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    hot, warm, _ = check_fractions(fractions)
    if not 0.0 < threshold_step <= 1.0:
        raise ValueError(f"threshold_step must be in (0, 1], got {threshold_step}")
    block = default_block(capacity) if block is None else int(block)
    if block < 1:
        raise ValueError(f"block must be at least 1, got {block}")
    blocks = -(-capacity // block)
    data = jax.tree.map(lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype), example)
    return TieredState(
        data=data,
        abs_td_error=jnp.zeros((capacity,), jnp.float32),
        tier=jnp.full((blocks * block,), EMPTY, jnp.int8),
        uid=jnp.full((capacity,), -1, jnp.int32),
        block_count=jnp.zeros((blocks, NUM_TIERS), jnp.int32),
        cursor=jnp.zeros((), jnp.int32),
        size=jnp.zeros((), jnp.int32),
        thresholds=jnp.zeros((2,), jnp.float32),
        quantiles=jnp.asarray((1.0 - hot, 1.0 - hot - warm), jnp.float32),
        threshold_step=jnp.asarray(threshold_step, jnp.float32),
        seeded=jnp.zeros((), bool),
        next_uid=jnp.zeros((), jnp.int32),
        block=block,
    )


# --- thresholds -----------------------------------------------------------------------------


def _weighted_quantiles(x: jax.Array, weight: jax.Array, q: jax.Array) -> jax.Array:
    """Inverse-CDF quantiles q[K] of values x[B] with weights (0 = left out)."""
    x = jnp.where(weight > 0, x, jnp.inf)
    order = jnp.argsort(x)
    xs, cum = x[order], jnp.cumsum(weight[order])
    # the relative slack resolves float noise at exact boundaries (0.99 * 200 = 198.00001) downwards
    target = q * cum[-1] * (1.0 - 1e-6)
    idx = jnp.sum(cum[None, :] < target[:, None], axis=1)
    return xs[jnp.clip(idx, 0, x.shape[0] - 1)]


def _track(state: TieredState, abs_td: jax.Array, weight: jax.Array) -> TieredState:
    weight = jnp.where(jnp.isfinite(abs_td), weight, 0.0).astype(jnp.float32)
    seen = weight.sum() > 0
    batch_q = _weighted_quantiles(abs_td, weight, state.quantiles)
    step = jnp.where(state.seeded, state.threshold_step, 1.0)
    moved = state.thresholds + step * (batch_q - state.thresholds)
    moved = moved.at[0].set(jnp.maximum(moved[0], moved[1]))  # hot never below warm
    return state.replace(thresholds=jnp.where(seen, moved, state.thresholds), seeded=state.seeded | seen)


def route(thresholds: jax.Array, abs_td: jax.Array) -> jax.Array:
    """[B] int32 tier of each |TD| under `thresholds`: 0 hot, 1 warm, 2 cold."""
    return jnp.where(abs_td > thresholds[0], HOT, jnp.where(abs_td > thresholds[1], WARM, COLD)).astype(jnp.int32)


# --- the block index ---------------------------------------------------------------------------


def _recount(state: TieredState, blocks: jax.Array) -> TieredState:
    """`block_count` with the rows of `blocks` [K] recounted from the labels (a block listed
    twice gets the same count twice)."""
    labels = state.tier[blocks[:, None] * state.block + jnp.arange(state.block)]  # [K, block]
    counts = (labels[..., None] == jnp.arange(NUM_TIERS, dtype=labels.dtype)).sum(1, dtype=jnp.int32)
    return state.replace(block_count=state.block_count.at[blocks].set(counts))


def tier_sizes(state: TieredState) -> jax.Array:
    """[3] int32 items in hot, warm, cold."""
    return state.block_count.sum(0)


def live(state: TieredState) -> jax.Array:
    """[capacity] bool, which slots hold an item."""
    return state.uid >= 0


# --- public API --------------------------------------------------------------------------------


def add(state: TieredState, batch: Any, td_error: jax.Array) -> TieredState:
    """Add a batch (leading axis B <= capacity) of new items with their TD errors td_error[B],
    overwriting the oldest items once the ring is full.

    The thresholds first move towards this batch's |TD| quantiles, then each item is labelled
    with the tier its |TD| belongs to.
    """
    b = td_error.shape[0]
    leading = {jnp.shape(x)[0] for x in jax.tree.leaves(batch)}
    if leading != {b}:
        raise ValueError(f"every field of the batch needs a leading axis of {b} (as td_error), got {leading}")
    if b > state.capacity:
        raise ValueError(f"a batch of {b} items does not fit a tiered buffer of capacity {state.capacity}")
    abs_td = jnp.abs(td_error).astype(jnp.float32)
    state = _track(state, abs_td, jnp.ones((b,), jnp.float32))
    slots = (state.cursor + jnp.arange(b, dtype=jnp.int32)) % state.capacity
    uid = (state.next_uid + jnp.arange(b, dtype=jnp.int32)) & _UID_BITS
    data = jax.tree.map(lambda buf, x: buf.at[slots].set(jnp.asarray(x).astype(buf.dtype)), state.data, batch)
    state = state.replace(
        data=data,
        abs_td_error=state.abs_td_error.at[slots].set(abs_td),
        tier=state.tier.at[slots].set(route(state.thresholds, abs_td).astype(jnp.int8)),
        uid=state.uid.at[slots].set(uid),
        cursor=(state.cursor + b) % state.capacity,
        size=jnp.minimum(state.size + b, state.capacity),
        next_uid=(state.next_uid + b) & _UID_BITS,
    )
    # the slots are consecutive (mod capacity), so they span a run of consecutive blocks
    span = min(state.num_blocks, b // state.block + 2)
    blocks = (slots[0] // state.block + jnp.arange(span, dtype=jnp.int32)) % state.num_blocks
    return _recount(state, blocks)


def sample(
    state: TieredState, key: jax.Array, batch_size: int, proportions: jax.Array, beta: jax.Array | float
) -> tuple[Any, SampleInfo]:
    """Draw `batch_size` items (with replacement) across tiers in `proportions` [3] (hot, warm, cold).

    Returns the items and a SampleInfo. On an empty buffer every entry is invalid with weight 0.
    """
    counts = tier_sizes(state)
    total_items = counts.sum()
    share = jnp.asarray(proportions, jnp.float32) * (counts > 0)
    share = jnp.where(
        share.sum() > 0,
        share / jnp.maximum(share.sum(), 1e-30),
        counts / jnp.maximum(total_items, 1).astype(jnp.float32),
    )
    # one generator call: 32 random bits for the systematic offset and for each draw's rank
    bits = jax.random.bits(key, (batch_size + 1,), jnp.uint32)
    u = (jnp.arange(batch_size) + (bits[0] >> 8).astype(jnp.float32) * 2.0**-24) / batch_size
    tier = jnp.searchsorted(jnp.cumsum(share), u, side="right").astype(jnp.int32)
    # float rounding can leave the cumulative share just under 1: stay on a tier with a share
    last_with_share = jnp.max(jnp.where(share > 0, jnp.arange(NUM_TIERS), 0))
    tier = jnp.minimum(tier, last_with_share)
    n = counts[tier]
    rank = (bits[1:] % jnp.maximum(n, 1).astype(jnp.uint32)).astype(jnp.int32)  # the rank-th item of its tier
    # its block: the first whose running count of the tier exceeds the rank
    running = jnp.cumsum(state.block_count, axis=0)[:, tier].T  # [B, num_blocks]
    block = jnp.minimum((running <= rank[:, None]).sum(1), state.num_blocks - 1)
    before = jnp.where(block > 0, jnp.take_along_axis(running, jnp.maximum(block - 1, 0)[:, None], 1)[:, 0], 0)
    # its slot: the position in that block where the tier's running count passes the rest of the rank
    labels = state.tier[block[:, None] * state.block + jnp.arange(state.block)]  # [B, block]
    within = jnp.cumsum(labels == tier[:, None].astype(labels.dtype), axis=1)
    offset = jnp.minimum((within <= (rank - before)[:, None]).sum(1), state.block - 1)
    slot = jnp.minimum(block * state.block + offset, state.capacity - 1).astype(jnp.int32)
    valid = n > 0
    probability = jnp.where(valid, share[tier] / jnp.maximum(n, 1), 0.0)
    raw = jnp.where(valid, (total_items * probability) ** (-jnp.asarray(beta, jnp.float32)), 0.0)
    weight = raw / jnp.maximum(jnp.max(raw), 1e-30)
    info = SampleInfo(
        tier=tier,
        slot=slot,
        weight=weight.astype(jnp.float32),
        valid=valid,
        uid=jnp.where(valid, state.uid[slot], -1),
        probability=probability.astype(jnp.float32),
        abs_td_error=state.abs_td_error[slot],
    )
    return jax.tree.map(lambda buf: buf[slot], state.data), info


def update(state: TieredState, info: SampleInfo, td_error: jax.Array) -> TieredState:
    """Write back new TD errors td_error[B] for the items drawn in `info`; items change tier as needed.

    The thresholds first move towards the batch's importance-weighted |TD| quantiles. Entries
    whose slot no longer holds the drawn item are ignored.
    """
    abs_td = jnp.abs(td_error).astype(jnp.float32)
    current = info.valid & (info.uid >= 0) & (state.uid[info.slot] == info.uid)
    inverse_probability = jnp.where(current, 1.0 / jnp.maximum(info.probability, 1e-30), 0.0)
    state = _track(state, abs_td, inverse_probability / jnp.maximum(inverse_probability.max(), 1e-30))
    target = jnp.where(current, info.slot, state.tier.shape[-1])  # past the end of every buffer: dropped
    state = state.replace(
        abs_td_error=state.abs_td_error.at[target].set(abs_td, mode="drop"),
        tier=state.tier.at[target].set(route(state.thresholds, abs_td).astype(jnp.int8), mode="drop"),
    )
    return _recount(state, info.slot // state.block)
