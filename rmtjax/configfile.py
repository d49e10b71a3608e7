"""Reading a config file: bounded in size, strict about its YAML.

A config is a few kilobytes; a path such as `/dev/zero` or a multi-gigabyte file by mistake
must be refused at once, not read until memory runs out. And a mapping that names the same
key twice (where YAML's loaders keep the last one silently) is refused, naming the key and
both lines.

What the YAML expands to is bounded too (issue 34): a few hundred bytes of aliases (`&a [*b, *b,
...]` nested) would otherwise expand to gigabytes, and a value nested thousands of levels deep or
a number literal thousands of digits long would end in a `RecursionError` or an overflow. The
loader refuses nesting deeper than `MAX_DEPTH`, a document that expands (aliases followed) to more
than `MAX_NODES` nodes or holds a cycle, and number literals longer than `MAX_NUMBER_CHARS`:
`InputTooLarge`, which the config readers report as a one-line `ConfigError`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

# far above any real config (the bundled presets are ~2 KB), far below what could hurt
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 32  # nesting of mappings and lists (a config nests three or four levels)
MAX_NODES = 200_000  # nodes of the document with every alias expanded (a long scalar weighs more)
MAX_NUMBER_CHARS = 64  # characters of an integer or float literal
MAX_OVERRIDE_CHARS = 64 << 10  # characters of one --set value


class InputTooLarge(ValueError):
    """YAML that would expand past the bounds above; the message says which and where."""


def read_text(path: Path, error, limit: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of `path`, read at most `limit` + 1 bytes; `error(message)` builds the
    exception raised for any problem (a `ConfigError`)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise error(f"cannot read config file {path}: it is a directory")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"cannot read config file {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{path} is larger than {limit:,} bytes, far more than a config holds; "
                    f"check the path (a config is a small YAML file)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path} is not a text (UTF-8) file: {e.reason} at byte {e.start}") from None


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a mapping naming one key twice, and YAML past the bounds."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise InputTooLarge(f"is nested too deeply (more than {MAX_DEPTH} levels; line {mark.line + 1}, column "
                                    f"{mark.column + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node):
        _check_expansion(node)
        return super().construct_document(node)


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root) -> None:
    """Refuse a composed document whose aliases expand to more than MAX_NODES nodes (a scalar
    weighs 1 + len/64), nest deeper than MAX_DEPTH, or form a cycle. Each node is visited once
    (sizes are memoised), so this is linear in the text, however far the aliases would expand."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    entered: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = _children(node)
            own = 1 + (len(node.value) // 64 if isinstance(node, yaml.ScalarNode) else 0)
            size[key] = own + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > MAX_NODES:
                raise InputTooLarge(f"expands (aliases followed) to more than {MAX_NODES:,} nodes (line "
                                    f"{node.start_mark.line + 1}); a config is a few hundred")
            if depth[key] > MAX_DEPTH:
                raise InputTooLarge(f"is nested too deeply through aliases (more than {MAX_DEPTH} levels; line "
                                    f"{node.start_mark.line + 1})")
            continue
        if key in size:
            continue
        if key in entered:
            raise InputTooLarge(f"holds an alias to a node that contains it (line {node.start_mark.line + 1}): "
                                f"it would expand without end")
        entered.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)


def _bounded_number(constructor):
    def construct(loader, node):
        if len(node.value) > MAX_NUMBER_CHARS:
            raise InputTooLarge(f"holds a number literal of {len(node.value):,} characters "
                                f"(line {node.start_mark.line + 1}); "
                                f"at most {MAX_NUMBER_CHARS}")
        return constructor(loader, node)

    return construct


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *base` brings keys that the mapping's own keys may override
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # the base constructor reports an unhashable key
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark,
                f"the key {key!r} appears twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1}); "
                f"keep one of them", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _bounded_number(yaml.SafeLoader.construct_yaml_int))
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _bounded_number(yaml.SafeLoader.construct_yaml_float))


def parse_yaml(text: str):
    """`yaml.safe_load(text)`, but a key given twice in one mapping is a `yaml.YAMLError`, and
    YAML past the bounds (depth, expansion, number length) an `InputTooLarge`."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
