"""The speed-of-light references (`benchmarks/lib/reference.py`) timed alone: the minimal DQN or
PPO on CartPole-v1, one fused program, compile apart from run (prints, writes nothing).

    python -m benchmarks reference --algo dqn [--steps N] [--seeds 1] [--seed 0]
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from benchmarks.lib.reference import DQNSettings, PPOSettings, make_dqn, make_ppo
from benchmarks.lib.runner import compile_and_time


def add_arguments(p) -> None:
    p.add_argument("--algo", choices=("dqn", "ppo"), required=True)
    p.add_argument("--steps", type=int, default=None, help="total env steps per seed (default: the settings')")
    p.add_argument("--seeds", type=int, default=1, help="seeds, vmapped when more than 1")
    p.add_argument("--seed", type=int, default=0)


def run(a) -> None:
    settings = DQNSettings() if a.algo == "dqn" else PPOSettings()
    if a.steps is not None:
        settings = dataclasses.replace(settings, total_steps=a.steps)
    train = (make_dqn if a.algo == "dqn" else make_ppo)(settings)
    key = jax.random.key(a.seed)
    fn, arg = (train, key) if a.seeds == 1 else (jax.vmap(train), jax.random.split(key, a.seeds))

    compile_s, run_s, (_, metrics) = compile_and_time(fn, arg)
    steps = int(np.asarray(metrics["env_steps"]).reshape(-1)[-1]) * a.seeds
    final = np.atleast_1d(np.asarray(metrics["episode_return"])[..., -1])
    print(f"{a.algo} {settings.env_id}: {a.seeds} seed(s) x {steps // a.seeds} env steps")
    print(f"compile {compile_s:.1f} s, run {run_s:.1f} s, {steps / run_s:,.0f} env-steps/s (all seeds)")
    print("final return per seed: " + " ".join(f"{r:.1f}" for r in final))
