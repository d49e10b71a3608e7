"""Whole-run throughput and final return under fp32, bf16 and fp16 compute, side by side.

For each agent config (RMT on CartPole-v1 from its preset, PPO on CartPole-v1 from its
preset) the same run is compiled and timed once per precision policy, in one process:

- `fp32`;
- `bf16` and `fp16` with the default escalation (after 10 non-finite updates in a row): both
  the low-precision and the fp32 network passes are traced, and under the vmap over seeds the
  flag's pick is a select, so both are computed;
- `bf16 (no escalation)`: escalation off, only the bfloat16 path is traced.

Compile time is measured apart from run time (`benchmarks.lib.runner.compile_and_time` on
`rmtjax.make_train`). Throughput ratios are against fp32 of the same config.

    python -m benchmarks precision [--steps 200000] [--seeds 4] [--algos rmt,ppo]
"""

from __future__ import annotations

import jax
import numpy as np

import rmtjax
from benchmarks.lib.runner import compile_and_time
from benchmarks.lib.tables import write_table

POLICIES = [
    ("fp32", {"precision.compute": "fp32"}),
    ("bf16", {"precision.compute": "bf16"}),
    ("bf16 (no escalation)", {"precision.compute": "bf16", "precision.escalate_after_consecutive": 0}),
    ("fp16", {"precision.compute": "fp16"}),
]


def add_arguments(ap) -> None:
    ap.add_argument("--steps", type=int, default=200_000, help="env steps per seed")
    ap.add_argument("--seeds", type=int, default=4, help="seeds vmapped in one program")
    ap.add_argument("--algos", default="rmt,ppo", help="comma-separated: rmt, ppo (CartPole-v1 presets)")


def run(args):
    rows = []
    for algo in args.algos.split(","):
        base_sps = None
        for name, overrides in POLICIES:
            cfg = rmtjax.make_config(algo, "CartPole-v1", {"train.total_steps": args.steps,
                                                           "train.num_seeds": args.seeds, **overrides})
            compile_s, run_s, (_, metrics) = compile_and_time(rmtjax.make_train(cfg), jax.random.key(0))
            m = jax.device_get(metrics)
            sps = args.steps * args.seeds / run_s
            base_sps = sps if base_sps is None else base_sps
            ret = np.asarray(m["episode_return"])[:, -1]
            rows.append([f"{algo} {name}", f"{compile_s:.1f}", f"{run_s:.1f}", f"{sps:,.0f}",
                         f"**{sps / base_sps:.2f}×**", f"{ret.mean():.0f} ± {ret.std():.0f}",
                         f"{np.asarray(m['skipped_updates'])[:, -1].mean():.0f}",
                         f"{np.asarray(m['precision_bits'])[:, -1].mean():.0f}",
                         f"{np.asarray(m['loss_scale'])[:, -1].mean():g}"])
            print(" | ".join(rows[-1]), flush=True)
            # written after every run, so a cut-short benchmark still leaves what it measured
            write_table("precision", "precision", "Compute precision: whole-run throughput and final return (CartPole-v1)",
                        ["config", "compile s", "run s", "env-steps/s", "vs fp32", "final return (mean ± std)",
                         "skipped updates", "bits at end", "loss scale at end"], rows,
                        notes=f"{args.steps:,} env steps per seed × {args.seeds} seeds (vmapped), presets "
                              "rmt_CartPole-v1 / ppo_CartPole-v1. Throughput = env steps of all seeds / run "
                              "seconds; 'vs fp32' > 1 means faster than fp32 of the same agent. Final return: "
                              "the last iteration's episode_return, mean ± std over seeds. 'bits at end' is "
                              "the precision in force after the last update (32 after an escalation).")
