"""A run's init program compiled with XLA's full optimisation and with the driver's
`INIT_COMPILER_OPTIONS` (no LLVM optimisation passes): compile seconds, run seconds, and how far
the two initial states lie apart, for each agent on its preset.

    python -m benchmarks init_compile [--agents rmt:CartPole-v1 ...] [--seeds 1] [--rounds 3] [--name init_compile]

The init program (`Program.initial_state`: env reset, network initialisation, the n-step window's
fill, replay and optimiser state, the doctor's and the meta layer's) runs once per run, so its
compile is all it costs. Each agent's program is compiled both ways once per round, every agent
in each round, with the persistent cache off; the table gives each one's fastest round (this
machine drifts by ±10% and more over minutes). `largest difference` is the largest absolute
difference between the two states' floating-point leaves; `leaves that differ` counts the leaves
that are not bit-identical.
"""

from __future__ import annotations

import time

import jax
import numpy as np

import rmtjax
from benchmarks.lib.tables import write_table
from rmtjax import cache
from rmtjax.driver import INIT_COMPILER_OPTIONS, Program, seed_keys

AGENTS = ("rmt:CartPole-v1", "dqn:CartPole-v1", "pqn:CartPole-v1", "ppo:CartPole-v1", "sac:Pendulum-v1")


def measure(agent: str, seeds: int, options: dict | None, seed: int = 0):
    """(compile s, run s, the state) of one cold compile of `agent`'s init program."""
    algo, env = agent.split(":")
    program = Program(rmtjax.make_config(algo, env, {"train.num_seeds": seeds}))
    keys = seed_keys(jax.random.key(seed), seeds)
    lowered = jax.jit(lambda k: program.init(k)).lower(keys)
    t0 = time.perf_counter()
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    t1 = time.perf_counter()
    state = jax.block_until_ready(compiled(keys))
    return t1 - t0, time.perf_counter() - t1, state


def apart(a, b) -> tuple[float, int, int]:
    """(max |a - b| over floating-point leaves, leaves not bit-identical, leaves)."""
    worst, differ, leaves = 0.0, 0, 0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        x, y = np.asarray(x), np.asarray(y)
        leaves += 1
        if not np.array_equal(x, y, equal_nan=True):
            differ += 1
            if np.issubdtype(x.dtype, np.floating):
                worst = max(worst, float(np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
    return worst, differ, leaves


def add_arguments(ap) -> None:
    ap.add_argument("--agents", nargs="+", default=list(AGENTS), metavar="ALGO:ENV")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="compiles of each program, one per round")
    ap.add_argument("--name", default="init_compile")


def run(args):
    cache.enable(disable=True)
    best: dict[tuple[str, str], list[float]] = {}
    gap: dict[str, tuple] = {}
    for round_ in range(args.rounds):
        for agent in args.agents:
            states = {}
            for label, options in (("optimised", None), ("driver", INIT_COMPILER_OPTIONS)):
                compile_s, run_s, states[label] = measure(agent, args.seeds, options, seed=round_)
                old = best.get((agent, label))
                best[(agent, label)] = [compile_s, run_s] if old is None else [min(old[0], compile_s), min(old[1], run_s)]
            gap[agent] = apart(states["optimised"], states["driver"])
        rows = []
        for agent in args.agents:
            full, fast = best[(agent, "optimised")], best[(agent, "driver")]
            worst, differ, leaves = gap[agent]
            rows.append([agent.replace(":", " on "), f"{full[0]:.2f}", f"**{fast[0]:.2f}**", f"{fast[0] / full[0]:.2f}×",
                         f"{full[1] * 1e3:.1f}", f"{fast[1] * 1e3:.1f}", f"{worst:.1e}", f"{differ} of {leaves}"])
        print("\n".join(" | ".join(r) for r in rows), flush=True)
        write_table("init_compile", args.name, f"The init program's compile, optimised and at the driver's options "
                    f"({args.seeds} seed(s), {args.rounds} rounds)",
                    ["agent (preset)", "compile s, optimised", "compile s, driver", "ratio", "run ms, optimised",
                     "run ms, driver", "largest difference of the states", "leaves that differ"], rows,
                    notes=__doc__.split("\n\n", 2)[2] + f"\n\nThe driver's options: `{INIT_COMPILER_OPTIONS}`.")
