"""Diagnostics shared by the replay buffers.

`top_share_of` measures how strongly a sampled batch leans towards the largest TD errors held in
the buffer: for uniform sampling it is about `1 - q`, for prioritised sampling larger. It sorts
the whole buffer (O(capacity log capacity)), so call it once per iteration for metrics, not
inside the learning loop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def top_share_of(
    td_all: jax.Array,
    valid_all: jax.Array,
    td_sampled: jax.Array,
    valid_sampled: jax.Array | None = None,
    q: float | jax.Array = 0.9,
) -> jax.Array:
    """Fraction of the sampled items whose |TD| is in the top `1 - q` of the buffer's |TD|.

    td_all, valid_all: [capacity] TD errors of every slot and which slots hold a live item.
    td_sampled, valid_sampled: [B] TD errors of a sampled batch and which entries count.
    The top set is the k = round((1 - q) * N) largest of the N live |TD| (at least one); an
    item ties into it when its |TD| equals the k-th largest. Returns 0 for an empty buffer or
    batch.
    """
    if valid_sampled is None:
        valid_sampled = jnp.ones(td_sampled.shape, bool)
    live_abs = jnp.where(valid_all, jnp.abs(td_all).astype(jnp.float32), -jnp.inf)
    n = valid_all.sum()
    # round() rather than ceil(): (1 - 0.9) * 100 is 10.000002 in float32
    k = jnp.clip(jnp.round((1.0 - q) * n).astype(jnp.int32), 1, jnp.maximum(n, 1))
    descending = -jnp.sort(-live_abs)
    cutoff = descending[k - 1]
    in_top = (jnp.abs(td_sampled).astype(jnp.float32) >= cutoff) & valid_sampled
    counted = valid_sampled.sum()
    share = in_top.sum() / jnp.maximum(counted, 1)
    return jnp.where((n > 0) & (counted > 0), share, 0.0).astype(jnp.float32)
