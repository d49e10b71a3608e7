"""Trace a function once and use the trace twice: for its output shapes and for its value.

`jax.lax.cond` between a computation and "nothing happened" (zeros in the computation's output
shapes) needs those shapes before the cond is built. `jax.eval_shape(fn, ...)` gets them by
tracing `fn` — and the cond then traces `fn` again. For a training step whose trace costs
seconds of Python (flax modules, the replay's bookkeeping), that doubles the time a run spends
before XLA sees the program, and the persistent compilation cache cannot save it.
`trace_once` traces `fn` to a jaxpr once and returns a function that evaluates that jaxpr,
with the output shapes beside it. A leaf module: it imports nothing of rmtjax.
"""

from __future__ import annotations

from typing import Any, Callable

import jax


def trace_once(fn: Callable, *args) -> tuple[Callable, Any]:
    """`(replay, out_shapes)`: `replay(*args)` computes `fn(*args)` from one trace of `fn`
    made here for arguments shaped like `args` (arrays, tracers or `jax.ShapeDtypeStruct`s;
    under `vmap`, the per-example shapes the tracers have); `out_shapes` is its output as
    `jax.ShapeDtypeStruct`s. `fn` must take its inputs as arguments, not close over tracers
    of an enclosing trace (those would be baked into the jaxpr as constants of another trace).
    `replay` accepts arguments of the same tree structure, shapes and dtypes only."""
    # make_jaxpr reads only the abstract values of `args` (tracers keep their weak types and,
    # under shard_map, which mesh axes they vary over)
    closed, out_shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    in_tree = jax.tree.structure(args)
    out_tree = jax.tree.structure(out_shapes)

    def replay(*call_args):
        flat, tree = jax.tree.flatten(call_args)
        if tree != in_tree:
            raise TypeError(f"trace_once: called with {tree}, traced for {in_tree}")
        return jax.tree.unflatten(out_tree, jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *flat))

    return replay, out_shapes


def zeros(shapes: Any) -> Any:
    """Zeros shaped like a tree of `jax.ShapeDtypeStruct`s."""
    return jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), shapes)
