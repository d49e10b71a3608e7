"""The agent registry: algorithm name -> agent class (each with a `Config` section).

Modules are imported on first use, so reading a config does not build every agent. A new agent
joins with `register_agent(name, cls_or_path)`; it gets the shared layers (meta-controller,
PBT, curriculum, precision, devices, run directories) by implementing `rmtjax.protocol`.
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
_BUILTIN = dict(_REGISTRY)


def register_agent(name: str, agent) -> None:
    """Make `algo: name` build `agent`: an agent class, or `"module:Class"` imported on first use
    (a process that resumes a run directory must register its agent again before it does)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_agent: the name must be an identifier, got {name!r}")
    if isinstance(agent, str):
        if agent.count(":") != 1:
            raise ValueError(f"register_agent({name!r}, {agent!r}): expected 'module:Class'")
    else:
        members = ("Config", "HParams", "data_parallel", "check_devices", "init", "step", "act",
                   "signals", "learner", "with_learner", "max_entropy", "steps_per_iteration", "num_iterations")
        missing = [m for m in members if not hasattr(agent, m)]
        if not isinstance(agent, type) or missing:
            raise TypeError(f"register_agent({name!r}): {agent!r} is not an agent class implementing "
                            f"rmtjax.protocol.AgentProtocol{' (missing ' + ', '.join(missing) + ')' if missing else ''}")
    _REGISTRY[name] = agent


def available_algos() -> list[str]:
    return sorted(_REGISTRY)


def agent_class(algo: str):
    from rmtjax.schema import ConfigError, close_matches

    if algo not in _REGISTRY:
        raise ConfigError(f"algo: unknown algorithm {algo!r}.{close_matches(algo, _REGISTRY)}")
    entry = _REGISTRY[algo]
    if not isinstance(entry, str):
        return entry
    module, name = entry.split(":")
    return getattr(importlib.import_module(module), name)


def agent_config_class(algo: str):
    return agent_class(algo).Config


# the built-in agents' recurrent variants (`agent.torso: lstm | gru`): subclasses of the registered
# class with a hidden state (`rmtjax.protocol`: recurrent, initial_carry, act_step)
_RECURRENT = {
    "ppo": "rmtjax.agents.recurrent:RecurrentPPO",
    "pqn": "rmtjax.agents.recurrent:RecurrentPQN",
    "dqn": "rmtjax.agents.r2d2:RecurrentDQN",
    "rmt": "rmtjax.agents.r2d2:RecurrentRMT",
}


def recurrent_variant(algo: str):
    """The class a built-in `algo` is built as with a recurrent torso (None where it has none)."""
    if algo not in _RECURRENT or _REGISTRY.get(algo) != _BUILTIN.get(algo):
        return None
    module, name = _RECURRENT[algo].split(":")
    return getattr(importlib.import_module(module), name)


def build_agent(config):
    """The agent object for a validated `Config` (a built-in agent with `agent.torso: lstm | gru`:
    its recurrent variant)."""
    if getattr(config.agent, "torso", None) in ("lstm", "gru"):
        variant = recurrent_variant(config.algo)
        if variant is not None:
            return variant(config)
    return agent_class(config.algo)(config)
