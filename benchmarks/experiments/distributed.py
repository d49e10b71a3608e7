"""Data-parallel training: what crosses the mesh per gradient update for each fusion mode,
read from the compiled program, and the final return each mode reaches.

For each fusion mode (`mean`, `topk`, `int8`, `bf16`) the agent's own sharded gradient step
(`RMT.gradient_step` under `shard_map` over `--devices` devices, one local minibatch each) is
lowered and compiled, and every collective in the compiled HLO is listed with its operand
sizes × dtype bytes. Two byte counts per update and device:

- *sent*: the operands one device hands to the collectives (an all-reduce's input, an
  all-gather's local piece);
- *on the wire* (estimate for ring algorithms): an all-reduce moves 2·(D-1)/D × its operand
  per device, an all-gather (D-1) × its operand (each device receives every other piece).

Then each mode trains the same config to `--steps` env steps per seed and reports the final
return. On a machine whose devices are real accelerators (not CPU devices split by
XLA_FLAGS) it also times 1, 2, ..., D devices on the same global config: scaling efficiency =
throughput with d devices / (d × throughput with 1).

    python -m benchmarks distributed [--devices 4] [--algo dqn] [--steps 15000] [--seeds 2] [--modes mean,topk]
                                     [--out distributed]
"""

from __future__ import annotations

import os
import sys

if (sys.argv[1:2] == ["distributed"] and "jax" not in sys.modules
        and "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "")):
    # `python -m benchmarks distributed`, imported before jax: CPU devices for a machine without
    # several accelerators (only the CPU platform reads it)
    _d = sys.argv[sys.argv.index("--devices") + 1] if "--devices" in sys.argv else "4"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={_d}"

import collections  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import rmtjax  # noqa: E402
from benchmarks.lib.tables import write_table  # noqa: E402
from rmtjax import distributed  # noqa: E402
from rmtjax.agents import build_agent  # noqa: E402

MODES = ("mean", "topk", "int8", "bf16")
# a DQN that learns CartPole-v1 in a short budget (the preset's settings, a smaller net, faster targets)
SMALL_DQN = {"agent.hidden": [64, 64], "agent.lr": 1e-3, "agent.target_update_every": 100,
             "agent.learning_starts": 500, "agent.batch_size": 64, "agent.buffer_size": 10_000,
             "agent.eps_decay_frac": 0.3}


def config(algo: str, devices: int, mode: str, steps: int, seeds: int, extra=None):
    base = dict(SMALL_DQN) if algo == "dqn" else {}
    if algo == "rmt":  # RMT's preset with an env count the devices divide
        base = {"env.num_envs": max(4, devices)}
    over = {"train.total_steps": steps, "train.num_seeds": seeds, "train.progress": False, "train.num_chunks": 1,
            "distributed.devices": devices, **base, **(extra or {})}
    if devices > 1:
        over["distributed.fusion"] = mode
    return rmtjax.make_config(algo, "CartPole-v1", over)


def update_collectives(cfg) -> tuple[int, list[dict]]:
    """(parameter count, collectives of one compiled sharded gradient step)."""
    agent = build_agent(cfg)
    mesh = distributed.make_mesh(cfg.distributed)
    # init on the mesh gives each device its state; one device's suffices for shapes and values
    init = distributed.ShardedRun(cfg, mesh).init(lambda keys, hp: jax.vmap(lambda k: agent.init(k, hp))(keys))
    state = distributed.ShardedRun.local_state(init(jax.random.split(jax.random.key(0), 1)))
    state = jax.tree.map(lambda x: x[0], state)  # the one seed
    B = cfg.agent.batch_size
    spec = agent.spec
    batch = {"obs": jnp.zeros((B,) + spec.obs_shape, jnp.float32), "action": jnp.zeros((B,), jnp.int32),
             "rewards": jnp.zeros((B, agent.cfg.n_step)), "steps": jnp.ones((B,), jnp.int32),
             "boot_obs": jnp.zeros((B,) + spec.obs_shape, jnp.float32), "terminated": jnp.zeros((B,), bool)}

    def step(b, w):
        out = agent.gradient_step(state.params, state.target_params, state.opt_state, state.precision,
                                  b, w, jnp.float32(0.99), jnp.float32(1.0))
        return out.params

    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P(), check_vma=False))
    hlo = fn.lower(batch, jnp.ones(B)).compile().as_text()
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    return n, distributed.collective_bytes(hlo)


def wire_bytes(op: dict, devices: int) -> float:
    if op["op"] == "all-reduce":
        return 2 * (devices - 1) / devices * op["operand_bytes"]
    if op["op"] == "all-gather":
        return (devices - 1) * op["operand_bytes"]
    if op["op"] == "reduce-scatter":
        return (devices - 1) / devices * op["operand_bytes"]
    return op["operand_bytes"]  # collective-permute, all-to-all: each device sends its operand once


def add_arguments(ap) -> None:
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--algo", default="dqn", choices=("dqn", "rmt"))
    ap.add_argument("--steps", type=int, default=15_000, help="env steps per seed of each training run (0: none)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="distributed", help="results/distributed/OUT.md")


def run(args):
    D = args.devices
    modes = args.modes.split(",")
    real = jax.devices()[0].platform != "cpu"

    byte_rows, base = [], None
    for algo in dict.fromkeys([args.algo, "rmt"]):
        for mode in modes:
            cfg = config(algo, D, mode, 100_000, 1)
            n, ops = update_collectives(cfg)
            sent = sum(o["operand_bytes"] for o in ops)
            wire = sum(wire_bytes(o, D) for o in ops)
            if mode == "mean":
                base = (sent, wire)
            kinds = collections.Counter(o["op"] for o in ops)
            byte_rows.append([f"{algo} {mode}", f"{n:,}", ", ".join(f"{c}× {k}" for k, c in sorted(kinds.items())),
                              f"{sent:,}", f"{sent / (4 * n):.2f}", f"**{1 - sent / base[0]:.0%}**" if base else "",
                              f"{wire:,.0f}", f"{1 - wire / base[1]:.0%}" if base else ""])
            print(" | ".join(byte_rows[-1]), flush=True)

    ret_rows = []
    if args.steps:
        for mode in (["one device"] + modes):
            cfg = config(args.algo, 1 if mode == "one device" else D, mode, args.steps, args.seeds)
            r = rmtjax.train(cfg, jax.random.key(0))
            fr = r.final_return
            ret_rows.append([mode, D if mode != "one device" else 1, f"{np.nanmean(fr):.0f}",
                             ", ".join(f"{x:.0f}" for x in fr), f"{r.compile_seconds:.0f}", f"{r.run_seconds:.0f}"])
            print(" | ".join(map(str, ret_rows[-1])), flush=True)

    scale_rows = []
    if real and args.steps:
        base_sps = None
        for d in [x for x in (1, 2, 4, 8, 16) if x <= D]:
            cfg = config(args.algo, d, "mean", args.steps, args.seeds)
            t0 = time.perf_counter()
            r = rmtjax.train(cfg, jax.random.key(0))
            sps = args.steps * args.seeds / r.run_seconds
            base_sps = sps if base_sps is None else base_sps
            scale_rows.append([d, f"{sps:,.0f}", f"{sps / (d * base_sps):.2f}"])

    table = [[*r] for r in byte_rows]
    notes = [
        f"**Bytes per gradient update and device** ({D} devices; {'real' if real else 'CPU'} devices). "
        "`sent` = sum over the compiled step's collectives of operand elements × dtype bytes (what one "
        "device hands to them; the loss and finiteness flag, int8 scales and the like included); "
        "`× dense f32` = sent / (4 bytes × parameters); `cut vs mean` = 1 - sent / sent of mean fusion; "
        "`wire` = ring estimate of bytes each device sends: 2(D-1)/D × operand for an all-reduce, "
        "(D-1) × operand for an all-gather (top-k's values and indices are all-gathered: each device "
        "receives every other device's k entries, so its wire bytes grow with D).",
        "",
        f"topk sends {0.2:.0%} of the entries as float32 values plus int32 indices: 8 bytes per sent entry "
        "against 4 per entry of a dense all-reduce, so 20% cuts what a device sends by 60%, not 80%; "
        "int8 is an all-reduce of int8 values (each device's range is ±⌊127/D⌋, so the sum cannot "
        "overflow) plus one float32 scale per tensor: about 75%. bf16 would halve the all-reduce, but "
        "XLA's CPU backend converts a bf16 all-reduce to float32 (convert, f32 all-reduce, convert: seen "
        "in the compiled HLO), so on CPU devices it moves as many bytes as mean; on other backends the "
        "table shows what their compiler keeps.",
    ]
    if ret_rows:
        notes += ["", f"**Final return** ({args.algo} on CartPole-v1, {args.steps:,} env steps per seed × "
                      f"{args.seeds} seeds, key 0; the first row trains the same global config on one device; "
                      f"settings: {SMALL_DQN if args.algo == 'dqn' else 'the rmt preset'}; 500 is the maximum).",
                  "", "| fusion | devices | final return (mean) | per seed | compile s | run s |",
                  "|---|---|---|---|---|---|"]
        notes += ["| " + " | ".join(map(str, r)) + " |" for r in ret_rows]
    if scale_rows:
        notes += ["", "**Scaling** (mean fusion, same global config):", "",
                  "| devices | env-steps/s | efficiency |", "|---|---|---|"]
        notes += ["| " + " | ".join(map(str, r)) + " |" for r in scale_rows]
    else:
        notes += ["", "Scaling efficiency: not measured — these are CPU devices split from one host "
                      "(XLA_FLAGS), which share the same cores; it needs several real devices."]
    write_table("distributed", args.out, "Data-parallel gradient fusion: bytes per update and final return",
                ["config", "parameters", "collectives", "sent bytes", "× dense f32", "cut vs mean",
                 "wire bytes (ring est.)", "wire cut"], table, "\n".join(notes))
