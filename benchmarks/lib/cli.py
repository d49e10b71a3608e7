"""The shape every experiment, report and investigation shares, and its config files.

A module of `benchmarks/experiments/`, `benchmarks/reports/` or `benchmarks/investigations/` has
a docstring (its first paragraph is its one-line description), `add_arguments(parser)` and
`run(args)`; `python -m benchmarks NAME [options]` builds its parser and calls it.

A config file (`benchmarks/configs/NAME.toml`) is data, read with `tomllib` and never executed:
`experiment = "curves"` and the experiment's options by name (`--ablation-envs` as
`ablation_envs` or `ablation-envs`), the values TOML's own (lists for `nargs="+"`, `true` for a
flag). `python -m benchmarks run NAME [options]` runs it; options given on the command line
override the file's.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


class ConfigFileError(ValueError):
    """A config file that names no experiment, or an option its experiment does not have."""


class UsageError(ValueError):
    """Options that parse but do not fit together (e.g. a `--set` for an agent that is not run)."""


def parser(module, prog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of an experiment module: its docstring's first paragraph as the
    description, the rest as the epilog, its `add_arguments`."""
    doc = (module.__doc__ or "").strip()
    first, _, rest = doc.partition("\n\n")
    ap = argparse.ArgumentParser(prog=prog, description=first, epilog=rest or None,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(ap)
    return ap


def parse(module, argv=None, prog: str | None = None) -> argparse.Namespace:
    """`argv` (the options after the experiment's name) parsed by the module's parser."""
    return parser(module, prog).parse_args(argv)


def config_path(name: str) -> Path:
    """A config file by path, or by name in benchmarks/configs/ (with or without `.toml`)."""
    path = Path(name)
    if path.suffix == ".toml" and path.exists():
        return path
    stem = path.name.removesuffix(".toml")
    found = CONFIGS / f"{stem}.toml"
    if not found.exists():
        known = ", ".join(sorted(p.stem for p in CONFIGS.glob("*.toml")))
        raise ConfigFileError(f"no config file {name!r} (in {CONFIGS}: {known})")
    return found


def read_config(path: Path) -> tuple[str, dict]:
    """(experiment name, options) of a config file."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    experiment = data.pop("experiment", None)
    if not isinstance(experiment, str):
        raise ConfigFileError(f"{path}: experiment = \"NAME\" is missing (one of `python -m benchmarks list`)")
    return experiment, {key.replace("-", "_"): value for key, value in data.items()}


def apply_config(ap: argparse.ArgumentParser, options: dict, source: str) -> None:
    """Make `options` the parser's defaults: every key must be one of its options' names, and an
    option the config gives is no longer required on the command line."""
    actions = {a.dest: a for a in ap._actions if a.dest != "help"}
    for key in options:
        if key not in actions:
            raise ConfigFileError(f"{source}: unknown option {key!r} (options: {', '.join(sorted(actions))})")
        actions[key].required = False
        if not actions[key].option_strings:  # a positional given by the config: may be left out
            actions[key].nargs = "*" if actions[key].nargs in ("+", "*") else "?"
    for group in ap._mutually_exclusive_groups:
        if any(a.dest in options for a in group._group_actions):
            group.required = False
    ap.set_defaults(**options)
