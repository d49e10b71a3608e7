"""Running an experiment and recording where it ran: the results folder, the machine, the
command, the commit, compile and run seconds apart, one agent trained over vmapped seeds."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import jax

import rmtjax
from rmtjax.config import parse_override
from benchmarks.lib.cli import UsageError

# results/<experiment>/: every experiment writes its files into its own folder (`out`)
RESULTS = Path(__file__).resolve().parent.parent / "results"


def out(group: str) -> Path:
    """results/GROUP, the folder of one experiment's files (created on first use). Read at call
    time, so a test can point `RESULTS` elsewhere."""
    path = RESULTS / group
    path.mkdir(parents=True, exist_ok=True)
    return path


def machine() -> str:
    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    dev = jax.devices()[0]
    return f"{os.cpu_count()} cores, {cpu}; jax {jax.__version__} on {dev.platform} ({dev.device_kind})"


def compile_and_time(fn, *args):
    """(compile seconds, run seconds, output) of `jax.jit(fn)(*args)`, compile measured apart."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    t1 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, out


def command(argv: list[str] | None = None) -> str:
    """The command line that ran this experiment, as a user would type it from the repository
    root: `python -m benchmarks NAME ...` (under `-m`, `sys.argv[0]` is the absolute path of
    `benchmarks/__main__.py`, which names the checkout it ran in, not the command)."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    if script.name == "__main__.py" and script.parent.name == "benchmarks":
        argv[0] = "-m benchmarks"
    elif script.suffix == ".py" and script.parent.parent.name == "benchmarks":
        argv[0] = f"-m benchmarks.{script.parent.name}.{script.stem}"
    return "python " + " ".join(argv)


def git_rev() -> str:
    """HEAD's short hash; a copy of the tree without its .git (e.g. sent to a remote GPU machine)
    names its commit in RMTJAX_GIT_REV."""
    if os.environ.get("RMTJAX_GIT_REV"):
        return os.environ["RMTJAX_GIT_REV"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=Path(__file__).parent).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def sets_per_algo(sets: list[str], algos: list[str]) -> dict[str, list[str]]:
    """`--set` values per agent: `ALGO:KEY=VALUE` for that agent, `KEY=VALUE` for every one of `algos`.
    An ALGO that is not among `algos` (a typo, or an agent left out of the run) is an error, not
    an override silently dropped."""
    out: dict[str, list[str]] = {a: [] for a in algos}
    for s in sets:
        algo, sep, rest = s.partition(":")
        if sep and "=" not in algo:
            if algo not in out:
                raise UsageError(f"--set {s}: {algo!r} is not one of the agents run ({' '.join(algos)})")
            out[algo].append(rest)
        else:
            for a in algos:
                out[a].append(s)
    return out


def run_agent(algo: str, env: str, steps: int, seeds: int, sets: list[str], seed: int, preset: bool = True):
    """Train `algo` on `env` from its preset for the env (or, with `preset=False` or without one,
    its defaults) with the `KEY=VALUE` overrides `sets`: all seeds vmapped in one compiled program."""
    overrides = dict(parse_override(s) for s in sets)
    overrides.update({"train.total_steps": steps, "train.num_seeds": seeds, "train.progress": False,
                      "train.num_chunks": 10})
    if preset:
        cfg = rmtjax.make_config(algo, env, overrides)
    else:
        cfg = rmtjax.Config.from_dict({"algo": algo, "env": {"id": env}, "train": {}, "agent": {}}).override(overrides)
    return rmtjax.train(cfg, jax.random.key(seed))
