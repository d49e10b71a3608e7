"""What each agent reaches on the issue's environments at short CPU budgets: LunarLander
(discrete and continuous) and BipedalWalker through the gymnasium adapter, Breakout-MinAtar
in JAX.

    python -m benchmarks more_envs                    # every row below, 2 seeds each
    python -m benchmarks more_envs --scale 0.1 --only LunarLander   # a quick look at a few rows

Each row is one run of `--seeds` vmapped seeds from the agent's preset for the env
(`rmtjax/configs/`, else its defaults) with the row's overrides, at the row's env steps per
seed (times `--scale`). The budgets fit this project's 2-core CPU (27 minutes for the whole
table, other jobs sharing the cores at load 5-7); they are far below what these envs need (LunarLander and
BipedalWalker are usually trained for 0.5-5M steps), so the table says where each agent is
after a short run, not what it can reach. A random policy's return, measured here through
the same env adapter, is given as the reference. The full runs are one command each
(`rmtjax train --algo A --env E --set train.num_seeds=S`, printed under the table), meant for
a GPU or a bigger machine.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import rmtjax
from benchmarks.lib.tables import write_table
from rmtjax.config import EnvConfig, _preset_path, parse_override
from rmtjax.envs import make_env

LL = "gymnasium:LunarLander-v3"
LLC = "gymnasium:LunarLanderContinuous-v3"
BW = "gymnasium:BipedalWalker-v3"
BO = "Breakout-MinAtar"

# (env, agent, env steps per seed, overrides of the preset for this CPU budget). Off-policy
# warm-ups are shortened to fit the budget and buffers to its size; SAC does a quarter of an
# update per env step instead of one (its 256×256 updates dominate the time on this CPU).
ROWS = [
    (LL, "rmt", 50_000, ["agent.learning_starts=2000", "agent.buffer_size=50000"]),
    (LL, "dqn", 50_000, ["agent.learning_starts=2000", "agent.buffer_size=50000"]),
    (LL, "ppo", 300_000, []),
    (LLC, "sac", 20_000, ["agent.learning_starts=2000", "agent.buffer_size=50000", "agent.updates_per_step=0.25"]),
    (LLC, "rmt", 50_000, ["agent.learning_starts=2000", "agent.buffer_size=50000"]),
    (LLC, "ppo", 300_000, []),
    (BW, "sac", 20_000, ["agent.learning_starts=2000", "agent.buffer_size=50000", "agent.updates_per_step=0.25"]),
    (BW, "ppo", 200_000, []),
    (BW, "rmt", 40_000, ["agent.learning_starts=2000", "agent.buffer_size=50000"]),
    (BO, "rmt", 30_000, []),
    (BO, "ppo", 300_000, []),
]

# random-policy reference: (envs, steps per env) of uniformly random actions
RANDOM_ROLLOUT = {LL: (8, 1000), LLC: (8, 1000), BW: (8, 2000), BO: (8, 2000)}


def random_policy_return(env_id: str, num_envs: int, steps: int, seed: int = 0) -> tuple[float, float, int]:
    """(mean, std, count) of the returns of the episodes a uniformly random policy completes in
    `steps` steps of `num_envs` envs, through the same env adapter and episode statistics."""
    env = make_env(EnvConfig(id=env_id, num_envs=num_envs))
    spec = env.spec

    def act(k):
        if spec.discrete:
            return jax.random.randint(k, (num_envs,), 0, spec.num_actions)
        return jax.random.uniform(k, (num_envs, *spec.action_shape), minval=jnp.asarray(spec.action_low),
                                  maxval=jnp.asarray(spec.action_high))

    def body(state, k):
        ka, ks = jax.random.split(k)
        _, state, _, _, _, info = env.step(ks, state, act(ka))
        return state, (info["raw_reward"], info["done"])

    @jax.jit
    def run(key):
        _, state = env.reset(key)
        _, out = jax.lax.scan(body, state, jax.random.split(jax.random.key(seed + 1), steps))
        return out

    rewards, dones = (np.asarray(x) for x in run(jax.random.key(seed)))
    returns = []
    for e in range(num_envs):
        acc = 0.0
        for r, d in zip(rewards[:, e], dones[:, e]):
            acc += float(r)
            if d:
                returns.append(acc)
                acc = 0.0
    return float(np.mean(returns)), float(np.std(returns)), len(returns)


def run_row(env_id, algo, steps, sets, seeds, seed):
    overrides = dict(parse_override(s) for s in sets)
    overrides.update({"train.total_steps": steps, "train.num_seeds": seeds, "train.progress": False,
                      "train.num_chunks": 10})
    cfg = rmtjax.make_config(algo, env_id, overrides)
    t0 = time.perf_counter()
    result = rmtjax.train(cfg, jax.random.key(seed))
    return result, time.perf_counter() - t0


def add_arguments(ap) -> None:
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every row's env steps by this")
    ap.add_argument("--only", nargs="+", default=None, help="rows whose env id contains one of these")
    ap.add_argument("--name", default="more_envs")


def run(args):
    rows_to_run = [r for r in ROWS if args.only is None or any(s in r[0] for s in args.only)]
    load_before = os.getloadavg()[0]
    t_start = time.perf_counter()
    random_ref = {}
    for env_id in dict.fromkeys(r[0] for r in rows_to_run):
        n, t = RANDOM_ROLLOUT[env_id]
        random_ref[env_id] = random_policy_return(env_id, n, t)
        m, s, c = random_ref[env_id]
        print(f"random policy on {env_id}: {m:.1f} ± {s:.1f} over {c} episodes", flush=True)

    table, commands, steps_run = [], [], []
    for env_id, algo, steps, sets in rows_to_run:
        steps = max(int(steps * args.scale), 1)
        result, wall = run_row(env_id, algo, steps, sets, args.seeds, args.seed)
        print(result.summary(), f"(wall {wall:.0f}s)", flush=True)
        fr = result.final_return
        steps_run.append(result.env_steps)
        episodes = result.metrics["episode_count"].sum(axis=1)
        sps = result.env_steps * args.seeds / result.run_seconds
        m, s, c = random_ref[env_id]
        table.append([f"`{env_id}`", algo, f"{result.env_steps:,}", args.seeds,
                      f"{np.mean(fr):.1f} ± {np.std(fr):.1f}", " / ".join(f"{v:.1f}" for v in fr),
                      f"{int(episodes.min()):,}", f"{m:.1f}", f"{sps:,.0f}", f"{result.compile_seconds:.0f}",
                      " ".join(f"`{x}`" for x in sets) or ("none" if _has_preset(algo, env_id) else "defaults")])
        commands.append(f"rmtjax train --algo {algo} --env {env_id} --set train.num_seeds=8"
                        + ("" if _has_preset(algo, env_id) else " --set train.total_steps=1000000"))

    wall_min = (time.perf_counter() - t_start) / 60
    header = ["env", "agent", "env steps / seed", "seeds", "final return (mean ± std over seeds)", "per seed",
              "episodes / seed (min)", "random policy", "env-steps/s", "compile s", "settings (changed from the preset)"]
    notes = "\n".join([
        f"**Short CPU budgets.** Every row is {min(steps_run):,}-{max(steps_run):,} env steps "
        f"per seed on a 2-core CPU shared with other jobs (1-min load average {load_before:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end; the whole table took {wall_min:.0f} min wall). These envs are "
        "usually trained for 0.5-5M steps (gymnasium calls LunarLander solved at 200 and BipedalWalker at 300, "
        "averaged over 100 episodes). The rows show where each agent stands after a short run, not what it can "
        "reach; with 2 seeds and each seed's last episodes they are a noisy measure (a seed above 200 here is "
        "not a solved env). Reproduce with `python -m benchmarks more_envs` (needs the `box2d` extra).",
        "",
        "**Final return**: per seed, the mean over its envs of the return of the last completed *training* "
        "episode (with the agent's exploration: ε/Boltzmann for RMT and DQN, the stochastic policy for SAC "
        "and PPO), not a greedy evaluation. **Random policy**: mean return of the episodes completed by "
        "uniformly random actions through the same adapter (" +
        ", ".join(f"`{e}` {random_ref[e][0]:.1f} ± {random_ref[e][1]:.1f} over {random_ref[e][2]} episodes"
                  for e in random_ref) +
        "). **Env-steps/s**: all seeds, the whole loop (host env stepping through the gymnasium adapter, "
        "replay, updates), compile excluded. **Settings**: what the benchmark changed from the preset to fit "
        "the budget (shorter off-policy warm-ups, buffers sized to the run; SAC at 2 updates per iteration "
        "of 8 envs, a quarter of the preset's one update per env step).",
        "",
        "The presets for the gymnasium envs (`rmtjax/configs/*_gymnasium_*.yaml`) hold the usual full-run "
        "settings and are not tuned; Breakout-MinAtar has no preset (the agents' defaults, as in the suite). "
        "Full runs, 1M env steps per seed (8 seeds), for a GPU or a bigger machine (the gymnasium envs still "
        "step on the host CPU, one call per vectorised step; a GPU speeds up the updates, not the env):",
        "",
        "```bash",
        'pip install -e ".[box2d]"',
        *commands,
        "```",
    ])
    write_table("more_envs", args.name, "More environments: LunarLander, LunarLanderContinuous, BipedalWalker, "
                "Breakout-MinAtar at short CPU budgets", header, table, notes)


def _has_preset(algo: str, env_id: str) -> bool:
    return _preset_path(algo, env_id).exists()
