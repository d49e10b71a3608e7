"""Meta-controller benchmark: fixed hyperparameters (meta.mode off) against each meta mode.

For every env and mode, one run of `--seeds` vmapped seeds with the same config apart from
`meta.mode`. Reported per (env, mode):

- score: each seed's mean `episode_return` over the last 10% of iterations, aggregated over
  seeds as IQM with a 95% percentile-bootstrap interval (`benchmarks/lib/stats.py`);
- throughput: env steps per second of the run (all seeds, compile excluded), and its ratio
  to mode `off` on the same env (the whole runs are timed one after another, so a load that
  changes during the benchmark shows up here);
- cost: the meta-controller's cost measured apart from that drift: every mode's compiled loop
  (`--cost-iters` iterations from the same warmed-up state, metrics included) is timed
  `--cost-reps` times, the modes interleaved round by round; cost = median over rounds of
  (mode's time / off's time in the same round) - 1.

    python -m benchmarks meta [--envs CartPole-v1 Acrobot-v1 Pendulum-v1] [--steps N] [--seeds 16]
                              [--modes off rules bandit pbt] [--discrete rmt] [--continuous sac]
                              [--set meta.interval=20 ...] [--name meta] [--note TEXT]

`--steps 0` (the default) uses each preset's `train.total_steps` (100,000 without a preset).
Discrete envs use `--discrete` (default rmt); continuous ones `--continuous` (default sac, the
agent with a tuned Pendulum preset). `--set` adds dotted overrides to every run.
"""

from __future__ import annotations

import time

import jax
import numpy as np

import rmtjax
from rmtjax.config import _preset_path, parse_override
from rmtjax.envs import make_env
from rmtjax.driver import Program, _masked_chunk, _scan_steps

from benchmarks.lib.tables import write_table
from benchmarks.lib.stats import iqm_ci

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


def loop_cost(env_id: str, modes, args) -> dict[str, tuple[float, float, float, float]]:
    """mode -> (median, min, max) over rounds of its loop time / off's loop time - 1, and the median
    of the same ratio in process CPU time.

    Each mode's `args.cost_iters` iterations are compiled once (a scan of the batched step
    with its metrics, as in a training chunk) and run from the state reached after as many
    warm-up iterations (past `learning_starts`, so updates happen), untouched between calls;
    the modes take turns within each round so any load on the machine falls on all alike."""
    progs = {}
    for mode in modes:
        cfg = config_for(env_id, mode, args)
        program = Program(cfg)
        agent, init, vstep = program.agent, program.init, program.step
        keys = jax.random.split(jax.random.key(args.seed), cfg.train.num_seeds)
        state = jax.jit(lambda k: init(k, None))(keys)
        iters = args.cost_iters
        warm = max(iters, agent.first_iteration_with(cfg.agent.learning_starts) + 1) \
            if hasattr(cfg.agent, "learning_starts") else iters
        state = jax.block_until_ready(jax.jit(_scan_steps(vstep, warm))(state)[0])
        # the timed iterations continue the clock from `warm`, so learning is on in all of them
        chunk = _masked_chunk(vstep, iters)
        run = jax.jit(lambda s: chunk(s, np.int32(warm), np.int32(iters))).lower(state).compile()
        jax.block_until_ready(run(state))  # first call outside the timing
        progs[mode] = (run, state)
    ratios = {m: [] for m in modes}
    cpu_ratios = {m: [] for m in modes}
    for _ in range(args.cost_reps):
        times, cpu = {}, {}
        for mode in modes:
            prog, state = progs[mode]
            t0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(prog(state))
            times[mode], cpu[mode] = time.perf_counter() - t0, time.process_time() - c0
        for mode in modes:
            ratios[mode].append(times[mode] / times["off"] - 1.0)
            cpu_ratios[mode].append(cpu[mode] / cpu["off"] - 1.0)
    return {m: (float(np.median(r)), float(np.min(r)), float(np.max(r)), float(np.median(cpu_ratios[m])))
            for m, r in ratios.items()}


def add_arguments(p) -> None:
    p.add_argument("--envs", nargs="+", default=["CartPole-v1", "Acrobot-v1", "Pendulum-v1"])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--steps", type=int, default=0, help="env steps per seed (0: each preset's)")
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--discrete", default="rmt", help="agent for discrete-action envs")
    p.add_argument("--continuous", default="sac", help="agent for continuous-action envs")
    p.add_argument("--set", action="append", help="dotted override for every run, e.g. meta.interval=20")
    p.add_argument("--seed", type=int, default=0, help="PRNG seed (the same key for every run)")
    p.add_argument("--cost-iters", type=int, default=100, help="iterations per timed loop for the cost column")
    p.add_argument("--cost-reps", type=int, default=7, help="interleaved rounds for the cost column (0: skip)")
    p.add_argument("--name", default="meta", help="results/meta/NAME.md")
    p.add_argument("--note", default="", help="a line added above the notes (e.g. 'smoke run')")


def run(args):
    if "off" not in args.modes:
        args.modes = ["off", *args.modes]  # the baseline every ratio is taken against

    rows = []
    for env_id in args.envs:
        costs = loop_cost(env_id, args.modes, args) if args.cost_reps > 0 else {}
        for mode, (mid, lo, hi, cpu) in costs.items():
            print(f"{env_id} {mode}: loop cost {mid:+.1%} (rounds {lo:+.1%} .. {hi:+.1%}), CPU time {cpu:+.1%}",
                  flush=True)
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
                         (f"{costs[mode][0]:+.1%} [{costs[mode][1]:+.1%}, {costs[mode][2]:+.1%}]" if costs else "-"),
                         (f"{costs[mode][3]:+.1%}" if costs else "-"),
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
        "mode off on the same env and config (below 1: slower); whole runs one after another, so a changing "
        "load on the machine enters it.",
        f"Loop cost: the meta-controller's cost apart from load drift: each mode's compiled loop of "
        f"{args.cost_iters} iterations (metrics included) from the same warmed-up state, timed in "
        f"{args.cost_reps} interleaved rounds; median over rounds of (mode / off) - 1, [min, max] over rounds "
        f"(wall clock); `CPU cost`: the same median with the process's CPU time in place of wall time (less "
        f"sensitive to other jobs taking the cores, though not blind to them).",
        f"Meta settings: the `meta:` section's defaults (meta.interval={cfg0.meta.interval}, "
        f"meta.warmup={cfg0.meta.warmup}) plus any --set. Each (env, mode) is one run, so a mode's score "
        f"difference from off includes seed noise; the intervals say how much. On a machine shared with other "
        f"work the throughput ratios carry timing noise of several percent.",
    ]
    write_table("meta", args.name, "Meta-controller: fixed hyperparameters vs each meta mode",
                ["env", "agent", "meta.mode", "IQM return", "95% CI", "mean", "env steps/s", "vs off",
                 "loop cost", "CPU cost", "compile s"], rows, notes="\n\n".join(notes))
