"""Whole-run throughput of rmtjax's PPO against rejax's PPO at the same settings, side by side.

PPO on CartPole-v1, 4 envs × 128 steps, 4 epochs × 4 minibatches, 64-64 tanh networks,
500k env steps; for 1 seed and for 8 seeds vmapped in one program. Compile time is measured
apart from run time. rejax 0.1.3 expects gymnax's older 5-value `step`; a thin adapter folds
gymnax 1.0.1's `terminated`/`truncated` into its `done` (no other change to rejax). rejax's
periodic evaluation is switched off so both programs only train.

    python -m benchmarks throughput [--steps 500000]
"""

from __future__ import annotations

import jax
import numpy as np

import rmtjax
from benchmarks.lib.runner import compile_and_time
from benchmarks.lib.peers import rejax_train_fn
from benchmarks.lib.tables import write_table


def add_arguments(ap) -> None:
    ap.add_argument("--steps", type=int, default=500_000)


def run(args):
    rows = []
    for seeds in (1, 8):
        cfg = rmtjax.make_config("ppo", "CartPole-v1", {"train.total_steps": args.steps, "train.num_seeds": seeds})
        ours = rmtjax.make_train(cfg)
        theirs = rejax_train_fn(args.steps)
        key = jax.random.key(0)
        rj = (lambda k: jax.vmap(theirs)(jax.random.split(k, seeds))) if seeds > 1 else theirs
        c_ours, r_ours, (_, metrics) = compile_and_time(ours, key)
        c_rj, r_rj, _ = compile_and_time(rj, key)
        ret = float(np.mean(np.asarray(metrics["episode_return"])[:, -1]))
        total = args.steps * seeds
        rows.append(["rmtjax ppo", seeds, f"{c_ours:.1f}", f"{r_ours:.1f}", f"{total / r_ours:,.0f}", f"{ret:.0f}"])
        rows.append(["rejax ppo", seeds, f"{c_rj:.1f}", f"{r_rj:.1f}", f"{total / r_rj:,.0f}", "-"])
        rows.append(["ratio rmtjax/rejax (env-steps/s)", seeds, f"{c_ours / c_rj:.2f}× compile", "",
                     f"**{r_rj / r_ours:.2f}×**", ""])
        # written after each seed count, so a cut-short run still leaves what it measured
        write_table("throughput", "throughput_ppo", "PPO whole-run throughput: rmtjax vs rejax (CartPole-v1)",
                    ["trainer", "seeds", "compile s", "run s", "env-steps/s", "final episode_return"], rows,
                    notes=f"{args.steps:,} env steps per seed, 4 envs × 128 steps, 4 epochs × 4 minibatches, 64-64 tanh. "
                          "Ratio > 1 means rmtjax is faster. Both run in the same process, one after the other.")
