"""Markdown tables: a table's text, and a results file with the command, machine, date, commit and
compile cache above it."""

from __future__ import annotations

import datetime
from pathlib import Path

import jax

from benchmarks.lib import runner


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table of `rows` under `header`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def compile_cache() -> str:
    """Whether this process compiled through a persistent cache, which turns a compile column
    into disk reads of programs compiled by an earlier run."""
    where = jax.config.jax_compilation_cache_dir
    return f"on ({where}): a compile column may read programs compiled before" if where else "off (cold compiles)"


def provenance() -> list[str]:
    """The lines that say how a results file came about: command, machine, date, commit and the
    compile cache."""
    return [f"- command: `{runner.command()}`",
            f"- machine: {runner.machine()}",
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
            f"- git: {runner.git_rev()}",
            f"- compile cache: {compile_cache()}"]


def write_table(group: str, name: str, title: str, header: list[str], rows: list[list], notes: str = "") -> Path:
    """Print a markdown table and write it, with the command, machine, date and commit, to
    results/GROUP/NAME.md (GROUP: the experiment's own folder)."""
    lines = [f"# {title}", ""] + provenance() + [""] + [table(header, rows)]
    if notes:
        lines += ["", notes]
    text = "\n".join(lines) + "\n"
    print(text)
    path = runner.out(group) / f"{name}.md"
    path.write_text(text)
    return path
