"""The hierarchical replay's prefetching sampler: minibatches drawn over the whole capacity on the
host, staged on the device for the chunk that uses them (`agent.hier_sampling: prefetch`).

`rmtjax.replay.hierarchical` in its first form (`hier_sampling: cache`) samples from what the
device holds: a tiered buffer of `device_fraction` of the capacity whose cold tier is refreshed
from the lower levels. Its hot and warm tiers are then `device_fraction` of the all-device
buffer's, so each of their items is drawn that many times more often; and between refreshes
the cold draws reuse the same resident sample. This module draws instead from the distribution
of the all-device tiered buffer over the *whole* capacity, and uses device memory only for the
draws themselves:

- **Device** (`PrefetchReplay`, inside the compiled loop): the *staging area* holds the
  `stage` draws (items, their ids, tiers, |TD| and draw probabilities) the host made for this
  chunk, in the order the updates consume them; `sample` reads the next `batch_size` of them
  (a cursor), `update` logs the new |TD| of each draw. New transitions go to the outbox, as in
  the cache form. The staging area and the outbox are all the replay keeps on the device.
- **Host** (`PrefetchLevels`, between chunks): moves the outbox down into host RAM and disk
  (`Levels`: the newest `capacity` items, each once), writes the logged |TD| back to the items
  (the last draw of an item wins), ranks every held item by |TD| into hot / warm / cold tiers
  with the shares of `tier_fractions`, and draws the next chunk's minibatches as the tiered
  buffer would: per minibatch, `batch_size * tier_proportions` draws per tier (systematic, so
  floor or ceil), uniform over the tier's items with replacement. Each draw carries its
  probability P(i) = share_t / n_t, from which the device takes the importance weight
  (N P(i))^-beta, N the number of items held, as the tiered buffer does.

What differs from the all-device tiered buffer: tiers are exact |TD| ranks at each sync rather
than the tiered buffer's moving quantile thresholds and age rings; the draws of a chunk are made
at its start, so an item's new |TD| changes how often it is drawn from the next chunk on; and a
transition added during a chunk can be drawn from the next chunk on (the all-device buffer can
draw it at once). With short chunks (`sync_every` a few iterations) these are small; the
staging area holds `sync_every × updates per iteration × batch_size` draws, so short chunks also
keep it small.

The hit rate is the share of the chunk's draws served from the staging area: 1 unless a chunk
drew more than was staged (it then wraps around: `prefetch_overrun`) or drew before anything
was staged (the first chunks, while the lower levels hold fewer than `max(warmup, batch_size)`
items: those draws are uniform over the chunk's own new transitions, `prefetch_fallback`).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rmtjax.replay import tiered
from rmtjax.replay.hierarchical import FRESH_TD, UID_MASK, Levels
from rmtjax.replay.util import POOL, last_occurrence, top_share

NO_TIER = -1  # a draw from the outbox (nothing staged yet): no tier


@struct.dataclass
class PrefetchState:
    staged: Any  # pytree [D, ...]: the items of the chunk's draws, in the order they are used
    staged_uid: jax.Array  # [D] int32, the drawn item's id
    staged_prob: jax.Array  # [D] float32, P(i) of the draw under the whole-capacity sampler
    staged_tier: jax.Array  # [D] int32, the tier the item was drawn from
    staged_td: jax.Array  # [D] float32, the item's |TD| when it was drawn
    staged_count: jax.Array  # int32, draws staged (0 before the first staging)
    written: jax.Array  # [D] bool, whether draw d got a new |TD| this chunk
    written_td: jax.Array  # [D] float32, that |TD|
    cursor: jax.Array  # int32, draws used this chunk
    items_total: jax.Array  # int32, N: items held over all levels at the staging
    tier_sizes: jax.Array  # [3] int32, items per tier at the staging
    thresholds: jax.Array  # [2] float32, the smallest |TD| in hot and in warm at the staging
    pool_td: jax.Array  # [POOL] float32, |TD| of a uniform draw of the items held (top-TD diagnostic)
    outbox: Any  # {"item": pytree [O, ...], "td": [O], "uid": [O]}: items added since the last sync
    outbox_count: jax.Array  # int32
    outbox_lost: jax.Array  # int32, items that found the outbox full
    next_uid: jax.Array  # int32, the id of the next item added
    draws: jax.Array  # int32, draws this chunk
    overrun: jax.Array  # int32, draws this chunk past the staged ones (wrapped around)
    fallback: jax.Array  # int32, draws this chunk from the outbox (nothing staged)


@struct.dataclass
class PrefetchDraw:
    row: jax.Array  # [B] int32: staging row, or outbox row for a fallback draw
    from_outbox: jax.Array  # bool scalar: the whole minibatch came from the outbox
    tier: jax.Array  # [B] int32 (NO_TIER for outbox draws)
    weight: jax.Array  # [B] float32, importance weight, max 1 over the valid entries
    valid: jax.Array  # [B] bool
    abs_td_error: jax.Array  # [B] float32, stored |TD| when drawn


class PrefetchReplay:
    """The device side: the staging area of `stage` draws and an outbox of `outbox` items."""

    needs_td = True

    def __init__(self, stage: int, outbox: int):
        self.stage, self.outbox_size = stage, outbox

    def init(self, example):
        def rows(n):
            return jax.tree.map(lambda x: jnp.zeros((n,) + jnp.shape(x), jnp.asarray(x).dtype), example)

        d, i32, f32 = self.stage, jnp.int32, jnp.float32
        zero = jnp.zeros((), i32)
        return PrefetchState(
            staged=rows(d), staged_uid=jnp.full((d,), -1, i32), staged_prob=jnp.zeros((d,), f32),
            staged_tier=jnp.full((d,), NO_TIER, i32), staged_td=jnp.zeros((d,), f32), staged_count=zero,
            written=jnp.zeros((d,), bool), written_td=jnp.zeros((d,), f32), cursor=zero, items_total=zero,
            tier_sizes=jnp.zeros((3,), i32), thresholds=jnp.zeros((2,), f32), pool_td=jnp.zeros((POOL,), f32),
            outbox={"item": rows(self.outbox_size), "td": jnp.zeros((self.outbox_size,), f32),
                    "uid": jnp.full((self.outbox_size,), -1, i32)},
            outbox_count=zero, outbox_lost=zero, next_uid=zero, draws=zero, overrun=zero, fallback=zero)

    def add(self, state, batch, td_abs=None):
        b = jax.tree.leaves(batch)[0].shape[0]
        if td_abs is None:  # a new item ranks hottest until it is first learned from (no forward pass)
            td_abs = jnp.full((b,), FRESH_TD, jnp.float32)
        uid = (state.next_uid + jnp.arange(b, dtype=jnp.int32)) & UID_MASK
        rows = state.outbox_count + jnp.arange(b, dtype=jnp.int32)
        lost = (rows >= self.outbox_size).sum(dtype=jnp.int32)
        values = {"item": batch, "td": jnp.abs(td_abs).astype(jnp.float32), "uid": uid}
        outbox = jax.tree.map(lambda buf, v: buf.at[rows].set(jnp.asarray(v).astype(buf.dtype), mode="drop"),
                              state.outbox, values)
        return state.replace(outbox=outbox, outbox_count=jnp.minimum(state.outbox_count + b, self.outbox_size),
                             outbox_lost=state.outbox_lost + lost, next_uid=(state.next_uid + b) & UID_MASK)

    def sample(self, state, key, batch_size, beta):
        staged = state.staged_count > 0
        # the staged draws in order (wrapping round if a chunk uses more than were staged)
        position = state.cursor + jnp.arange(batch_size, dtype=jnp.int32)
        s_row = position % jnp.maximum(state.staged_count, 1)
        # before anything is staged: uniform over this chunk's new transitions
        o_n = state.outbox_count
        o_row = jax.random.randint(key, (batch_size,), 0, jnp.maximum(o_n, 1))
        row = jnp.where(staged, s_row, o_row)
        valid = jnp.where(staged, state.staged_uid[s_row] >= 0, jnp.broadcast_to(o_n > 0, (batch_size,)))
        prob = jnp.where(staged, state.staged_prob[s_row], 1.0 / jnp.maximum(o_n, 1).astype(jnp.float32))
        n = jnp.where(staged, state.items_total, o_n).astype(jnp.float32)
        raw = jnp.where(valid, (n * prob) ** (-jnp.asarray(beta, jnp.float32)), 0.0)
        weight = raw / jnp.maximum(raw.max(), 1e-30)
        items = jax.tree.map(lambda s, o: jnp.where(staged, s[s_row], o[o_row]), state.staged, state.outbox["item"])
        info = PrefetchDraw(row=row, from_outbox=~staged, tier=jnp.where(staged, state.staged_tier[s_row], NO_TIER),
                            weight=weight.astype(jnp.float32), valid=valid,
                            abs_td_error=jnp.where(staged, state.staged_td[s_row], state.outbox["td"][o_row]))
        return items, info

    def update(self, state, info, td_abs, keep=None):
        b = td_abs.shape[0]
        ok = info.valid if keep is None else info.valid & keep
        td_abs = jnp.abs(td_abs).astype(jnp.float32)
        staged = ~info.from_outbox
        s_at = jnp.where(ok & staged, info.row, self.stage)  # past the end: not written
        o_at = jnp.where(ok & ~staged, info.row, self.outbox_size)
        # a minibatch's staged rows are distinct (b <= staged_count); outbox rows may repeat: the last wins
        o_at = jnp.where(last_occurrence(o_at, o_at < self.outbox_size, self.outbox_size), o_at, self.outbox_size)
        past = jnp.maximum(state.cursor + b - jnp.maximum(state.staged_count, 0), 0)
        return state.replace(
            written=state.written.at[s_at].set(True, mode="drop"),
            written_td=state.written_td.at[s_at].set(td_abs, mode="drop"),
            outbox={**state.outbox, "td": state.outbox["td"].at[o_at].set(td_abs, mode="drop")},
            cursor=state.cursor + jnp.where(staged, b, 0),
            draws=state.draws + b,
            overrun=state.overrun + jnp.where(staged, jnp.minimum(past, b), 0),
            fallback=state.fallback + jnp.where(staged, 0, b))

    def batch_stats(self, state, info):
        return {"hot_share": (info.tier == tiered.HOT).mean(), "warm_share": (info.tier == tiered.WARM).mean(),
                "cold_share": (info.tier == tiered.COLD).mean()}

    def key_share(self, state, info, key):
        return top_share(state.pool_td, info.abs_td_error)

    def buffer_stats(self, state):
        return {"replay_size": state.items_total, "hot_size": state.tier_sizes[0], "warm_size": state.tier_sizes[1],
                "cold_size": state.tier_sizes[2], "hot_threshold": state.thresholds[0],
                "warm_threshold": state.thresholds[1], "outbox_lost": state.outbox_lost}


def tier_counts(n: int, fractions) -> tuple[int, int, int]:
    """Items per tier when n items are ranked by |TD|: hot and warm round(fraction * n), cold the rest."""
    hot = int(round(fractions[0] * n))
    warm = min(int(round(fractions[1] * n)), n - hot)
    return hot, warm, n - hot - warm


def rank_tiers(td: np.ndarray, caps) -> list[np.ndarray]:
    """Positions of the caps[0] items with the highest |TD| (hot), the next caps[1] (warm) and
    the rest (cold); O(n) (a partition, not a sort: the order within a tier is arbitrary)."""
    n, cut = td.shape[0], (caps[0], caps[0] + caps[1])
    kth = [k for k in cut if 0 < k < n]
    order = np.argpartition(-td, kth) if kth else np.arange(n)
    return [order[:cut[0]], order[cut[0]:cut[1]], order[cut[1]:]]


def draw_tiers(rng: np.random.Generator, minibatches: int, batch_size: int, share: np.ndarray) -> np.ndarray:
    """[minibatches, batch_size] tier of each draw: per minibatch, systematic sampling on `share`
    (each tier floor or ceil of batch_size * share draws), as `tiered.sample` splits a minibatch."""
    u = (np.arange(batch_size)[None, :] + rng.random((minibatches, 1))) / batch_size
    tier = np.searchsorted(np.cumsum(share), u, side="right")
    last_with_share = int(np.max(np.flatnonzero(share > 0)))
    return np.minimum(tier, last_with_share)


class PrefetchLevels(Levels):
    """The host and disk levels (`Levels`) with the prefetching sync of this module's docstring."""

    def __init__(self, *, seeds: int, host_capacity: int, disk_capacity: int, stage: int, batch_size: int,
                 fractions, proportions, warmup: int, disk_dir=None, seed: int = 0, max_iterations: int | None = None):
        super().__init__(seeds=seeds, host_capacity=host_capacity, disk_capacity=disk_capacity, cold_rows=(0, 0),
                         refresh_share=0.0, warmup=warmup, priority="1", disk_dir=disk_dir, seed=seed,
                         max_iterations=max_iterations)
        if stage % batch_size:
            raise ValueError(f"the staging area's {stage} draws are not whole minibatches of {batch_size}")
        self.stage, self.batch_size = stage, batch_size
        self.fractions = tuple(float(f) for f in fractions)
        self.proportions = np.asarray(proportions, np.float64)

    def _write_back(self, s: int, q: np.ndarray, in_host: np.ndarray, in_disk: np.ndarray, td: np.ndarray) -> None:
        """Seed s's logged |TD| (draws in order; their sequence numbers q and levels from
        `_seq_of_uid` / `_level_of`) onto the items still held; the last draw of an item wins."""
        last = np.unique(q[::-1], return_index=True)[1]  # the last occurrence of each sequence number
        keep = np.zeros(q.size, bool)
        keep[q.size - 1 - last] = True
        host, disk = keep & in_host, keep & in_disk
        self.host_td[s, q[host] % self.host_capacity] = td[host]
        if self.disk_capacity:
            self.disk_td[s, q[disk] % self.disk_capacity] = td[disk]

    def after_chunk(self, state):
        t0 = time.perf_counter()
        replay: PrefetchState = state.replay
        got = jax.device_get({"items": replay.outbox["item"], "td": replay.outbox["td"],
                              "count": replay.outbox_count, "lost": replay.outbox_lost,
                              "uid": replay.staged_uid, "written": replay.written, "written_td": replay.written_td,
                              "draws": replay.draws, "overrun": replay.overrun, "fallback": replay.fallback})
        if self.fields is None:
            self._allocate(got["items"])
        if np.any(got["lost"] > 0):
            raise RuntimeError(f"replay outbox overflowed ({got['lost'].tolist()} items lost per seed): the driver "
                               f"must sync at least every agent.sync_every iterations")
        S, D, B = self.seeds, self.stage, self.batch_size
        leaves = jax.tree.leaves(got["items"])
        down, dropped = np.zeros(S, np.int64), np.zeros(S, np.int64)
        for s in range(S):
            k = int(got["count"][s])
            dropped[s] = self._append(s, [x[s, :k] for x in leaves], got["td"][s, :k])
            down[s] = k
        q = self._seq_of_uid(got["uid"])
        in_host, in_disk = self._level_of(q)
        for s in range(S):
            w = got["written"][s]
            self._write_back(s, q[s][w], in_host[s][w], in_disk[s][w], got["written_td"][s][w])

        host_n, disk_n = self.sizes()
        staged = [np.zeros((S, D) + shape, dtype) for shape, dtype in self.fields]
        uid = np.full((S, D), -1, np.int32)
        prob = np.zeros((S, D), np.float32)
        tier_of = np.full((S, D), NO_TIER, np.int32)
        td_of = np.zeros((S, D), np.float32)
        count = np.zeros(S, np.int32)
        total = np.zeros(S, np.int32)
        sizes = np.zeros((S, 3), np.int32)
        thresholds = np.zeros((S, 2), np.float32)
        pool = np.zeros((S, POOL), np.float32)
        for s in range(S):
            n = int(host_n[s] + disk_n[s])
            if n < max(self.warmup, B, 1):
                continue
            rng = np.random.default_rng([self.seed, s, self.syncs])
            td = np.concatenate([self.host_td[s, :host_n[s]], self.disk_td[s, :disk_n[s]]])
            caps = tier_counts(n, self.fractions)
            members = rank_tiers(td, caps)
            share = self.proportions * (np.asarray(caps) > 0)
            share = share / share.sum() if share.sum() > 0 else np.asarray(caps, np.float64) / n
            tiers = draw_tiers(rng, D // B, B, share).reshape(-1)
            index = np.empty(D, np.int64)
            for t in range(3):
                at = np.flatnonzero(tiers == t)
                if at.size:
                    index[at] = members[t][rng.integers(0, caps[t], at.size)]
            for buf, part in zip(staged, self._gather(s, index, int(host_n[s]))):
                buf[s] = part
            seq = np.where(index < host_n[s], self._host_seq(s, np.minimum(index, max(host_n[s] - 1, 0))),
                           self._disk_seq(s, np.maximum(index - host_n[s], 0)))
            uid[s] = (seq & UID_MASK).astype(np.int32)
            prob[s] = (share[tiers] / np.asarray(caps, np.float64)[tiers]).astype(np.float32)
            tier_of[s], td_of[s] = tiers, td[index]
            count[s], total[s], sizes[s] = D, n, caps
            thresholds[s] = [td[members[t]].min() if caps[t] else np.inf for t in (0, 1)]
            pool[s] = td[rng.integers(0, n, POOL)]
        new = replay.replace(
            staged=jax.tree.unflatten(self.treedef, staged), staged_uid=uid, staged_prob=prob, staged_tier=tier_of,
            staged_td=td_of, staged_count=count, written=np.zeros((S, D), bool), written_td=np.zeros((S, D), np.float32),
            cursor=np.zeros(S, np.int32), items_total=total, tier_sizes=sizes, thresholds=thresholds, pool_td=pool,
            outbox_count=np.zeros(S, np.int32), draws=np.zeros(S, np.int32), overrun=np.zeros(S, np.int32),
            fallback=np.zeros(S, np.int32))
        new = jax.device_put(new)
        self.syncs += 1
        self._clock(t0)
        draws = got["draws"].astype(np.int64)
        misses = got["overrun"].astype(np.int64) + got["fallback"]
        hit = np.where(draws > 0, 1.0 - misses / np.maximum(draws, 1), 1.0)
        metrics = {
            "replay_hit_rate": hit.astype(np.float32),
            "replay_items_down": down, "replay_items_up": count.astype(np.int64),
            "replay_bytes_moved": (down + count) * self.item_bytes,
            "replay_device_items": count.astype(np.int64),
            "replay_host_items": host_n, "replay_disk_items": disk_n, "replay_dropped": dropped,
            "prefetch_overrun": got["overrun"].astype(np.int64), "prefetch_fallback": got["fallback"].astype(np.int64),
        }
        return state.replace(replay=new), metrics
