"""Do demonstrations speed up learning? RMT with and without demonstrations made by a trained RMT.

    python -m benchmarks demonstrations --env CartPole-v1 --seeds 8 --steps 100000 --threshold 400 \
        [--expert-steps 200000] [--demo-steps 5000] [--name demonstrations_CartPole-v1]

1. An expert: RMT from its preset for the env, one seed, `--expert-steps`, key 1000 (not one of
   the compared seeds); its greedy return over 20 episodes is reported.
2. Demonstrations: `--demo-steps` transitions of the expert's greedy policy in 10 fresh envs
   (obs, action, reward, terminated, truncated, next_obs), written with
   `rmtjax.replay.demonstrations.save` to a temporary file.
3. The comparison: RMT from the same preset, `--seeds` seeds vmapped, `--steps` env steps, key 0,
   without demonstrations and with them (`agent.demo_share` 0.25 → 0 over the first half, and
   the large-margin loss with weight 1 as a third row unless `--no-margin`), and as DQfD uses
   them (unless `--pretrain 0`): the third row's settings after `--pretrain` gradient steps on
   the demonstrations alone before the first env step (`agent.demo_pretrain`), and ε held at
   the preset's final value from the start (`agent.eps_start` = `agent.eps_end`: a policy that
   starts out imitating the expert is not made to act at random first; DQfD's ε was 0.01
   throughout). A control row runs without demonstrations at that ε, so the DQfD row's gain is
   not the ε's.

The table gives each variant's env steps to the threshold: the first env step at which a seed's
learning curve (the return of its envs' last finished episodes, trailing mean over 1% of the
iterations) reaches `--threshold`; a seed that never does counts as the budget (censored, shown
as "> budget"). Median and IQM with a 95% bootstrap interval over seeds.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import jax
import numpy as np

import rmtjax
from benchmarks.lib.tables import write_table
from benchmarks.lib.curves import episode_returns, smooth
from benchmarks.lib.stats import iqm_ci
from rmtjax.replay import demonstrations as demo_io


def expert(base: rmtjax.Config, steps: int):
    cfg = base.override({"train.total_steps": steps, "train.num_seeds": 1, "train.progress": False})
    result = rmtjax.train(cfg, jax.random.key(1000))
    greedy = rmtjax.evaluate(result, episodes=20)
    return result, float(np.mean(greedy.returns))


def collect(result, steps: int, num_envs: int = 10, seed: int = 2000) -> dict[str, np.ndarray]:
    """`steps` transitions of the trained policy's greedy actions in `num_envs` fresh envs."""
    from rmtjax.agents import build_agent
    from rmtjax.envs import make_env

    config = result.config
    agent = build_agent(config)
    env = make_env(dataclasses.replace(config.env, num_envs=num_envs))
    params = jax.tree.map(lambda x: x[0], result.state.params)
    k_reset, k_run = jax.random.split(jax.random.key(seed))
    obs, env_state = env.reset(k_reset)

    def step(carry, k):
        obs, env_state = carry
        action = agent.act(params, obs)
        next_obs, env_state, reward, terminated, truncated, info = env.step(k, env_state, action)
        row = {"obs": obs, "action": action, "reward": reward, "terminated": terminated, "truncated": truncated,
               "next_obs": info["final_obs"]}
        return (next_obs, env_state), row

    _, rows = jax.jit(lambda c, ks: jax.lax.scan(step, c, ks))((obs, env_state),
                                                                jax.random.split(k_run, -(-steps // num_envs)))
    return {k: np.asarray(v).reshape((-1,) + v.shape[2:])[:steps] for k, v in rows.items()}


def steps_to(result, threshold: float) -> np.ndarray:
    """[seeds] env steps at which each seed's smoothed curve first reaches `threshold` (inf: never)."""
    m = result.metrics
    curve = smooth(episode_returns(m["episode_return"], m["episode_count"]))
    hit = np.nan_to_num(curve, nan=-np.inf) >= threshold
    first = np.where(hit.any(1), hit.argmax(1), -1)
    return np.where(first >= 0, m["env_steps"][0][np.maximum(first, 0)], np.inf).astype(np.float64)


ROWS = ("none", "share", "margin", "dqfd", "control")


def add_arguments(ap) -> None:
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--threshold", type=float, default=400.0)
    ap.add_argument("--expert-steps", type=int, default=200_000)
    ap.add_argument("--demo-steps", type=int, default=5_000)
    ap.add_argument("--no-margin", action="store_true")
    ap.add_argument("--pretrain", type=int, default=1000,
                    help="gradient steps of the DQfD row's pre-training on the demonstrations (0: no such row)")
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS),
                    help="which rows to run: without demonstrations, their share, share + margin, DQfD, and the "
                         "control of the DQfD row's ε (without demonstrations)")
    ap.add_argument("--name", default=None)


def run(args):
    base = rmtjax.make_config("rmt", args.env)  # the preset, read once: every run below starts from it
    trained, expert_return = expert(base, args.expert_steps)
    demos = collect(trained, args.demo_steps)
    demo_return = demos["reward"].sum() / max(1, (demos["terminated"] | demos["truncated"]).sum())
    print(f"expert greedy return {expert_return:.1f}; {len(demos['reward']):,} demonstration transitions", flush=True)

    share = {"agent.demo_share": 0.25, "agent.demo_share_end": 0.0}
    variants = {
        "none": ("without demonstrations", {}),
        "share": ("demonstrations, share 0.25 → 0 over the first half", share),
        "margin": ("the same + large-margin loss (weight 1)", {**share, "agent.demo_margin": 1.0}),
        "dqfd": (f"DQfD: share + margin, {args.pretrain:,} pre-training steps, ε {base.agent.eps_end:g} from the start",
                 {**share, "agent.demo_margin": 1.0, "agent.demo_pretrain": args.pretrain,
                  "agent.eps_start": base.agent.eps_end}),
        "control": (f"control: without demonstrations, ε {base.agent.eps_end:g} from the start",
                    {"agent.eps_start": base.agent.eps_end}),
    }
    rows_wanted = [r for r in args.rows if not (r == "margin" and args.no_margin) and not (r == "dqfd" and not args.pretrain)]
    variants = dict(variants[r] for r in rows_wanted)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demos.npz"
        demo_io.save(path, **demos)
        for name, sets in variants.items():
            overrides = {"train.total_steps": args.steps, "train.num_seeds": args.seeds, "train.progress": False, **sets}
            if any(k.startswith("agent.demo") for k in sets):
                overrides["agent.demonstrations"] = str(path)
            result = rmtjax.train(base.override(overrides), jax.random.key(0))
            reach = steps_to(result, args.threshold)
            censored = np.where(np.isfinite(reach), reach, args.steps)
            mid, lo, hi = iqm_ci(censored)
            per_seed = " ".join(f"{x / 1000:.1f}k" if np.isfinite(x) else "–" for x in reach)
            rows.append([name, f"{np.isfinite(reach).sum()}/{args.seeds}", f"{np.median(censored):,.0f}",
                         f"{mid:,.0f} [{lo:,.0f}, {hi:,.0f}]", per_seed,
                         f"{np.mean(result.final_return):.1f}"])
            print(" | ".join(rows[-1]), flush=True)
    header = ["RMT (preset)", f"seeds reaching {args.threshold:g}", "median env steps to it",
              "IQM [95% CI] (censored at the budget)", "per seed (– never)", "final return (mean)"]
    notes = (f"Expert: RMT preset, 1 seed × {args.expert_steps:,} steps (key 1000), greedy return "
             f"{expert_return:.1f} over 20 episodes; {len(demos['reward']):,} demonstration transitions of its greedy "
             f"policy (mean episode return in them {demo_return:.1f}). Compared runs: {args.seeds} seeds × "
             f"{args.steps:,} env steps, key 0. Steps to the threshold: the first env step at which a seed's curve "
             f"(its envs' last finished episode returns, trailing mean over 1% of the iterations) reaches it.")
    if args.name:
        write_table("demonstrations", args.name, f"Demonstrations on {args.env}: RMT with and without", header, rows, notes)
