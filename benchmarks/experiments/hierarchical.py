"""Replay beyond device memory: RMT with a device level of 10% of the capacity against the same
capacity all on the device (and against a device-only buffer of that 10%).

    python -m benchmarks hierarchical [--env Breakout-MinAtar] [--seeds 4] [--steps 300000] \
        [--capacity 50000] [--device-fraction 0.1] [--disk-fraction 0.5] [--sync-every 4] \
        [--variants hierarchical tiered small] [--name hierarchical_Breakout-MinAtar]

Every variant is RMT from its defaults (no preset: none is tuned to MinAtar), `--seeds` seeds
vmapped, key 0, `--steps` env steps:

- `tiered`: the tiered buffer of `--capacity` items, all in device memory (the default replay);
- `hierarchical`: the same capacity with `agent.replay: hierarchical`: `--device-fraction` of it
  for the device, the rest in host RAM and (`--disk-fraction`) on disk, moved every
  `--sync-every` iterations; `--set agent.hier_sampling=cache` for the device-cache sampler
  (the default, `prefetch`, stages each chunk's draws on the device);
- `small`: a tiered buffer of only the device level's size, all on the device — what the device
  memory alone would hold without the lower levels.

A seed's score is its learning curve averaged over the last tenth of training
(`curves.late_mean`); the table gives the IQM over seeds with a 95% bootstrap interval, the
device memory the replay state holds per seed (every array of `state.replay`: the buffer, and
for `hierarchical` also the outbox of one sync's transitions; with prefetch, the staged draws and
the outbox), the host RAM and disk of the lower levels, the hit rate averaged over the last tenth
(cache: the share of the priority mass on device-resident items; prefetch: the share of draws
served from the staged ones) and the seconds spent moving items. The table is rewritten after each
variant, so a partial run leaves the finished rows.
"""

from __future__ import annotations

import time

import jax
import numpy as np

import rmtjax
from rmtjax.replay import hier_options
from benchmarks.lib import runner
from benchmarks.lib.tables import write_table
from benchmarks.lib.curves import late_mean
from benchmarks.lib.stats import iqm_ci


def variant_overrides(name: str, args) -> dict:
    if name == "tiered":
        return {"agent.replay": "tiered", "agent.buffer_size": args.capacity}
    if name == "small":
        return {"agent.replay": "tiered", "agent.buffer_size": int(round(args.device_fraction * args.capacity))}
    if name == "hierarchical":
        from rmtjax.config import parse_override

        sync = {} if args.sync_every is None else {"agent.sync_every": args.sync_every}
        return {"agent.replay": "hierarchical", "agent.buffer_size": args.capacity,
                "agent.device_fraction": args.device_fraction, "agent.disk_fraction": args.disk_fraction,
                **sync, **dict(parse_override(s) for s in args.set)}
    raise SystemExit(f"unknown variant {name!r}: tiered, hierarchical or small")


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def add_arguments(ap) -> None:
    ap.add_argument("--env", default="Breakout-MinAtar")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300_000)
    ap.add_argument("--capacity", type=int, default=50_000)
    ap.add_argument("--device-fraction", type=float, default=0.1)
    ap.add_argument("--disk-fraction", type=float, default=0.5)
    ap.add_argument("--sync-every", type=int, default=None, help="agent.sync_every (default: the config's, 4)")
    ap.add_argument("--variants", nargs="+", default=["hierarchical", "tiered", "small"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for the hierarchical variant, e.g. agent.priority=1 (repeatable)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--note", default="", help="a line for the results file (e.g. the machine's load)")


def run(args):
    name = args.name or f"hierarchical_{args.env.replace(':', '_')}"

    rows, curves = [], {}
    for variant in args.variants:
        overrides = {"train.total_steps": args.steps, "train.num_seeds": args.seeds, "train.progress": False,
                     **variant_overrides(variant, args)}
        cfg = rmtjax.Config.from_dict({"algo": "rmt", "env": {"id": args.env}, "train": {}, "agent": {}}).override(overrides)
        t0 = time.perf_counter()
        r = rmtjax.train(cfg, jax.random.key(args.seed))
        wall = time.perf_counter() - t0
        m = r.metrics
        score = late_mean(m["episode_return"], m["env_steps"][0], m["episode_count"], args.steps)
        iqm, lo, hi = iqm_ci(score)
        device_bytes = sum(x.nbytes for x in jax.tree.leaves(r.state.replay)) / args.seeds
        late = m["env_steps"][0] > args.steps * 0.9
        if variant == "hierarchical":
            agent_cfg = cfg.agent
            dev, host, disk = hier_options.capacities(agent_cfg)
            item = float(m["replay_bytes_moved"][0, 0]) / max(float(m["replay_items_down"][0, 0] + m["replay_items_up"][0, 0]), 1)
            hit = float(np.mean(m["replay_hit_rate"][:, late]))
            move_s = float(r.timing["replay_move_seconds_total"])
            lower = f"{mib(host * item)} RAM + {mib(disk * item)} disk"
            extra = f"{hit:.3f}", f"{move_s:.1f}"
        else:
            lower, extra = "—", ("—", "—")
        label = variant + "".join(f", {s}" for s in args.set) if variant == "hierarchical" else variant
        rows.append([label, str(cfg.agent.buffer_size), f"{iqm:.2f} [{lo:.2f}, {hi:.2f}]",
                     " ".join(f"{x:.1f}" for x in score), mib(device_bytes), lower, *extra,
                     f"{r.env_steps * args.seeds / r.run_seconds:,.0f}", f"{wall:.0f}"])
        curves[variant] = m["episode_return"]
        print(rows[-1], flush=True)
        write_table("hierarchical", name, f"Replay beyond device memory: {args.env}",
                    ["variant", "capacity (items)", "score IQM [95% CI]", "per seed", "device MiB per seed (replay state)",
                     "lower levels per seed (MiB)", "hit rate (last 10%)", "seconds moving", "env-steps/s", "wall s"],
                    rows,
                    (f"{args.note}\n\n" if args.note else "")
                    + f"{args.seeds} seeds × {args.steps:,} env steps, RMT defaults (no preset), key {args.seed}. "
                    + " ".join(__doc__.split("\n\n", 2)[2].split()))
        np.savez(runner.out("hierarchical") / f"{name}.npz", env_steps=m["env_steps"][0], **curves)
