"""Where a value-based agent's compile time goes: trace, lower and XLA compile seconds and the
size of the program, for one configuration and variants of it with one component switched.

    python -m benchmarks compile_time [--algo rmt] [--variants ...] [--baseline dqn] [--name compile_rmt]

Each row builds the training chunk the driver compiles (the agent vmapped over seeds, the
masked scan of `--iters` iterations) and times `jit(...).trace`, `.lower()` and `.compile()`
with the persistent compilation cache off. `StableHLO chars` is the length of the lowered
program's text: a rough measure of how much code XLA has to optimise. Seconds move with the
load of the machine; compare rows of one run.
"""

from __future__ import annotations

import time

import jax
import numpy as np

import rmtjax
from benchmarks.lib.tables import write_table
from rmtjax.config import parse_override

VARIANTS = {
    "as configured": [],
    "uniform replay (not tiered)": ["agent.replay=uniform"],
    "ε-greedy (no Boltzmann)": ["agent.exploration=eps_greedy"],
    "fractal torso (not one dense layer)": ["agent.torso=dense_fractal"],
    "Double-DQN (one more forward pass)": ["agent.double_q=true"],
}


def measure(algo: str, env: str, sets: list[str], iters: int) -> dict:
    from rmtjax.driver import Program, _masked_chunk

    overrides = dict(parse_override(s) for s in sets)
    cfg = rmtjax.make_config(algo, env, {"train.progress": False, **overrides})
    program = Program(cfg)
    keys = jax.random.split(jax.random.key(0), cfg.train.num_seeds)
    state = jax.eval_shape(lambda k: program.init(k, None), keys)
    fn = jax.jit(_masked_chunk(program.step, iters), donate_argnums=0)
    t0 = time.perf_counter()
    traced = fn.trace(state, np.int32(0), np.int32(iters))
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    lowered.compile()
    t3 = time.perf_counter()
    return {"trace": t1 - t0, "lower": t2 - t1, "compile": t3 - t2, "chars": len(lowered.as_text())}


def add_arguments(ap) -> None:
    ap.add_argument("--algo", default="rmt")
    ap.add_argument("--baseline", nargs="*", default=["dqn"], help="agents compiled as configured, for comparison")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="applies to every row")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--iters", type=int, default=100, help="iterations per compiled chunk")
    ap.add_argument("--name", default=None, help="results/compile_time/NAME.md (default: print only)")


def run(args):
    from rmtjax import cache

    cache.enable(disable=True)
    rows = []
    runs = [(args.algo, v) for v in args.variants] + [(b, "as configured") for b in args.baseline]
    for algo, variant in runs:
        m = measure(algo, args.env, args.set + VARIANTS[variant], args.iters)
        rows.append([f"{algo}: {variant}", f"{m['trace']:.1f}", f"{m['lower']:.1f}", f"{m['compile']:.1f}",
                     f"{m['trace'] + m['lower'] + m['compile']:.1f}", f"{m['chars']:,}"])
        print(" | ".join(rows[-1]), flush=True)
    header = ["agent: variant", "trace s", "lower s", "XLA compile s", "total s", "StableHLO chars"]
    title = f"Compile time of {args.algo} on {args.env}, component by component"
    notes = __doc__.split("\n\n", 2)[2] + ("\n\nOverrides for every row: " + " ".join(args.set) if args.set else "")
    if args.name:
        write_table("compile_time", args.name, title, header, rows, notes)
