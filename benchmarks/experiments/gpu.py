"""The throughput table at GPU scale, in one command, for a machine with a GPU and rmtjax installed.

    python -m benchmarks gpu                    # every row; writes results/gpu/gpu.md
    python -m benchmarks gpu --max-seconds 420  # starts no row after 420 s (a lease's budget)
    python -m benchmarks gpu --smoke            # every case tiny, bf16 once: a minute, any backend (the tests run it)

Rows: PPO on CartPole-v1 with 2,048 envs, and DQN, PQN and RMT on Breakout-MinAtar (each from
its preset, or its defaults where it has none, with the env and seed counts below), each in
float32 and in bfloat16 (`precision.compute: bf16`: network compute in bf16, parameters and
losses in float32). Every row is one `make_train` program, seeds vmapped, compiled apart from
its run (`jit(...).lower(...).compile()`); env-steps/s counts all seeds and envs. Nothing is
downloaded and nothing outside this repository is needed. Rows run all fp32 first, then all
bf16, and the table is rewritten after each row, so a run stopped early (a device lease ends)
still leaves every finished row on disk.
"""

from __future__ import annotations

import dataclasses
import time
import traceback

import jax
import numpy as np

import rmtjax
from benchmarks.lib.runner import compile_and_time
from benchmarks.lib.tables import write_table

# the docstring's paragraph on what the rows are, as the results file's note
_ROWS_NOTE = next(par for par in __doc__.split("\n\n") if par.startswith("Rows:"))


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    algo: str
    env: str
    seeds: int
    steps: int  # env steps per seed
    overrides: dict
    smoke: dict  # what --smoke puts on top (small envs, few steps)


CASES = [
    Case("PPO, 2,048 envs", "ppo", "CartPole-v1", 1, 20_000_000,
         {"env.num_envs": 2048, "agent.rollout_len": 64, "agent.num_minibatches": 32},
         {"env.num_envs": 8, "agent.rollout_len": 16, "agent.num_minibatches": 2}),
    Case("DQN (MinAtar paper), 8 seeds × 16 envs", "dqn", "Breakout-MinAtar", 8, 300_000,
         {"env.num_envs": 16, "agent.updates_per_step": 1 / 16, "agent.batch_size": 256},
         {"env.num_envs": 2, "agent.updates_per_step": 0.5, "agent.batch_size": 8, "agent.buffer_size": 256,
          "agent.learning_starts": 32}),
    Case("PQN (purejaxql), 4 seeds × 128 envs", "pqn", "Breakout-MinAtar", 4, 2_000_000, {},
         {"env.num_envs": 4, "agent.rollout_len": 4, "agent.num_minibatches": 2}),
    Case("RMT, 8 seeds × 16 envs", "rmt", "Breakout-MinAtar", 8, 300_000,
         {"env.num_envs": 16, "agent.updates_per_step": 1 / 16, "agent.batch_size": 256},
         {"env.num_envs": 2, "agent.updates_per_step": 0.5, "agent.batch_size": 8, "agent.buffer_size": 256,
          "agent.learning_starts": 32, "agent.hidden": [16, 16]}),
]
PRECISIONS = ("fp32", "bf16")


def config(case: Case, precision: str, smoke: bool) -> rmtjax.Config:
    sets = {**case.overrides, "train.total_steps": case.steps, "train.num_seeds": case.seeds,
            "train.progress": False, "precision.compute": precision}
    if smoke:
        sets.update({**case.smoke, "train.total_steps": 256, "train.num_seeds": 1})
    return rmtjax.make_config(case.algo, case.env, sets)


def run_case(case: Case, precision: str, smoke: bool) -> list[str]:
    cfg = config(case, precision, smoke)
    c, r, (_, metrics) = compile_and_time(rmtjax.make_train(cfg), jax.random.key(0))
    done = int(np.asarray(metrics["env_steps"])[0, -1])
    ret = np.asarray(metrics["episode_return"])[:, -1]
    seeds = cfg.train.num_seeds
    return [case.name, precision, f"{seeds} × {done:,}", f"{c:.1f}", f"{r:.1f}", f"{done * seeds / r:,.0f}",
            f"{np.mean(ret):.1f}"]


def add_arguments(ap) -> None:
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, any backend: checks that every row runs")
    ap.add_argument("--name", default=None, help="results/gpu/NAME.md (default: gpu, or gpu_smoke with --smoke)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no further row once this many seconds have passed (rows left are listed)")


def run(args):
    name = args.name or ("gpu_smoke" if args.smoke else "gpu")
    if not args.smoke and jax.default_backend() == "cpu":
        print("warning: no accelerator found; the table will be of the CPU (use --smoke for a quick check)")
    header = ["run", "precision", "seeds × env steps", "compile s", "run s", "env-steps/s", "final return (mean)"]
    # fp32 for every case first, so that a budget cut leaves one precision whole;
    # --smoke checks that every case runs and bf16 only once (its path is tested with each agent)
    todo = [(case, p) for p in PRECISIONS for i, case in enumerate(CASES)
            if not args.smoke or p == PRECISIONS[0] or i == 0]
    rows, skipped = [], []
    dev = jax.devices()[0]
    t0 = time.perf_counter()

    def write():
        notes = (f"{_ROWS_NOTE}\n\nDevice: {dev.platform} ({dev.device_kind}), "
                 f"{jax.device_count()} device(s); whole script {time.perf_counter() - t0:.0f} s so far"
                 f"{'' if len(rows) + len(skipped) < len(todo) else ' (finished)'}.")
        if skipped:
            notes += " Not run (past --max-seconds): " + "; ".join(f"{c.name} {p}" for c, p in skipped) + "."
        return write_table("gpu", name, "Throughput at GPU scale" + (" (smoke)" if args.smoke else ""), header, rows,
                           notes)

    path = None
    for case, precision in todo:
        if args.max_seconds is not None and time.perf_counter() - t0 > args.max_seconds:
            skipped.append((case, precision))
            continue
        try:
            rows.append(run_case(case, precision, args.smoke))
        except Exception as e:  # noqa: BLE001 - one failing row (an unseen jax/backend) must not lose the others
            if args.smoke:
                raise
            traceback.print_exc()
            rows.append([case.name, precision, f"failed: {type(e).__name__}: {str(e)[:200]}".replace("|", "/"),
                         "—", "—", "—", "—"])
        print(" | ".join(rows[-1]), flush=True)
        path = write()
    return write() if skipped or path is None else path
