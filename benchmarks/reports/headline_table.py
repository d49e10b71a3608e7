"""The headline table's plan and its builder: which rows it has and at what configuration, the
pieces each run stores, and the table and plots rebuilt from every stored piece (it trains
nothing: `python -m benchmarks headline` runs the rows, `--table` rebuilds the table).

A piece is results/headline/headline/NAME/<env>__<algo>__key<K>.npz (NAME: `headline`, `headline_gpu`,
`headline_repro`, `headline_smoke`): the seeds' scores, their binned curves, their greedy
evaluation and where and when they ran. The table goes to results/headline/NAME.md, a plot per
env to results/headline/NAME_<env>.png.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np

import rmtjax
from benchmarks.lib import runner
from benchmarks.lib.plots import pyplot
from benchmarks.lib.stats import iqm_along, iqm_ci
from benchmarks.lib.tables import write_table

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

# `--repro`: baselines at a published configuration *and budget*, to check that they reproduce the
# published number before a comparison with them is quoted (results/headline/headline_repro.md).
# (env, algo) -> (env steps, overrides on the preset, where they come from)
REPRO = {
    # rl-baselines3-zoo hyperparams/dqn.yml, LunarLander-v2 ("Tuned"): 1 env, a gradient step per
    # env step (train_freq 4, gradient_steps -1), target every 250 steps, ε 1 -> 0.1 over 12%,
    # Huber loss and a gradient-norm clip of 10 (stable-baselines3's DQN defaults)
    ("gymnasium:LunarLander-v3", "dqn"): (100_000, {
        "env.num_envs": 1, "agent.rollout_len": 4, "agent.updates_per_step": 1.0, "agent.batch_size": 128,
        "agent.buffer_size": 50_000, "agent.learning_starts": 0, "agent.lr": 6.3e-4, "agent.lr_end_frac": 1.0,
        "agent.gamma": 0.99, "agent.target_update_every": 250, "agent.eps_start": 1.0, "agent.eps_end": 0.1,
        "agent.eps_decay_frac": 0.12, "agent.loss": "huber", "agent.max_grad_norm": 10.0,
        "agent.hidden": [256, 256], "agent.double_q": False, "agent.n_step": 1},
        "rl-baselines3-zoo's (dqn.yml), at its 100k"),
    # the SAC presets are the zoo's (lr held constant; no gSDE for BipedalWalker): at its 500k
    ("gymnasium:LunarLanderContinuous-v3", "sac"): (500_000, {}, "rl-baselines3-zoo's (sac.yml), at its 500k"),
    ("gymnasium:BipedalWalker-v3", "sac"): (500_000, {}, "rl-baselines3-zoo's (sac.yml, no gSDE), at its 500k"),
    # the PPO presets are the zoo's; at the zoo's budget of 1M for LunarLander the headline row is the check
}
PUBLISHED_REPRO = {("gymnasium:LunarLander-v3", "dqn"): "154.4 ± 79.2 (zoo, 100k)",
                   ("gymnasium:LunarLanderContinuous-v3", "sac"): "260.4 ± 65.5 (zoo, 500k)",
                   ("gymnasium:BipedalWalker-v3", "sac"): "297.7 ± 33.1 (zoo, 500k)"}

# where each Box2D preset's settings come from (rmtjax/configs/{algo}_gymnasium_{env}.yaml say more)
PRESET_SOURCE = {"ppo": "preset: rl-baselines3-zoo's", "rmt": "preset: RMT's own, untuned",
                 "dqn": "preset: RMT's shared settings, not a published config",
                 "sac": "preset: rl-baselines3-zoo's (constant lr; no gSDE)"}

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


def config_for(env: str, algo: str, steps: int, seeds: int, smoke: bool, repro: bool = False):
    """The config of one row and a short description of where its settings come from."""
    overrides = {"train.total_steps": steps, "train.num_seeds": seeds, "train.progress": False,
                 "train.num_chunks": 1 if smoke else 20}
    if repro:
        _, settings, source = REPRO[(env, algo)]
        overrides.update(settings)
    elif env == ATARI_ENV:
        overrides.update(ATARI_ENV_SETTINGS)
        overrides.update(ATARI[algo])
        source = {"dqn": "CleanRL dqn_atari (smaller replay)", "ppo": "CleanRL ppo_atari",
                  "pqn": "purejaxql Atari, fewer envs", "rmt": "RMT defaults, DQN's replay ratio"}[algo]
    else:
        source = PRESET_SOURCE.get(algo, "preset") if _has_preset(algo, env) else "defaults (no preset)"
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
    if args.repro:
        rows = [(e, a, steps) for (e, a), (steps, _, _) in REPRO.items()]
        return [r for r in rows if (not args.envs or r[0] in args.envs) and (not args.algos or r[1] in args.algos)]
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
    if values.size == 0 or np.all(np.isnan(values)):
        return "no episode finished"
    m, lo, hi = iqm_ci(values[~np.isnan(values)])
    return f"{m:.1f} [{lo:.1f}, {hi:.1f}]"


# --- rows run in pieces -------------------------------------------------------------------------
#
# A row is expensive (hours for the off-policy agents on host-stepped Box2D), so every invocation
# stores what it ran as a *piece*: results/headline/headline/NAME/<env>__<algo>__key<K>.npz with the seeds' scores,
# binned curves and where and when it ran. The table is rebuilt from every piece stored under
# NAME, so rows (and seeds of a row, under different keys) run in separate invocations, sessions
# or machines add up to one table; a piece already stored is not run again.

CURVE_POINTS = 500  # curves are stored binned to at most this many points per seed
EVAL_EPISODES = 20  # greedy evaluation episodes per seed after training

# published results of the baselines' configurations, for the reproduction check (one run each,
# deterministic evaluation; rl-baselines3-zoo benchmark.md; their v2 envs, at their budgets)
PUBLISHED = {
    ("gymnasium:LunarLander-v3", "ppo"): "242.1 ± 31.8 (zoo, 1M)",
    ("gymnasium:LunarLanderContinuous-v3", "ppo"): "270.9 ± 32.1 (zoo, 1M)",
    ("gymnasium:BipedalWalker-v3", "ppo"): "213.3 ± 129.5 (zoo, 5M)",
    ("gymnasium:LunarLanderContinuous-v3", "sac"): "260.4 ± 65.5 (zoo, 500k)",
    ("gymnasium:BipedalWalker-v3", "sac"): "297.7 ± 33.1 (zoo, 500k)",
}


def piece_path(name: str, env: str, algo: str, key: int) -> Path:
    return runner.RESULTS / "headline" / name / f"{env.replace(':', '_')}__{algo}__key{key}.npz"


def binned(values: np.ndarray, env_steps: np.ndarray, points: int = CURVE_POINTS):
    """values [seeds, iters] (NaN: no episode yet) averaged over `points` runs of iterations."""
    edges = np.linspace(0, values.shape[1], min(points, values.shape[1]) + 1).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a bin before a seed's first episode: NaN
        curve = np.stack([np.nanmean(values[:, a:b], axis=1) for a, b in zip(edges[:-1], edges[1:])], axis=1)
    return curve, env_steps[edges[1:] - 1]


def training_mean(curve: np.ndarray) -> np.ndarray:
    """[seeds] each seed's binned learning curve averaged over all of training (the area under
    the curve per env step; a bin before the seed's first episode counts as its first value)."""
    filled = np.where(np.isnan(curve), np.nan_to_num(curve[np.arange(len(curve)), np.argmax(~np.isnan(curve), 1)])[:, None],
                      curve)
    return filled.mean(axis=1)


def save_piece(path: Path, *, scores, returns, env_steps, meta: dict, eval_scores=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    curve, steps = binned(returns, env_steps)
    extra = {} if eval_scores is None else {"eval_scores": np.asarray(eval_scores, np.float64)}
    np.savez_compressed(path, scores=np.asarray(scores, np.float64), curve=curve, curve_env_steps=steps,
                        meta=np.array(json.dumps(meta)), **extra)


def load_pieces(name: str, results=None) -> dict[tuple[str, str], list[dict]]:
    """(env, algo) -> the pieces stored under results/headline/NAME (`results`: another results
    folder), in key order."""
    out: dict[tuple[str, str], list[dict]] = {}
    for path in sorted((Path(results or runner.RESULTS) / "headline" / name).glob("*.npz")):
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            piece = {**meta, "scores": z["scores"], "curve": z["curve"], "curve_env_steps": z["curve_env_steps"],
                     "eval_scores": z["eval_scores"] if "eval_scores" in z.files else None, "path": path}
        out.setdefault((meta["env"], meta["algo"]), []).append(piece)
    for pieces in out.values():
        pieces.sort(key=lambda p: p["key"])
    return out


def write_headline(name: str, args) -> None:
    """The table of every planned row (the whole plan, not only this invocation's filter) from the
    pieces stored under `name`, the pieces' provenance and a plot per env."""
    plan = rows_to_run(argparse.Namespace(**{**vars(args), "envs": None, "algos": None}))
    pieces = load_pieces(name)
    table, provenance = [], []
    claims = {} if args.repro else CLAIMS  # the design's claims are at 1M, not these budgets
    for env, algo, steps in plan:
        got = pieces.get((env, algo), [])
        published = (PUBLISHED_REPRO if args.repro else PUBLISHED).get((env, algo), "")
        if not got:
            table.append([env, algo, _source(env, algo, args.smoke, args.repro), f"{steps:,}", 0,
                          "not run yet", "", "", "",
                          claims.get((env, algo), ""), published, ""])
            continue
        scores = np.concatenate([p["scores"] for p in got])
        evals = [p["eval_scores"] for p in got if p["eval_scores"] is not None]
        evaluated = np.concatenate(evals) if evals else np.zeros(0)
        eval_cell = (fmt(evaluated) + ("" if len(evaluated) == len(scores) else f" ({len(evaluated)} seeds)")
                     if len(evaluated) else "—")
        env_steps = {p["env_steps"] for p in got}
        table.append([env, algo, got[0]["source"], " / ".join(f"{s:,}" for s in sorted(env_steps)), len(scores),
                      fmt(scores), " ".join("nan" if np.isnan(v) else f"{v:.1f}" for v in scores),
                      fmt(np.concatenate([training_mean(p["curve"]) for p in got])), eval_cell,
                      claims.get((env, algo), ""), published,
                      f"{sum(p['run_seconds'] + p['compile_seconds'] for p in got):.0f}"])
        for p in got:
            provenance.append([env, algo, p["key"], p["seeds"], f"{p['env_steps']:,}", p["git"], p["date"],
                               p["load"], f"{p['run_seconds']:.0f} + {p['compile_seconds']:.0f}", p["note"] or ""])
    notes = _notes(args) + "\n\n**Pieces** (each row is the union of its pieces' seeds; a piece is one invocation):\n\n"
    notes += "\n".join(["| env | agent | key | seeds | env steps | git | date | load (1/5/15 min) | run + compile s | note |",
                        "|---|---|---|---|---|---|---|---|---|---|"]
                       + ["| " + " | ".join(str(c) for c in r) + " |" for r in provenance])
    title = ("Reproductions: baselines at a published configuration and budget (issue 22)"
             if args.repro else "Headline table (issue 22)")
    write_table("headline", name, title + (" — smoke run, not results" if args.smoke else ""),
                ["env", "agent", "configuration", "env steps per seed", "seeds", "IQM of last-10% return [95% CI]",
                 "per seed", "IQM of the mean over training (area under the curve)",
                 f"greedy eval IQM ({EVAL_EPISODES} episodes a seed)", "design claims",
                 "published (its config)", "seconds"], table, notes=notes)
    _plot(name, pieces)


def _source(env: str, algo: str, smoke: bool, repro: bool = False) -> str:
    return config_for(env, algo, 1_000_000, 1, smoke, repro)[1]


def _notes(args) -> str:
    return (f"A seed's score is its mean episode return over the last 10% of training (the training episodes, with "
            f"the agent's exploration); IQM over seeds with a 95% percentile-bootstrap interval. 'mean over "
            f"training': each seed's learning curve averaged over all its env steps (bins of equal env steps), "
            f"which credits learning early. 'greedy eval': "
            f"after training, each seed's mean return over {EVAL_EPISODES} greedy episodes (the deterministic "
            f"policy) on fresh envs (`rmtjax.evaluate`), IQM over seeds — what 'published' reports (a row the "
            f"evaluation was added after has '—'). 'design claims' is "
            f"the number the starting design claimed at 1M steps (Breakout: at its own, unstated, budget). Atari "
            f"rows: real Breakout through ale-py with sticky actions 0.25, frame skip 4, 84×84 grey, 4 stacked "
            f"frames, rewards clipped for learning (the score is the raw game score). 'seconds': run + compile of "
            f"all the row's pieces, on a machine that may have run other jobs beside them (see each piece's load). "
            + ("SMOKE RUN: a few hundred steps, to check the script; the numbers mean nothing." if args.smoke
               else ""))


def _plot(name: str, pieces: dict) -> None:
    plt = pyplot()
    if plt is None or not pieces:
        return
    for env in sorted({e for e, _ in pieces}):
        fig, ax = plt.subplots(figsize=(6, 4))
        for (e, algo), got in sorted(pieces.items()):
            if e != env:
                continue
            n = min(p["curve"].shape[1] for p in got)  # pieces of one row share their length unless steps differ
            curve = np.concatenate([p["curve"][:, :n] for p in got])
            ax.plot(got[0]["curve_env_steps"][:n], iqm_along(curve, axis=0), label=f"{algo} ({curve.shape[0]} seeds)")
        ax.set_xlabel("env steps per seed")
        ax.set_ylabel("episode return (IQM over seeds)")
        ax.set_title(env)
        ax.legend()
        fig.tight_layout()
        fig.savefig(runner.out("headline") / f"{name}_{env.replace(':', '_')}.png", dpi=100)
        plt.close(fig)


def resolve(args) -> str:
    """Check the plan's options, fill in what they leave to the mode; the table's name."""
    if args.smoke and args.gpu:
        raise SystemExit("error: --smoke and --gpu exclude each other")
    args.steps = args.steps or (512 if args.smoke else 1_000_000)
    if args.smoke:
        args.atari_steps = 128
    if args.repro and (args.smoke or args.gpu):
        raise SystemExit("error: --repro runs the reproduction rows alone")
    return args.name or ("headline_smoke" if args.smoke else "headline_gpu" if args.gpu else
                         "headline_repro" if args.repro else "headline")


def add_arguments(ap) -> None:
    ap.add_argument("--steps", type=int, default=None, help="env steps per seed of the Box2D rows (default 1M)")
    ap.add_argument("--atari-steps", type=int, default=200_000, help="env steps per seed of the Breakout rows on a CPU")
    ap.add_argument("--envs", nargs="+", default=None, help="ignored: the table lists every row of the plan")
    ap.add_argument("--algos", nargs="+", default=None, help="ignored: the table lists every row of the plan")
    ap.add_argument("--gpu", action="store_true", help="the plan with the 10M-step Atari and MinAtar rows")
    ap.add_argument("--smoke", action="store_true", help="the smoke run's plan")
    ap.add_argument("--repro", action="store_true", help="the reproduction rows (results/headline/headline_repro.md)")
    ap.add_argument("--name", default=None)


def run(args) -> None:
    """Rebuild the table and plots from the stored pieces (`python -m benchmarks claims` then
    carries the headline row into the claims table)."""
    write_headline(resolve(args), args)
