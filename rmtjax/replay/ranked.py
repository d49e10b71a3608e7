"""Ranked replay: hot, warm and cold tiers as exact |TD| ranks over one FIFO ring.

Layout. One ring of `capacity` items (`cursor`, `size`, as `ring.py`), each with its last |TD|
(`td`). A new item's |TD| is +inf ("fresh"): it ranks above every item that has been drawn and
scored, so it lands in hot at the next refresh, and `add` needs no TD (no forward pass at
insertion). Items leave only by age: a write overwrites the oldest.

Tiers. `refresh` ranks the live items by |TD| with one `lax.top_k` of static width K (the hot
and warm tiers at full capacity, `top_width`): `top[:n_hot]` is the hot tier, the next `n_warm`
are warm (descending |TD|, ties to the lower slot, fresh items first), every other live item is
cold. Tier sizes are max(1, round(f * size)) for hot and warm, capped so that at least one item
is cold (size 1: everything cold; size 2: one hot, one cold). Between refreshes the tiers are
frozen: an item scored since keeps its tier, an item added since is cold, and a slot of the top
set that the ring has overwritten stays in its tier with its new (fresh) item. All top slots stay
live (a ring never shrinks), so the tiers always hold live items. Before the first refresh hot
and warm are empty and every draw is uniform over the live items.

Sampling. The batch is split across tiers by fixed proportions with systematic points
(i + 0.5) / B, so tier t gets floor or ceil of B * p_t rows, the same split every call; an empty
tier's share goes to the others in proportion. Hot and warm draws are uniform (with replacement)
over their tier's slots in `top`. Cold draws are exact and O(batch log K): the refresh keeps the
top slots in ascending order as `cold_skip[j] = j-th smallest top slot - j`; the r-th live slot
outside the top set is `r + #{j: cold_skip[j] <= r}` (live slots are [0, size) before the ring
wraps and all of them after). Item i of tier t has P(i) = p_t / n_t per draw and the importance
weight (N * P(i))^-beta / the batch's max, N = size.

Write-back. `update` scatters the drawn items' new |TD| (non-finite -> 0; rows where `keep` is
False are left as they were). An item drawn twice in one batch gets the same |TD| in both rows (same
parameters, same transition), so which duplicate lands is not resolved (measured: resolving it, a
sort of the batch, cost more than the rest of `update` under vmap over 8 seeds). It does not refresh: the agent
calls `refresh`, or `maybe_refresh(state, due)` with `due` an UNBATCHED bool from its own clock
(e.g. its update counter % refresh_every == 0). Under `jax.vmap` over seeds an unbatched `due`
keeps the `lax.cond` a real branch; a per-buffer (batched) predicate would turn it into a select
that runs the top-k every update. `since_refresh` counts updates since the last refresh, for
diagnostics and for a caller without a clock of its own.

Cost: `add`, `sample` and `update` are O(batch); `refresh` is one top_k over the capacity, a
sort of the K top slots (K ~ 11% of the capacity by default) and O(capacity) elementwise work. Everything is
jit/vmap-able: K and the fractions are static, the rest is arrays in the state.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax.replay.util import POOL, TOP_QUANTILE

HOT, WARM, COLD = 0, 1, 2
_NO_SKIP = jnp.iinfo(jnp.int32).max  # pads cold_skip past the top set


@struct.dataclass
class RankedState:
    data: Any  # pytree of arrays [capacity, ...]
    td: jax.Array  # [C] float32, last |TD| per slot; +inf fresh (never scored), -inf empty
    cursor: jax.Array  # int32, next slot to write
    size: jax.Array  # int32, live slots (<= capacity)
    top: jax.Array  # [K] int32, slots in descending |TD| as of the last refresh
    in_top: jax.Array  # [C] bool, slot in hot or warm at the last refresh
    cold_skip: jax.Array  # [K] int32, ascending top slots minus their rank; _NO_SKIP past n_hot + n_warm
    n_hot: jax.Array  # int32, hot tier size at the last refresh
    n_warm: jax.Array  # int32
    thresholds: jax.Array  # [2] float32, lowest |TD| in hot and in warm at the last refresh (finite)
    since_refresh: jax.Array  # int32, updates since the last refresh
    fractions: tuple[float, float] = struct.field(pytree_node=False)  # hot, warm shares of the items

    @property
    def capacity(self) -> int:
        return self.td.shape[0]


@struct.dataclass
class RankedInfo:
    slot: jax.Array  # [B] int32
    weight: jax.Array  # [B] float32, importance weight, max 1 over the valid rows
    tier: jax.Array  # [B] int32, 0 hot, 1 warm, 2 cold
    td: jax.Array  # [B] float32, stored |TD| when drawn (+inf: fresh)
    valid: jax.Array  # [B] bool, False only on an empty buffer


def check_fractions(fractions) -> tuple[float, float]:
    """(hot, warm) from fractions (hot, warm, cold) or (hot, warm): positive, hot + warm < 1."""
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) not in (2, 3) or any(not f > 0 for f in fractions):
        raise ValueError(f"fractions must be positive (hot, warm, cold) shares, got {fractions}")
    if len(fractions) == 3 and abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"fractions must sum to 1, got {fractions} (sum {sum(fractions):.6g})")
    if not fractions[0] + fractions[1] < 1.0:
        raise ValueError(f"fractions must leave a cold share (hot + warm < 1), got {fractions}")
    return fractions[0], fractions[1]


def top_width(capacity: int, fractions) -> int:
    """K, the static width of the top-k: hot + warm tier sizes at full capacity, plus rounding slack."""
    hot, warm = check_fractions(fractions)
    return min(capacity, max(1, round(hot * capacity)) + max(1, round(warm * capacity)) + 2)


def tier_sizes(size: jax.Array, fractions) -> tuple[jax.Array, jax.Array]:
    """(n_hot, n_warm) for `size` live items: max(1, round(f * size)) each, leaving one item cold."""
    hot, warm = fractions
    size = jnp.asarray(size, jnp.int32)
    s = size.astype(jnp.float32)
    n_hot = jnp.clip(jnp.maximum(1, jnp.floor(hot * s + 0.5).astype(jnp.int32)), 0, jnp.maximum(size - 1, 0))
    n_warm = jnp.clip(jnp.maximum(1, jnp.floor(warm * s + 0.5).astype(jnp.int32)), 0, jnp.maximum(size - 1 - n_hot, 0))
    return n_hot, n_warm


def init(example: Any, capacity: int, fractions=(0.01, 0.1, 0.89)) -> RankedState:
    """An empty buffer for items shaped like `example` (one transition, no batch axis)."""
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    fr = check_fractions(fractions)
    k = top_width(capacity, fr)
    data = jax.tree.map(lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype), example)
    zero = jnp.zeros((), jnp.int32)
    return RankedState(
        data=data,
        td=jnp.full((capacity,), -jnp.inf, jnp.float32),
        cursor=zero,
        size=zero,
        top=jnp.zeros((k,), jnp.int32),
        in_top=jnp.zeros((capacity,), bool),
        cold_skip=jnp.full((k,), _NO_SKIP, jnp.int32),
        n_hot=zero,
        n_warm=zero,
        thresholds=jnp.zeros((2,), jnp.float32),
        since_refresh=zero,
        fractions=fr,
    )


def live(state: RankedState) -> jax.Array:
    """[C] bool, the slots holding an item (the ring fills [0, size) before it wraps)."""
    return jnp.arange(state.capacity) < state.size


def add(state: RankedState, batch: Any) -> RankedState:
    """Write a batch (leading axis B <= capacity) at the cursor, overwriting the oldest; its |TD| is
    +inf (hottest until scored), or 0 for an item holding a non-finite number (a NaN reward or
    observation): such an item is never ranked hot, so it cannot keep poisoning minibatches."""
    capacity = state.capacity
    sizes = {jnp.shape(x)[0] for x in jax.tree.leaves(batch)}
    if len(sizes) != 1:
        raise ValueError(f"every field of the batch needs the same leading axis, got {sorted(sizes)}")
    (b,) = sizes
    if b > capacity:
        raise ValueError(f"a batch of {b} items does not fit a ranked buffer of capacity {capacity}")
    slots = (state.cursor + jnp.arange(b)) % capacity
    data = jax.tree.map(lambda buf, x: buf.at[slots].set(jnp.asarray(x).astype(buf.dtype)), state.data, batch)
    return state.replace(
        data=data,
        td=state.td.at[slots].set(jnp.where(_finite_rows(batch, b), jnp.inf, 0.0)),
        cursor=(state.cursor + b) % capacity,
        size=jnp.minimum(state.size + b, capacity),
    )


def _finite_rows(batch: Any, b: int) -> jax.Array:
    """[B] bool: every floating-point number of the item is finite."""
    ok = jnp.ones((b,), bool)
    for x in jax.tree.leaves(batch):
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.floating):
            ok = ok & jnp.isfinite(x.reshape(b, -1)).all(axis=1)
    return ok


def refresh(state: RankedState) -> RankedState:
    """Re-rank: the tiers become the exact |TD| ranks of the live items now (one top_k, no sort)."""
    c, k = state.capacity, state.top.shape[0]
    is_live = live(state)
    values, top = jax.lax.top_k(jnp.where(is_live, state.td, -jnp.inf), k)
    n_hot, n_warm = tier_sizes(state.size, state.fractions)
    n_top = n_hot + n_warm
    rank = jnp.arange(k)
    in_top = jnp.zeros((c,), bool).at[top].set(rank < n_top)
    # the top slots in ascending order: a sort of K ints (measured cheaper than a cumsum and scatter over C)
    ascending = jnp.sort(jnp.where(rank < n_top, top, c))
    cold_skip = jnp.where(rank < n_top, ascending - rank, _NO_SKIP).astype(jnp.int32)
    # each tier's lowest |TD|; a tier of fresh items only reads the largest finite |TD| (0 if none)
    finite_max = jnp.max(jnp.where(is_live & jnp.isfinite(state.td), state.td, 0.0))
    lowest = values[jnp.clip(jnp.stack([n_hot, n_top]) - 1, 0, k - 1)]
    thresholds = jnp.where(jnp.stack([n_hot, n_warm]) > 0, jnp.minimum(lowest, finite_max), 0.0)
    return state.replace(top=top.astype(jnp.int32), in_top=in_top, cold_skip=cold_skip, n_hot=n_hot,
                         n_warm=n_warm, thresholds=thresholds.astype(jnp.float32),
                         since_refresh=jnp.zeros((), jnp.int32))


def maybe_refresh(state: RankedState, due: jax.Array | bool) -> RankedState:
    """`refresh` where `due`; keep `due` unbatched under vmap so this stays a branch (see module doc)."""
    return jax.lax.cond(due, refresh, lambda s: s, state)


def tier_counts(state: RankedState) -> jax.Array:
    """[3] int32 items per tier now: hot and warm as of the last refresh, cold the rest of the live items."""
    return jnp.stack([state.n_hot, state.n_warm, state.size - state.n_hot - state.n_warm])


def sample(
    state: RankedState, key: jax.Array, batch_size: int, proportions, beta: jax.Array | float
) -> tuple[Any, RankedInfo]:
    """Draw `batch_size` items (with replacement) across hot, warm, cold in `proportions` [3].

    On an empty buffer every row is invalid with weight 0 (and reads slot 0).
    """
    counts = tier_counts(state)
    share = jnp.asarray(proportions, jnp.float32) * (counts > 0)
    share = jnp.where(share.sum() > 0, share / jnp.maximum(share.sum(), 1e-30),
                      counts / jnp.maximum(state.size, 1).astype(jnp.float32))
    u = (jnp.arange(batch_size) + 0.5) / batch_size
    tier = jnp.searchsorted(jnp.cumsum(share), u, side="right").astype(jnp.int32)
    last_with_share = jnp.max(jnp.where(share > 0, jnp.arange(3), 0))  # float rounding near 1
    tier = jnp.minimum(tier, last_with_share)
    n = counts[tier]
    r = jax.random.randint(key, (batch_size,), 0, jnp.maximum(n, 1))
    k = state.top.shape[0]
    top_slot = state.top[jnp.clip(jnp.where(tier == WARM, state.n_hot + r, r), 0, k - 1)]
    cold_slot = r + jnp.searchsorted(state.cold_skip, r, side="right").astype(jnp.int32)
    slot = jnp.where(tier == COLD, cold_slot, top_slot).astype(jnp.int32)
    valid = n > 0
    probability = jnp.where(valid, share[tier] / jnp.maximum(n, 1), 0.0)
    raw = jnp.where(valid, (state.size * probability) ** (-jnp.asarray(beta, jnp.float32)), 0.0)
    weight = raw / jnp.maximum(jnp.max(raw), 1e-30)
    batch = jax.tree.map(lambda buf: buf[slot], state.data)
    return batch, RankedInfo(slot=slot, weight=weight.astype(jnp.float32), tier=tier, td=state.td[slot], valid=valid)


def update(state: RankedState, info: RankedInfo, td_abs: jax.Array, keep: jax.Array | None = None) -> RankedState:
    """Write the drawn items' new |TD| (non-finite -> 0); rows where `keep` is False are untouched.

    No re-ranking here: call `refresh` / `maybe_refresh` on the caller's schedule.
    """
    c = state.capacity
    mask = info.valid if keep is None else info.valid & keep
    value = jnp.abs(jnp.asarray(td_abs, jnp.float32))
    value = jnp.where(jnp.isfinite(value), value, 0.0)
    td = state.td.at[jnp.where(mask, info.slot, c)].set(value, mode="drop")
    return state.replace(td=td, since_refresh=state.since_refresh + 1)


def key_share(state: RankedState, info: RankedInfo, key: jax.Array) -> jax.Array:
    """Share of the batch's scored rows at or above the 90th |TD| percentile of a uniform pool of
    scored items (fresh items, +inf, are left out of both); 0 when nothing is scored yet."""
    pool = jax.random.randint(key, (POOL,), 0, jnp.maximum(state.size, 1))
    pool_td = state.td[pool]
    threshold = jnp.nanquantile(jnp.where(jnp.isfinite(pool_td), pool_td, jnp.nan), TOP_QUANTILE)
    scored = info.valid & jnp.isfinite(info.td)
    hits = (scored & (info.td >= threshold)).sum()
    return hits / jnp.maximum(scored.sum(), 1)


class RankedReplay:
    """Hot/warm/cold tiers as exact |TD| ranks over one FIFO ring, re-ranked on the caller's
    schedule (`maybe_refresh(state, due)` with an unbatched `due`, every `refresh_every` updates)."""

    needs_td = False

    def __init__(self, capacity: int, fractions=(0.01, 0.1, 0.89), proportions=(0.25, 0.35, 0.4),
                 refresh_every: int = 8):
        check_fractions(fractions)
        if not int(refresh_every) >= 1 or int(refresh_every) != refresh_every:
            raise ValueError(f"refresh_every must be a positive integer, got {refresh_every!r}")
        props = tuple(float(p) for p in proportions)
        if len(props) != 3 or any(p < 0 for p in props) or not sum(props) > 0:
            raise ValueError(f"proportions must be three non-negative numbers (hot, warm, cold), got {props}")
        self.capacity, self.fractions, self.refresh_every = capacity, tuple(fractions), int(refresh_every)
        self.proportions = jnp.asarray(props, jnp.float32) / sum(props)

    def init(self, example):
        return init(example, self.capacity, self.fractions)

    def add(self, state, batch, td_abs=None):
        return add(state, batch)

    def sample(self, state, key, batch_size, beta):
        return sample(state, key, batch_size, self.proportions, beta)

    def update(self, state, info, td_abs, keep=None):
        return update(state, info, td_abs, keep)

    def refresh(self, state):
        return refresh(state)

    def refresh_due(self, updates):
        """Whether the update numbered `updates` (counting from 1) should be followed by a refresh."""
        return updates % self.refresh_every == 0

    def maybe_refresh(self, state, due):
        return maybe_refresh(state, due)

    def batch_stats(self, state, info):
        return {"hot_share": (info.tier == HOT).mean(), "warm_share": (info.tier == WARM).mean(),
                "cold_share": (info.tier == COLD).mean()}

    def key_share(self, state, info, key):
        return key_share(state, info, key)

    def buffer_stats(self, state):
        counts = tier_counts(state)
        return {"replay_size": state.size, "hot_size": counts[0], "warm_size": counts[1], "cold_size": counts[2],
                "fresh": (live(state) & (state.td == jnp.inf)).sum(),
                "hot_threshold": state.thresholds[0], "warm_threshold": state.thresholds[1]}
