"""Reading a config file: bounded in size, strict about its YAML.

A config is a few kilobytes; a path such as `/dev/zero` or a multi-gigabyte file by mistake
must be refused at once, not read until memory runs out. And a mapping that names the same
key twice (where YAML's loaders keep the last one silently) is refused, naming the key and
both lines.
"""

from __future__ import annotations

from pathlib import Path

import yaml

# far above any real config (the bundled presets are ~2 KB), far below what could hurt
MAX_CONFIG_BYTES = 1 << 20


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
    """`yaml.SafeLoader` that refuses a mapping naming one key twice."""


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


def parse_yaml(text: str):
    """`yaml.safe_load(text)`, but a key given twice in one mapping is a `yaml.YAMLError`."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
