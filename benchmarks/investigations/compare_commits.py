"""Throughput of two checkouts of rmtjax on the same runs, alternating, on one machine.

    python -m benchmarks compare_commits OLD_CHECKOUT NEW_CHECKOUT --run rmt:CartPole-v1 \
        --run rmt:Breakout-MinAtar:seeds=4 [--steps 100000] [--rounds 3] [--name NAME]

Each run (`algo:env`, optionally `:seeds=N`) trains from that algorithm's preset for the env (its
defaults where there is none) in a fresh Python process per checkout (`PYTHONPATH` set to the
checkout), `--rounds` times, old and new taking turns so any load falls on both; the table gives
each side's median env-steps/s (all seeds, the whole driver loop after compile), the ratio new ÷
old and the compile seconds. Both checkouts use the Python environment this script runs in.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from benchmarks.lib.tables import write_table

CHILD = """
import json, sys, jax, rmtjax
algo, env, seeds, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cfg = rmtjax.make_config(algo, env, {"train.total_steps": steps, "train.num_seeds": seeds, "train.progress": False})
r = rmtjax.train(cfg, jax.random.key(0))
print(json.dumps({"sps": r.env_steps * seeds / r.run_seconds, "compile": r.compile_seconds}))
"""


def parse_run(text: str) -> tuple[str, str, int]:
    parts = text.split(":")
    seeds = 1
    if parts[-1].startswith("seeds="):
        seeds = int(parts.pop()[len("seeds="):])
    return parts[0], ":".join(parts[1:]), seeds


def measure(checkout: str, algo: str, env: str, seeds: int, steps: int) -> dict:
    environ = {**os.environ, "PYTHONPATH": os.path.abspath(checkout), "RMTJAX_CACHE_DIR": "off"}
    proc = subprocess.run([sys.executable, "-c", CHILD, algo, env, str(seeds), str(steps)], env=environ,
                          capture_output=True, text=True, timeout=7200, cwd=os.path.abspath(checkout))
    if proc.returncode:
        raise RuntimeError(f"{checkout}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_arguments(ap) -> None:
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--run", action="append", required=True, metavar="ALGO:ENV[:seeds=N]")
    ap.add_argument("--steps", type=int, default=100_000, help="env steps per seed of every run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="compare_commits")


def run(args):
    rows = []
    for run in args.run:
        algo, env, seeds = parse_run(run)
        got = {"old": [], "new": []}
        for _ in range(args.rounds):
            for side in ("old", "new"):
                got[side].append(measure(getattr(args, side), algo, env, seeds, args.steps))
                print(run, side, got[side][-1], flush=True)
        old = statistics.median(g["sps"] for g in got["old"])
        new = statistics.median(g["sps"] for g in got["new"])
        rows.append([algo, env, seeds, f"{args.steps:,}", f"{old:,.0f}", f"{new:,.0f}", f"**{new / old:.2f}×**",
                     f"{statistics.median(g['compile'] for g in got['old']):.1f}",
                     f"{statistics.median(g['compile'] for g in got['new']):.1f}"])
        write_table("compare_commits", args.name, "Throughput of two checkouts side by side",
                    ["agent", "env", "seeds", "env steps per seed", "old env-steps/s", "new env-steps/s", "new ÷ old",
                     "old compile s", "new compile s"], rows,
                    notes=f"old: `{args.old}`, new: `{args.new}`; median of {args.rounds} alternating runs each, "
                          f"a fresh process per run, persistent compilation cache off.")
