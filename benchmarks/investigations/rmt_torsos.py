"""Which torso RMT can afford on images: one gradient step and one acting forward pass per
torso on Breakout-MinAtar (10×10×4), measured side by side.

    python -m benchmarks rmt_torsos [--steps 50] [--rounds 5] [--name rmt_torsos]

Each row is the RMT agent's own `gradient_step` (three forward passes for the Double-DQN target,
backward, guard, Adam) on a fixed minibatch of 128, scanned `--steps` times in one compiled
program, and its acting pass (one forward of `env.num_envs` = 4 observations, scanned). Every
program is compiled first, then all are timed in alternation (best of `--rounds`), so the
machine's load moves the rows alike: read the ratios. GFLOP per step is XLA's own count of the
compiled step. The first two rows are the same network with the same parameters: the 3×3
convolutions as lax's convolution op and as one matrix product over shifted copies
(`rmtjax.networks.torsos.Conv3x3`, what `torso: fractal` runs on images).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from benchmarks.investigations.rmt_components import compiled_steps
from benchmarks.lib.tables import write_table
from rmtjax.networks import ConvFractalTorso, QNetwork

ENV = "Breakout-MinAtar"


def _lax_convolutions(agent):
    """The agent's convolutional fractal torso with lax's convolution op in place of the matrix product."""
    for dtype, net in list(agent.nets.items()):
        t = net.torso
        torso = ConvFractalTorso(t.channels, t.num_blocks, t.width, t.activation, t.layer_norm, t.dtype, conv_op=True)
        agent.nets[dtype] = QNetwork(torso, net.head)
    agent.net = agent.nets[jnp.dtype(jnp.float32)]


CONV = {"agent.torso": "fractal"}
DENSE = {"agent.torso": "dense_fractal"}
VARIANTS = {  # name -> (config overrides, network swap)
    "conv fractal (torso: fractal), 16 channels, 1 block, dense 64, convolutions as lax's op": (CONV, _lax_convolutions),
    "the same, convolutions as one matrix product (Conv3x3)": (CONV, None),
    "conv fractal, 16 channels, 2 blocks (Conv3x3)": ({**CONV, "agent.hidden": [64, 64]}, None),
    "dense fractal 64, 1 block, flattened image (RMT's default until 496d57e)": (DENSE, None),
    "dense fractal 128, 2 blocks, flattened image": ({**DENSE, "agent.hidden": [128, 128]}, None),
    "MLP 64, one layer (RMT's default since 496d57e)": ({"agent.torso": "mlp", "agent.hidden": [64]}, None),
    "MinAtar CNN 16 → 128 (DQN's and PQN's Breakout presets)": ({"agent.torso": "cnn", "agent.hidden": [128]}, None),
    "MLP 128-128 (DQN's default)": ({"agent.torso": "mlp", "agent.hidden": [128, 128]}, None),
}


def _flops(compiled) -> float:
    """XLA's FLOP count of the compiled scan, which counts its body (one step) once."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", float("nan")))


def _acting(agent, state, steps: int):
    obs = jnp.broadcast_to(jnp.zeros(agent.spec.obs_shape, agent.spec.obs_dtype),
                           (steps, agent.config.env.num_envs) + agent.spec.obs_shape)

    def run(params, xs):
        return jax.lax.scan(lambda c, x: (c, jnp.argmax(agent.q_values(params, x), -1)), 0, xs)[1]

    return jax.jit(run).lower(state.params, obs).compile(), (state.params, obs)


def add_arguments(ap) -> None:
    ap.add_argument("--steps", type=int, default=50, help="gradient steps (and acting passes) per timed call")
    ap.add_argument("--rounds", type=int, default=5, help="timed calls per variant, alternating; the best is kept")
    ap.add_argument("--name", default=None, help="results/rmt_torsos/NAME.md (default: print only)")


def run(args):
    built = {}
    for name, (sets, swap) in VARIANTS.items():
        fn, a, _, (agent, state) = compiled_steps(sets, args.steps, env=ENV, swap=swap)
        built[name] = (fn, a, *_acting(agent, state, args.steps), _flops(fn))
    step = dict.fromkeys(built, float("inf"))
    act = dict.fromkeys(built, float("inf"))
    for fn, a, afn, aa, _ in built.values():
        jax.block_until_ready((fn(*a), afn(*aa)))
    for _ in range(args.rounds):
        for name, (fn, a, afn, aa, _) in built.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*a))
            t1 = time.perf_counter()
            jax.block_until_ready(afn(*aa))
            t2 = time.perf_counter()
            step[name] = min(step[name], (t1 - t0) / args.steps * 1e6)
            act[name] = min(act[name], (t2 - t1) / args.steps * 1e6)
    default, mlp = next(iter(VARIANTS)), list(VARIANTS)[-1]
    rows = [[name, f"{built[name][4] / 1e9:.3f}", f"{step[name]:,.0f}", f"{step[default] / step[name]:.1f}×",
             f"{step[mlp] / step[name]:.2f}×", f"{act[name]:,.0f}"] for name in built]
    header = ["torso (RMT gradient step, batch 128)", "GFLOP / step (XLA)", "µs / step", "speed ÷ lax conv fractal",
              "speed ÷ MLP 128-128", "µs / acting pass (4 obs)"]
    notes = ("Best of the alternating rounds. `speed ÷ X`: X's step time over this row's. Every row keeps the rest "
             "of RMT's step (LayerNorm, dueling head, 3-step Double-DQN targets, Huber loss, clip).")
    if args.name:
        write_table("rmt_torsos", args.name, f"RMT's torsos on images: gradient step and acting pass ({ENV})", header,
                    rows, notes)
    else:
        for r in rows:
            print(" | ".join(r))
