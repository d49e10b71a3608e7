"""Agents as a user chooses them: wall-clock (compile included) until the greedy policy reaches a
threshold, per seed, each agent at its preset.

    python -m benchmarks choose [--envs CartPole-v1:475 Acrobot-v1:-100] [--algos rmt dqn pqn]
                                [--seeds 8] [--evals 40] [--seed 0] [--set ALGO:KEY=VALUE ...] [--name choose]

Each (agent, env) is one program: `--seeds` seeds vmapped, the preset's full budget, the greedy
policy evaluated in the loop (`train.eval_every`, 10 episodes per seed) `--evals` times (`--set`
overrides the preset, e.g. to tune it on other `--seed` keys than the table's). A seed's
time to the threshold is the compile time plus the run's seconds up to the first evaluation at
or above the threshold (its share of the run's iterations, the seeds running side by side); a
seed that never reaches it counts as not reached. The table gives the median over seeds (with
how many reached it), the median env steps (per seed) done by then, which does not depend on the
machine's speed, and the IQM of the final greedy return with its 95% interval.
"""

from __future__ import annotations

import jax
import numpy as np

import rmtjax
from rmtjax.agents import build_agent
from rmtjax.config import parse_override
from benchmarks.lib.runner import sets_per_algo
from benchmarks.lib.tables import write_table
from benchmarks.lib.stats import stratified_iqm_ci


def first_reached(result, threshold: float) -> np.ndarray:
    """Per seed, the iteration (1-based) after which its greedy return first reached `threshold`;
    0 where it never did."""
    iters = np.asarray(result.eval_iterations)  # the iterations each evaluation followed (1-based)
    reached = np.asarray(result.eval_return) >= threshold  # [seeds, evaluations]
    return np.where(reached.any(axis=1), iters[reached.argmax(axis=1)], 0)


def time_to_threshold(result, threshold: float) -> np.ndarray:
    """Seconds (compile included) until each seed's greedy return first reached `threshold`; inf
    where it never did."""
    it = first_reached(result, threshold)
    n = result.metrics["env_steps"].shape[1]
    return np.where(it > 0, result.compile_seconds + result.run_seconds * it / n, np.inf)


def steps_to_threshold(result, threshold: float) -> np.ndarray:
    """Env steps (per seed) done when each seed's greedy return first reached `threshold`; inf where
    it never did: how much experience it needed, whatever the machine's speed."""
    it = first_reached(result, threshold)
    steps = np.asarray(result.metrics["env_steps"])  # [seeds, iterations]
    done = steps[np.arange(len(it)), np.maximum(it, 1) - 1]
    return np.where(it > 0, done, np.inf)


def train_preset(algo: str, env: str, seeds: int, evals: int, sets: list[str] = (), seed: int = 0):
    base = rmtjax.make_config(algo, env, dict(parse_override(s) for s in sets))
    steps_per_iteration = build_agent(base).steps_per_iteration
    iterations = max(1, base.train.total_steps // steps_per_iteration)
    cfg = base.override({"train.num_seeds": seeds, "train.progress": False,
                         "train.eval_every": max(1, iterations // evals), "train.eval_episodes": 10})
    return rmtjax.train(cfg, jax.random.key(seed))


def add_arguments(ap) -> None:
    ap.add_argument("--envs", nargs="+", default=["CartPole-v1:475", "Acrobot-v1:-100"], help="ENV:THRESHOLD")
    ap.add_argument("--algos", nargs="+", default=["rmt", "dqn", "pqn"])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--evals", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0, help="the key the seeds are split from")
    ap.add_argument("--set", action="append", default=[], metavar="ALGO:KEY=VALUE",
                    help="an override of one agent's preset, e.g. rmt:agent.batch_size=64 (or KEY=VALUE for all)")
    ap.add_argument("--name", default="choose")


def run(args):
    from rmtjax import cache

    cache.enable(disable=True)  # cold compiles: what a first run costs
    header = ["env", "agent (preset)", "env steps × seeds", "compile s", "run s", "reached",
              "median s to threshold", "median env steps to threshold", "final greedy IQM [95% CI]"]
    rows = []
    sets = sets_per_algo(args.set, args.algos)
    for item in args.envs:
        env, threshold = item.rsplit(":", 1)
        for algo in args.algos:
            r = train_preset(algo, env, args.seeds, args.evals, sets[algo], args.seed)
            t = time_to_threshold(r, float(threshold))
            reached = np.isfinite(t)
            median = np.median(t)  # inf when half or more never reach it
            steps = np.median(steps_to_threshold(r, float(threshold)))
            final = r.eval_return[:, -1]
            iqm, lo, hi = stratified_iqm_ci(final[:, None])
            label = f"{algo} ({', '.join(sets[algo])})" if sets[algo] else algo
            rows.append([f"{env} (≥ {threshold})", label, f"{r.config.train.total_steps:,} × {args.seeds}",
                         f"{r.compile_seconds:.1f}", f"{r.run_seconds:.1f}", f"{reached.sum()}/{len(t)}",
                         "never" if not np.isfinite(median) else f"**{median:.1f}**",
                         "never" if not np.isfinite(steps) else f"{steps:,.0f}",
                         f"{iqm:.1f} [{lo:.1f}, {hi:.1f}]"])
            print(" | ".join(rows[-1]), flush=True)
            write_table("choose", args.name, "Wall-clock to a greedy threshold, each agent at its preset", header, rows,
                        notes=__doc__.split("\n\n", 2)[2])
