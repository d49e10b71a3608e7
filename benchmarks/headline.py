"""The headline table of issue 22: RMT against PPO, SAC, DQN and PQN, each at a stated configuration.

    python -m benchmarks.headline                 # CPU: the Box2D rows at 1M steps × 5 seeds, Breakout at --atari-steps
    python -m benchmarks.headline --gpu           # GPU: the above, then real Breakout and the five MinAtar games at 10M
    python -m benchmarks.headline --smoke         # every code path at a few hundred steps: minutes, any machine
    python -m benchmarks.headline --envs gymnasium:LunarLander-v3 --algos rmt ppo --seeds 8

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
(`benchmarks.curves.late_mean`); a row gives the IQM over seeds with a 95% percentile-bootstrap
interval (`benchmarks.stats.iqm_ci`) and every seed's score, beside the design's claimed number
where it made one. Curves (`episode_return` per iteration and seed, with env steps) go to
`results/NAME.npz` and a plot per env to `results/NAME_<env>.png`. The table, with the command,
machine, date and commit, goes to `results/NAME.md` (`headline`, `headline_gpu`, or
`headline_smoke` for `--smoke`).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import rmtjax
from benchmarks.common import RESULTS, pyplot, write_table
from benchmarks.curves import late_mean
from benchmarks.stats import iqm_ci

BOX2D = {
    "gymnasium:LunarLander-v3": ("rmt", "ppo", "dqn", "pqn"),
    "gymnasium:LunarLanderContinuous-v3": ("rmt", "ppo", "sac"),
    "gymnasium:BipedalWalker-v3": ("rmt", "ppo", "sac"),
}
ATARI_ENV = "atari:Breakout"
MINATAR = ("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar", "SpaceInvaders-MinAtar")
MINATAR_ALGOS = ("rmt", "dqn", "pqn")

# the design's claimed returns at 1M steps (DESIGN.md's headline table); it names "LunarLander"
# without saying which, so SAC's claim (continuous actions only) sits beside LunarLanderContinuous
CLAIMS = {
    ("gymnasium:LunarLander-v3", "rmt"): 285, ("gymnasium:LunarLander-v3", "ppo"): 198,
    ("gymnasium:LunarLanderContinuous-v3", "sac"): 231,
    ("gymnasium:BipedalWalker-v3", "rmt"): 312, ("gymnasium:BipedalWalker-v3", "ppo"): 187,
    ("gymnasium:BipedalWalker-v3", "sac"): 269,
    (ATARI_ENV, "rmt"): 452, (ATARI_ENV, "ppo"): 318,
}

# the Atari protocol's wrappers that live in rmtjax's env section (the rest is the atari: adapter's)
ATARI_ENV_SETTINGS = {"env.frame_stack": 4, "env.reward_clip": 1.0}
ATARI = {
    "dqn": {"env.num_envs": 4, "agent.torso": "nature_cnn", "agent.hidden": [512], "agent.lr": 1e-4,
            "agent.batch_size": 32, "agent.buffer_size": 100_000, "agent.learning_starts": 20_000,
            "agent.target_update_every": 1_000, "agent.updates_per_step": 0.25, "agent.rollout_len": 4,
            "agent.eps_end": 0.01, "agent.eps_decay_frac": 0.1, "agent.loss": "huber", "agent.gamma": 0.99},
    "rmt": {"env.num_envs": 4, "agent.torso": "nature_cnn", "agent.hidden": [512], "agent.lr": 1e-4,
            "agent.batch_size": 32, "agent.buffer_size": 100_000, "agent.learning_starts": 20_000,
            "agent.updates_per_step": 0.25, "agent.rollout_len": 4, "agent.eps_end": 0.01,
            "agent.eps_decay_frac": 0.1},
    "ppo": {"env.num_envs": 8, "agent.torso": "nature_cnn", "agent.hidden": [512], "agent.activation": "relu",
            "agent.rollout_len": 128, "agent.num_epochs": 4, "agent.num_minibatches": 4, "agent.lr": 2.5e-4,
            "agent.clip_eps": 0.1, "agent.ent_coef": 0.01, "agent.vf_coef": 0.5, "agent.max_grad_norm": 0.5},
    "pqn": {"env.num_envs": 16, "agent.torso": "nature_cnn", "agent.hidden": [512], "agent.rollout_len": 32,
            "agent.num_epochs": 2, "agent.num_minibatches": 4, "agent.lr": 2.5e-4, "agent.td_lambda": 0.65,
            "agent.eps_end": 0.001, "agent.eps_decay_frac": 0.1},
}
# what --smoke puts on top of a row: a few iterations, small buffers
SMOKE = {"dqn": {"agent.buffer_size": 512, "agent.learning_starts": 64, "agent.batch_size": 16},
         "rmt": {"agent.buffer_size": 512, "agent.learning_starts": 64, "agent.batch_size": 16},
         "sac": {"agent.buffer_size": 512, "agent.learning_starts": 64, "agent.batch_size": 16},
         "ppo": {"agent.rollout_len": 16, "agent.num_minibatches": 2},
         "pqn": {"agent.rollout_len": 8, "agent.num_minibatches": 2}}
SMOKE_ROWS = (("gymnasium:LunarLander-v3", "ppo"), ("gymnasium:LunarLanderContinuous-v3", "sac"),
              (ATARI_ENV, "dqn"))


def config_for(env: str, algo: str, steps: int, seeds: int, smoke: bool):
    """The config of one row and a short description of where its settings come from."""
    overrides = {"train.total_steps": steps, "train.num_seeds": seeds, "train.progress": False,
                 "train.num_chunks": 1 if smoke else 20}
    if env == ATARI_ENV:
        overrides.update(ATARI_ENV_SETTINGS)
        overrides.update(ATARI[algo])
        source = {"dqn": "CleanRL dqn_atari (smaller replay)", "ppo": "CleanRL ppo_atari",
                  "pqn": "purejaxql Atari, fewer envs", "rmt": "RMT defaults, DQN's replay ratio"}[algo]
    else:
        source = "preset" if _has_preset(algo, env) else "defaults (no preset)"
    if smoke:
        overrides.update(SMOKE[algo])
        if env == ATARI_ENV:
            overrides["env.num_envs"] = 2
            if algo in ("dqn", "rmt"):
                overrides["agent.hidden"] = [32]
        if algo == "ppo" and env != ATARI_ENV:
            overrides["env.num_envs"] = 4
    return rmtjax.make_config(algo, env, overrides), source


def _has_preset(algo: str, env: str) -> bool:
    from importlib import resources

    name = f"{algo}_{env.replace(':', '_')}.yaml"
    return resources.files("rmtjax.configs").joinpath(name).is_file()


def rows_to_run(args) -> list[tuple[str, str, int]]:
    """(env, algo, env steps per seed) for every row this invocation runs."""
    if args.smoke:
        return [(e, a, args.steps) for e, a in SMOKE_ROWS]
    rows = [(e, a, args.steps) for e, algos in BOX2D.items() for a in algos]
    atari_steps = 10_000_000 if args.gpu else args.atari_steps
    rows += [(ATARI_ENV, a, atari_steps) for a in ("rmt", "dqn", "pqn", "ppo")]
    if args.gpu:
        rows += [(g, a, 10_000_000) for g in MINATAR for a in MINATAR_ALGOS]
    if args.envs:
        rows = [r for r in rows if r[0] in args.envs]
    if args.algos:
        rows = [r for r in rows if r[1] in args.algos]
    return rows


def fmt(values) -> str:
    values = np.asarray(values, float)
    if np.all(np.isnan(values)):
        return "no episode finished"
    m, lo, hi = iqm_ci(values[~np.isnan(values)])
    return f"{m:.1f} [{lo:.1f}, {hi:.1f}]"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="env steps per seed of the Box2D rows (default 1M)")
    ap.add_argument("--atari-steps", type=int, default=200_000, help="env steps per seed of the Breakout rows on a CPU")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per row (default 5; --smoke: 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--envs", nargs="+", default=None, help="only these envs")
    ap.add_argument("--algos", nargs="+", default=None, help="only these agents")
    ap.add_argument("--gpu", action="store_true", help="add the 10M-step Atari and MinAtar rows (for a GPU)")
    ap.add_argument("--smoke", action="store_true", help="three rows at a few hundred steps: checks the script")
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    if args.smoke and args.gpu:
        ap.error("--smoke and --gpu exclude each other")
    args.steps = args.steps or (512 if args.smoke else 1_000_000)
    args.seeds = args.seeds or (2 if args.smoke else 5)
    if args.smoke:
        args.atari_steps = 128
    name = args.name or ("headline_smoke" if args.smoke else "headline_gpu" if args.gpu else "headline")

    table, curves, started = [], {}, time.time()
    for env, algo, steps in rows_to_run(args):
        if args.smoke and env == ATARI_ENV:
            steps = args.atari_steps
        cfg, source = config_for(env, algo, steps, args.seeds, args.smoke)
        result = rmtjax.train(cfg, jax.random.key(args.seed))
        m = result.metrics
        env_steps = m["env_steps"][0]
        scores = late_mean(m["episode_return"], env_steps, m["episode_count"], int(env_steps[-1]))
        key = f"{env.replace(':', '_')}__{algo}"
        curves[key] = m["episode_return"]
        curves[key + "__env_steps"] = env_steps
        curves[key + "__episode_count"] = m["episode_count"]
        claim = CLAIMS.get((env, algo), "")
        table.append([env, algo, source, f"{int(env_steps[-1]):,}", args.seeds, fmt(scores),
                      " ".join("nan" if np.isnan(v) else f"{v:.1f}" for v in scores), claim,
                      f"{result.run_seconds + result.compile_seconds:.0f}"])
        print(env, algo, np.round(scores, 1), f"{time.time() - started:.0f}s", flush=True)
        RESULTS.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(RESULTS / f"{name}.npz", **curves)
        write_table(name, "Headline table (issue 22)" + (" — smoke run, not results" if args.smoke else ""),
                    ["env", "agent", "configuration", "env steps per seed", "seeds", "IQM of last-10% return [95% CI]",
                     "per seed", "design claims", "seconds"], table, notes=_notes(args))
    _plot(name, curves)


def _notes(args) -> str:
    return (f"Key {args.seed}. A seed's score is its mean episode return over the last 10% of training; IQM over "
            f"seeds with a 95% percentile-bootstrap interval. 'design claims' is the number the starting design "
            f"claimed at 1M steps (Breakout: at its own, unstated, budget). Atari rows: real Breakout through "
            f"ale-py with sticky actions 0.25, frame skip 4, 84×84 grey, 4 stacked frames, rewards clipped for "
            f"learning (the score is the raw game score). " + ("SMOKE RUN: a few hundred steps, to check the "
                                                             "script; the numbers mean nothing." if args.smoke
                                                             else ""))


def _plot(name: str, curves: dict) -> None:
    plt = pyplot()
    if plt is None:
        return
    from benchmarks.curves import episode_returns
    from benchmarks.stats import iqm_along

    envs = sorted({k.split("__")[0] for k in curves})
    for env in envs:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key in sorted(k for k in curves if k.startswith(env + "__") and k.count("__") == 1):
            returns = episode_returns(curves[key], curves[key + "__episode_count"])
            ax.plot(curves[key + "__env_steps"], iqm_along(returns, axis=0), label=key.split("__")[1])
        ax.set_xlabel("env steps per seed")
        ax.set_ylabel("episode return (IQM over seeds)")
        ax.set_title(env.replace("_", ":", 1))
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / f"{name}_{env}.png", dpi=100)
        plt.close(fig)


if __name__ == "__main__":
    main()
