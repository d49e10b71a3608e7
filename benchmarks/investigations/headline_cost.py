"""What the headline table's unrun rows cost on this machine: a short timed probe of each.

    python -m benchmarks headline_cost                      # SAC on the two Box2D envs, the four Breakout rows
    python -m benchmarks headline_cost --rows sac:gymnasium:BipedalWalker-v3 --seeds 2

Each probe is its row's own config (`benchmarks.reports.headline_table.config_for`: the preset or the Atari
settings, the row's envs, networks, batch and update ratio, all its seeds vmapped) with two
changes that keep it short and small: learning starts after one iteration, so the timed run is
all steady-state learning, what nearly all of a row is; and the replay holds 5,000 transitions a
seed (sampling does not cost more with a larger capacity; memory does). Compile is timed apart
from the run. From the env-steps/s (all seeds together) it projects the hours of the whole row at
its budget on this machine (the Box2D rows 1M env steps a seed, Breakout `--atari-steps`) and of
the 10M-a-seed Breakout row of `headline --gpu`. Writes results/headline_cost/headline_cost.md.
"""

from __future__ import annotations

import jax

import rmtjax
from benchmarks.lib.tables import write_table
from benchmarks.reports.headline_table import ATARI_ENV, config_for

DEFAULT_ROWS = ("sac:gymnasium:LunarLanderContinuous-v3", "sac:gymnasium:BipedalWalker-v3",
                f"dqn:{ATARI_ENV}", f"rmt:{ATARI_ENV}", f"pqn:{ATARI_ENV}", f"ppo:{ATARI_ENV}")
# env steps a seed each probe runs: whole iterations of the row, a minute or two each here
PROBE_STEPS = {"sac": 400, "dqn": 400, "rmt": 400, "pqn": 1024, "ppo": 1024}


def probe(algo: str, env: str, seeds: int):
    """(where the settings come from, env steps timed over all seeds, compile s, run s)."""
    cfg, source = config_for(env, algo, 1_000_000, seeds, smoke=False)
    overrides = {"train.num_chunks": 1, "train.total_steps": PROBE_STEPS[algo]}
    if algo in ("dqn", "rmt", "sac"):
        overrides |= {"agent.learning_starts": cfg.env.num_envs * getattr(cfg.agent, "rollout_len", 1),
                      "agent.buffer_size": 5_000}
    result = rmtjax.train(cfg.override(overrides), jax.random.key(0))
    env_steps = int(result.metrics["env_steps"][0][-1]) * seeds
    return source, env_steps, result.compile_seconds, result.run_seconds


def add_arguments(ap) -> None:
    ap.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), help="ALGO:ENV of the rows to probe")
    ap.add_argument("--seeds", type=int, default=5, help="seeds vmapped, as in the row (5)")
    ap.add_argument("--steps", type=int, default=1_000_000, help="env steps a seed of the Box2D rows")
    ap.add_argument("--atari-steps", type=int, default=200_000, help="env steps a seed of the CPU Breakout rows")


def run(args):
    rows = []
    for row in args.rows:
        algo, env = row.split(":", 1)
        source, env_steps, compile_s, run_s = probe(algo, env, args.seeds)
        rate = env_steps / run_s

        def hours(steps_a_seed: int) -> float:
            return steps_a_seed * args.seeds / rate / 3600

        budget = args.atari_steps if env == ATARI_ENV else args.steps
        gpu = f"{hours(10_000_000):,.0f}" if env == ATARI_ENV else ""
        rows.append([env, algo, source, args.seeds, f"{env_steps:,}", f"{compile_s:.0f}", f"{run_s:.0f}",
                     f"{rate:.1f}", f"{budget:,}", f"{hours(budget):.1f}", gpu])
        print(rows[-1], flush=True)
    about = next(par for par in __doc__.split("\n\n") if par.startswith("Each probe"))
    notes = (about + "\n\n'hours' assume the probe's rate for the whole row; a real row's warm-up steps only "
             "act (cheaper), and host-stepped Box2D slows as the agents learn.")
    write_table("headline_cost", "headline_cost", "The headline's unrun rows: throughput on this machine",
                ["env", "agent", "configuration", "seeds", "env steps timed (all seeds)", "compile s", "run s",
                 "env-steps/s (all seeds)", "row's env steps a seed", "hours for the row here",
                 "hours for 10M a seed here"], rows, notes=notes)
