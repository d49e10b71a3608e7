"""Shared bits of the benchmark scripts: machine description, timing, table output."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import jax

RESULTS = Path(__file__).parent / "results"


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
    """The command line that ran this script, as a user would type it from the repository root:
    `python -m benchmarks.NAME ...` (under `-m`, `sys.argv[0]` is the script's absolute path,
    which names the checkout it ran in, not the command)."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    if script.suffix == ".py" and script.parent.name == "benchmarks":
        argv[0] = f"-m benchmarks.{script.stem}"
    return "python " + " ".join(argv)


def write_table(name: str, title: str, header: list[str], rows: list[list], notes: str = "") -> Path:
    """Print a markdown table and write it, with the command, machine and date, to results/NAME.md."""
    lines = [f"# {title}", "",
             f"- command: `{command()}`",
             f"- machine: {machine()}",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
             f"- git: {_git_rev()}", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    if notes:
        lines += ["", notes]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(text)
    return path


def _git_rev() -> str:
    """HEAD's short hash; a copy of the tree without its .git (e.g. sent to a remote GPU machine)
    names its commit in RMTJAX_GIT_REV."""
    if os.environ.get("RMTJAX_GIT_REV"):
        return os.environ["RMTJAX_GIT_REV"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=Path(__file__).parent).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or None (with a line saying so) when
    matplotlib is not installed: the scripts then write their tables without plots."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'rmtjax[bench]'): no plot")
        return None
    return plt
