"""The one entry point of the benchmarks.

    python -m benchmarks list                     # every experiment, report and investigation
    python -m benchmarks NAME [options]           # run one (`python -m benchmarks NAME -h`: its options)
    python -m benchmarks run CONFIG [options]     # a config file of benchmarks/configs/ (name or path)

Experiments (`benchmarks/experiments/`) measure and write results/<experiment>/; reports
(`benchmarks/reports/`) only read stored results and build tables from them; investigations
(`benchmarks/investigations/`) are one-off probes kept to reproduce what they found. Every module
of the three has a docstring, `add_arguments(parser)` and `run(args)` (`benchmarks.lib.cli`).
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

from benchmarks.lib import cli

ROOT = Path(__file__).resolve().parent
KINDS = ("experiments", "reports", "investigations")


def registry() -> dict[str, tuple[str, Path]]:
    """name -> (kind, file) of every module the entry point runs, found by listing the folders
    (no module is imported to list them)."""
    found = {}
    for kind in KINDS:
        for path in sorted((ROOT / kind).glob("*.py")):
            if path.stem != "__init__":
                found[path.stem] = (kind, path)
    return found


def describe(path: Path) -> str:
    """The first line of a module's docstring, read with `ast` (nothing is run)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


def load(name: str):
    kind, _ = registry()[name]
    return importlib.import_module(f"benchmarks.{kind}.{name}")


def list_all() -> str:
    lines = []
    found = registry()
    for kind in KINDS:
        lines.append(f"{kind}:")
        for name, (k, path) in found.items():
            if k == kind:
                lines.append(f"  {name:18} {describe(path)}")
    configs = sorted(cli.CONFIGS.glob("*.toml"))
    lines.append("configs (python -m benchmarks run NAME):")
    for path in configs:
        experiment, _ = cli.read_config(path)
        lines.append(f"  {path.stem:34} {experiment}")
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return None
    name, rest = argv[0], argv[1:]
    if name == "list":
        print(list_all())
        return None
    if name == "run":
        if not rest:
            raise SystemExit("python -m benchmarks run CONFIG [options]: which config? (python -m benchmarks list)")
        path = cli.config_path(rest[0])
        experiment, options = cli.read_config(path)
        if experiment not in registry():
            raise SystemExit(f"{path}: experiment {experiment!r} is not one of `python -m benchmarks list`")
        module = load(experiment)
        ap = cli.parser(module, prog=f"python -m benchmarks run {rest[0]}")
        cli.apply_config(ap, options, str(path))
        return module.run(ap.parse_args(rest[1:]))
    if name not in registry():
        raise SystemExit(f"no benchmark {name!r}; `python -m benchmarks list` names them")
    module = load(name)
    return module.run(cli.parse(module, rest, prog=f"python -m benchmarks {name}"))


if __name__ == "__main__":
    try:
        main()
    except (cli.ConfigFileError, cli.UsageError) as e:
        raise SystemExit(f"error: {e}") from None
