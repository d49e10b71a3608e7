"""One table from learning curves that earlier benchmark runs saved, for agents run apart (one
at a time on this machine, or some on another machine) at the same env, budget and seeds.

    python -m benchmarks compare_curves --env Breakout-MinAtar --steps 300000 \
        rmt=results/hierarchical/hierarchical_Breakout-MinAtar.npz:tiered \
        dqn=results/curves/value_Breakout-MinAtar_dqn.npz:dqn --name value_Breakout-MinAtar

Each `LABEL=FILE.npz:KEY` names the curves `KEY` ([seeds, iterations] episode returns) of a file
written by `benchmarks.experiments.curves` (which also saves `KEY_env_steps` and `KEY_episode_count`) or by
`benchmarks.experiments.hierarchical` (which saves `env_steps` only; its runs are long enough that every
seed has finished episodes in the last tenth, which is all the score reads). A seed's score is its
curve averaged over the last tenth of training (`curves.late_mean`); the table gives the IQM
over seeds with a 95% bootstrap interval, the per-seed scores and the mean curve at ten points;
the plot goes beside it. The runs must share `--steps` (checked against each file's last
env-step count).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.lib import runner
from benchmarks.lib.curves import POINTS, grid_points, late_mean
from benchmarks.lib.plots import plot_curves
from benchmarks.lib.stats import iqm_ci
from benchmarks.lib.tables import write_table


def read(spec: str):
    """`LABEL=FILE.npz:KEY` -> (label, returns [S, I], env_steps [I], episode counts [S, I])."""
    label, _, rest = spec.partition("=")
    path, _, key = rest.rpartition(":")
    if not (label and path and key):
        raise SystemExit(f"{spec!r}: expected LABEL=FILE.npz:KEY")
    file = Path(path)
    if not file.is_absolute() and not file.exists():
        file = runner.RESULTS.parent / path  # paths relative to benchmarks/ work from the repository root too
    with np.load(file) as z:
        if key not in z.files:
            raise SystemExit(f"{file}: no curves {key!r} (it has {', '.join(z.files)})")
        returns = np.asarray(z[key], np.float64)
        steps = np.asarray(z[f"{key}_env_steps"] if f"{key}_env_steps" in z.files else z["env_steps"])
        count_key = f"{key}_episode_count"
        # without saved counts: every iteration counts as one after an episode (see the docstring)
        episodes = np.asarray(z[count_key]) if count_key in z.files else np.ones_like(returns)
    return label, returns, steps, episodes


def add_arguments(ap) -> None:
    ap.add_argument("runs", nargs="+", metavar="LABEL=FILE.npz:KEY")
    ap.add_argument("--env", required=True, help="for the title")
    ap.add_argument("--steps", type=int, required=True, help="env steps per seed of every run")
    ap.add_argument("--name", required=True)
    ap.add_argument("--note", default="", help="a paragraph for the results file (where each run came from)")


def run(args):
    rows, curves, grid = [], {}, None
    for spec in args.runs:
        label, returns, steps, episodes = read(spec)
        if abs(int(steps[-1]) - args.steps) > 0.01 * args.steps:
            raise SystemExit(f"{label}: its run ends at {int(steps[-1]):,} env steps, not --steps {args.steps:,}")
        score = late_mean(returns, steps, episodes, args.steps)
        iqm, lo, hi = iqm_ci(score)
        grid, pts = grid_points(returns, steps, episodes, args.steps)
        rows.append([label, str(returns.shape[0]), f"{iqm:.2f} [{lo:.2f}, {hi:.2f}]",
                     " ".join(f"{v:.1f}" for v in score)] + ["–" if np.isnan(v) else f"{v:.1f}" for v in pts])
        curves[label] = (returns, steps, episodes)
    header = ["agent", "seeds", "score IQM [95% CI]", "per seed"] + [f"{g / 1000:.4g}k" for g in grid]
    notes = ((args.note + "\n\n") if args.note else "") + (
        f"{args.steps:,} env steps per seed. Score: each seed's learning curve (the return of its envs' last "
        f"finished episodes) averaged over the last tenth of training; IQM over seeds with a 95% bootstrap "
        f"interval. The {POINTS} columns: the mean over seeds at evenly spaced points of training.")
    write_table("compare_curves", args.name, f"Learning curves on {args.env}: {', '.join(curves)}", header, rows, notes)
    plot_curves(runner.out("compare_curves") / f"{args.name}.png", args.env, curves)
