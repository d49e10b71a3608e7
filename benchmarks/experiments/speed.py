"""rmtjax's DQN, RMT and PPO against the project's speed-of-light references (`benchmarks/lib/reference.py`),
side by side in one process.

    python -m benchmarks speed [--seeds 1 8] [--steps 500000 200000] [--rows ...] [--repeats 3] [--name speed]

Settings (the issue's, CartPole-v1): **DQN** — CleanRL's / PureJaxRL's configuration: 10 envs, one
gradient step of batch 128 per iteration (10 env steps), buffer 10,000, learning from 10,000 env
steps, lr 2.5e-4, hard target update every 500 env steps (50 gradient steps), ε 1 → 0.05 over
the first half, 120-84 ReLU MLP, squared loss, no gradient clipping. **RMT** — the same envs,
replay ratio, batch, buffer, warm-up, lr, target period and ε schedule with every RMT component
on (tiered replay, ε+Boltzmann exploration, 3-step DQN targets (Double-DQN until RMT's default
became single-Q), Huber loss, dueling head, clipping) and its CartPole preset's other settings:
its torso (a one-layer 64-wide MLP with LayerNorm since ae87776, one 64-wide fractal block
before; RMT's default torso too since 496d57e) and its re-ranking of the ring (every 128 updates
since 1283c38, 16 before); `rmt-fractal`: one 64-wide fractal block with LayerNorm (RMT's
default torso until 496d57e); `rmt-64`: two 64-wide fractal blocks;
`rmt-mlp`: every component but the torso, which is the DQN's 120-84 MLP with LayerNorm;
`rmt-dqnnet`: the DQN's very network (120-84, no LayerNorm), so the row measures RMT's machinery
at the DQN's arithmetic. **PPO** — rmtjax's CartPole preset against the reference PPO at the
same settings.

Every program is compiled apart from its run (`jit(...).lower(...).compile()`), the seeds
vmapped in one program; env-steps/s counts all seeds. `compile s` is a cold compile (the
persistent cache switched off); `warm compile s` compiles the same program again, from a new
`make_train`, with the persistent compilation cache on (its first compile fills it): what a
second identical run costs. Each compiled program then runs `--repeats` times (default 3),
alternating with its reference (reference, rmtjax, reference, ...), since this shared machine's
speed drifts by ±30% over minutes: `env-steps/s` is the median of the runs (all of them listed
in `runs`), the ratio the median over the pairs of rmtjax ÷ the reference run just before it
(the range in brackets). A reference row lists its runs beside the first rmtjax row of its
family.
"""

from __future__ import annotations

import tempfile
import time

import jax
import numpy as np

import rmtjax
from benchmarks.lib import reference
from benchmarks.lib.tables import write_table

DQN_SETTINGS = {"env.num_envs": 10, "agent.rollout_len": 1, "agent.updates_per_step": 0.1, "agent.batch_size": 128,
                "agent.buffer_size": 10_000, "agent.learning_starts": 10_000, "agent.lr": 2.5e-4,
                "agent.target_update_every": 50, "agent.eps_end": 0.05, "agent.eps_decay_frac": 0.5}
ROWS = {
    "dqn": ("dqn", {**DQN_SETTINGS, "agent.hidden": [120, 84], "agent.max_grad_norm": 0.0}),
    "rmt": ("rmt", DQN_SETTINGS),
    "rmt-fractal": ("rmt", {**DQN_SETTINGS, "agent.torso": "dense_fractal", "agent.hidden": [64]}),
    "rmt-64": ("rmt", {**DQN_SETTINGS, "agent.torso": "dense_fractal", "agent.hidden": [64, 64]}),
    # every RMT component but the torso: the DQN's 120-84 MLP (with LayerNorm) instead of the preset's
    "rmt-mlp": ("rmt", {**DQN_SETTINGS, "agent.torso": "mlp", "agent.hidden": [120, 84]}),
    # RMT's machinery (tiered replay, ε+Boltzmann, 3-step targets, dueling, Huber, clip) on the DQN's very network
    "rmt-dqnnet": ("rmt", {**DQN_SETTINGS, "agent.torso": "mlp", "agent.hidden": [120, 84], "agent.layer_norm": False}),
    "ppo": ("ppo", {}),
}


def config(row: str, steps: int, seeds: int) -> rmtjax.Config:
    algo, sets = ROWS[row]
    return rmtjax.make_config(algo, "CartPole-v1", {**sets, "train.total_steps": steps, "train.num_seeds": seeds,
                                                    "train.progress": False})


def reference_fn(row: str, steps: int, seeds: int):
    if row == "ppo":
        fn = reference.make_ppo(reference.PPOSettings(total_steps=steps))
    else:
        fn = reference.make_dqn(reference.DQNSettings(total_steps=steps))
    return fn if seeds == 1 else (lambda k: jax.vmap(fn)(jax.random.split(k, seeds)))


def _set_cache(path: str | None):
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", path)
    compilation_cache.reset_cache()


def _runner(fn, key):
    """(cold compile seconds, run() -> (seconds, output)) for the program `fn(key)`."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(key).compile()
    compile_s = time.perf_counter() - t0

    def run():
        t1 = time.perf_counter()
        out = jax.block_until_ready(compiled(key))
        return time.perf_counter() - t1, out

    return compile_s, run


def prepare_rmtjax(row: str, steps: int, seeds: int, cache_dir: str) -> dict:
    """Cold compile, warm compile (from the persistent cache) and a runner for rmtjax's program."""
    cfg = config(row, steps, seeds)
    key = jax.random.key(0)
    _set_cache(None)
    compile_s, run = _runner(rmtjax.make_train(cfg), key)
    _set_cache(cache_dir)  # fill the cache, then compile a new make_train of the same config from it
    jax.jit(rmtjax.make_train(cfg)).lower(key).compile()
    t0 = time.perf_counter()
    jax.jit(rmtjax.make_train(cfg)).lower(key).compile()
    warm = time.perf_counter() - t0
    _set_cache(None)

    def result(out):
        _, metrics = out
        return int(np.asarray(metrics["env_steps"])[0, -1]) * seeds, np.asarray(metrics["episode_return"])[:, -1]

    return {"compile": compile_s, "warm": warm, "run": run, "result": result}


def prepare_reference(row: str, steps: int, seeds: int) -> dict:
    compile_s, run = _runner(reference_fn(row, steps, seeds), jax.random.key(0))

    def result(out):
        _, metrics = out
        env_steps = np.asarray(metrics["env_steps"]).reshape(seeds, -1)
        return int(env_steps[0, -1]) * seeds, np.asarray(metrics["episode_return"]).reshape(seeds, -1)[:, -1]

    return {"compile": compile_s, "run": run, "result": result}


def alternate(a: dict, b: dict, repeats: int) -> tuple[list, list, tuple]:
    """Run the two prepared programs in turn, `repeats` times each (a, b, a, b, ...): their
    env-steps/s per run, and each program's output of its first run (the returns)."""
    sps_a, sps_b, first = [], [], []
    for i in range(repeats):
        for prog, sps in ((a, sps_a), (b, sps_b)):
            seconds, out = prog["run"]()
            done, ret = prog["result"](out)
            sps.append(done / seconds)
            if i == 0:
                first.append(ret)
    return sps_a, sps_b, tuple(first)


def _ret(x) -> str:
    x = np.asarray(x)
    return f"{x[0]:.0f}" if x.size == 1 else f"{x.mean():.0f} ({x.min():.0f}–{x.max():.0f})"


def add_arguments(ap) -> None:
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, nargs="+", default=[500_000, 200_000],
                    help="env steps per seed, one per --seeds entry")
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs of each program, alternating with its reference; medians are reported")
    ap.add_argument("--name", default="speed")


def run(args):
    if len(args.steps) != len(args.seeds):
        raise SystemExit("error: give one --steps value per --seeds value")
    from rmtjax import cache

    cache.enable(disable=True)  # this script switches the persistent cache on and off itself
    header = ["trainer", "seeds × steps", "compile s", "warm compile s", "env-steps/s (median)", "runs",
              "÷ reference (median of pairs)", "final return"]
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for seeds, steps in zip(args.seeds, args.steps):
            refs = {}
            for row in args.rows:
                family = "ppo" if row == "ppo" else "dqn"
                ref = refs.get(family) or prepare_reference(family, steps, seeds)
                ours = prepare_rmtjax(row, steps, seeds, cache_dir)
                ref_sps, our_sps, (ref_ret, our_ret) = alternate(ref, ours, args.repeats)
                if family not in refs:
                    refs[family] = ref
                    rows.append([f"reference {family}", f"{seeds} × {steps:,}", f"{ref['compile']:.1f}", "—",
                                 f"{np.median(ref_sps):,.0f}", _runs(ref_sps), "1", _ret(ref_ret)])
                    print(" | ".join(rows[-1]), flush=True)
                ratios = np.asarray(our_sps) / np.asarray(ref_sps)
                spread = f" ({ratios.min():.2f}–{ratios.max():.2f})" if len(ratios) > 1 else ""
                rows.append([f"rmtjax {row}", f"{seeds} × {steps:,}", f"{ours['compile']:.1f}", f"{ours['warm']:.1f}",
                             f"{np.median(our_sps):,.0f}", _runs(our_sps),
                             f"**{np.median(ratios):.2f}×**{spread}", _ret(our_ret)])
                print(" | ".join(rows[-1]), flush=True)
                write_table("speed", args.name, "rmtjax against the speed-of-light references (CartPole-v1)", header, rows,
                            notes=__doc__.split("\n\n", 2)[2])


def _runs(sps) -> str:
    return " / ".join(f"{x / 1000:.1f}k" for x in sps)
