"""Learning curves of several agents on one environment, at equal env steps, seeds vmapped.

    python -m benchmarks.curves --env CartPole-v1 --algos rmt dqn --seeds 8 --steps 300000 \
        --threshold 475 --name rmt_vs_dqn_CartPole-v1

Each agent runs from its preset for the env (`rmtjax/configs/{algo}_{env}.yaml`, else its
defaults) with `--set algo:key=value` overrides, all seeds in one compile. The table gives
each agent's mean episode return at ten evenly spaced points of training, the final return
per seed, how many seeds reach `--threshold`, and whole-loop env-steps/s; the curves go to
`results/NAME.npz` and, when matplotlib is installed, a plot to `results/NAME.png`.
"""

from __future__ import annotations

import argparse
import warnings
from collections import defaultdict

import jax
import numpy as np

import rmtjax
from benchmarks.common import RESULTS, pyplot, write_table
from rmtjax.config import parse_override

POINTS = 10
# diagnostics averaged over the second half of training, when an agent reports them
DIAGNOSTICS = ("top_td_share", "hot_share", "warm_share", "cold_share")


def curve_points(returns: np.ndarray, env_steps: np.ndarray, points: int = POINTS):
    """(steps [points], mean return over seeds at each, [seeds, points]) from per-iteration
    `returns` [seeds, iters]: each point is the iteration at the end of its tenth of training."""
    iters = returns.shape[1]
    idx = np.unique(np.linspace(iters / points, iters, points).round().astype(int) - 1)
    return env_steps[idx], returns[:, idx]


def grid_points(returns: np.ndarray, env_steps: np.ndarray, episodes: np.ndarray, total_steps: int,
                points: int = POINTS):
    """(grid [points], mean return over seeds at each grid point) for a table whose columns are
    the same for every agent: grid point g reads the last iteration at or before g (0.1% slack,
    for iterations that overshoot the budget by a few steps). A seed that has not finished an
    episode by then counts as missing (its metric holds 0, not a return); NaN where no seed has
    one, or where the agent's first iteration comes after g."""
    grid = np.linspace(total_steps / points, total_steps, points)
    values = episode_returns(returns, episodes)
    out = np.full(points, np.nan)
    for j, g in enumerate(grid):
        idx = np.searchsorted(env_steps, g * 1.001, side="right") - 1
        if idx >= 0 and not np.isnan(values[:, idx]).all():
            out[j] = np.nanmean(values[:, idx])
    return grid, out


def episode_returns(returns: np.ndarray, episodes: np.ndarray) -> np.ndarray:
    """`returns` [seeds, iters] with NaN before each seed's first finished episode (where the
    metric holds 0, not a return); `episodes` [seeds, iters] the episodes finished per iteration."""
    return np.where(np.cumsum(episodes, axis=1) > 0, returns, np.nan)


def late_mean(returns: np.ndarray, env_steps: np.ndarray, episodes: np.ndarray, total_steps: int,
              share: float = 0.1) -> np.ndarray:
    """[seeds] each seed's learning curve averaged over the iterations in the last `share` of
    training (NaN where the seed has finished no episode by then). Steadier than the final
    return, which is one snapshot of each env's last episode: on Breakout-MinAtar at 1M steps a
    seed's snapshot has a standard deviation of 5-8 over the iterations of the last tenth."""
    late = env_steps > total_steps * (1.0 - share)
    values = episode_returns(returns, episodes)[:, late]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a seed with no episode yet: NaN
        return np.nanmean(values, axis=1)


def smooth(values: np.ndarray, share: float = 0.01) -> np.ndarray:
    """[seeds, iters] trailing moving mean over a window of `share` of all iterations (at least 1), ignoring
    NaN (pre-episode) entries; NaN where the window holds none. For plots only."""
    window = max(1, int(values.shape[1] * share))
    ok = ~np.isnan(values)
    total = np.cumsum(np.where(ok, values, 0.0), axis=1)
    count = np.cumsum(ok, axis=1)
    total[:, window:] = total[:, window:] - total[:, :-window]
    count[:, window:] = count[:, window:] - count[:, :-window]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def run_agent(algo: str, env: str, steps: int, seeds: int, sets: list[str], seed: int, preset: bool = True):
    """Train `algo` on `env` from its preset for the env (or, with `preset=False` or without one,
    its defaults) with the `KEY=VALUE` overrides `sets`."""
    overrides = dict(parse_override(s) for s in sets)
    overrides.update({"train.total_steps": steps, "train.num_seeds": seeds, "train.progress": False,
                      "train.num_chunks": 10})
    if preset:
        cfg = rmtjax.make_config(algo, env, overrides)
    else:
        cfg = rmtjax.Config.from_dict({"algo": algo, "env": {"id": env}, "train": {}, "agent": {}}).override(overrides)
    return rmtjax.train(cfg, jax.random.key(seed))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = ap.parse_args(argv)
    name = args.name or f"curves_{'_'.join(args.algos)}_{args.env.replace(':', '_')}"

    per_algo = defaultdict(list)
    for s in args.set:
        algo, sep, rest = s.partition(":")
        if sep and "=" not in algo:
            per_algo[algo].append(rest)
        else:
            for a in args.algos:
                per_algo[a].append(s)

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
    write_table(name, f"Learning curves on {args.env}: {', '.join(args.algos)}", header, rows, notes)
    np.savez_compressed(RESULTS / f"{name}.npz", **curves)  # per agent: returns [seeds, iters], env steps, episodes
    _plot(name, args, {a: (curves[a], curves[f"{a}_env_steps"], curves[f"{a}_episode_count"]) for a in args.algos})


def _plot(name, args, curves):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for algo, (ret, x, episodes) in curves.items():
        ret = smooth(episode_returns(ret, episodes))
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before any episode
            ax.plot(x, np.nanmean(ret, 0), label=f"{algo} (mean of {ret.shape[0]})")
            ax.fill_between(x, np.nanmin(ret, 0), np.nanmax(ret, 0), alpha=0.2)
    ax.set_xlabel("env steps per seed (curves: moving mean over 1% of training)")
    ax.set_ylabel("episode return")
    ax.set_title(args.env)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=100)


if __name__ == "__main__":
    main()
