"""Whole-loop training throughput of rmtjax and of its peers (rejax, stable-baselines3) at matched
settings, one seed each: the suite's throughput rows on their own, every trainer one after the
other in this process (`benchmarks/lib/peers.py` holds the trainers and their settings).

    python -m benchmarks peers [--algos rmt dqn ppo sac] [--steps N] [--name peers]
"""

from __future__ import annotations

from benchmarks.lib.peers import SETTINGS_NOTE, THROUGHPUT_ENV, THROUGHPUT_HEADER, throughput_row
from benchmarks.lib.tables import write_table


def add_arguments(ap) -> None:
    ap.add_argument("--algos", nargs="+", default=["rmt", "dqn", "ppo", "sac"], choices=list(THROUGHPUT_ENV))
    ap.add_argument("--steps", type=int, default=20_000, help="env steps of every run")
    ap.add_argument("--name", default="peers", help="results/peers/NAME.md")


def run(args) -> None:
    rows = []
    for algo in args.algos:
        rows.append(throughput_row(algo, args.steps)[0])
        print(" | ".join(rows[-1]), flush=True)
    write_table("peers", args.name, "Whole-loop throughput against rejax and stable-baselines3 (one seed)",
                THROUGHPUT_HEADER, rows,
                notes=SETTINGS_NOTE + "\n\nEach trainer runs the same number of env steps, one after the other in "
                "this process; env-steps/s excludes compile (JAX: `jit(...).lower().compile()` timed apart) and "
                "SB3's model construction. A ratio above 1 means rmtjax is faster. Other jobs on the machine "
                "change the load between the runs: read ratios as rough.")
