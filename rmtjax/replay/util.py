"""Helpers shared by the replay buffers: deterministic batched writes, the top-TD-share diagnostic."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def last_occurrence(key: jax.Array, mask: jax.Array, sentinel: int) -> jax.Array:
    """[B] bool: entry b is masked in and no later masked-in entry has the same key.

    Makes a scatter with duplicate indices deterministic (the last write wins, as if the batch
    were written one entry at a time). `sentinel` must exceed every key; O(B log B).
    """
    b = key.shape[0]
    key = jnp.where(mask, key, sentinel + jnp.arange(b))  # masked-out entries never collide
    order = jnp.argsort(key, stable=True)  # equal keys stay in batch order
    sorted_key = key[order]
    last_in_run = jnp.concatenate([sorted_key[1:] != sorted_key[:-1], jnp.ones((1,), bool)])
    return jnp.zeros((b,), bool).at[order].set(last_in_run) & mask


TOP_QUANTILE = 0.9  # "key samples": the top 10% of |TD error| in the buffer
POOL = 1024  # buffer items drawn to estimate that quantile, so the diagnostic costs O(pool)


def top_share(td_pool: jax.Array, td_batch: jax.Array) -> jax.Array:
    """Share of a sampled batch whose |TD| is at or above the buffer's 90th percentile, the
    percentile estimated from `td_pool`, a uniform draw of the buffer's items."""
    threshold = jnp.quantile(td_pool, TOP_QUANTILE)
    return (td_batch >= threshold).mean()


def write_td(state, slot: jax.Array, td_abs: jax.Array, keep: jax.Array | None = None):
    """A buffer whose items carry their last |TD| as `data["td"]` (ring, sum-tree), with it set at
    `slot` (only where `keep`, when given)."""
    if keep is not None:
        slot = jnp.where(keep, slot, state.data["td"].shape[0])  # past the end: dropped
    return state.replace(data={**state.data, "td": state.data["td"].at[slot].set(td_abs, mode="drop")})
