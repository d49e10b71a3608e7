"""Environments: `make_env(env_cfg)` builds a wrapped, vectorised environment from an id.

An id without a prefix is a gymnax id (`CartPole-v1`, `Breakout-MinAtar`, ...). An id
`<prefix>:<name>` goes to the adapter registered for that prefix in `_ADAPTERS`:

| prefix       | runs                          | needs                                  |
|--------------|-------------------------------|----------------------------------------|
| `gymnasium:` | on the host, via a callback   | gymnasium (installed with rmtjax); Box2D envs: `rmtjax[box2d]` |
| `brax:`      | in JAX, vmapped like gymnax   | `rmtjax[brax]`                         |
| `playground:`| in JAX (MJX), vmapped         | `rmtjax[playground]`                   |
| `craftax:`   | in JAX, vmapped               | `rmtjax[craftax]`                      |
| `navix:`     | in JAX, vmapped               | `rmtjax[navix]`                        |
| `jumanji:`   | in JAX, vmapped               | `rmtjax[jumanji]`                      |
| `xminigrid:` | in JAX, vmapped               | `rmtjax[xminigrid]`                    |
| `atari:`     | on the host (ale-py through the gymnasium adapter) | `rmtjax[atari]`   |

The pure-JAX suites other than brax share `rmtjax.envs.functional.SuiteEnv` (one way to keep
termination and truncation apart and to auto-reset). Every adapter's env may offer
`render(state) -> uint8 [H, W, 3]` for one environment's state; `VecEnv.render(state, index)`
is the one entry point.

An adapter is a module with `has(name) -> bool`, `names() -> list[str]` and
`make(name, env_cfg) -> VecEnv`; its package is imported only when an id with its prefix is
used, so a missing optional extra costs nothing until then.

rmtjax's own ids (no prefix): `CartPole-masked-v1`, CartPole-v1 with the velocities hidden
(`rmtjax.envs.masked`), a memory task.

An environment of your own with gymnax's interface (e.g. a subclass of
`gymnax.environments.environment.Environment`) is trained by registering it under an id:
`register_env("MyEnv-v0", MyEnv)` (a class or factory called with no arguments, or an instance),
then `make_config("ppo", "MyEnv-v0")` — or `make_config("ppo", MyEnv())`, which registers the
instance under its class name. The config holds only the id: a process that reads back or
resumes such a run registers the env first.
"""

from __future__ import annotations

import dataclasses
import importlib

from rmtjax.envs.imports import allow_import, allowed_imports
from rmtjax.envs.vec import EnvSpec, VecEnv, VecEnvState, episode_metrics, final_return

__all__ = ["Adapter", "EnvSpec", "VecEnv", "VecEnvState", "adapter_prefixes", "allow_import", "allowed_imports",
           "available_envs", "check_env_id", "default_env_params", "register_env", "registered_envs", "env_spec", "episode_metrics", "final_return", "is_host_env", "make_env",
           "split_id"]

# Ids that gymnax registers but that need a data download at construction; not offered here.
_NEEDS_DOWNLOAD = {"MNISTBandit-bsuite"}


@dataclasses.dataclass(frozen=True)
class Adapter:
    """Where the ids of one prefix come from."""

    module: str  # the rmtjax module implementing has/names/make
    package: str  # the import name of the package it needs
    install: str  # what a user runs to get that package
    runs_on_host: bool  # True: stepped through a host callback, not pure JAX


_ADAPTERS = {
    "gymnasium": Adapter("rmtjax.envs.gymnasium_env", "gymnasium", "pip install 'gymnasium>=1.1'", True),
    "brax": Adapter("rmtjax.envs.brax_env", "brax", "pip install 'rmtjax[brax]'", False),
    "playground": Adapter("rmtjax.envs.playground_env", "mujoco_playground", "pip install 'rmtjax[playground]'",
                          False),
    "craftax": Adapter("rmtjax.envs.craftax_env", "craftax", "pip install 'rmtjax[craftax]'", False),
    "navix": Adapter("rmtjax.envs.navix_env", "navix", "pip install 'rmtjax[navix]'", False),
    "jumanji": Adapter("rmtjax.envs.jumanji_env", "jumanji", "pip install 'rmtjax[jumanji]'", False),
    "xminigrid": Adapter("rmtjax.envs.xminigrid_env", "xminigrid", "pip install 'rmtjax[xminigrid]'", False),
    "atari": Adapter("rmtjax.envs.atari_env", "ale_py", "pip install 'rmtjax[atari]'", True),
}


# ids registered by the user (`register_env`): id -> a function giving (env, default params)
_CUSTOM: dict = {}

# rmtjax's own gymnax-style environments (ids without a prefix): id -> "module:Class"
_OWN = {"CartPole-masked-v1": "rmtjax.envs.masked:MaskedCartPole"}


def _own_env(env_id: str):
    """(env, default params) of one of rmtjax's own ids."""
    module, name = _OWN[env_id].split(":")
    env = getattr(importlib.import_module(module), name)()
    return env, env.default_params


def register_env(env_id: str, env) -> str:
    """Make the gymnax-style environment `env` trainable under the id `env_id` (no prefix, not a
    gymnax id). `env` is an instance, or a class or factory called with no arguments; its
    parameters are its `default_params` (`env.params.<name>` overrides their fields). An id
    registered again is replaced. Returns the id."""
    from rmtjax.schema import ConfigError

    if not isinstance(env_id, str) or not env_id or ":" in env_id or env_id.strip() != env_id:
        raise ConfigError(f"register_env: {env_id!r} is not a usable id: give a name without ':' or spaces at "
                          f"its ends, e.g. 'MyEnv-v0' (':' marks another suite's prefix)")
    if env_id in _gymnax_ids() or env_id in _OWN:
        raise ConfigError(f"register_env: {env_id!r} is a gymnax id already; choose another name"
                          if env_id not in _OWN else f"register_env: {env_id!r} is an id of rmtjax's own; choose "
                                                     f"another name")
    if isinstance(env, type) or not hasattr(env, "step"):
        if not callable(env):
            raise ConfigError(f"register_env({env_id!r}, ...): expected an environment with gymnax's interface "
                              f"(reset, step, action_space, default_params), its class or a factory; got "
                              f"{type(env).__name__}")
        factory = env
    else:
        factory = lambda: env  # noqa: E731
    _CUSTOM[env_id] = factory
    for key in [k for k in _SPECS if k[0] == env_id]:  # specs of an env registered before under this id
        del _SPECS[key]
    return env_id


def registered_envs() -> list[str]:
    """The ids registered with `register_env`."""
    return sorted(_CUSTOM)


def _custom_env(env_id: str):
    """(env, default params) of a registered id."""
    from rmtjax.schema import ConfigError

    made = _CUSTOM[env_id]()
    env = made[0] if isinstance(made, tuple) else made
    params = made[1] if isinstance(made, tuple) else getattr(env, "default_params", None)
    for method in ("reset", "step", "action_space"):
        if not callable(getattr(env, method, None)):
            raise ConfigError(f"env.id: the environment registered as {env_id!r} ({type(env).__name__}) has no "
                              f"{method}(); it needs gymnax's interface: reset(key, params), step(key, state, "
                              f"action, params), action_space(params), default_params")
    return env, params


def default_env_params(env_id: str):
    """The default parameters of a gymnax or registered environment (no prefix)."""
    if env_id in _CUSTOM:
        return _custom_env(env_id)[1]
    if env_id in _OWN:
        return _own_env(env_id)[1]
    import gymnax

    return gymnax.make(env_id)[1]


def adapter_prefixes() -> list[str]:
    return sorted(_ADAPTERS)


def split_id(env_id: str) -> tuple[str | None, str]:
    """`"brax:ant"` -> `("brax", "ant")`; a gymnax id -> `(None, id)`. Only the first colon
    splits, so `gymnasium:ale_py:ALE/Pong-v5` keeps gymnasium's own `module:EnvId` form."""
    prefix, sep, name = env_id.partition(":")
    return (prefix, name) if sep else (None, env_id)


def _gymnax_ids() -> list[str]:
    import gymnax

    return [e for e in gymnax.registered_envs if e not in _NEEDS_DOWNLOAD]


def _adapter_module(prefix: str, env_id: str):
    """The adapter's module, or a ConfigError saying what to install."""
    from rmtjax.schema import ConfigError, close_matches

    if prefix not in _ADAPTERS:
        raise ConfigError(f"env.id: {env_id!r} has an unknown prefix {prefix!r}.{close_matches(prefix, _ADAPTERS)} "
                          f"Prefixes: {', '.join(adapter_prefixes())}; an id without a prefix is a gymnax id.")
    adapter = _ADAPTERS[prefix]
    try:
        importlib.import_module(adapter.package)
    except ImportError as e:
        raise ConfigError(f"env.id: {env_id!r} needs the {adapter.package} package, which does not import "
                          f"({e}); install it with: {adapter.install}") from None
    return importlib.import_module(adapter.module)


def check_env_id(env_id: str) -> None:
    """Raise a `ConfigError` unless `env_id` names an environment that can be built here."""
    from rmtjax.schema import ConfigError, close_matches

    prefix, name = split_id(env_id)
    if prefix is None:
        ids = _gymnax_ids()
        if env_id in ids or env_id in _CUSTOM or env_id in _OWN:
            return
        ids = ids + sorted(_OWN) + registered_envs()
        hint = ""
        try:  # an id that only gymnasium has, given without its prefix
            from rmtjax.envs import gymnasium_env

            if gymnasium_env.has(env_id):
                hint = f" gymnasium has it: use 'gymnasium:{env_id}'."
        except ImportError:
            pass
        raise ConfigError(f"env.id: unknown environment {env_id!r}.{hint or close_matches(env_id, ids)} "
                          f"Available: {', '.join(ids)}; other suites by prefix: "
                          f"{', '.join(p + ':<name>' for p in adapter_prefixes())}")
    module = _adapter_module(prefix, env_id)
    if not module.has(name):
        known = module.names()
        raise ConfigError(f"env.id: {prefix} has no environment {name!r}."
                          f"{close_matches(name, known)}")


def is_host_env(env_id: str) -> bool:
    """True when `env_id` runs on the host (through a callback) rather than in JAX."""
    prefix, _ = split_id(env_id)
    return prefix is not None and prefix in _ADAPTERS and _ADAPTERS[prefix].runs_on_host


def available_envs(adapters: bool = True) -> list[str]:
    """Every gymnax id and registered id (`register_env`), then (with `adapters`) the prefixed ids of each adapter whose package
    is installed. Importing an adapter's package can be slow (brax: seconds)."""
    ids = _gymnax_ids() + sorted(_OWN) + registered_envs()
    if adapters:
        for prefix, adapter in sorted(_ADAPTERS.items()):
            try:
                importlib.import_module(adapter.package)
            except ImportError:
                continue
            ids += [f"{prefix}:{n}" for n in importlib.import_module(adapter.module).names()]
    return ids


def make_env(env_cfg) -> VecEnv:
    """A `VecEnv` for `env_cfg` (an `EnvConfig`). For gymnax ids, `env_cfg.params` overrides
    fields of the environment's default parameters; for prefixed ids, the adapter says what
    they mean."""
    check_env_id(env_cfg.id)
    prefix, name = split_id(env_cfg.id)
    if prefix is not None:
        return _adapter_module(prefix, env_cfg.id).make(name, env_cfg)

    import gymnax
    import jax.numpy as jnp

    env, params = (_custom_env(env_cfg.id) if env_cfg.id in _CUSTOM else _own_env(env_cfg.id) if env_cfg.id in _OWN
                   else gymnax.make(env_cfg.id))
    if env_cfg.params:
        checked = check_env_params(env_cfg.id, params, env_cfg.params)
        params = params.replace(**{k: jnp.asarray(v, jnp.asarray(getattr(params, k)).dtype) if isinstance(v, list) else v
                                   for k, v in checked.items()})
    return VecEnv(env, params, env_cfg)


_SPECS: dict = {}


def env_spec(env_cfg) -> EnvSpec:
    """The `EnvSpec` of the environment `env_cfg` describes, for config checks: built once (one
    env, stepped in this process) per distinct id, parameters and wrappers, then remembered, so
    validating a config again — an override, a resume — builds nothing."""
    import json

    key = (env_cfg.id, json.dumps(env_cfg.params, sort_keys=True, default=repr), env_cfg.frame_stack,
           env_cfg.normalize_obs)
    if key not in _SPECS:
        _SPECS[key] = make_env(dataclasses.replace(env_cfg, num_envs=1, host_vectorization="sync")).spec
    return _SPECS[key]


def check_env_params(env_id: str, defaults, overrides) -> dict:
    """`overrides` (name -> value) checked against the environment's default parameters: every
    name must exist and every value must have the default's kind (bool, integer, number, or a
    list of the default's length). Returns the values converted to those kinds (plain Python:
    bool, int, float, or a list of them)."""
    import numpy as np

    from rmtjax.schema import ConfigError, close_matches

    names = {f.name for f in dataclasses.fields(defaults)}
    out = {}
    for k, v in overrides.items():
        if k not in names:
            raise ConfigError(f"env.params.{k}: {env_id} has no parameter {k!r}.{close_matches(str(k), names)}")
        default = getattr(defaults, k)
        shape = np.shape(default)
        kind = np.asarray(default).dtype.kind
        try:
            arr = np.asarray(v)
        except Exception:  # ragged lists and the like: not a value of any kind we accept
            arr = np.asarray(None)
        if kind in "iu" and arr.dtype.kind == "f" and np.all(np.mod(arr, 1) == 0):
            arr = arr.astype(np.int64)  # 1e3 and 200.0 are integers written as numbers
            v = arr.tolist()
        if arr.shape != shape or arr.dtype.kind not in {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}.get(kind, kind):
            want = {"b": "true or false", "i": "an integer", "u": "an integer", "f": "a number"}.get(kind, kind)
            if shape:
                want = f"a list of {shape[0]} values, each {want}"
            raise ConfigError(f"env.params.{k}: expected {want} (like the default {np.asarray(default).tolist()!r}), got {v!r}")
        if kind == "f" and not np.all(np.isfinite(arr)):
            raise ConfigError(f"env.params.{k}: expected a finite number, got {v!r}")
        if kind in "iu" and not np.all((arr >= -(2**31)) & (arr < 2**31)):
            raise ConfigError(f"env.params.{k}: {v!r} does not fit in a 32-bit integer")
        if k == "max_steps_in_episode" and not np.all(arr >= 1):  # a time limit of 0 steps ends nothing
            raise ConfigError(f"env.params.{k}: expected an integer ≥ 1 (the time limit in steps), got {v!r}")
        out[k] = arr.astype({"b": bool, "i": np.int64, "u": np.int64, "f": np.float64}.get(kind, arr.dtype)).tolist()
    return out
