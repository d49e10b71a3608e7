"""What the training doctor's detectors (`rmtjax.doctor`) cost: the same run with `doctor.enabled`
true and false, compiled apart, then timed side by side in one process.

For each agent (presets on CartPole-v1; DQN's iterations are the smallest, so a per-iteration
cost shows most there) both programs are compiled (`rmtjax.make_train`), then run `--repeats`
times each, alternating, and the median run seconds are compared. A ratio of 1.00 means the
detectors cost nothing measurable.

    python -m benchmarks doctor_cost [--steps 20000] [--seeds 2] [--repeats 3] [--algos dqn,ppo]
"""

from __future__ import annotations

import time

import jax
import numpy as np

import rmtjax
from benchmarks.lib.tables import write_table


def add_arguments(ap) -> None:
    ap.add_argument("--steps", type=int, default=20_000, help="env steps per seed")
    ap.add_argument("--seeds", type=int, default=2, help="seeds vmapped in one program")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each program (alternating)")
    ap.add_argument("--algos", default="dqn,ppo", help="comma-separated algorithms (CartPole-v1 presets)")


def run(args):
    rows = []
    key = jax.random.key(0)
    for algo in args.algos.split(","):
        compiled, compile_s = {}, {}
        for on in (False, True):
            cfg = rmtjax.make_config(algo, "CartPole-v1", {"train.total_steps": args.steps,
                                                           "train.num_seeds": args.seeds, "doctor.enabled": on})
            t0 = time.perf_counter()
            compiled[on] = jax.jit(rmtjax.make_train(cfg)).lower(key).compile()
            compile_s[on] = time.perf_counter() - t0
            jax.block_until_ready(compiled[on](key))  # a first run, untimed
        times = {False: [], True: []}
        for _ in range(args.repeats):
            for on in (False, True):
                t0 = time.perf_counter()
                jax.block_until_ready(compiled[on](key))
                times[on].append(time.perf_counter() - t0)
        off, on = float(np.median(times[False])), float(np.median(times[True]))
        spread = max(times[True] + times[False]) / min(times[True] + times[False])
        iters = rmtjax.make_config(algo, "CartPole-v1", {"train.total_steps": args.steps})
        n_iter = rmtjax.agents.build_agent(iters).num_iterations
        rows.append([algo, f"{n_iter:,}", f"{compile_s[False]:.1f}", f"{compile_s[True]:.1f}", f"{off:.3f}",
                     f"{on:.3f}", f"**{on / off:.3f}**", f"{spread:.2f}"])
        print(" | ".join(rows[-1]), flush=True)
        write_table("doctor_cost", "doctor_cost", "The training doctor's cost: the loop with and without its detectors",
                    ["agent", "iterations", "compile s (off)", "compile s (on)", "run s (off, median)",
                     "run s (on, median)", "on / off", "max/min of all runs"], rows,
                    notes=f"{args.steps:,} env steps per seed × {args.seeds} seeds (vmapped), CartPole-v1 presets, "
                          f"`doctor.enabled` false vs true (default thresholds); each program compiled once, then "
                          f"run {args.repeats}× each, alternating, after an untimed first run. 'on / off' is the "
                          f"ratio of the median run seconds; 'max/min of all runs' is the timing noise on this "
                          f"machine (a ratio inside it is no measurable cost).")
