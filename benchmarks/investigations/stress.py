"""Back-to-back training runs, each in its own process, watched for hangs.

    python -m benchmarks stress [--runs 30] [--name stress]

Cycles through PPO, DQN, RMT and PQN on CartPole-v1 and SAC on Pendulum-v1, 2 seeds each
(so every init is batched over seeds, the case that deadlocked jaxlib 0.10's batched LAPACK calls),
2k–20k env steps, `rmtjax train` in a fresh process with the persistent compilation cache off (so
every run compiles). A run counts as hung when its process uses no CPU time for 60 s; it is then
killed. The table lists every run's outcome and time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.lib.tables import write_table

RUNS = [
    ("ppo", "CartPole-v1", 20_000), ("dqn", "CartPole-v1", 20_000), ("rmt", "CartPole-v1", 10_000),
    ("sac", "Pendulum-v1", 2_000), ("pqn", "CartPole-v1", 20_000), ("rmt", "Pendulum-v1", 4_000),
]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_one(algo: str, env: str, steps: int, idle_limit: float = 60.0) -> tuple[str, float]:
    cmd = [sys.executable, "-m", "rmtjax.cli", "train", "--algo", algo, "--env", env, "--quiet",
           "--set", f"train.total_steps={steps}", "--set", "train.num_seeds=2"]
    env_vars = {**os.environ, "RMTJAX_CACHE_DIR": "off"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env_vars, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    last, idle_since = 0.0, time.perf_counter()
    while proc.poll() is None:
        time.sleep(2)
        try:
            now = cpu_seconds(proc.pid)
        except OSError:
            break
        if now - last > 0.05:
            last, idle_since = now, time.perf_counter()
        elif time.perf_counter() - idle_since > idle_limit:
            proc.kill()
            proc.wait()
            return "HUNG (no CPU time for 60 s; killed)", time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode:
        return f"failed (exit {proc.returncode}): {err.strip().splitlines()[-1] if err.strip() else ''}", \
            time.perf_counter() - t0
    return "ok", time.perf_counter() - t0


def add_arguments(ap) -> None:
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--name", default="stress")


def run(args):
    import jax

    rows, hung, failed = [], 0, 0
    for i in range(args.runs):
        algo, env, steps = RUNS[i % len(RUNS)]
        outcome, seconds = run_one(algo, env, steps)
        rows.append([i + 1, algo, env, f"{steps:,}", outcome, f"{seconds:.0f}"])
        hung = sum("HUNG" in r[4] for r in rows)
        failed = sum(r[4].startswith("failed") for r in rows)
        # rewritten after every run, so an interrupted stress still leaves its table
        write_table("stress", args.name, f"{len(rows)} of {args.runs} back-to-back trainings: {hung} hung, {failed} failed",
                    ["run", "agent", "env", "env steps per seed", "outcome", "seconds"], rows,
                    notes=f"jax {jax.__version__}. " + __doc__.split("\n\n")[1].replace("\n", " "))
    return 1 if hung or failed else 0
