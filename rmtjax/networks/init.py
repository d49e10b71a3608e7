"""Orthogonal initialisation without LAPACK.

`orthogonal(scale, column_axis)` is a drop-in for `flax.linen.initializers.orthogonal` (which is
`jax.nn.initializers.orthogonal`): it draws the same Gaussian matrix JAX draws and
orthonormalises it with classical Gram–Schmidt applied twice (CGS2) in a `lax.fori_loop`, which
gives the Q of the QR factorisation with a positive diagonal of R — JAX's own sign convention —
so for the same key it returns JAX's matrix up to float rounding, and the same (Haar)
distribution.

Why: JAX's initialiser runs a LAPACK QR. Under `vmap` over seeds that is a *batched* QR, and
jaxlib 0.10.0 to 0.11.x splits batched LAPACK calls with `ParallelBatchMap`, which schedules the
chunks on XLA:CPU's intra-op thread pool and then blocks the pool thread it runs on until they
finish. A network init has several independent layers, so several batched QRs can run at once;
when they occupy every pool thread (2 on a 2-core machine), nobody is left to run the chunks and
the process hangs at 0% CPU. Gram–Schmidt is plain matmuls and reductions: under `vmap` it
becomes batched dots, never a custom call. (Upstream turned the LAPACK batch splitting off for
open-source builds after 0.11.0; `benchmarks/investigations/jax_cpu_deadlock.py` reproduces the hang.)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _orthonormal_columns(a: jax.Array) -> jax.Array:
    """The Q factor (positive diagonal of R) of a tall or square `a` [m, n], m >= n."""
    m, n = a.shape
    # rows of `qt` are the q vectors found so far; the rest are zero, so `qt @ v` needs no mask
    at = a.T

    def body(j, qt):
        v = at[j]
        v = v - (qt @ v) @ qt
        v = v - (qt @ v) @ qt  # the second pass keeps Qᵀ Q = I to working precision
        v = v * lax.rsqrt(jnp.maximum(jnp.sum(v * v), jnp.finfo(v.dtype).tiny))
        return lax.dynamic_update_index_in_dim(qt, v, j, axis=0)

    return lax.fori_loop(0, n, body, jnp.zeros((n, m), a.dtype)).T


def random_orthogonal(key, n: int, m: int, dtype=jnp.float32) -> jax.Array:
    """An [n, m] matrix with orthonormal rows or columns (whichever are fewer), Haar-distributed."""
    z = jax.random.normal(key, (max(n, m), min(n, m)), dtype)
    work = jnp.promote_types(dtype, jnp.float32)  # orthonormalise in at least float32
    q = _orthonormal_columns(z.astype(work)).astype(dtype)
    return q.T if n < m else q


def orthogonal(scale=1.0, column_axis: int = -1, dtype=None):
    """An initializer with the signature and result of `flax.linen.initializers.orthogonal`."""

    def init(key, shape, dtype=dtype):
        dtype = jnp.float32 if dtype is None else dtype
        if len(shape) < 2:
            raise ValueError("orthogonal initializer requires at least a 2D shape")
        if any(d == 0 for d in shape):
            return jnp.zeros(shape, dtype)
        n_rows, n_cols = math.prod(shape) // shape[column_axis], shape[column_axis]
        q = random_orthogonal(key, n_rows, n_cols, dtype)
        q = jnp.reshape(q, tuple(np.delete(shape, column_axis)) + (shape[column_axis],))
        return jnp.array(scale, dtype) * jnp.moveaxis(q, -1, column_axis)

    return init
