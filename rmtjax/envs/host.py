"""Calling a stateful host (Python) environment from inside the compiled program.

`batched_host_call(callback, result_shapes)` turns a host function that works on a batch of
environments into a JAX function that can sit inside `jit`, `lax.scan`, `lax.cond` and
`vmap`, making **one** host call per use however many `vmap`s surround it.

Why `io_callback` and not `pure_callback`: a host environment is stateful, and stepping it is
a side effect. `pure_callback` promises JAX the opposite (no side effects), which licenses the
compiler to drop a call whose result looks unused, to merge two calls with equal arguments,
or to run one more than once; any of these would silently desynchronise the host env from
the program. `io_callback` declares the effect, so a traced call runs exactly once per
execution. Its own `vmap` rule, however, turns a call into a sequential `lax.map`: one
host call per seed. `jax.custom_batching.custom_vmap` replaces that rule: under `vmap` the
batch axes are folded into the environment axis and the same callback runs once on the
whole `[seeds × envs]` batch.

Order is carried by data, not by effects: every call takes and returns a token (a
generation and a step counter, one per environment) that the environment state threads from
step to step, so XLA cannot reorder two steps, and the host checks the token, so stepping a
stale state (re-stepping an old state, replaying, or a duplicated call) raises at once
instead of diverging silently. The token also covers the one thing `custom_vmap` gives up:
a step whose outputs nobody reads may be dropped; its token never advances either, so the
program's view and the host's stay the same.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jax.experimental import io_callback


def batched_host_call(callback: Callable, result_shapes: Callable[[int], Sequence[jax.ShapeDtypeStruct]]):
    """A JAX function `f(*args) -> tuple` that calls `callback(*numpy_args)` on the host.

    Every argument has a leading environment axis of the same size `M`; `result_shapes(M)`
    gives the outputs (each with leading axis `M`). Under `vmap` (any depth), the vmapped axes
    are folded into `M` (row-major: batch index outer, environment index inner) and the
    callback runs once on the merged batch; outputs are unfolded again.
    """

    def call(*args):
        m = args[0].shape[0]
        shapes = tuple(result_shapes(m))
        return tuple(io_callback(lambda *a: tuple(callback(*a)), shapes, *args, ordered=False))

    fn = custom_vmap(call)

    @fn.def_vmap
    def _fold(axis_size, in_batched, *args):
        full = [a if b else jnp.broadcast_to(a, (axis_size,) + a.shape) for a, b in zip(args, in_batched)]
        merged = [a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:]) for a in full]
        out = fn(*merged)
        unfolded = tuple(o.reshape((axis_size, o.shape[0] // axis_size) + o.shape[1:]) for o in out)
        return unfolded, tuple(True for _ in unfolded)

    return fn

