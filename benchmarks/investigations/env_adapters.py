"""What a host environment costs: PPO throughput on native gymnax CartPole-v1 against
gymnasium's CartPole-v1 run through the gymnasium adapter (one host call per vectorised step).

Same agent, same config, side by side in one process; env-steps/s counts the training run
only (compile excluded), so it includes PPO's own updates. Writes a table to
benchmarks/results/env_adapters/env_adapters.md.

    python -m benchmarks env_adapters [--total-steps 65536] [--num-envs 4 16 64]
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import jax

import rmtjax
from benchmarks.lib import runner

PAIRS = ("CartPole-v1", "gymnasium:CartPole-v1")


def measure(env_id: str, num_envs: int, total_steps: int, seed: int = 0) -> dict:
    cfg = rmtjax.make_config("ppo", env_id, {
        "env.num_envs": num_envs, "train.total_steps": total_steps, "train.num_seeds": 1,
        "train.num_chunks": 1, "train.progress": False, "agent.rollout_len": 128, "agent.num_minibatches": 4})
    result = rmtjax.train(cfg, jax.random.key(seed))
    steps = result.env_steps
    return {"env": env_id, "num_envs": num_envs, "steps": steps, "compile_s": result.compile_seconds,
            "run_s": result.run_seconds, "sps": steps / result.run_seconds}


def add_arguments(p) -> None:
    p.add_argument("--total-steps", type=int, default=65536)
    p.add_argument("--num-envs", type=int, nargs="+", default=[4, 16, 64])
    p.add_argument("--out", default=str(runner.RESULTS / "env_adapters" / "env_adapters.md"))


def run(args):
    load_before = os.getloadavg()[0]
    rows = []
    for n in args.num_envs:
        native, host = (measure(e, n, args.total_steps) for e in PAIRS)
        for r in (native, host):
            r["ratio"] = native["sps"] / r["sps"]
            rows.append(r)
            print(f"{r['env']:<24} num_envs={n:<3} {r['sps']:>10,.0f} env-steps/s  "
                  f"(run {r['run_s']:.1f}s, compile {r['compile_s']:.1f}s)  native/this = {r['ratio']:.1f}x")

    machine = (f"{platform.machine()}, {os.cpu_count()} CPU cores (1-min load average {load_before:.1f} before, "
               f"{os.getloadavg()[0]:.1f} after: other work shared the cores), jax {jax.__version__} on "
               f"{jax.devices()[0].platform}, Python {platform.python_version()}")
    lines = [
        "# PPO throughput: native gymnax env vs the same env on the host (gymnasium adapter)",
        "",
        f"Machine: {machine}. PPO, rollout_len 128, 4 epochs × 4 minibatches, "
        f"{args.total_steps:,} env steps, one seed; env-steps/s over the training run (compile excluded).",
        "",
        "| env | num_envs | env-steps/s | run s | compile s | native ÷ this |",
        "|-----|---------:|------------:|------:|----------:|--------------:|",
    ]
    for r in rows:
        lines.append(f"| `{r['env']}` | {r['num_envs']} | {r['sps']:,.0f} | {r['run_s']:.1f} | "
                     f"{r['compile_s']:.1f} | {r['ratio']:.1f} |")
    lines.append("")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0
