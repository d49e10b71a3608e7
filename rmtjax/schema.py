"""The config schema: `Section` (a frozen dataclass section checked field by field when it is
built), `param` (a field with its range, choices and doc) and `ConfigError`.

A leaf module: it imports nothing of rmtjax, so every layer (agents, envs, precision, meta,
distributed) declares its config section from here and `rmtjax.config` assembles them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from typing import Any, Mapping

class ConfigError(ValueError):
    """A configuration value or key a user can fix; the message says how."""

# Integers end up in int32 arrays and loop counts inside the compiled program.
INT_MAX = 2**31 - 1
# Numbers become float32 arrays: beyond this they would be inf.
FLOAT32_MAX = 3.4028234663852886e38

def param(default, *, lo=None, hi=None, lo_open=False, hi_open=False, choices=None, doc=""):
    """A config field with a default, an optional range [lo, hi] (open ends by flag) and choices."""
    meta = {"lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open, "choices": choices, "doc": doc}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)

def close_matches(name: str, valid) -> str:
    matches = difflib.get_close_matches(name, list(valid), n=3, cutoff=0.5)
    return f" Did you mean: {', '.join(matches)}?" if matches else f" Valid names: {', '.join(sorted(valid))}."

def _number(path: str, value: Any, integer: bool) -> int | float:
    """A finite number from a number or a numeric string; an integer only where the value is whole."""
    what = "an integer" if integer else "a number"
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{path}: expected {what}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{path}: expected {what}, got {value!r}")
    if isinstance(value, int) and value.bit_length() > 256:  # far past any range; float() would overflow
        raise ConfigError(f"{path}: an integer of {value.bit_length():,} bits is out of range")
    if not math.isfinite(value):
        raise ConfigError(f"{path}: expected a finite number, got {value!r}")
    if not integer:
        return float(value)
    if isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    return int(value)

def _coerce(path: str, value: Any, typ: Any) -> Any:
    """Check `value` against the annotation `typ`, converting only where no information is lost."""
    origin = typing.get_origin(typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if typ is int or typ is float:
        return _number(path, value, integer=typ is int)
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path}: expected a string, got {value!r}")
    if origin is tuple:
        (elem, *_rest) = typing.get_args(typ)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return tuple(_coerce(f"{path}[{i}]", v, elem) for i, v in enumerate(value))
    if origin is dict or typ is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return dict(value)
    raise TypeError(f"unsupported config annotation {typ!r} at {path}")  # a bug in rmtjax, not user input

class Section:
    """Base of every config section: type and range checks at construction."""

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            path = f"{self.section_name()}.{f.name}"
            value = _coerce(path, getattr(self, f.name), hints[f.name])
            object.__setattr__(self, f.name, value)
            m = f.metadata
            if m.get("choices") is not None and value not in m["choices"]:
                raise ConfigError(f"{path}: {value!r} is not one of {list(m['choices'])}")
            if isinstance(value, tuple) and not value and f.default:  # hidden=[] would be no network
                raise ConfigError(f"{path}: expected at least one value, got an empty list "
                                  f"(the default is {list(f.default)})")
            items = value if isinstance(value, tuple) else (value,)
            for v in items:
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    continue
                if isinstance(v, float) and abs(v) > FLOAT32_MAX:  # numbers become float32 arrays
                    raise ConfigError(f"{path}: {value!r} does not fit in a 32-bit float (|x| ≤ {FLOAT32_MAX:.4g})")
                lo, hi = m.get("lo"), m.get("hi")
                if hi is None and isinstance(v, int):
                    hi = INT_MAX
                bad_lo = lo is not None and (v <= lo if m.get("lo_open") else v < lo)
                bad_hi = hi is not None and (v >= hi if m.get("hi_open") else v > hi)
                if bad_lo or bad_hi:
                    left = "(" if m.get("lo_open") else "["
                    right = ")" if m.get("hi_open") else "]"
                    rng = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
                    raise ConfigError(f"{path}: {value!r} is out of range; allowed {rng}")
        self.validate()

    def validate(self) -> None:
        """Cross-field checks of one section; override where needed."""

    @classmethod
    def section_name(cls) -> str:
        return getattr(cls, "_section", cls.__name__)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str | None = None):
        path = path or cls.section_name()
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping of settings, got {data!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in names:
                raise ConfigError(f"unknown key {path}.{key}.{close_matches(str(key), names)}")
        return cls(**dict(data))

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else (dict(v) if isinstance(v, dict) else v)
        return out



def type_name(typ: Any) -> str:
    """How a field's annotation reads in a listing: int, float, bool, str, list of int, mapping."""
    origin = typing.get_origin(typ)
    if origin is tuple:
        return f"list of {type_name(typing.get_args(typ)[0])}"
    if origin is dict or typ is dict:
        return "mapping"
    return getattr(typ, "__name__", str(typ))


def allowed(meta: Mapping[str, Any], typ: Any) -> str:
    """A field's allowed values as text: its choices, its range, or '' when any value of its type is."""
    if meta.get("choices") is not None:
        return "one of " + ", ".join(str(c) for c in meta["choices"])
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is None and hi is None:
        return ""
    left = "(" if meta.get("lo_open") else "["
    right = ")" if meta.get("hi_open") else "]"
    hi_text = "inf" if hi is None else hi
    if hi is None and (typ is int or typing.get_args(typ)[:1] == (int,)):
        hi_text = f"{INT_MAX}"
    return f"{left}{'-inf' if lo is None else lo}, {hi_text}{right}"


def describe(cls: type, prefix: str | None = None) -> list[dict]:
    """One entry per field of the section `cls`: `name` (dotted), `type`, `default`, `allowed`
    (choices or range, '' when any value of the type is) and `doc`."""
    prefix = cls.section_name() if prefix is None else prefix
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        default = list(default) if isinstance(default, tuple) else default
        rows.append({"name": f"{prefix}.{f.name}", "type": type_name(hints[f.name]), "default": default,
                     "allowed": allowed(f.metadata, hints[f.name]), "doc": f.metadata.get("doc", "")})
    return rows
