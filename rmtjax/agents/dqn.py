"""Plain DQN: the ablation baseline of RMT.

Uniform ring replay, ε-greedy exploration, an MLP torso, one-step targets from a hard-updated
target network, no dueling head, no Double-DQN unless asked. It runs on the RMT machinery
(same env loop, same learning step), with every RMT-specific component switched off, so a
comparison of the two measures the components and nothing else.
"""

from __future__ import annotations

import dataclasses

from rmtjax.agents.rmt import RMT, RMTConfig
from rmtjax.config import Section, param


@dataclasses.dataclass(frozen=True)
class DQNConfig(Section):
    _section = "agent"
    rollout_len: int = param(4, lo=1, doc="env steps per env per iteration")
    updates_per_step: float = param(0.25, lo=0.0, lo_open=True, doc="gradient updates per env step")
    batch_size: int = param(128, lo=1)
    buffer_size: int = param(50_000, lo=16)
    learning_starts: int = param(1_000, lo=0)
    lr: float = param(5e-4, lo=0.0, hi=1.0, lo_open=True)
    gamma: float = param(0.99, lo=0.0, hi=1.0)
    n_step: int = param(1, lo=1, hi=32)
    double_q: bool = param(False)
    target_update_every: int = param(500, lo=1, doc="gradient steps between target updates")
    huber_delta: float = param(1.0, lo=0.0, lo_open=True)
    max_grad_norm: float = param(10.0, lo=0.0, lo_open=True)
    hidden: tuple[int, ...] = param((128, 128), lo=1)
    activation: str = param("relu", choices=("relu", "tanh", "gelu", "silu", "elu"))
    torso: str = param("mlp", choices=("mlp", "cnn"))
    eps_start: float = param(1.0, lo=0.0, hi=1.0)
    eps_end: float = param(0.05, lo=0.0, hi=1.0)
    eps_decay_frac: float = param(0.5, lo=0.0, hi=1.0, lo_open=True)

    def validate_with(self, env, train):
        DQN.settings(self).validate_with(env, train)


class DQN(RMT):
    Config = DQNConfig

    @staticmethod
    def settings(agent_cfg) -> RMTConfig:
        fixed = {"replay": "uniform", "exploration": "eps_greedy", "dueling": False, "layer_norm": False,
                 "target_update": "hard"}
        return RMTConfig(**dataclasses.asdict(agent_cfg), **fixed)
