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

    from rmtjax.config import ConfigError, _close

    if env_cfg.id not in available_envs():
        raise ConfigError(f"env.id: unknown environment {env_cfg.id!r}.{_close(env_cfg.id, available_envs())}")
    env, params = gymnax.make(env_cfg.id)
    if env_cfg.params:
        names = {f.name for f in dataclasses.fields(params)}
        for k in env_cfg.params:
            if k not in names:
                raise ConfigError(f"env.params.{k}: {env_cfg.id} has no parameter {k!r}.{_close(k, names)}")
        params = params.replace(**env_cfg.params)
    return VecEnv(env, params, env_cfg)
