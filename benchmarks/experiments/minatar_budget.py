"""The five MinAtar games at equal wall-clock: each agent trains for the same seconds per game
(compilation not counted), then its greedy policy is evaluated; a table of IQMs with 95% intervals
and the aggregate score (each game's IQM ÷ the best agent's IQM on that game, averaged over games).

    python -m benchmarks minatar_budget [--budget-seconds 60] [--seeds 4] [--algos rmt dqn pqn]
                                        [--configs benchmarks/configs/agents/rmt_many_envs.yaml] [--key 0]
                                        [--name minatar_budget]

Each agent runs at its preset where it has one (DQN and PQN on Breakout-MinAtar), else at its
defaults; each `--configs` file is one more entry run on every game. One program per (agent,
game), the seeds vmapped (`rmtjax.compare` with `budget_seconds`), compiled cold (the persistent
cache off). The aggregate's interval resamples each (agent, game)'s seeds (5,000 draws) with the
per-game best held at its point value.
"""

from __future__ import annotations

import numpy as np

from benchmarks.lib.tables import write_table
from rmtjax.compare import compare
from rmtjax.stats import iqm

GAMES = ("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar", "SpaceInvaders-MinAtar")


def aggregate(scores: dict[str, dict[str, np.ndarray]], draws: int = 5000, seed: int = 0):
    """scores[label][game] = per-seed returns -> {label: (mean normalised IQM, lo, hi)}."""
    games = sorted({g for per in scores.values() for g in per})
    best = {g: max(iqm(per[g]) for per in scores.values()) for g in games}
    rng = np.random.default_rng(seed)
    out = {}
    for label, per in scores.items():
        point = np.mean([iqm(per[g]) / best[g] if best[g] > 0 else 1.0 for g in games])
        boot = np.zeros(draws)
        for g in games:
            x = per[g]
            idx = rng.integers(0, len(x), (draws, len(x)))
            boot += np.array([iqm(x[i]) for i in idx]) / (best[g] if best[g] > 0 else 1.0)
        boot /= len(games)
        out[label] = (float(point), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5)))
    return out


def add_arguments(ap) -> None:
    ap.add_argument("--budget-seconds", type=float, default=60.0)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--algos", nargs="+", default=["rmt", "dqn", "pqn"])
    ap.add_argument("--configs", nargs="*", default=["benchmarks/configs/agents/rmt_many_envs.yaml"])
    ap.add_argument("--games", nargs="+", default=list(GAMES))
    ap.add_argument("--key", type=int, default=0, help="the integer seed every entry starts from (compare's key)")
    ap.add_argument("--name", default="minatar_budget")


def run(args):
    from rmtjax import cache

    cache.enable(disable=True)  # cold compiles: the compile column is what a first run costs
    header = ["game", "agent", "env steps / seed", "trained s", "env-steps/s", "compile s", "greedy IQM [95% CI]",
              "per seed"]
    rows, scores = [], {}
    for game in args.games:  # one game at a time, so the table grows as it goes
        res = compare(args.algos, [game], args.seeds, configs=args.configs, budget_seconds=args.budget_seconds,
                      key=args.key, progress=False)
        for e, r in zip(res.entries, res.table()):
            scores.setdefault(e.label, {})[game] = np.asarray(e.eval_return, np.float64)
            rows.append([game, e.label, f"{e.env_steps:,}", f"{e.run_seconds:.1f}", f"{e.steps_per_second:,.0f}",
                         f"{e.compile_seconds:.1f}",
                         f"{r['eval_iqm']:.2f} [{r['eval_lo']:.2f}, {r['eval_hi']:.2f}]",
                         " ".join(f"{v:.1f}" for v in e.eval_return)])
            print(" | ".join(rows[-1]), flush=True)
        agg = aggregate(scores)  # every entry has run every game so far
        notes = [f"Budget: {args.budget_seconds:g} s of training per (agent, game), {args.seeds} seeds; "
                 f"greedy evaluation of 10 episodes per seed after it.", "",
                 "| agent | aggregate (IQM ÷ best, mean over games) [95% CI] |", "|---|---|"]
        notes += [f"| {k} | **{p:.3f}** [{lo:.3f}, {hi:.3f}] |" for k, (p, lo, hi) in agg.items()]
        write_table("minatar_budget", args.name, "MinAtar at equal wall-clock", header, rows,
                    notes="\n".join(notes) + "\n\n" + __doc__.split("\n\n", 2)[2])

