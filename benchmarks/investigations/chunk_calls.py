"""What a call of the compiled chunk costs beside the iterations it steps: the driver's chunk (a
`while_loop` over the iterations asked for) beside the one it replaced (a `lax.scan` over the
whole chunk, each surplus iteration skipped by a `cond`), in one process.

    python -m benchmarks chunk_calls [--algo dqn] [--env CartPole-v1] [--iters 100000]
                                     [--steps 0 1 1000] [--reps 5] [--name chunk_calls]

Both chunks are compiled for `--iters` iterations from the same fresh state (the persistent
cache off; `--rounds` times each, alternating which goes first, the fastest kept), then called stepping each of `--steps` iterations from iteration 0 (`--reps` calls
each, the fastest kept; a call's time includes fetching its metrics, as the driver's pieces do).
Compile seconds drift on this machine by 10-25% between rounds; the optimised program's line
count is a size that does not drift.
The last column says whether the two give the same state, bit for bit, after the longest call.
The last chunk of a run, each piece of the progress bar and each piece of a wall-clock budget
is such a shorter call.
"""

from __future__ import annotations

import time

import jax
import numpy as np

import rmtjax
from benchmarks.lib.tables import write_table
from rmtjax import cache
from rmtjax.driver import PackedMetrics, Program, _masked_chunk, _MetricPack, seed_keys
from rmtjax.tracing import trace_once, zeros


def scan_chunk(vstep, max_length: int):
    """The chunk as it was before the while loop: a scan of `max_length` iterations, each past
    `length` a `cond` that skips the step."""

    def run(state, start, length):
        step_once, (_, probe) = trace_once(vstep, state, jax.numpy.int32(0))
        pack = _MetricPack(probe)
        zero_metrics = pack.pack(zeros(probe))

        def body(s, i):
            return jax.lax.cond(i < length, lambda s_: (lambda r: (r[0], pack.pack(r[1])))(step_once(s_, start + i)),
                                lambda s_: (s_, zero_metrics), s)

        state, packed = jax.lax.scan(body, state, jax.numpy.arange(max_length, dtype=jax.numpy.int32))
        return state, PackedMetrics(packed, pack.groups)

    return run


def _time_call(chunk, state, steps: int, reps: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(reps):
        fresh = jax.tree.map(lambda x: x.copy(), state)  # the chunk donates its state
        t = time.perf_counter()
        out, metrics = chunk(fresh, np.int32(0), np.int32(steps))
        jax.device_get(metrics)
        best = min(best, time.perf_counter() - t)
    return best, out


def add_arguments(ap) -> None:
    ap.add_argument("--algo", default="dqn")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--iters", type=int, default=100_000, help="iterations the chunk is compiled for")
    ap.add_argument("--steps", type=int, nargs="+", default=[0, 1, 1000], help="iterations a call steps")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="compiles of each chunk (alternating), the fastest kept")
    ap.add_argument("--name", default="chunk_calls")


def run(args):
    cache.enable(disable=True)
    cfg = rmtjax.make_config(args.algo, args.env, {"train.num_seeds": args.seeds, "train.progress": False})
    program = Program(cfg)
    state = program.initial_state(seed_keys(jax.random.key(0), args.seeds))
    variants = {"while_loop (now)": _masked_chunk, "scan + cond (before)": scan_chunk}
    compiled, seconds, finals, rows = {}, {}, {}, []
    for r in range(args.rounds):  # this machine's compile times drift over minutes: alternate, keep the fastest
        for label in list(variants)[::1 if r % 2 == 0 else -1]:
            t = time.perf_counter()
            fn = variants[label](program.step, args.iters)  # a new function: nothing served from memory
            compiled[label] = jax.jit(fn, donate_argnums=0).lower(
                state, np.int32(0), np.int32(args.iters)).compile()
            seconds[label] = min(seconds.get(label, float("inf")), time.perf_counter() - t)
    for label in variants:
        cells = []
        for steps in args.steps:
            s, finals[label] = _time_call(compiled[label], state, steps, args.reps)
            cells.append(f"{s * 1e3:.1f}")
        rows.append([label, f"{seconds[label]:.2f}", f"{len(compiled[label].as_text().splitlines()):,}", *cells])

    def host(x):  # a key's bits for a key array
        return np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)

    a, b = (jax.tree.leaves(f) for f in finals.values())
    same = all(np.array_equal(host(x), host(y)) for x, y in zip(a, b))
    for r in rows:
        r.append("yes" if same else "NO")
    print("\n".join(" | ".join(r) for r in rows), flush=True)
    write_table("chunk_calls", args.name,
                f"A chunk call's cost beside its iterations ({args.algo}, {args.env}, {args.seeds} seeds, "
                f"a chunk of {args.iters:,} iterations)",
                ["chunk", "compile s", "HLO lines", *[f"call stepping {n:,} (ms)" for n in args.steps],
                 f"same state after {max(args.steps):,}"], rows, notes=__doc__.split("\n\n", 2)[2])
