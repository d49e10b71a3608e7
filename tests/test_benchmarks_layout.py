"""benchmarks/: one entry point, no import circle, reports that only read, config files that are
data and reproduce the recorded runs, results grouped by experiment."""

import ast
import re
from pathlib import Path

import pytest

from benchmarks import __main__ as entry
from benchmarks.lib import cli

BENCH = Path(entry.__file__).resolve().parent
LAYERS = ("lib", "reports", "experiments", "investigations")  # a layer imports only from itself and those before it


def _modules() -> dict[str, Path]:
    """benchmarks.X.Y -> file, for every module of the package (the entry point included)."""
    found = {"benchmarks.__main__": BENCH / "__main__.py"}
    for path in BENCH.glob("*/*.py"):
        if path.parent.name in LAYERS and path.stem != "__init__":
            found[f"benchmarks.{path.parent.name}.{path.stem}"] = path
    return found


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every import in a file, at any depth (function-level ones too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [a.name for a in node.names]
            # `from benchmarks.lib import runner` imports the module benchmarks.lib.runner
            out += [(f"{node.module}.{n}", []) for n in names if f"{node.module}.{n}" in _modules()]
            out.append((node.module, names))
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {i for i, _ in _imports(p) if i in mods and i != m} for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (module -> modules it imports), or None."""
    state = {}

    def visit(m, stack):
        state[m] = "open"
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n, stack + [n])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_circle_hidden_behind_a_function_level_import(tmp_path):
    # like the circle this layout removed (claims, suite and headline importing each other inside functions)
    assert _cycle({"claims": {"stats"}, "suite": {"claims"}, "stats": set()}) is None
    assert _cycle({"claims": {"suite"}, "suite": {"headline"}, "headline": {"claims"}}) == \
        ["claims", "suite", "headline", "claims"]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from benchmarks.lib import runner\n")
    assert ("benchmarks.lib.runner", []) in _imports(src)


def test_the_import_graph_of_benchmarks_has_no_cycle():
    graph = _graph()
    assert _cycle(graph) is None, "import circle: " + " -> ".join(_cycle(graph))
    assert len(graph) > 30 and graph["benchmarks.experiments.suite"]  # the walk saw the package


def test_layers_import_downwards_and_never_each_others_private_names():
    for module, path in _modules().items():
        layer = module.split(".")[1]
        for name, names in _imports(path):
            if not name.startswith("benchmarks"):
                continue
            assert name != "benchmarks.__main__", f"{module} imports the entry point"
            target = name.split(".")[1] if "." in name else ""
            if layer in LAYERS and target in LAYERS:
                assert LAYERS.index(target) <= LAYERS.index(layer), f"{module} ({layer}) imports {name}"
            private = [n for n in names if n.startswith("_")]
            assert not private, f"{module} imports private names {private} from {name}"


def test_every_experiment_report_and_investigation_has_the_entry_points_shape():
    found = entry.registry()
    files = [p for p in BENCH.glob("*/*.py") if p.parent.name in entry.KINDS and p.stem != "__init__"]
    assert len(found) == len(files), "two modules share a name"
    for name, (kind, path) in found.items():
        tree = ast.parse(path.read_text())
        defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert ast.get_docstring(tree), f"{name}: no docstring"
        assert {"add_arguments", "run"} <= defs, f"{name}: no add_arguments/run"
        assert "argparse.ArgumentParser(" not in path.read_text(), f"{name}: builds its own parser"
    assert {"speed", "curves", "suite", "headline"} <= {n for n, (k, _) in found.items() if k == "experiments"}
    assert {"claims", "headline_table", "compare_curves"} == {n for n, (k, _) in found.items() if k == "reports"}


def test_list_names_every_module_and_config(capsys):
    entry.main(["list"])
    text = capsys.readouterr().out
    for name in entry.registry():
        assert re.search(rf"^  {name} ", text, re.M), name
    assert re.search(r"^  speed_rmt +speed$", text, re.M)


def test_an_unknown_benchmark_and_an_unknown_config_option_are_one_line_errors(tmp_path):
    with pytest.raises(SystemExit, match="no benchmark 'sped'"):
        entry.main(["sped"])
    bad = tmp_path / "bad.toml"
    bad.write_text('experiment = "curves"\nsteps = 1000\nstepz = 5\n')
    with pytest.raises(cli.ConfigFileError, match="bad.toml: unknown option 'stepz'"):
        entry.main(["run", str(bad)])
    bad.write_text("steps = 1000\n")
    with pytest.raises(cli.ConfigFileError, match="experiment = \"NAME\" is missing"):
        entry.main(["run", str(bad)])


def _command(md: Path) -> tuple[str | None, str]:
    """The command recorded in a results file: (the config file it ran, or None; its options)."""
    m = re.search(r"- command: `python -m benchmarks(?:\.\w+| run ([^`\s]+)| \w+) ?([^`]*)`", md.read_text())
    assert m, f"{md.name}: no recorded command"
    return m.group(1), m.group(2)


def _recorded(md: Path, parser) -> list[str]:
    """The options of the command recorded in a results file (a `--note` recorded unquoted is
    one value up to the next option)."""
    cmd = _command(md)[1]
    words, known, out, i = cmd.split(), {o for a in parser._actions for o in a.option_strings}, [], 0
    while i < len(words):
        out.append(words[i])
        if words[i] == "--note":
            j = i + 1
            while j < len(words) and words[j] not in known:
                j += 1
            out.append(" ".join(words[i + 1:j]))
            i = j
            continue
        i += 1
    return out


@pytest.mark.parametrize("path", sorted(cli.CONFIGS.glob("*.toml")), ids=lambda p: p.stem)
def test_each_config_is_data_and_reproduces_the_command_its_results_file_recorded(path):
    experiment, options = cli.read_config(path)
    module = entry.load(experiment)
    ap = cli.parser(module)
    cli.apply_config(ap, options, str(path))
    from_config = vars(ap.parse_args([]))
    md = BENCH / "results" / experiment / f"{path.stem}.md"
    assert md.exists(), f"{path.name}: no results/{experiment}/{path.stem}.md"
    ran = _command(md)[0]
    if ran:  # run from a config file: that file, with any options given on the command line
        assert Path(ran).stem == path.stem, f"{md.name} was run from {ran}, not {path.name}"
        replay = cli.parser(module)
        cli.apply_config(replay, options, str(path))
        recorded = vars(replay.parse_args(_recorded(md, replay)))
    else:
        recorded = vars(cli.parser(module).parse_args(_recorded(md, cli.parser(module))))
    for key in set(recorded) - {"name", "out", "table"}:  # the config names the file it reproduces
        assert from_config[key] == recorded[key], f"{path.name}: {key} {from_config[key]!r} != {recorded[key]!r}"
    assert from_config.get("name", from_config.get("out", path.stem)) == path.stem


def test_results_are_grouped_by_experiment():
    results = BENCH / "results"
    loose = [p.name for p in results.iterdir() if not p.is_dir()]
    assert not loose, f"results/ holds files outside an experiment's folder: {loose}"
    groups = {p.name for p in results.iterdir()}
    assert {"speed", "curves", "headline", "claims", "suite"} <= groups
    assert (results / "headline" / "headline").is_dir()  # the headline pieces


def test_the_recorded_command_is_the_entry_points():
    from benchmarks.lib.runner import command

    assert command(["/x/benchmarks/__main__.py", "run", "speed_rmt"]) == "python -m benchmarks run speed_rmt"


def test_a_results_file_says_whether_its_compiles_read_a_persistent_cache(tmp_path):
    import jax

    from benchmarks.lib.tables import provenance

    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert provenance()[-1] == "- compile cache: off (cold compiles)"
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        assert provenance()[-1].startswith(f"- compile cache: on ({tmp_path}): a compile column may read")
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_the_readme_names_every_results_file():
    readme = (BENCH / "README.md").read_text()
    missing = [str(p.relative_to(BENCH / "results")) for p in (BENCH / "results").glob("*/*.md")
               if f"`{p.relative_to(BENCH / 'results')}`" not in readme]
    assert not missing, f"benchmarks/README.md does not say how to reproduce {missing}"


def test_the_package_root_holds_only_the_entry_point():
    """A new script goes into experiments/ (or investigations/, reports/) with add_arguments/run,
    not beside the entry point, and a config file is TOML in configs/."""
    loose = sorted(p.name for p in BENCH.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"benchmarks/{loose}: move into experiments/, reports/ or investigations/"
