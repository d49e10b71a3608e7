"""Transfer between related tasks: env steps to a threshold from scratch and from a source run.

    python -m benchmarks transfer --task cartpole --seeds 8 --name transfer_cartpole
    python -m benchmarks transfer --task acrobot --seeds 8 --name transfer_acrobot
    python -m benchmarks transfer --task acrobot --name transfer_acrobot --reanalyse --threshold -130

1. The source: the task's agent from its preset on the source env (`--source-steps`, the
   preset's budget by default), `--seeds` seeds vmapped, key 1000 (not the compared runs' key).
2. Zero-shot: the source's greedy return on the target env (20 episodes per seed), so the table
   shows how much adaptation the target needs.
3. The comparison on the target env (changed physics), `--seeds` seeds vmapped, key 0: from
   scratch (the preset, `--scratch-steps`, longer than the transferred runs' budget so that its
   steps to the threshold are measured rather than cut off), and, `--steps` env steps each, from
   the source (`init_from`: seed k from
   source seed k) with everything trained, with the torso frozen, with the torso released layer
   by layer (progressive), and with a KL penalty to the source policy.

Steps to the threshold: the first env step at which a seed's learning curve (the return of its
envs' last finished episodes, trailing mean over 1% of the iterations; the training, i.e.
behaviour, policy) reaches `--threshold`; a seed that never does counts as the budget
(censored). IQM over seeds with a 95% bootstrap interval; the speed-up is the scratch IQM over a
variant's IQM, its interval from resampling the seeds of both.

Tasks: `cartpole`: PPO (its preset solves CartPole-v1), target CartPole-v1 with the pole four
times as long (`env.params.length` 2.0 and `polemass_length` 0.2: the same pole mass). Chosen
where the source's greedy policy fails (probed on 4 source seeds, 20 episodes each: it keeps 500
with the pole twice as long, gravity 20, a cart 5× as heavy or the push halved, and drops to
15-22 from length 1.5 on); `acrobot`: DQN (its preset solves Acrobot-v1; RMT's preset does too but runs at
a tenth of DQN's speed on this CPU), target Acrobot-v1 with both links 1.5× as heavy
(`link_mass_1`, `link_mass_2` 1.5; at 2.0 no variant came near −100 within 300k steps:
`results/transfer/transfer_acrobot_mass2.md`). DQN's transferred rows start ε at the preset's final 0.05 (a
fine-tuned policy does not need to explore from ε = 1; one row keeps the preset's schedule to
show what that costs).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

import rmtjax
from benchmarks.lib.plots import pyplot
from benchmarks.lib import runner
from benchmarks.lib.tables import write_table
from benchmarks.lib.curves import episode_returns, smooth
from benchmarks.lib.stats import iqm_ci, speedup_cell

TASKS = {
    "cartpole": {
        "algo": "ppo", "env": "CartPole-v1", "threshold": 475.0, "steps": 300_032, "scratch_steps": 1_000_448,
        "target": {"length": 2.0, "polemass_length": 0.2},
        "describe": "pole four times as long (length 2.0, polemass_length 0.2: the same pole mass)",
        "progressive": {"torso/Dense_1": 0.1, "torso/Dense_0": 0.2},
        "kl_coef": 0.1, "tuned_sets": {},
    },
    "acrobot": {
        "algo": "dqn", "env": "Acrobot-v1", "threshold": -100.0, "steps": 300_000, "scratch_steps": 500_000,
        "target": {"link_mass_1": 1.5, "link_mass_2": 1.5},
        "describe": "both links 1.5× as heavy (link_mass_1, link_mass_2 1.5)",
        "progressive": {"torso/Dense_1": 0.1, "torso/Dense_0": 0.2},
        "kl_coef": 0.1, "tuned_sets": {"agent.eps_start": 0.05},
    },
}


def steps_to(result, threshold: float, start: int) -> np.ndarray:
    """[seeds] env steps at which each seed's smoothed curve first reaches `threshold` at or after env
    step `start` (inf: never). Before every env has finished an episode the curve is the mean
    over the envs that have, which early on are the ones whose episodes were shortest: with a
    good policy on Acrobot (short is good) a few fast first episodes cross the threshold at once.
    `start` = envs × the episode time limit, by when every env has finished at least one."""
    m = result.metrics
    curve = smooth(episode_returns(m["episode_return"], m["episode_count"]))
    hit = (np.nan_to_num(curve, nan=-np.inf) >= threshold) & (m["env_steps"] >= start)
    first = np.where(hit.any(1), hit.argmax(1), -1)
    return np.where(first >= 0, m["env_steps"][0][np.maximum(first, 0)], np.inf).astype(np.float64)


def add_arguments(ap) -> None:
    ap.add_argument("--task", choices=sorted(TASKS), default="cartpole")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=None, help="env steps per target run (default: the task's)")
    ap.add_argument("--source-steps", type=int, default=None, help="default: the preset's total_steps")
    ap.add_argument("--scratch-steps", type=int, default=None, help="env steps of the scratch run (default: the task's)")
    ap.add_argument("--threshold", type=float, default=None)
    ap.add_argument("--name", default=None)
    ap.add_argument("--reanalyse", action="store_true",
                    help="train nothing: read the curves of results/transfer/NAME.npz again at --threshold and append the "
                         "table to results/transfer/NAME.md")


def run(args):
    task = TASKS[args.task]
    if args.reanalyse:
        return reanalyse(args, task)
    steps = args.steps or task["steps"]
    scratch_steps = args.scratch_steps or task["scratch_steps"]
    threshold = task["threshold"] if args.threshold is None else args.threshold
    algo, env = task["algo"], task["env"]

    base = rmtjax.make_config(algo, env, {"train.num_seeds": args.seeds, "train.progress": False})
    source_steps = args.source_steps or base.train.total_steps
    t0 = time.perf_counter()
    source = rmtjax.train(base.override({"train.total_steps": source_steps}), jax.random.key(1000))
    print(f"source: {source.summary()} ({time.perf_counter() - t0:.0f}s)", flush=True)

    target = base.override({"train.total_steps": steps, **{f"env.params.{k}": v for k, v in task["target"].items()}})
    zero_src = rmtjax.evaluate(source, episodes=20).returns.mean(1)
    zero_shot = rmtjax.evaluate(dataclasses.replace(source, config=target), episodes=20).returns.mean(1)
    print(f"source greedy on the source env {zero_src.mean():.1f}, on the target env {zero_shot.mean():.1f}", flush=True)

    tuned = task["tuned_sets"]
    from rmtjax.envs import env_spec

    limit = env_spec(target.env).max_episode_steps
    start = target.env.num_envs * limit  # every env has finished an episode by then (its time limit)
    variants = {"from scratch (preset)": ({}, False)}
    if tuned:
        variants["init_from, all trained, preset settings"] = ({}, True)
    variants.update({
        "init_from, all trained": (dict(tuned), True),
        "init_from, torso frozen": ({**tuned, "transfer.freeze": ["torso"]}, True),
        "init_from, progressive (" + ", ".join(f"{g} at {s:g}" for g, s in task["progressive"].items()) + ")":
            ({**tuned, "transfer.unfreeze": task["progressive"]}, True),
        f"init_from, KL to the source (kl_coef {task['kl_coef']:g})": ({**tuned, "transfer.kl_coef": task["kl_coef"]},
                                                                        True),
    })
    rows, reach_of, curves = [], {}, {}
    for name, (sets, transferred) in variants.items():
        t0 = time.perf_counter()
        budget = steps if transferred else scratch_steps
        result = rmtjax.train(target.override({**sets, "train.total_steps": budget}), jax.random.key(0),
                              init_from=source if transferred else None)
        seconds = time.perf_counter() - t0
        reach = steps_to(result, threshold, start)
        censored = np.where(np.isfinite(reach), reach, budget)
        reach_of[name] = censored
        if not transferred:
            scratch_reach = reach
        m = result.metrics
        curves[name] = smooth(episode_returns(m["episode_return"], m["episode_count"]))
        curves[name + " env_steps"] = m["env_steps"][0]
        mid, lo, hi = iqm_ci(censored)
        if not transferred:
            speed = "1"
        else:
            speed = speedup_cell(reach_of["from scratch (preset)"], scratch_steps, censored, budget)
        per_seed = " ".join(f"{x / 1000:.1f}k" if np.isfinite(x) else "–" for x in reach)
        rows.append([name, f"{budget:,}", f"{np.isfinite(reach).sum()}/{args.seeds}", f"{mid:,.0f} [{lo:,.0f}, {hi:,.0f}]",
                     speed, per_seed, f"{np.mean(result.final_return):.1f}", f"{seconds:.0f}"])
        print(" | ".join(rows[-1]), flush=True)

    header = [f"{algo.upper()} on {env}, target: {task['describe']}", "env steps (budget)", f"seeds reaching {threshold:g}",
              "IQM env steps to it [95% CI] (censored at the budget)", "speed-up vs scratch (IQM ratio) [95% CI]",
              "per seed (– never)", "final return (mean)", "seconds"]
    notes = (f"Source: {algo} preset on {env}, {args.seeds} seeds × {source_steps:,} env steps (key 1000), final return "
             f"mean {np.mean(source.final_return):.1f}; its greedy return (20 episodes per seed) is {zero_src.mean():.1f} "
             f"on {env} and {zero_shot.mean():.1f} on the target (per seed: "
             f"{' '.join(f'{x:.0f}' for x in zero_shot)}). Target runs: {args.seeds} seeds, key 0, the preset with the env "
             f"changed and the budget in the table (the scratch run's longer, so that its steps to the threshold are "
             f"measured; its schedules, e.g. PPO's lr annealing and DQN's ε decay, stretch with it); init_from maps "
             f"target seed k to source seed k. Steps to the threshold: "
             f"the first env step at which a seed's training curve (its envs' last finished episode returns, trailing "
             f"mean over 1% of the iterations) reaches it, counted from env step {start:,} (env.num_envs × the "
             f"{limit}-step time limit: every env has finished an episode by then; before, the curve is the mean "
             f"of the envs whose first episodes ended first, i.e. the shortest); a seed that never does counts as "
             f"the budget. The speed-up "
             f"is IQM(scratch) / IQM(variant) with a 95% bootstrap interval (seeds of both resampled), both censored "
             f"at the shorter of the two budgets; where an IQM is itself cut off at that horizon the ratio is only a "
             f"bound (≥, ≤) or nothing. Transfer settings (kl_coef, the release shares) were set once, not tuned."
             + (f" {int((~np.isfinite(scratch_reach)).sum())} of the {args.seeds} scratch seeds never reached the "
                f"threshold and count as {scratch_steps:,}."
                if not np.all(np.isfinite(scratch_reach)) else "")
             + (f" The transferred rows except the one marked 'preset settings' run with {tuned} (the preset's final "
                f"ε from the start)." if tuned else ""))
    if args.name:
        write_table("transfer", args.name, f"Transfer on {env} ({algo}): env steps to {threshold:g} from scratch and from a source run",
                    header, rows, notes)
        np.savez_compressed(runner.out("transfer") / f"{args.name}.npz", zero_shot=zero_shot, source_final=source.final_return,
                            scratch_censored=int((~np.isfinite(scratch_reach)).sum()),
                            **{f"reach {k}": v for k, v in reach_of.items()}, **curves)
        _plot(args.name, curves, threshold, env, task["describe"])


def reanalyse(args, task):
    """Steps to `--threshold` from the curves a run saved (the same measure as `steps_to`)."""
    from benchmarks.lib.runner import command

    if args.name is None or args.threshold is None:
        raise SystemExit("--reanalyse needs --name and --threshold")
    cfg = rmtjax.make_config(task["algo"], task["env"])
    from rmtjax.envs import env_spec

    start = cfg.env.num_envs * env_spec(cfg.env).max_episode_steps
    with np.load(runner.out("transfer") / f"{args.name}.npz") as z:
        names = [k for k in z.files if k.startswith("reach ")]
        out, reach_of = [], {}
        for key in names:
            name = key[len("reach "):]
            curve, steps = z[name], z[name + " env_steps"]
            budget = int(steps[-1])
            hit = (np.nan_to_num(curve, nan=-np.inf) >= args.threshold) & (steps >= start)
            first = np.where(hit.any(1), hit.argmax(1), -1)
            reach = np.where(first >= 0, steps[np.maximum(first, 0)], np.inf)
            censored = np.where(np.isfinite(reach), reach, budget)
            reach_of[name] = censored
            mid, lo, hi = iqm_ci(censored)
            if name == "from scratch (preset)":
                speed, scratch_missing, scratch_budget = "1", int((~np.isfinite(reach)).sum()), budget
            else:
                speed = speedup_cell(reach_of["from scratch (preset)"], scratch_budget, censored, budget)
            per_seed = " ".join(f"{x / 1000:.1f}k" if np.isfinite(x) else "–" for x in reach)
            out.append(f"| {name} | {budget:,} | {np.isfinite(reach).sum()}/{len(reach)} | {mid:,.0f} [{lo:,.0f}, "
                       f"{hi:,.0f}] | {speed} | {per_seed} |")
    text = "\n".join([
        "", f"## The same runs at threshold {args.threshold:g}", "",
        f"- command: `{command()}` (reads results/transfer/{args.name}.npz; trains nothing)", "",
        f"| variant | env steps (budget) | seeds reaching {args.threshold:g} | IQM env steps to it [95% CI] (censored "
        f"at the budget) | speed-up vs scratch (IQM ratio) [95% CI] | per seed (– never) |",
        "|---|---|---|---|---|---|", *out, ""])
    print(text)
    with open(runner.out("transfer") / f"{args.name}.md", "a") as f:
        f.write(text)
    np.savez_compressed(runner.out("transfer") / f"{args.name}_at{args.threshold:g}.npz",
                        **{f"reach {k}": v for k, v in reach_of.items()}, scratch_censored=scratch_missing)


def _plot(name, curves, threshold, env, describe):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, v in curves.items():
        if k.endswith(" env_steps"):
            continue
        with np.errstate(all="ignore"):
            mean = np.nanmean(v, axis=0)
        ax.plot(curves[k + " env_steps"], mean, label=k, lw=1.2)
    ax.axhline(threshold, color="grey", ls=":", lw=1)
    ax.set_xlabel("env steps per seed")
    ax.set_ylabel("return (mean over seeds, smoothed)")
    ax.set_title(f"{env}, target: {describe}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(runner.out("transfer") / f"{name}.png", dpi=110)
    print(f"plot: {runner.out('transfer') / f'{name}.png'}")
