"""Tiered replay: hot, warm and cold tiers keyed on |TD error|, as pure functions over a typed state.

Layout. One flat store of `capacity` rows; tier t owns the rows [offset_t, offset_t +
capacity_t) (by default 1% / 10% / 89% of the capacity). Inside its rows each tier is a ring
whose live items form one contiguous run: the oldest at `start[t]`, then `count[t]` items in
age order. Every row also keeps the item's |TD error| and a unique id (`uid`, -1 where no live
item is), so a write-back can tell whether a slot still holds the item that was sampled.

Routing. An item goes to hot if |TD| > thresholds[0], else to warm if |TD| > thresholds[1],
else to cold. The thresholds track quantiles of the running |TD| distribution (by default the
0.99 and 0.89 quantiles, so each tier receives the share of items that matches its share of
the capacity and all tiers turn over at about the same rate). Every `add` and every `update`
moves them by an exponential moving average towards the batch's quantiles:
`threshold += threshold_step * (batch_quantile - threshold)`; the first batch sets them
outright. In an `update` batch each TD error is weighted by 1 / P(drawn), so the weighted
batch quantile estimates the buffer's distribution rather than the skewed sampling
distribution. Batch quantiles are the inverse-CDF ones (no interpolation); for batches much
smaller than 1 / (1 - q) the hot threshold leans towards the batch maximum. Non-finite TD errors
are left out of the tracking (and, failing every comparison, are routed to cold).

Eviction. A tier that receives more items than it has room for evicts its oldest items: hot's
are demoted to warm and warm's to cold (keeping their |TD|; they are re-routed by TD error when
next written back), cold's are dropped. Items pass along in age order, the demoted ones ahead
of the batch's own new items, so within a tier age order is kept.

Movement. `update` writes new TD errors back. An item whose tier is unchanged keeps its slot; an
item whose new |TD| belongs to another tier leaves its slot and is inserted into the new tier
(with the eviction cascade above). A tier stays contiguous: the holes left by k departing items
are filled with the tier's oldest remaining items from the first k positions of its run, and
the run's start advances by k. Those few old items thereby look younger than they are;
everything stays O(batch). Within one write-back batch, duplicates of one item resolve to the
last occurrence; entries whose slot no longer holds the sampled item (uid changed) are ignored.

Sampling. The batch is split across tiers by systematic sampling on the given proportions, so
each tier gets floor or ceil of `batch_size * proportion` draws; an empty tier's share is spread
over the non-empty ones in proportion (if none of those has a share, uniformly over all
items). Within a tier draws are uniform over its live items, with replacement. Item i of tier t
is drawn with probability P(i) = p_t / count_t per draw, and its importance weight is
(N * P(i))^-beta / max over the batch, N the number of live items.

Every operation costs O(batch) (O(batch log batch) for the batch quantiles and duplicate
resolution), and all of it is jit/vmap-able: the tier sizes are static, everything else is an
array in the state. Each phase of an `add` or `update` reads first and then writes each buffer
once, so XLA updates the buffers in place (inside a jitted loop) instead of copying them. The
same holds for the caller: use a sampled batch (and its weights) before writing back, as a
learner does; a read of it kept until after the `update` would force a copy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax.replay.util import last_occurrence

HOT, WARM, COLD = 0, 1, 2
NUM_TIERS = 3
_UID_BITS = 0x7FFFFFFF  # uids wrap within int32's positive range; -1 marks an empty row


@struct.dataclass
class TieredState:
    data: Any  # pytree of arrays [capacity, ...]
    abs_td_error: jax.Array  # [capacity] float32, |TD error| of the item in each row
    uid: jax.Array  # [capacity] int32, the item's unique id, -1 where no live item
    start: jax.Array  # [3] int32, position (within the tier) of each tier's oldest item
    count: jax.Array  # [3] int32, live items per tier
    thresholds: jax.Array  # [2] float32, |TD| above [0] -> hot, above [1] -> warm, else cold
    quantiles: jax.Array  # [2] float32, the quantiles the thresholds track
    threshold_step: jax.Array  # float32, step of the thresholds' moving average
    seeded: jax.Array  # bool, whether any TD error has been seen yet
    next_uid: jax.Array  # int32
    tier_capacity: tuple[int, int, int] = struct.field(pytree_node=False)

    @property
    def capacity(self) -> int:
        return sum(self.tier_capacity)

    @property
    def tier_offset(self) -> tuple[int, int, int]:
        hot, warm, _ = self.tier_capacity
        return (0, hot, hot + warm)


@struct.dataclass
class SampleInfo:
    tier: jax.Array  # [B] int32, 0 hot, 1 warm, 2 cold
    slot: jax.Array  # [B] int32, position within the tier
    weight: jax.Array  # [B] float32, importance weight, max 1 over the valid entries
    valid: jax.Array  # [B] bool, False only when the buffer is empty
    uid: jax.Array  # [B] int32, the drawn item's id
    probability: jax.Array  # [B] float32, P(i): the chance the item had per draw
    abs_td_error: jax.Array  # [B] float32, the stored |TD| at the time of drawing


def tier_capacities(capacity: int, fractions=(0.01, 0.1, 0.89)) -> tuple[int, int, int]:
    """Rows per tier: hot and warm get round(fraction * capacity), cold the rest."""
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) != NUM_TIERS or any(not f > 0 for f in fractions):
        raise ValueError(f"fractions must be three positive numbers (hot, warm, cold), got {fractions}")
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"fractions must sum to 1, got {fractions} (sum {sum(fractions):.6g})")
    hot, warm = (int(round(f * capacity)) for f in fractions[:2])
    caps = (hot, warm, capacity - hot - warm)
    if min(caps) < 1:
        need = int(-(-1 // min(fractions)))  # ceil(1 / smallest fraction)
        raise ValueError(
            f"a capacity of {capacity} with fractions {fractions} leaves tier sizes {caps}; "
            f"every tier needs a slot: use a capacity of at least {need} or larger fractions"
        )
    return caps


def init(
    example: Any,
    capacity: int,
    fractions=(0.01, 0.1, 0.89),
    quantiles=None,
    threshold_step: float = 0.05,
) -> TieredState:
    """An empty tiered buffer for items shaped like `example` (one transition, no batch axis).

    fractions: share of `capacity` for hot, warm, cold. quantiles: the |TD| quantiles the hot
    and warm thresholds track; by default (1 - f_hot, 1 - f_hot - f_warm). threshold_step: the
    moving-average step of the thresholds per batch, in (0, 1].
    """
    caps = tier_capacities(capacity, fractions)
    if quantiles is None:
        quantiles = (1.0 - fractions[0], 1.0 - fractions[0] - fractions[1])
    quantiles = tuple(float(q) for q in quantiles)
    if len(quantiles) != 2 or not 0.0 < quantiles[1] <= quantiles[0] < 1.0:
        raise ValueError(f"quantiles must be (hot, warm) with 0 < warm <= hot < 1, got {quantiles}")
    if not 0.0 < threshold_step <= 1.0:
        raise ValueError(f"threshold_step must be in (0, 1], got {threshold_step}")
    data = jax.tree.map(lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype), example)
    return TieredState(
        data=data,
        abs_td_error=jnp.zeros((capacity,), jnp.float32),
        uid=jnp.full((capacity,), -1, jnp.int32),
        start=jnp.zeros((NUM_TIERS,), jnp.int32),
        count=jnp.zeros((NUM_TIERS,), jnp.int32),
        thresholds=jnp.zeros((2,), jnp.float32),
        quantiles=jnp.asarray(quantiles, jnp.float32),
        threshold_step=jnp.asarray(threshold_step, jnp.float32),
        seeded=jnp.zeros((), bool),
        next_uid=jnp.zeros((), jnp.int32),
        tier_capacity=caps,
    )


# --- small pytree helpers -------------------------------------------------------------------


def _gather(tree, idx):
    return jax.tree.map(lambda x: x[idx], tree)


def _scatter(tree, idx, values):
    """Rows `idx` of every leaf set from `values`; an index past the end is dropped."""
    return jax.tree.map(lambda buf, v: buf.at[idx].set(v.astype(buf.dtype), mode="drop"), tree, values)


def _select(mask, a, b):
    def pick(x, y):
        return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y)

    return jax.tree.map(pick, a, b)


def _concat(a, b):
    return jax.tree.map(lambda x, y: jnp.concatenate([x, y]), a, b)


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


# --- moving items in and out of tiers --------------------------------------------------------
#
# Each phase below reads what it needs and then writes every buffer with one scatter whose
# operands are those reads. An old version of a buffer read after a write to it would make XLA
# copy the whole buffer (O(capacity)) to keep both alive; with this ordering it updates in place.


def _store(state):
    return (state.data, state.abs_td_error, state.uid)


def _plan_insert(state: TieredState, tier: int, items, mask: jax.Array):
    """Where the masked items (oldest first) go when appended to `tier`, and who gets evicted.

    Returns (rows[L], incoming[L]) to write (a row past the end is not written), the evicted
    items (oldest first, read from `state`) with their mask, and the tier's new start and count.
    """
    cap, off, total = state.tier_capacity[tier], state.tier_offset[tier], state.capacity
    length = mask.shape[0]
    r = jnp.arange(length)
    s, n = state.start[tier], state.count[tier]
    m = mask.sum(dtype=jnp.int32)
    rank = jnp.cumsum(mask) - 1
    by_rank = jnp.zeros((length,), jnp.int32).at[jnp.where(mask, rank, length)].set(r, mode="drop")
    incoming = _gather(items, by_rank)  # incoming[i] is the i-th masked item
    evict = jnp.maximum(n + m - cap, 0)
    # the evicted are the oldest `evict` of (the tier's items, then the incoming ones)
    old = _gather(_store(state), off + (s + r) % cap)
    evicted = _select(r < n, old, _gather(incoming, jnp.clip(r - n, 0, length - 1)))
    keep = (r < m) & (r >= evict - n)
    rows = jnp.where(keep, off + (s + n + r) % cap, total)
    return (rows, incoming), (evicted, r < evict), ((s + evict) % cap, n + m - evict)


def _cascade(state: TieredState, items, tier: jax.Array, mask: jax.Array) -> TieredState:
    """Insert items into their tiers; hot's evictions go to warm, warm's to cold, cold's are dropped.

    The tiers own disjoint rows, so every tier's reads can come from the incoming state and all
    the writes go in one scatter.
    """
    carried, carried_mask = None, None
    rows, values, start, count = [], [], state.start, state.count
    for t in range(NUM_TIERS):
        mine = mask & (tier == t)
        if carried is None:
            cand, cand_mask = items, mine
        else:
            cand, cand_mask = _concat(carried, items), jnp.concatenate([carried_mask, mine])
        (r, v), (carried, carried_mask), (s, n) = _plan_insert(state, t, cand, cand_mask)
        rows.append(r)
        values.append(v)
        start, count = start.at[t].set(s), count.at[t].set(n)
    values = jax.tree.map(lambda *v: jnp.concatenate(v), *values)
    data, abs_td, uid = _scatter(_store(state), jnp.concatenate(rows), values)
    return state.replace(data=data, abs_td_error=abs_td, uid=uid, start=start, count=count)


def _plan_remove(state: TieredState, tier: int, slots: jax.Array, mask: jax.Array):
    """How the masked items (distinct live slots of `tier`) leave it, keeping the tier contiguous.

    The run gives up its k oldest positions. The i-th surviving item among them (a filler) and
    the i-th departing item outside them (a hole, in batch order) swap rows: the filler keeps
    its place in the run, the departing item lands on a row that is no longer live. Returns the
    writes per buffer (rows, values), each departing item's row after the swap, and the tier's
    new start and count.
    """
    cap, off, total = state.tier_capacity[tier], state.tier_offset[tier], state.capacity
    b = mask.shape[0]
    j = jnp.arange(b)
    s, n = state.start[tier], state.count[tier]
    k = mask.sum(dtype=jnp.int32)
    in_run = (slots - s) % cap
    head_leaves = jnp.zeros((b,), bool).at[jnp.where(mask & (in_run < k), in_run, b)].set(True, mode="drop")
    head = off + (s + j) % cap  # the k oldest positions
    filler = (j < k) & ~head_leaves
    hole = mask & (in_run >= k)
    hole_rank, filler_rank = jnp.cumsum(hole) - 1, jnp.cumsum(filler) - 1
    hole_row = jnp.zeros((b,), jnp.int32).at[jnp.where(hole, hole_rank, b)].set(off + slots, mode="drop")
    filler_row = jnp.zeros((b,), jnp.int32).at[jnp.where(filler, filler_rank, b)].set(head, mode="drop")
    filler_to = jnp.where(filler, hole_row[jnp.clip(filler_rank, 0, b - 1)], total)
    leaver_to = jnp.where(hole, filler_row[jnp.clip(hole_rank, 0, b - 1)], total)
    leaver_row = jnp.where(hole, leaver_to, off + slots)
    data, abs_td, uid = _store(state)
    vacated = jnp.where(j < k, head, total)
    writes = (
        (jnp.concatenate([filler_to, leaver_to]), _concat(_gather(data, head), _gather(data, off + slots))),
        (filler_to, abs_td[head]),
        (jnp.concatenate([filler_to, vacated]), jnp.concatenate([uid[head], jnp.full((b,), -1, jnp.int32)])),
    )
    return writes, leaver_row, ((s + k) % cap, n - k)


def _remove(state: TieredState, tier: jax.Array, slots: jax.Array, mask: jax.Array):
    """Take the masked items out of their tiers (tier[B]); returns the state and their rows now."""
    plans = [_plan_remove(state, t, slots, mask & (tier == t)) for t in range(NUM_TIERS)]
    buffers = []
    for i, buf in enumerate(_store(state)):
        rows = jnp.concatenate([p[0][i][0] for p in plans])
        values = jax.tree.map(lambda *v: jnp.concatenate(v), *[p[0][i][1] for p in plans])
        buffers.append(_scatter(buf, rows, values))
    leaver_row = plans[0][1]
    for t in range(1, NUM_TIERS):
        leaver_row = jnp.where(tier == t, plans[t][1], leaver_row)
    start = jnp.stack([p[2][0] for p in plans]).astype(jnp.int32)
    count = jnp.stack([p[2][1] for p in plans]).astype(jnp.int32)
    data, abs_td, uid = buffers
    return state.replace(data=data, abs_td_error=abs_td, uid=uid, start=start, count=count), leaver_row


# --- public API --------------------------------------------------------------------------------


def add(state: TieredState, batch: Any, td_error: jax.Array) -> TieredState:
    """Add a batch (leading axis B) of new items with their TD errors td_error[B].

    The thresholds first move towards this batch's |TD| quantiles, then each item goes to the
    tier its |TD| belongs to (evicting and demoting the oldest where a tier overflows).
    """
    b = td_error.shape[0]
    leading = {jnp.shape(x)[0] for x in jax.tree.leaves(batch)}
    if leading != {b}:
        raise ValueError(f"every field of the batch needs a leading axis of {b} (as td_error), got {leading}")
    abs_td = jnp.abs(td_error).astype(jnp.float32)
    state = _track(state, abs_td, jnp.ones((b,), jnp.float32))
    uid = (state.next_uid + jnp.arange(b, dtype=jnp.int32)) & _UID_BITS
    batch = jax.tree.map(lambda buf, x: jnp.asarray(x).astype(buf.dtype), state.data, batch)
    state = state.replace(next_uid=(state.next_uid + b) & _UID_BITS)
    return _cascade(state, (batch, abs_td, uid), route(state.thresholds, abs_td), jnp.ones((b,), bool))


def sample(
    state: TieredState, key: jax.Array, batch_size: int, proportions: jax.Array, beta: jax.Array | float
) -> tuple[Any, SampleInfo]:
    """Draw `batch_size` items (with replacement) across tiers in `proportions` [3] (hot, warm, cold).

    Returns the items and a SampleInfo. On an empty buffer every entry is invalid with weight 0.
    """
    caps = jnp.asarray(state.tier_capacity, jnp.int32)
    offsets = jnp.asarray(state.tier_offset, jnp.int32)
    counts = state.count
    total_items = counts.sum()
    share = jnp.asarray(proportions, jnp.float32) * (counts > 0)
    share = jnp.where(
        share.sum() > 0,
        share / jnp.maximum(share.sum(), 1e-30),
        counts / jnp.maximum(total_items, 1).astype(jnp.float32),
    )
    k_tier, k_slot = jax.random.split(key)
    u = (jnp.arange(batch_size) + jax.random.uniform(k_tier)) / batch_size
    tier = jnp.searchsorted(jnp.cumsum(share), u, side="right").astype(jnp.int32)
    # float rounding can leave the cumulative share just under 1: stay on a tier with a share
    last_with_share = jnp.max(jnp.where(share > 0, jnp.arange(NUM_TIERS), 0))
    tier = jnp.minimum(tier, last_with_share)
    n = counts[tier]
    offset_in_run = jax.random.randint(k_slot, (batch_size,), 0, jnp.maximum(n, 1))
    slot = (state.start[tier] + offset_in_run) % caps[tier]
    row = offsets[tier] + slot
    valid = n > 0
    probability = jnp.where(valid, share[tier] / jnp.maximum(n, 1), 0.0)
    raw = jnp.where(valid, (total_items * probability) ** (-jnp.asarray(beta, jnp.float32)), 0.0)
    weight = raw / jnp.maximum(jnp.max(raw), 1e-30)
    info = SampleInfo(
        tier=tier,
        slot=slot.astype(jnp.int32),
        weight=weight.astype(jnp.float32),
        valid=valid,
        uid=jnp.where(valid, state.uid[row], -1),
        probability=probability.astype(jnp.float32),
        abs_td_error=state.abs_td_error[row],
    )
    return _gather(state.data, row), info


def update(state: TieredState, info: SampleInfo, td_error: jax.Array) -> TieredState:
    """Write back new TD errors td_error[B] for the items drawn in `info`; items change tier as needed.

    The thresholds first move towards the batch's importance-weighted |TD| quantiles. Entries
    whose slot no longer holds the drawn item are ignored; duplicates resolve to the last one.
    """
    total = state.capacity
    offsets = jnp.asarray(state.tier_offset, jnp.int32)
    abs_td = jnp.abs(td_error).astype(jnp.float32)
    row = offsets[info.tier] + info.slot
    current = info.valid & (info.uid >= 0) & (state.uid[row] == info.uid)
    winner = last_occurrence(row, current, total)
    inverse_probability = jnp.where(info.valid, 1.0 / jnp.maximum(info.probability, 1e-30), 0.0)
    state = _track(state, abs_td, inverse_probability / jnp.maximum(inverse_probability.max(), 1e-30))
    new_tier = route(state.thresholds, abs_td)
    stay = winner & (new_tier == info.tier)
    move = winner & (new_tier != info.tier)
    kept_td = state.abs_td_error.at[jnp.where(stay, row, total)].set(abs_td, mode="drop")
    state, moved_row = _remove(state.replace(abs_td_error=kept_td), info.tier, info.slot, move)
    movers = (_gather(state.data, moved_row), abs_td, info.uid)
    return _cascade(state, movers, new_tier, move)


def tier_sizes(state: TieredState) -> jax.Array:
    """[3] int32 live items in hot, warm, cold."""
    return state.count


def live(state: TieredState) -> jax.Array:
    """[capacity] bool, which rows hold a live item."""
    return state.uid >= 0
