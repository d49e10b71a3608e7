"""The agent registry: algorithm name -> agent class (each with a `Config` section).

Modules are imported on first use, so reading a config does not build every agent.
"""

from __future__ import annotations

import importlib

_REGISTRY = {
    "ppo": "rmtjax.agents.ppo:PPO",
    "rmt": "rmtjax.agents.rmt:RMT",
    "dqn": "rmtjax.agents.dqn:DQN",
    "sac": "rmtjax.agents.sac:SAC",
    "pqn": "rmtjax.agents.pqn:PQN",
}


def available_algos() -> list[str]:
    return sorted(_REGISTRY)


def agent_class(algo: str):
    from rmtjax.schema import ConfigError, close_matches

    if algo not in _REGISTRY:
        raise ConfigError(f"algo: unknown algorithm {algo!r}.{close_matches(algo, _REGISTRY)}")
    module, name = _REGISTRY[algo].split(":")
    return getattr(importlib.import_module(module), name)


def agent_config_class(algo: str):
    return agent_class(algo).Config


def build_agent(config):
    """The agent object for a validated `Config`."""
    return agent_class(config.algo)(config)
