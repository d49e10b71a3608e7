"""What each RMT component costs in one gradient step, and where RMT's gap to a plain DQN comes from.

    python -m benchmarks rmt_components [--name rmt_components]

One process, every variant compiled first, then timed in alternation (round-robin, best of
`--rounds`), so the load of the machine moves all rows alike: read the ratios. Each variant is
the RMT agent's own `gradient_step` (forward, target, backward, update guard, optimiser) on a
fixed CartPole-v1 minibatch of 128, scanned `--steps` times in one compiled program; it starts
from the full RMT step (128-wide fractal torso, LayerNorm, dueling head, 3-step Double-DQN
targets, Huber loss, gradient clipping) and switches one component off per row, down to the
plain DQN arithmetic (the 120-84 ReLU MLP, one-step targets from the target network, squared
loss, no clip) that `benchmarks/lib/reference.py` runs. Acting, replay and diagnostics are not in
these numbers (`benchmarks/investigations/profile_step.py` charges those phases).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

import rmtjax
from benchmarks.lib.tables import write_table
from rmtjax.driver import Program

MLP = {"agent.torso": "mlp", "agent.hidden": [120, 84]}
PLAIN = {"agent.double_q": False, "agent.layer_norm": False, "agent.dueling": False, "agent.max_grad_norm": 0.0,
         "agent.loss": "mse", "agent.n_step": 1}
# RMT's torso when this was first measured, named: its default and CartPole preset are one dense layer now
F128 = {"agent.torso": "dense_fractal", "agent.hidden": [128, 128]}
VARIANTS = {
    "RMT: fractal 128 (2 blocks), LayerNorm, dueling, Double-DQN, Huber, clip": F128,
    "fractal 64": {**F128, "agent.hidden": [64, 64]},
    "fractal 128, no Double-DQN (2 forward passes, not 3)": {**F128, "agent.double_q": False},
    "fractal 128, no LayerNorm": {**F128, "agent.layer_norm": False},
    "fractal 128, no dueling head": {**F128, "agent.dueling": False},
    "fractal 128, no clip": {**F128, "agent.max_grad_norm": 0.0},
    "fractal 128, squared loss": {**F128, "agent.loss": "mse"},
    "MLP 120-84, every other RMT component on": MLP,
    "MLP 120-84, plain DQN arithmetic": {**MLP, **PLAIN},
}


def macs_per_sample(params) -> int:
    """Multiply-adds of one forward pass per sample: the sum of the dense kernels' sizes."""
    return sum(int(x.size) for path, x in jax.tree_util.tree_leaves_with_path(params)
               if x.ndim == 2 and "kernel" in jax.tree_util.keystr(path))


def _observations(key, agent, batch_size):
    """A batch of observations of the agent's shape: normal draws, or 0/1 cells for images."""
    shape = (batch_size,) + agent.spec.obs_shape
    if len(agent.spec.obs_shape) == 3:
        return jax.random.bernoulli(key, 0.1, shape).astype(agent.spec.obs_dtype)
    return jax.random.normal(key, shape)


def compiled_steps(overrides: dict, steps: int, batch_size: int = 128, env: str = "CartPole-v1", swap=None):
    """(the compiled scan of `steps` gradient steps, its arguments, forward MACs per sample).
    `swap(agent)`: replaces the agent's networks before anything is traced (same parameters).
    Double-DQN targets unless `overrides` say otherwise: the step these investigations measured."""
    cfg = rmtjax.make_config("rmt", env, {"agent.batch_size": batch_size, "agent.double_q": True, **overrides})
    agent = Program(cfg).agent
    if swap is not None:
        swap(agent)
    state = jax.jit(agent.init)(jax.random.key(0))
    k = jax.random.split(jax.random.key(1), 3)
    n = agent.cfg.n_step
    batch = {"obs": _observations(k[0], agent, batch_size),
             "action": jax.random.randint(k[1], (batch_size,), 0, agent.spec.num_actions),
             "rewards": jnp.ones((batch_size, n)), "steps": jnp.full((batch_size,), n, jnp.int32),
             "boot_obs": _observations(k[2], agent, batch_size),
             "terminated": jnp.zeros((batch_size,), bool)}
    weight = jnp.ones((batch_size,))
    clip = jnp.float32(agent.cfg.max_grad_norm)

    def run(params, opt_state, prec, target, gamma):
        def body(carry, _):
            p, o, pr = carry
            out = agent.gradient_step(p, target, o, pr, batch, weight, gamma, clip)
            return (out.params, out.opt_state, out.precision), out.loss

        return jax.lax.scan(body, (params, opt_state, prec), None, length=steps)

    args = (state.params, state.opt_state, state.precision, state.target_params, state.hparams.gamma)
    return jax.jit(run).lower(*args).compile(), args, macs_per_sample(state.params), (agent, state)


def add_arguments(ap) -> None:
    ap.add_argument("--steps", type=int, default=300, help="gradient steps per timed call")
    ap.add_argument("--rounds", type=int, default=7, help="timed calls per variant, alternating; the best is kept")
    ap.add_argument("--name", default=None, help="results/rmt_components/NAME.md (default: print only)")


def run(args):
    built = {name: compiled_steps(sets, args.steps) for name, sets in VARIANTS.items()}
    best = dict.fromkeys(built, float("inf"))
    for fn, a, *_ in built.values():
        jax.block_until_ready(fn(*a))
    for _ in range(args.rounds):
        for name, (fn, a, *_) in built.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*a))
            best[name] = min(best[name], (time.perf_counter() - t0) / args.steps * 1e6)
    full, plain = next(iter(VARIANTS)), list(VARIANTS)[-1]
    rows = [[name, f"{built[name][2]:,}", f"{us:,.0f}", f"{us / best[full]:.2f}", f"{best[plain] / us:.2f}×"]
            for name, us in best.items()]
    header = ["variant (one gradient step, batch 128)", "forward MACs / sample", "µs / step", "÷ RMT", "speed ÷ plain DQN"]
    notes = ("Best of the alternating rounds; `÷ RMT` is the step's time as a share of the full RMT step's, "
             "`speed ÷ plain DQN` the plain DQN step's time over this row's (the share of the plain step's speed "
             "this arithmetic allows). MACs count the dense kernels of one forward pass (LayerNorm, biases and "
             "activations not included); a Double-DQN step runs three forward passes (online on obs and on the "
             "bootstrap obs, target on the bootstrap obs) and one backward, a plain DQN step two and one.")
    if args.name:
        write_table("rmt_components", args.name, "RMT's gradient step, component by component (CartPole-v1)", header, rows, notes)
    else:
        for r in rows:
            print(" | ".join(r))
