"""The configuration reference page of the docs site, generated from the schema.

Every field's type, default, allowed values and doc come from its own declaration
(`rmtjax.schema.param(..., doc=)`), read through `rmtjax.schema.describe`, so the page cannot
drift from the code. The sections are those of `rmtjax.config.Config`, and the agent section
once per registered algorithm.

    python -m rmtjax.docs_reference [OUT.md]     # write the page (default: print it)

The docs site builds it on the fly: `docs/hooks.py` (named in mkdocs.yml) adds the page that
`render()` returns as `reference/config.md`; nothing generated is committed.
"""

from __future__ import annotations

import dataclasses
import html
import sys
import typing

PAGE = "reference/config.md"


def sections() -> list[tuple[str, type]]:
    """(title, section class) for every section of a config: the agent's once per algorithm."""
    from rmtjax.agents import agent_config_class, available_algos
    from rmtjax.config import Config

    hints = typing.get_type_hints(Config)
    out = []
    for f in dataclasses.fields(Config):
        if f.name == "algo":
            continue
        if f.name == "agent":
            out += [(f"agent ({algo})", agent_config_class(algo)) for algo in available_algos()]
        else:
            out.append((f.name, hints[f.name]))
    return out


def _cell(text) -> str:
    """Text fit for one cell of a Markdown table: one line, pipes escaped, and `<`, `>`, `&` as
    entities (a doc's `minari:<dataset_id>` would otherwise be read as an HTML tag)."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def _code(value) -> str:
    """A value as code in a table cell: HTML, since a Markdown code span would show `\\|` as is."""
    return "<code>" + html.escape(repr(value), quote=False).replace("|", "&#124;") + "</code>"


def _summary(cls: type) -> str:
    doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
    return "" if doc.startswith(f"{cls.__name__}(") else doc  # a dataclass's generated signature


def render() -> str:
    """The whole page as Markdown."""
    from rmtjax.schema import describe

    lines = [
        "# Configuration reference",
        "",
        "Every field of every config section, generated from the fields' own declarations in the code",
        "(the same listing as `rmtjax config [SECTION]`). Set a field in a YAML file under its section,",
        "or on the command line with `--set section.field=value`; an agent section's defaults are the",
        "algorithm's own, which a preset (`rmtjax/configs/`) may change.",
        "",
    ]
    for title, cls in sections():
        name = title.split(" ")[0]
        lines += [f"## {title}", ""]
        summary = _summary(cls)
        if summary:
            lines += [summary, ""]
        lines += ["| field | type | default | allowed | what it does |", "|---|---|---|---|---|"]
        for row in describe(cls, name):
            lines.append(f"| `{row['name']}` | {_cell(row['type'])} | {_code(row['default'])} | "
                         f"{_cell(row['allowed'])} | {_cell(row['doc'])} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if argv:
        with open(argv[0], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
