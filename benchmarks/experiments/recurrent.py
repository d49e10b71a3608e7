"""Recurrent torsos against MLPs on a memory task: PPO, PQN and DQN with `agent.torso: lstm` and with
`agent.torso: mlp`, seeds vmapped, on gymnax's MemoryChain-bsuite or rmtjax's CartPole-masked-v1.

    python -m benchmarks recurrent --memory-length 16 --steps 200000 --seeds 8
    python -m benchmarks recurrent --task masked-cartpole --algos ppo --steps 300000 --seeds 8

The task (bsuite's memory chain, gymnax's version): the first observation shows a context bit,
the following `memory_length` ones do not (they show the time left, and the query at the end);
the action at the last step earns +1 if it names the context bit and −1 if not, and every
other step earns 0. An episode is `memory_length + 1` steps. A policy without memory can do no
better than a coin flip at the last step, an expected return of 0; one that remembers the bit
gets 1. `--task masked-cartpole`: CartPole-v1 observing the cart's position and the pole's angle
only (`rmtjax.envs.masked`): the velocities must be inferred from past observations.

Each agent is scored per seed by (a) its training curve averaged over the last 10% of training
(its exploration included: PPO samples its policy, PQN and DQN act ε-greedily) and (b) the
greedy policy's mean return over 128 fresh episodes (`rmtjax.evaluate`, through `act_step`, so the
recurrent agents carry their memory). The table gives the IQM over seeds with a 95% percentile
bootstrap interval, how many seeds solve the task (greedy return ≥ 0.9 on MemoryChain, ≥ 475 on
CartPole), and the curves at ten
points of training; `results/recurrent/NAME.npz` holds every curve and `results/recurrent/NAME.png` plots them
(IQM over seeds with the bootstrap band).
"""

from __future__ import annotations

import time

import jax
import numpy as np

import rmtjax
from benchmarks.lib.plots import pyplot
from benchmarks.lib import runner
from benchmarks.lib.tables import write_table
from benchmarks.lib.curves import episode_returns, grid_points, late_mean, smooth
from benchmarks.lib.stats import bootstrap_band, iqm_ci

# task -> (env id, greedy return a seed must reach to count as solving it, the LSTM's widths)
TASKS = {"memorychain": ("MemoryChain-bsuite", 0.9, 32), "masked-cartpole": ("CartPole-masked-v1", 475.0, 64)}
EVAL_EPISODES = 128

# per agent: the settings both torsos share, then each torso's own
COMMON = {
    "ppo": {"agent.rollout_len": 32, "agent.num_minibatches": 4, "agent.lr": 1e-3},
    "pqn": {"agent.rollout_len": 32, "agent.num_minibatches": 4},
    "dqn": {"agent.rollout_len": 8, "agent.learning_starts": 2000, "agent.buffer_size": 50_000,
            "agent.target_update_every": 100, "agent.lr": 1e-3},
    "rmt": {"agent.rollout_len": 8, "agent.learning_starts": 2000, "agent.buffer_size": 50_000,
            "agent.target_update_every": 100, "agent.lr": 1e-3},
}
TORSO = {  # the LSTM's widths are the task's (32 on MemoryChain, 64 on CartPole)
    "lstm": {"agent.torso": "lstm"},
    "mlp": {"agent.torso": "mlp", "agent.hidden": [64, 64]},
}
# DQN with a recurrent torso learns from stored sequences (rmtjax.agents.r2d2): 32 steps with a
# burn-in of 4, 32 sequences a minibatch, one update per 32 env steps; the MLP DQN from
# transitions, 128 a minibatch, one update per 4 env steps (the defaults)
# (RMT with a recurrent torso: the same, with the uniform replay and one-step targets it needs;
# its MLP keeps RMT's defaults: tiered replay, 3-step targets)
SEQUENCES = {"agent.seq_len": 32, "agent.burn_in": 4, "agent.batch_size": 32, "agent.updates_per_step": 1 / 32}
OWN = {("dqn", "lstm"): SEQUENCES, ("rmt", "lstm"): {**SEQUENCES, "agent.replay": "uniform", "agent.n_step": 1}}


def config(task: str, algo: str, torso: str, memory_length: int, steps: int, seeds: int, num_envs: int):
    env, _, width = TASKS[task]
    overrides = {"env.num_envs": num_envs, "train.total_steps": steps, "train.num_seeds": seeds,
                 "train.progress": False, "train.num_chunks": 10, **COMMON[algo], **TORSO[torso],
                 **OWN.get((algo, torso), {})}
    if task == "memorychain":
        overrides["env.params"] = {"memory_length": memory_length}
    if torso == "lstm":
        overrides.update({"agent.hidden": [width], "agent.rnn_width": width})
    return rmtjax.make_config(algo, env, overrides)


def interval(values) -> str:
    m, lo, hi = iqm_ci(np.asarray(values, np.float64))
    return f"{m:.2f} [{lo:.2f}, {hi:.2f}]"


def add_arguments(ap) -> None:
    ap.add_argument("--task", default="memorychain", choices=sorted(TASKS))
    ap.add_argument("--memory-length", type=int, default=16, help="memorychain: steps between the bit and the query")
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--algos", nargs="+", default=["ppo", "pqn", "dqn"], choices=sorted(COMMON))
    ap.add_argument("--torsos", nargs="+", default=["lstm", "mlp"], choices=sorted(TORSO))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None)


def run(args):
    name = args.name or (f"recurrent_memorychain_{args.memory_length}" if args.task == "memorychain"
                         else f"recurrent_{args.task.replace('-', '_')}")
    env_id, solved, width = TASKS[args.task]

    rows, curves, bands = [], {}, {}
    steps_axis = None
    for algo in args.algos:
        for torso in args.torsos:
            label = f"{algo}-{torso}"
            cfg = config(args.task, algo, torso, args.memory_length, args.steps, args.seeds, args.num_envs)
            t0 = time.perf_counter()
            r = rmtjax.train(cfg, jax.random.key(args.seed))
            wall = time.perf_counter() - t0
            ev = rmtjax.evaluate(r, episodes=EVAL_EPISODES, key=jax.random.key(args.seed + 1))
            greedy = ev.returns.mean(axis=1)  # [seeds]
            ret, env_steps, episodes = (r.metrics["episode_return"], r.metrics["env_steps"][0],
                                        r.metrics["episode_count"])
            late = late_mean(ret, env_steps, episodes, args.steps)
            steps_axis, pts = grid_points(ret, env_steps, episodes, args.steps)
            print(f"{label}: {r.summary()}; greedy per seed {np.round(greedy, 2)} ({wall:.0f}s)", flush=True)
            curves[label] = ret
            curves[f"{label}_env_steps"] = env_steps
            curves[f"{label}_episode_count"] = episodes
            curves[f"{label}_greedy"] = greedy
            rows.append([label, interval(greedy), f"{int((greedy >= solved).sum())}/{len(greedy)}", interval(late)]
                        + ["–" if np.isnan(v) else f"{v:.2f}" for v in pts]
                        + [" ".join(f"{v:.2f}" for v in greedy), f"{r.compile_seconds:.0f}", f"{wall:.0f}"])
            bands[label] = (env_steps, smooth(episode_returns(ret, episodes)))

    header = (["agent", "greedy return IQM [95% CI]", f"seeds solved (greedy ≥ {solved:g})",
               "last-10% training IQM [95% CI]"]
              + [f"{s / 1000:.4g}k" for s in steps_axis] + ["greedy per seed", "compile s", "wall s"])
    task = (f"MemoryChain-bsuite with memory_length {args.memory_length} (episodes of {args.memory_length + 1} "
            f"steps, one reward of ±1 at the end; no memory: expected return 0)" if args.task == "memorychain" else
            "CartPole-masked-v1 (CartPole-v1 observing the cart position and the pole angle, not their velocities; "
            "return up to 500)")
    notes = (f"{task}, {args.num_envs} envs per seed, "
             f"{args.steps:,} env steps per seed, {args.seeds} seeds (vmapped, one compile per agent), run key "
             f"{args.seed}. `greedy`: each seed's greedy policy over {EVAL_EPISODES} fresh episodes "
             f"(`rmtjax.evaluate`, memory carried through `act_step`); `last-10% training`: each seed's training "
             f"curve (exploration included) averaged over the last tenth of training; IQM over seeds with a 95% "
             f"percentile-bootstrap interval. The ten columns: the "
             f"mean over seeds of the training curve at each tenth of training. Settings per agent: "
             f"{ {a: COMMON[a] for a in args.algos} }; torsos: {TORSO}, the LSTM after one dense layer of {width}, "
             f"width {width}; "
             f"per agent and torso: { {f'{a}-{t}': v for (a, t), v in OWN.items() if a in args.algos} }; "
             f"everything else the agent's defaults. Wall time includes the compile and the evaluation; the machine is "
             f"shared, so times are noisy.")
    title = (f"MemoryChain-bsuite (memory_length {args.memory_length})" if args.task == "memorychain" else env_id)
    write_table("recurrent", name, f"Recurrent vs MLP torsos on {title}", header, rows, notes)
    np.savez_compressed(runner.out("recurrent") / f"{name}.npz", **curves)
    _plot(name, args, bands)


def _plot(name, args, bands):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(args.algos), figsize=(4.5 * len(args.algos), 3.6), squeeze=False)
    for ax, algo in zip(axes[0], args.algos):
        for torso in args.torsos:
            x, values = bands[f"{algo}-{torso}"]
            # points where every seed has a finished episode; IQM over seeds with a bootstrap band
            ok = ~np.isnan(values).any(axis=0)
            mid, lo, hi = bootstrap_band(values[:, ok])
            ax.plot(x[ok], mid, label=f"{torso} (IQM of {values.shape[0]})")
            ax.fill_between(x[ok], lo, hi, alpha=0.25)
        if args.task == "memorychain":
            ax.axhline(0.0, color="grey", lw=0.5)
            ax.set_ylim(-1.05, 1.05)
            ax.set_title(f"{algo}: memory_length {args.memory_length}")
        else:
            ax.set_title(f"{algo}: CartPole-masked-v1")
        ax.set_xlabel("env steps per seed")
        ax.set_ylabel("training episode return")
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(runner.out("recurrent") / f"{name}.png", dpi=100)
