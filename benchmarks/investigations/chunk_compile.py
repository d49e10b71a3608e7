"""A run's chunk compiled with XLA's default options and at lower LLVM optimisation levels (the
driver's `CPU_CHUNK_COMPILER_OPTIONS` among them): compile seconds, run seconds, and how far the
states lie apart after the same iterations, for each agent on its preset, in one process.

    python -m benchmarks chunk_compile [--agents rmt:CartPole-v1:70:300 ...] [--seeds 8] [--rounds 2]
                                       [--reps 4] [--name chunk_compile]

An agent is `algo:env:warm:timed`. Its program is initialised as the driver does and its chunk
compiled each way (the persistent cache off; `--rounds` times, each round in another order, the
fastest kept); each way's chunk then steps the first `warm` iterations (past `learning_starts`
in every preset measured; not timed), and from there the next `timed` iterations, `--reps`
times from the same state, the ways taking turns call by call so that a slow spell of this
machine falls on all of them; the table gives the fastest call. `largest difference` is the
largest absolute difference between a way's state after its last call and the default's, over
the floating-point entries finite in both, `leaves that differ` how many leaves are not
bit-identical: the optimisation level may change how XLA:CPU rounds (a trajectory that differs
in the last bit goes its own way, as a run on another CPU does).
"""

from __future__ import annotations

import time

import jax
import numpy as np

import rmtjax
from benchmarks.lib.tables import write_table
from rmtjax import cache
from rmtjax.driver import CPU_CHUNK_COMPILER_OPTIONS, Program, seed_keys

AGENTS = ("rmt:CartPole-v1:70:300", "dqn:CartPole-v1:1000:1000", "pqn:CartPole-v1:2:10", "ppo:CartPole-v1:2:100",
          "sac:Pendulum-v1:70:40", "rmt:Acrobot-v1:70:300", "rmt:Breakout-MinAtar:50:200")
WAYS = {"XLA default": None, "LLVM level 2": {"xla_backend_optimization_level": 2},
        "LLVM level 1": {"xla_backend_optimization_level": 1}}
DRIVER = next(label for label, options in WAYS.items() if options == CPU_CHUNK_COMPILER_OPTIONS)


def _host(x):
    return np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)


def apart(a, b) -> tuple[float, int, int]:
    """(max |a - b| over the floating-point entries finite in both, leaves not bit-identical, leaves)."""
    worst, differ, leaves = 0.0, 0, 0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = _host(x), _host(y)
        leaves += 1
        if not np.array_equal(x, y, equal_nan=True):
            differ += 1
            if np.issubdtype(x.dtype, np.floating):
                both = np.isfinite(x) & np.isfinite(y)
                if both.any():
                    worst = max(worst, float(np.abs(x[both].astype(np.float64) - y[both].astype(np.float64)).max()))
    return worst, differ, leaves


def measure(agent: str, seeds: int, rounds: int, reps: int):
    """way -> (compile s, run s, the state after the last call) for `agent`."""
    algo, env, warm, timed = agent.split(":")
    warm, timed = int(warm), int(timed)
    program = Program(rmtjax.make_config(algo, env, {"train.num_seeds": seeds}))
    fresh = program.initial_state(seed_keys(jax.random.key(0), seeds))
    length = max(warm, timed)
    compile_s, compiled = {}, {}
    for r in range(rounds):
        for label in list(WAYS)[r % len(WAYS):] + list(WAYS)[:r % len(WAYS)]:
            t0 = time.perf_counter()
            compiled[label] = program.compile_chunk(fresh, length, WAYS[label])
            compile_s[label] = min(compile_s.get(label, float("inf")), time.perf_counter() - t0)
    copy = lambda tree: jax.tree.map(lambda x: x.copy(), tree)  # a chunk donates its state
    warmed = {label: jax.block_until_ready(c(copy(fresh), np.int32(0), np.int32(warm))[0])
              for label, c in compiled.items()}
    run_s, last = {}, {}
    for _ in range(reps):
        for label, c in compiled.items():
            state = copy(warmed[label])
            t0 = time.perf_counter()
            last[label] = jax.block_until_ready(c(state, np.int32(warm), np.int32(timed)))[0]
            run_s[label] = min(run_s.get(label, float("inf")), time.perf_counter() - t0)
    return {label: (compile_s[label], run_s[label], last[label]) for label in WAYS}


def add_arguments(ap) -> None:
    ap.add_argument("--agents", nargs="+", default=list(AGENTS), metavar="ALGO:ENV:WARM:TIMED")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="compiles of each way, the fastest kept")
    ap.add_argument("--reps", type=int, default=4, help="timed calls of each way, taking turns, the fastest kept")
    ap.add_argument("--name", default="chunk_compile")


def run(args):
    cache.enable(disable=True)
    rows = []
    for agent in args.agents:
        out = measure(agent, args.seeds, args.rounds, args.reps)
        base_c, base_r, base_state = out["XLA default"]
        algo, env, _, timed = agent.split(":")
        for label, (compile_s, run_s, state) in out.items():
            worst, differ, leaves = apart(base_state, state)
            name = f"**{label}** (the driver's)" if label == DRIVER else label
            rows.append([f"{algo} on {env}", name, f"{compile_s:.2f}", f"{compile_s / base_c:.2f}×", timed,
                         f"{run_s:.2f}", f"{run_s / base_r:.2f}×", f"{worst:.1e}", f"{differ} of {leaves}"])
        del out
        print("\n".join(" | ".join(r) for r in rows[-len(WAYS):]), flush=True)
        write_table("chunk_compile", args.name,
                    f"The chunk's compile and run at XLA's defaults and at lower LLVM optimisation levels "
                    f"({args.seeds} seeds)",
                    ["agent (preset)", "compiled with", "compile s", "÷ default", "iterations timed", "run s",
                     "÷ default", "largest difference of the states", "leaves that differ"], rows,
                    notes=__doc__.split("\n\n", 2)[2] + f"\n\nThe driver's options on the CPU: "
                                                          f"`{CPU_CHUNK_COMPILER_OPTIONS}`.")
