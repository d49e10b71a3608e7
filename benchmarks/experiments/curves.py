"""Learning curves of several agents on one environment, at equal env steps, seeds vmapped.

    python -m benchmarks curves --env CartPole-v1 --algos rmt dqn --seeds 8 --steps 300000 \
        --threshold 475 --name rmt_vs_dqn_CartPole-v1

Each agent runs from its preset for the env (`rmtjax/configs/{algo}_{env}.yaml`, else its
defaults) with `--set algo:key=value` overrides, all seeds in one compile. The table gives
each agent's mean episode return at ten evenly spaced points of training, the final return
per seed, how many seeds reach `--threshold`, and whole-loop env-steps/s; the curves go to
`results/curves/NAME.npz` and, when matplotlib is installed, a plot to `results/curves/NAME.png`.
"""

from __future__ import annotations

import numpy as np

from benchmarks.lib import runner
from benchmarks.lib.curves import grid_points, late_mean
from benchmarks.lib.plots import plot_curves
from benchmarks.lib.runner import run_agent, sets_per_algo
from benchmarks.lib.tables import write_table

# diagnostics averaged over the second half of training, when an agent reports them
DIAGNOSTICS = ("top_td_share", "hot_share", "warm_share", "cold_share")


def add_arguments(ap) -> None:
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--algos", nargs="+", default=["rmt", "dqn"])
    ap.add_argument("--steps", type=int, default=300_000)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threshold", type=float, default=None, help="count the seeds whose final return reaches it")
    ap.add_argument("--set", action="append", default=[], metavar="ALGO:KEY=VALUE",
                    help="an override for one agent, e.g. rmt:agent.lr=3e-4 (or KEY=VALUE for all)")
    ap.add_argument("--no-presets", action="store_true", help="every agent from its defaults, not its preset")
    ap.add_argument("--name", default=None)


def run(args):
    name = args.name or f"curves_{'_'.join(args.algos)}_{args.env.replace(':', '_')}"

    per_algo = sets_per_algo(args.set, args.algos)

    rows, curves, diag_rows = [], {}, []
    steps_axis = None
    for algo in args.algos:
        r = run_agent(algo, args.env, args.steps, args.seeds, per_algo[algo], args.seed, preset=not args.no_presets)
        print(r.summary(), flush=True)
        env_steps = r.metrics["env_steps"][0]
        steps_axis, pts = grid_points(r.metrics["episode_return"], env_steps, r.metrics["episode_count"], args.steps)
        curves[algo] = r.metrics["episode_return"]
        curves[f"{algo}_env_steps"] = env_steps
        curves[f"{algo}_episode_count"] = r.metrics["episode_count"]
        fr = r.final_return
        late = late_mean(r.metrics["episode_return"], env_steps, r.metrics["episode_count"], args.steps)
        sps = r.env_steps * args.seeds / r.run_seconds
        reach = "" if args.threshold is None else f"{int((fr >= args.threshold).sum())}/{len(fr)}"
        rows.append([algo] + ["–" if np.isnan(v) else f"{v:.1f}" for v in pts] +
                    [f"{np.nanmean(late):.1f}", f"{np.mean(fr):.1f}", f"{np.median(fr):.1f}", f"{np.min(fr):.1f}", reach,
                     f"{sps:,.0f}", f"{r.compile_seconds:.0f}", " ".join(f"{v:.0f}" for v in fr)])
        half = r.metrics["env_steps"].shape[1] // 2
        diag = {k: float(np.mean(r.metrics[k][:, half:])) for k in DIAGNOSTICS if k in r.metrics}
        if diag:
            diag_rows.append([algo] + [f"{diag.get(k, float('nan')):.3f}" for k in DIAGNOSTICS])

    header = (["agent"] + [f"{s / 1000:.4g}k" for s in steps_axis] +
              ["last 10% mean", "final mean", "final median", "final min", f"≥ {args.threshold:g}" if args.threshold is not None else "",
               "env-steps/s", "compile s", "final per seed"])
    notes = (f"Mean over {args.seeds} seeds of the return of each env's last finished episode, at ten points of "
             f"training ({args.steps:,} env steps per seed; each column reads an agent's last iteration at or before it, a "
             f"seed counted once it has finished an episode, – before any has); `final` is the same at the end; "
             f"`last 10% mean`: each seed's curve averaged over the iterations of the last tenth of training "
             f"(steadier than the final snapshot), then the mean over seeds. Env-steps/s counts "
             f"all seeds of the whole loop (acting, replay, learning); absolute numbers here are noisy, compare "
             f"rows of one run.")
    if diag_rows:
        notes += ("\n\nReplay diagnostics, mean over the second half of training (`top_td_share`: share of each "
                  "minibatch whose |TD error| is in the buffer's top 10%; a uniform draw gives 0.10):\n\n"
                  "| agent | " + " | ".join(DIAGNOSTICS) + " |\n|" + "---|" * (len(DIAGNOSTICS) + 1) + "\n" +
                  "\n".join("| " + " | ".join(r) + " |" for r in diag_rows))
    write_table("curves", name, f"Learning curves on {args.env}: {', '.join(args.algos)}", header, rows, notes)
    np.savez_compressed(runner.out("curves") / f"{name}.npz", **curves)  # per agent: returns [seeds, iters], env steps, episodes
    plot_curves(runner.out("curves") / f"{name}.png", args.env,
                {a: (curves[a], curves[f"{a}_env_steps"], curves[f"{a}_episode_count"]) for a in args.algos})
