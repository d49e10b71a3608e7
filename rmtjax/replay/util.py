"""Batch helpers shared by the replay buffers."""

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
