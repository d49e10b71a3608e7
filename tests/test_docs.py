"""The documentation: the docs site builds with mkdocs' strict checks, the configuration reference
lists every field of the schema with its doc, the README stays an overview, every relative link
of the README, the changelog and the docs points to a file (and heading) that exists, and the
tutorial quotes tests/toy_agent.py as it is."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from rmtjax import docs_reference

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# pages the site generates at build time (docs/hooks.py), not files in docs/
GENERATED = {DOCS / docs_reference.PAGE}


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


def prose(text: str) -> str:
    """`text` without fenced code blocks and inline code, where a `[x](y)` is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"`", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def test_every_relative_link_points_to_an_existing_file_and_heading():
    broken = []
    for page in markdown_files():
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if path in GENERATED:
                continue
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_link_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[a](missing.md) [b](#title) [c](#nowhere) `[d](ignored.md)`\n")
    text = prose(page.read_text())
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets == ["missing.md", "#title", "#nowhere"]
    assert anchors(page) == {"title"} and slug("What `rmtjax` guarantees") == "what-rmtjax-guarantees"


def test_the_readme_is_an_overview_that_keeps_the_ci_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(readme) <= 300, f"README.md has {len(readme)} lines; move detail to docs/"
    assert "pip install -e . && rmtjax train" in readme
    # .ci/run runs exactly the README's test command
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert len(ci) == 1 and ci[0] in readme
    words = re.compile(r"this round|\bissue \d+|\bsessions?\b", re.I)
    for page in markdown_files():
        found = words.findall(prose(page.read_text(encoding="utf-8")))
        assert not found, f"{page.relative_to(ROOT)}: development-log wording {found}"


def test_the_config_reference_lists_every_section_and_field_with_its_doc():
    from rmtjax.agents import agent_config_class, available_algos
    from rmtjax.config import Config, EnvConfig

    page = docs_reference.render()
    headings = re.findall(r"^## (.+)$", page, flags=re.M)
    optional = [f.name for f in dataclasses.fields(Config) if f.name not in ("algo", "env", "train", "agent")]
    assert headings == ["env", "train", *[f"agent ({a})" for a in available_algos()], *optional]
    for title, cls in docs_reference.sections():
        body = page.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
        section = title.split(" ")[0]
        for f in dataclasses.fields(cls):
            row = next((line for line in body.splitlines() if line.startswith(f"| `{section}.{f.name}` |")), None)
            assert row is not None, f"{title}: no row for {f.name}"
            doc = " ".join(f.metadata.get("doc", "").split())
            doc = doc.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
            assert row.endswith(f"| {doc} |"), row
    assert "| `env.num_envs` | int | <code>4</code> | [1, 2147483647] | environments stepped in parallel per seed |" in page
    # a value holding a pipe stays in its cell; a doc's <placeholder> is text, not an HTML tag
    assert "| `agent.priority` | str | <code>'&#124;td&#124;^0.6 + 0.01'</code> |" in page
    assert "minari:&lt;dataset_id&gt;" in page
    assert len(re.findall(r"^\| `env\.", page, flags=re.M)) == len(dataclasses.fields(EnvConfig))
    assert len(re.findall(r"^\| `agent\.", page.split("## agent (rmt)")[1].split("\n## ")[0], flags=re.M)) == \
        len(dataclasses.fields(agent_config_class("rmt")))


def test_the_reference_command_writes_the_page(tmp_path):
    out = tmp_path / "config.md"
    assert docs_reference.main([str(out)]) == 0
    assert out.read_text(encoding="utf-8") == docs_reference.render()


def test_the_tutorial_quotes_the_toy_agent_as_it_is():
    source = (ROOT / "tests" / "toy_agent.py").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", (DOCS / "tutorial-agent.md").read_text(encoding="utf-8"),
                        flags=re.S | re.M)
    assert len(blocks) >= 9
    for block in blocks[:-1]:  # the last one is a usage example, not a quote
        assert block in source, f"not in tests/toy_agent.py:\n{block}"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="mkdocs and mkdocs-material are not installed (pip install -e '.[docs]')")
def test_the_docs_site_builds_strictly(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    assert "env.num_envs" in reference and "environments stepped in parallel per seed" in reference
    assert "<code>'&#124;td&#124;^0.6 + 0.01'</code>" in reference and "minari:&lt;dataset_id&gt;" in reference
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text(encoding="utf-8")
    assert "Changelog" in changelog and "breaking" in changelog
