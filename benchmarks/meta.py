"""Meta-controller benchmark: fixed hyperparameters (meta.mode off) against each meta mode.

For every env and mode, one run of `--seeds` vmapped seeds with the same config apart from
`meta.mode`. Reported per (env, mode):

- score: each seed's mean `episode_return` over the last 10% of iterations, aggregated over
  seeds as IQM with a 95% percentile-bootstrap interval (`benchmarks/stats.py`);
- throughput: env steps per second of the run (all seeds, compile excluded), and its ratio
  to mode `off` on the same env: the meta-controller's cost.

    python benchmarks/meta.py [--envs CartPole-v1 Acrobot-v1 Pendulum-v1] [--steps N] [--seeds 16]
                              [--modes off rules bandit pbt] [--discrete rmt] [--continuous sac]
                              [--set meta.interval=20 ...] [--name meta] [--note TEXT]

`--steps 0` (the default) uses each preset's `train.total_steps` (100,000 without a preset).
Discrete envs use `--discrete` (default rmt); continuous ones `--continuous` (default sac, the
agent with a tuned Pendulum preset). `--set` adds dotted overrides to every run.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import rmtjax
from rmtjax.config import _preset_path, parse_override
from rmtjax.envs import make_env

from benchmarks.common import write_table
from benchmarks.stats import iqm_ci

MODES = ("off", "rules", "bandit", "pbt")


def config_for(env_id: str, mode: str, args) -> rmtjax.Config:
    probe = rmtjax.make_config("ppo", env_id)
    algo = args.discrete if make_env(probe.env).spec.discrete else args.continuous
    steps = args.steps or (rmtjax.make_config(algo, env_id).train.total_steps if _preset_path(algo, env_id).exists()
                           else 100_000)
    overrides = {"train.total_steps": steps, "train.num_seeds": args.seeds, "train.progress": False,
                 "train.num_chunks": 1, "meta.mode": mode}
    overrides.update(dict(parse_override(s) for s in args.set or []))
    return rmtjax.make_config(algo, env_id, overrides)


def score(result: rmtjax.TrainResult) -> np.ndarray:
    """Each seed's mean episode return over the last 10% of iterations."""
    ret = result.metrics["episode_return"]
    tail = max(1, ret.shape[1] // 10)
    return ret[:, -tail:].mean(axis=1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["CartPole-v1", "Acrobot-v1", "Pendulum-v1"])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--steps", type=int, default=0, help="env steps per seed (0: each preset's)")
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--discrete", default="rmt", help="agent for discrete-action envs")
    p.add_argument("--continuous", default="sac", help="agent for continuous-action envs")
    p.add_argument("--set", action="append", help="dotted override for every run, e.g. meta.interval=20")
    p.add_argument("--seed", type=int, default=0, help="PRNG seed (the same key for every run)")
    p.add_argument("--name", default="meta", help="results/NAME.md")
    p.add_argument("--note", default="", help="a line added above the notes (e.g. 'smoke run')")
    args = p.parse_args(argv)
    if "off" not in args.modes:
        args.modes = ["off", *args.modes]  # the baseline every ratio is taken against

    rows = []
    for env_id in args.envs:
        base_sps = None
        for mode in args.modes:
            cfg = config_for(env_id, mode, args)
            t0 = time.perf_counter()
            result = rmtjax.train(cfg, jax.random.key(args.seed))
            wall = time.perf_counter() - t0
            s = score(result)
            mid, lo, hi = iqm_ci(s)
            sps = result.env_steps * cfg.train.num_seeds / result.run_seconds
            if mode == "off":
                base_sps = sps
            rows.append([env_id, cfg.algo, mode, f"{mid:.1f}", f"[{lo:.1f}, {hi:.1f}]",
                         f"{np.mean(s):.1f}", f"{sps:,.0f}", f"{sps / base_sps:.2f}",
                         f"{result.compile_seconds:.0f}"])
            print(f"{env_id} {cfg.algo} {mode}: IQM {mid:.1f} [{lo:.1f}, {hi:.1f}], {sps:,.0f} steps/s "
                  f"({wall:.0f}s wall)", flush=True)

    cfg0 = config_for(args.envs[0], "off", args)
    notes = [args.note] if args.note else []
    notes += [
        f"{args.seeds} seeds per run, vmapped in one program; env steps per seed: "
        + ", ".join(f"{e} {config_for(e, 'off', args).train.total_steps:,}" for e in args.envs) + ".",
        "Score: each seed's mean episode return over the last 10% of iterations; IQM over seeds with a "
        "95% percentile-bootstrap interval (2,000 resamples of the seeds).",
        "Throughput: env steps per second of the whole run (all seeds, compile excluded); ratio = this mode / "
        "mode off on the same env and config: the meta-controller's cost (below 1: slower).",
        f"Meta settings: the `meta:` section's defaults (meta.interval={cfg0.meta.interval}, "
        f"meta.warmup={cfg0.meta.warmup}) plus any --set. Each (env, mode) is one run, so a mode's score "
        f"difference from off includes seed noise; the intervals say how much. On a machine shared with other "
        f"work the throughput ratios carry timing noise of several percent.",
    ]
    write_table(args.name, "Meta-controller: fixed hyperparameters vs each meta mode",
                ["env", "agent", "meta.mode", "IQM return", "95% CI", "mean", "env steps/s", "vs off",
                 "compile s"], rows, notes="\n\n".join(notes))


if __name__ == "__main__":
    main()
