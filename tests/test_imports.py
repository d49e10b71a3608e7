"""The import graph of `rmtjax/`: no cycle, and the layers load without the driver."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_files() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "rmtjax").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the rmtjax modules it imports anywhere in its text (module level or inside a
    function: a deferred import still closes a cycle). `from pkg import sub` where `sub` is a
    module is an edge to `pkg.sub` only; the package's own `__init__` running first is the
    package hierarchy, not an import of its names."""
    mods = module_files()
    edges: dict[str, set[str]] = {m: set() for m in mods}

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.append(full if full in mods else base)
            for t in targets:
                o = owner(t)
                if o is not None and o != mod:
                    edges[mod].add(o)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_rmtjax():
    graph = import_graph()
    assert "rmtjax.schema" in graph and graph["rmtjax.schema"] == set(), "the schema is a leaf"
    assert graph["rmtjax.config"] >= {"rmtjax.schema", "rmtjax.meta.config"}  # the walker sees real edges
    assert cycles(graph) == []


@pytest.mark.parametrize("module, absent", [
    ("rmtjax.replay", ("rmtjax.driver", "rmtjax.config", "rmtjax.agents")),
    ("rmtjax.schema", ("rmtjax.driver", "rmtjax.config", "jax")),
    ("rmtjax.config", ("rmtjax.driver", "rmtjax.rundir")),
])
def test_a_layer_imports_without_the_driver(module, absent):
    code = f"import sys, {module}; print(sorted(m for m in {absent!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout
