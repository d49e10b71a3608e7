"""Environments: `make_env(env_cfg)` builds a wrapped, vectorised environment from an id.

Every gymnax id is available (`available_envs()`); other suites register adapters in
`_ADAPTERS` by a prefix such as `gymnasium:` or `brax:`.
"""

from __future__ import annotations

import dataclasses

from rmtjax.envs.vec import EnvSpec, VecEnv, VecEnvState, episode_metrics, final_return

__all__ = ["EnvSpec", "VecEnv", "VecEnvState", "available_envs", "episode_metrics", "final_return", "make_env"]

# Ids that gymnax registers but that need a data download at construction; not offered here.
_NEEDS_DOWNLOAD = {"MNISTBandit-bsuite"}


def available_envs() -> list[str]:
    import gymnax

    return [e for e in gymnax.registered_envs if e not in _NEEDS_DOWNLOAD]


def make_env(env_cfg) -> VecEnv:
    """A `VecEnv` for `env_cfg` (an `EnvConfig`), with `env_cfg.params` applied to the
    environment's default parameters."""
    import gymnax
    import jax.numpy as jnp

    from rmtjax.config import ConfigError, _close

    if env_cfg.id not in available_envs():
        raise ConfigError(f"env.id: unknown environment {env_cfg.id!r}.{_close(env_cfg.id, available_envs())}")
    env, params = gymnax.make(env_cfg.id)
    if env_cfg.params:
        checked = check_env_params(env_cfg.id, params, env_cfg.params)
        params = params.replace(**{k: jnp.asarray(v, jnp.asarray(getattr(params, k)).dtype) if isinstance(v, list) else v
                                   for k, v in checked.items()})
    return VecEnv(env, params, env_cfg)


def check_env_params(env_id: str, defaults, overrides) -> dict:
    """`overrides` (name -> value) checked against the environment's default parameters: every
    name must exist and every value must have the default's kind (bool, integer, number, or a
    list of the default's length). Returns the values converted to those kinds (plain Python:
    bool, int, float, or a list of them)."""
    import numpy as np

    from rmtjax.config import ConfigError, _close

    names = {f.name for f in dataclasses.fields(defaults)}
    out = {}
    for k, v in overrides.items():
        if k not in names:
            raise ConfigError(f"env.params.{k}: {env_id} has no parameter {k!r}.{_close(str(k), names)}")
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
        out[k] = arr.astype({"b": bool, "i": np.int64, "u": np.int64, "f": np.float64}.get(kind, arr.dtype)).tolist()
    return out
