"""The headline table of issue 22: RMT against PPO, SAC, DQN and PQN, each at a stated configuration.

    python -m benchmarks headline                 # CPU: the Box2D rows at 1M steps × 5 seeds, Breakout at --atari-steps
    python -m benchmarks headline --gpu           # GPU: the above, then real Breakout and the five MinAtar games at 10M
    python -m benchmarks headline --smoke         # every code path at a few hundred steps: minutes, any machine
    python -m benchmarks headline --envs gymnasium:LunarLander-v3 --algos rmt ppo   # some rows
    python -m benchmarks headline --envs gymnasium:BipedalWalker-v3 --algos sac --seeds 1 --seed 3   # one seed
    python -m benchmarks headline --table         # rebuild the table from what is stored
    python -m benchmarks headline --repro         # baselines at a published config and budget

Rows run in pieces: each invocation stores every row it trains (its seeds, from key `--seed`) in
`results/headline/NAME/<env>__<algo>__key<K>.npz`, and the table is rebuilt from all the pieces stored
under NAME. A long table is therefore run a few rows at a time, across sessions or machines, and
a row's seeds can be split over keys (`--seeds 1 --seed 0`, `--seed 1`, ...); a stored piece is
not run again (`--redo` forces it). The table lists every row of the plan, those without a piece
as "not run yet", and a second table gives each piece's commit, date, machine load and seconds.

Rows (env × agent; an agent runs where its action space fits):

- `gymnasium:LunarLander-v3` (discrete): RMT, PPO, DQN, PQN;
- `gymnasium:LunarLanderContinuous-v3` and `gymnasium:BipedalWalker-v3`: RMT (11 bins per action
  dimension), PPO, SAC;
- `atari:Breakout` (real Atari, ale-py, the standard protocol: frame skip 4, max-pool, 84×84 grey,
  sticky actions 0.25, no episodic life, 4 stacked frames, rewards clipped for learning and raw
  scores logged): RMT, DQN, PQN, PPO, all with the Nature CNN, at `--atari-steps` (CPU default
  200k per seed: what a 2-core machine does in hours, not the 10M of the literature);
- with `--gpu`: Breakout at 10M steps and the five MinAtar games at 10M (RMT, DQN, PQN).

Configurations, so that no row is a straw man: the Box2D rows use the bundled presets
(`rmtjax/configs/{algo}_gymnasium_{env}.yaml`, each says where its numbers come from; PQN on
LunarLander has none and runs from its defaults, and says so in the table). The Atari rows use
the settings in `ATARI` below (DQN: CleanRL's `dqn_atari.py` — Adam 1e-4, batch 32, target
every 1,000 updates, one update per 4 env steps, ε 1 → 0.01 over the first 10%; the replay is
smaller than its 1M frames on a CPU budget; PPO: CleanRL's `ppo_atari.py` — 8 envs × 128
steps, 4 epochs, 4 minibatches, lr 2.5e-4 annealed, clip 0.1, entropy 0.01; PQN: purejaxql's
Atari file scaled down in envs; RMT: its own defaults with DQN's replay ratio and the Nature
CNN). The MinAtar rows use each agent's preset for Breakout-MinAtar, else its defaults.

A seed's score is its learning curve averaged over the last 10% of training
(`benchmarks.lib.curves.late_mean`); a row gives the IQM over seeds with a 95% percentile-bootstrap
interval (`benchmarks.lib.stats.iqm_ci`) and every seed's score, beside the design's claimed number
where it made one. Curves (`episode_return` per seed, binned to at most 500 points) are stored
in the pieces and plotted per env to `results/headline/NAME_<env>.png`. The table, with the command,
machine, date and commit, goes to `results/headline/NAME.md` (`headline`, `headline_gpu`, or
`headline_smoke` for `--smoke`).
"""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

import jax
import numpy as np

import rmtjax
from benchmarks.lib import runner
from benchmarks.lib.curves import episode_returns, late_mean
from benchmarks.lib.runner import git_rev, machine
from benchmarks.reports import claims
from benchmarks.reports.headline_table import (ATARI_ENV, EVAL_EPISODES, config_for, piece_path, resolve,
                                               rows_to_run, save_piece, write_headline)


def run_piece(name: str, env: str, algo: str, steps: int, args) -> Path:
    """Train one row's `args.seeds` seeds from key `args.seed` and store them as a piece."""
    cfg, source = config_for(env, algo, steps, args.seeds, args.smoke, args.repro)
    t0 = time.time()
    result = rmtjax.train(cfg, jax.random.key(args.seed))
    m = result.metrics
    env_steps = m["env_steps"][0]
    scores = late_mean(m["episode_return"], env_steps, m["episode_count"], int(env_steps[-1]))
    # greedy evaluation episodes per seed, as published results (e.g. rl-baselines3-zoo's) report
    evaluation = rmtjax.evaluate(result, episodes=EVAL_EPISODES if not args.smoke else 2,
                                 key=jax.random.key(args.seed + 10_000))
    path = piece_path(name, env, algo, args.seed)
    save_piece(path, scores=scores, eval_scores=evaluation.returns.mean(axis=1),
               returns=episode_returns(m["episode_return"], m["episode_count"]), env_steps=env_steps,
               meta={"env": env, "algo": algo, "source": source, "key": args.seed, "seeds": args.seeds,
                     "env_steps": int(env_steps[-1]), "run_seconds": round(result.run_seconds, 1),
                     "compile_seconds": round(result.compile_seconds, 1), "wall_seconds": round(time.time() - t0, 1),
                     "git": git_rev(), "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
                     "machine": machine(), "load": _load(), "note": args.note})
    print(env, algo, f"key {args.seed}", np.round(scores, 1), f"{time.time() - t0:.0f}s", flush=True)
    return path


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def add_arguments(ap) -> None:
    ap.add_argument("--steps", type=int, default=None, help="env steps per seed of the Box2D rows (default 1M)")
    ap.add_argument("--atari-steps", type=int, default=200_000, help="env steps per seed of the Breakout rows on a CPU")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per row (default 5; --smoke: 2)")
    ap.add_argument("--seed", type=int, default=0, help="the key of this invocation's pieces (another key: more seeds)")
    ap.add_argument("--envs", nargs="+", default=None, help="only these envs")
    ap.add_argument("--algos", nargs="+", default=None, help="only these agents")
    ap.add_argument("--gpu", action="store_true", help="add the 10M-step Atari and MinAtar rows (for a GPU)")
    ap.add_argument("--smoke", action="store_true", help="three rows at a few hundred steps: checks the script")
    ap.add_argument("--repro", action="store_true", help="the reproduction rows: baselines at a published config "
                                                         "and budget (results/headline/headline_repro.md)")
    ap.add_argument("--table", action="store_true", help="run nothing: rebuild the table from the stored pieces")
    ap.add_argument("--redo", action="store_true", help="run a piece again even if it is stored")
    ap.add_argument("--note", default="", help="a line stored with each piece (e.g. what else the machine ran)")
    ap.add_argument("--name", default=None)


def run(args):
    name = resolve(args)
    args.seeds = args.seeds or (2 if args.smoke else 5)

    started = time.time()
    for env, algo, steps in ([] if args.table else rows_to_run(args)):
        if args.smoke and env == ATARI_ENV:
            steps = args.atari_steps
        path = piece_path(name, env, algo, args.seed)
        if path.exists() and not args.redo:
            print(f"{env} {algo} key {args.seed}: stored in {path.relative_to(runner.RESULTS)}; --redo runs it again")
            continue
        run_piece(name, env, algo, steps, args)
        write_tables(name, args)
        print(f"{time.time() - started:.0f}s so far", flush=True)
    write_tables(name, args)


def write_tables(name: str, args) -> None:
    """The table from every stored piece; for the headline table, its row in results/claims/claims.md too."""
    write_headline(name, args)
    if name == "headline":
        claims.upsert_row(claims.headline_row())
