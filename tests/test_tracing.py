"""rmtjax.tracing.trace_once: one trace, the same values as calling the function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmtjax.tracing import trace_once, zeros


def test_a_cond_built_with_trace_once_traces_its_branch_once_and_computes_the_same():
    calls = []

    def fn(x, t):
        calls.append(1)
        return x * t + jnp.sin(x), {"sum": (x * t).sum(), "count": t.astype(jnp.int32)}

    def with_trace_once(x, t, go):
        once, (_, shapes) = trace_once(fn, x, t)
        return jax.lax.cond(go, lambda a: once(*a), lambda a: (a[0], zeros(shapes)), (x, t))

    x, t = jnp.arange(6.0).reshape(2, 3), jnp.float32(1.5)
    calls.clear()
    got = jax.jit(jax.vmap(with_trace_once, in_axes=(0, None, None)))(x, t, True)
    assert len(calls) == 1  # eval_shape + cond would trace it twice
    want = jax.vmap(fn, in_axes=(0, None))(x, t)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    skipped = jax.jit(jax.vmap(with_trace_once, in_axes=(0, None, None)))(x, t, False)
    np.testing.assert_array_equal(np.asarray(skipped[0]), np.asarray(x))
    assert skipped[1]["count"].dtype == jnp.int32 and not np.asarray(skipped[1]["sum"]).any()


def test_trace_once_keeps_weak_types_and_refuses_another_structure():
    def fn(x, s):
        return x + s  # a weakly typed python scalar must not promote a bfloat16 x to float32

    x = jnp.ones((3,), jnp.bfloat16)
    once, out = trace_once(fn, x, 2.0)
    assert out.dtype == jnp.bfloat16 and once(x, 2.0).dtype == jnp.bfloat16
    with pytest.raises(TypeError, match="traced for"):
        once(x, (2.0, 3.0))
