"""Plain DQN: the baseline of RMT.

Uniform ring replay, ε-greedy exploration, an MLP torso, one-step targets from a hard-updated
target network, no dueling head, no Double-DQN unless asked. It runs on the RMT machinery
(same env loop, same learning step), with every RMT-specific component switched off, so a
comparison of the two measures the components and nothing else — and the machinery costs
nothing it does not use: a uniform replay computes no TD error at insertion and keeps no tiers.

The loss is the squared TD error by default (as CleanRL and PureJaxRL train DQN). A Huber loss
with δ = 1 — the DQN paper's clipped error, meant for Atari's clipped rewards — diverged on
CartPole-v1 at the CleanRL/PureJaxRL settings (returns up to 500, early TD errors far above δ,
whose gradient the Huber loss caps at δ): Q grew to ~6e7 and every seed stayed at a return of
10, here and in PureJaxRL's own DQN with only its loss swapped. With a Huber loss choose δ on
the scale of the returns (`agent.loss: huber`, `agent.huber_delta`).

Presets (`rmtjax/configs/dqn_*.yaml`) are published configurations: CleanRL's `dqn.py` (also
PureJaxRL's `dqn.py`) for CartPole-v1 and Acrobot-v1, the MinAtar paper's DQN for
Breakout-MinAtar.
"""

from __future__ import annotations

import dataclasses

from rmtjax.agents.rmt import RMT, RMTConfig
from rmtjax.networks.recurrent import RNN_TORSOS
from rmtjax.schema import Section, param


@dataclasses.dataclass(frozen=True)
class DQNConfig(Section):
    _section = "agent"
    rollout_len: int = param(4, lo=1, doc="env steps per env per iteration")
    updates_per_step: float = param(0.25, lo=0.0, lo_open=True, doc="gradient updates per env step")
    batch_size: int = param(128, lo=1)
    buffer_size: int = param(50_000, lo=16)
    learning_starts: int = param(1_000, lo=0, doc="env steps per seed before learning starts")
    lr: float = param(5e-4, lo=0.0, hi=1.0, lo_open=True)
    lr_end_frac: float = param(1.0, lo=0.0, hi=1.0, doc="learning rate at the end of training as a share of lr "
                                                        "(linear decay from the start; 1 keeps it constant)")
    optimizer: str = param("adam", choices=("adam", "rmsprop"), doc="adam, or centered RMSProp (decay 0.95, "
                                                                     "eps 0.01: the MinAtar paper's DQN)")
    gamma: float = param(0.99, lo=0.0, hi=1.0)
    n_step: int = param(1, lo=1, hi=32)
    double_q: bool = param(False)
    target_update_every: int = param(500, lo=1, doc="gradient steps between target updates")
    loss: str = param("mse", choices=("mse", "huber"), doc="mse (the mean squared TD error) or huber")
    huber_delta: float = param(1.0, lo=0.0, lo_open=True, doc="with loss: huber, on the scale of the returns")
    max_grad_norm: float = param(10.0, lo=0.0, doc="global-norm gradient clip; 0: no clipping")
    hidden: tuple[int, ...] = param((128, 128), lo=1)
    activation: str = param("relu", choices=("relu", "tanh", "gelu", "silu", "elu"))
    torso: str = param("mlp", choices=("mlp", "cnn", "nature_cnn") + RNN_TORSOS,
                       doc="mlp, cnn (the MinAtar CNN) or nature_cnn (Mnih et al. 2015; give hidden: [512]); lstm or "
                           "gru: dense layers of widths `hidden`, then a recurrent cell of width rnn_width, learning "
                           "from stored sequences with their hidden state and a burn-in (R2D2)")
    rnn_width: int = param(128, lo=1, doc="torso: lstm | gru: width of the recurrent cell (its hidden state)")
    seq_len: int = param(16, lo=2, hi=4096, doc="torso: lstm | gru: steps per stored sequence (≥ rollout_len); "
                                                "buffer_size counts transitions, batch_size sequences")
    burn_in: int = param(4, lo=0, doc="torso: lstm | gru: the first burn_in steps of a sequence only refresh the "
                                      "stored hidden state (no loss, no gradient)")
    eps_start: float = param(1.0, lo=0.0, hi=1.0)
    eps_end: float = param(0.05, lo=0.0, hi=1.0)
    eps_decay_frac: float = param(0.5, lo=0.0, hi=1.0, lo_open=True)
    diagnostics_every: int = param(100, lo=1, doc="iterations between computations of top_td_share")

    def validate_with(self, env, train):
        DQN.settings(self).validate_with(env, train)


class DQN(RMT):
    Config = DQNConfig

    @staticmethod
    def settings(agent_cfg) -> RMTConfig:
        fixed = {"replay": "uniform", "exploration": "eps_greedy", "dueling": False, "layer_norm": False,
                 "target_update": "hard"}
        return RMTConfig(**dataclasses.asdict(agent_cfg), **fixed)
