"""The five MinAtar games with each agent's defaults (no presets): a table with IQM and intervals.

    python -m benchmarks minatar [--algos rmt dqn pqn] [--seeds 4] [--steps 200000] [--name minatar_defaults]

Every agent runs from its defaults (`rmtjax.Config.from_dict` with an empty agent section: no
preset, nothing tuned to these games), the seeds vmapped in one program per agent and game. A
seed's score is its learning curve averaged over the last tenth of training (`curves.late_mean`:
steadier than the final snapshot of each env's last episode); the table gives, per game and
agent, the IQM over seeds with a 95% percentile-bootstrap interval, and every seed's score.
The last rows aggregate over games: each score divided by the best agent's IQM on that game
(so 1 is the best agent), then the IQM over all games × seeds with its interval, and how many
games each agent has the highest IQM on. Curves go to `results/minatar/NAME.npz`.

An entry of `--algos` may also name a variant of an agent's defaults (`VARIANTS` below, e.g.
`rmt-dqnloss`: RMT with DQN's squared loss and clip), to measure what one default costs.
"""

from __future__ import annotations

import numpy as np

from benchmarks.lib import runner
from benchmarks.lib.tables import write_table
from benchmarks.lib.curves import late_mean
from benchmarks.lib.runner import run_agent
from benchmarks.lib.stats import iqm_ci

GAMES = ("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar", "SpaceInvaders-MinAtar")
# named variants of an agent's defaults (`--algos rmt rmt-dqnloss`), to find out what a default costs
VARIANTS = {
    # RMT with DQN's loss and clip: the squared TD error and a global-norm clip of 10 (RMT: Huber δ=1, clip 0.5)
    "rmt-dqnloss": ("rmt", ["agent.loss=mse", "agent.max_grad_norm=10"]),
    "rmt-uniform": ("rmt", ["agent.replay=uniform"]),
    "rmt-epsgreedy": ("rmt", ["agent.exploration=eps_greedy"]),
}


def fmt(values) -> str:
    m, lo, hi = iqm_ci(np.asarray(values))
    return f"{m:.2f} [{lo:.2f}, {hi:.2f}]"


def add_arguments(ap) -> None:
    ap.add_argument("--algos", nargs="+", default=["rmt", "dqn", "pqn"])
    ap.add_argument("--games", nargs="+", default=list(GAMES))
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="minatar_defaults")


def run(args):
    scores, sps, curves = {}, {}, {}
    rows = []
    for game in args.games:
        for algo in args.algos:
            base, sets = VARIANTS.get(algo, (algo, []))
            r = run_agent(base, game, args.steps, args.seeds, sets, args.seed, preset=False)
            env_steps = r.metrics["env_steps"][0]
            scores[game, algo] = late_mean(r.metrics["episode_return"], env_steps, r.metrics["episode_count"],
                                           args.steps)
            sps[game, algo] = r.env_steps * args.seeds / r.run_seconds
            curves[f"{game}_{algo}"] = r.metrics["episode_return"]
            curves[f"{game}_{algo}_env_steps"] = env_steps
            curves[f"{game}_{algo}_episode_count"] = r.metrics["episode_count"]
            print(game, algo, np.round(scores[game, algo], 2), f"{sps[game, algo]:,.0f} env-steps/s", flush=True)
        best = max(args.algos, key=lambda a: iqm_ci(scores[game, a])[0])
        for algo in args.algos:
            s = scores[game, algo]
            rows.append([game, algo + (" **(best)**" if algo == best else ""), fmt(s),
                         " ".join(f"{v:.1f}" for v in s), f"{sps[game, algo]:,.0f}"])
        np.savez_compressed(runner.out("minatar") / f"{args.name}.npz", **curves)
        write_table("minatar", args.name, "MinAtar, each agent's defaults", ["game", "agent", "IQM [95% CI]", "per seed",
                                                                  "env-steps/s"], rows, notes=_notes(args))
    # aggregate: normalised by the best IQM of each game
    for algo in args.algos:
        normalised = []
        for game in args.games:
            top = max(iqm_ci(scores[game, a])[0] for a in args.algos)
            normalised.extend(np.asarray(scores[game, algo]) / max(top, 1e-8))
        wins = sum(max(args.algos, key=lambda a: iqm_ci(scores[g, a])[0]) == algo for g in args.games)
        rows.append(["all games (score ÷ best IQM of the game)", algo, fmt(normalised), f"best on {wins}", ""])
    write_table("minatar", args.name, "MinAtar, each agent's defaults", ["game", "agent", "IQM [95% CI]", "per seed",
                                                              "env-steps/s"], rows, notes=_notes(args))


def _notes(args) -> str:
    return (f"{args.seeds} seeds × {args.steps:,} env steps per agent and game, key {args.seed}; scores are each "
            f"seed's mean episode return over the last 10% of training. " + __doc__.split("\n\n")[2].replace("\n", " "))
