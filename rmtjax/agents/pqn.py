"""PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning") for discrete actions.

Q-learning without a replay buffer or a target network: many vectorised envs decorrelate the
data, a LayerNorm in the Q-network keeps the bootstrapped targets stable. One iteration:

1. roll out `rollout_len` steps in `num_envs` envs, ε-greedy on the online network (computing
   in the precision policy's dtype);
2. λ-returns over the rollout (`lambda_returns`), bootstrapping from max_a Q(s'_t, a) of the
   networks as they are before this iteration's updates, where s'_t is the observation step t
   ended in before any reset: a time-limit truncation bootstraps, a termination never does,
   and no return flows across an episode boundary;
3. `num_epochs` passes of `num_minibatches` updates of ½ (Q(s_t, a_t) − G_t)², each through
   the update guard (`rmtjax.guard`: global-norm clipping, a non-finite update is skipped).

The learning rate decays linearly from `lr` to `lr × lr_end_frac` over the run and ε from
`eps_start` to `eps_end` over the first `eps_decay_frac` of it, both read from the clock `t`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from rmtjax import exploration
from rmtjax.agents.base import Agent, hparam_metrics
from rmtjax.envs import VecEnvState, episode_metrics
from rmtjax.guard import lr_in_force, with_lr
from rmtjax.networks import QHead, QNetwork, make_torso, per_dtype
from rmtjax.networks.recurrent import RNN_TORSOS
from rmtjax.precision import PrecisionState, summarize
from rmtjax.protocol import Learner, Signals, hparam
from rmtjax.schema import ConfigError, Section, param

OPTIMIZERS = {"adam": optax.adam, "radam": optax.radam}


@dataclasses.dataclass(frozen=True)
class PQNConfig(Section):
    """PQN's settings. The defaults (used where no preset exists) are the published MinAtar
    configuration scaled to the default `env.num_envs` of 4: the same rollout length (32), epochs
    (2), minibatch size (128 transitions, hence one minibatch of 4 × 32) and so the same number of
    updates per env step, the same lr (5e-4, decayed linearly), λ (0.65), ε schedule (1 → 0.05 over
    the first 10%), clip (10) and RAdam; an MLP torso (128, 128) with LayerNorm, since an env nobody
    tuned for need not have image observations. With more envs, raise `num_minibatches` to keep
    the minibatch near 128.
    """

    _section = "agent"
    rollout_len: int = param(32, lo=1, doc="steps per env per iteration (the λ-return horizon)")
    num_epochs: int = param(2, lo=1, doc="passes over each rollout")
    num_minibatches: int = param(1, lo=1, doc="minibatches per epoch; must divide env.num_envs × rollout_len")
    lr: float = param(5e-4, lo=0.0, hi=1.0, lo_open=True, doc="learning rate at the start of training")
    lr_end_frac: float = param(0.0, lo=0.0, hi=1.0, doc="learning rate at the end of training as a share of lr "
                                                        "(linear decay over the run; 1 keeps it constant)")
    gamma: float = param(0.99, lo=0.0, hi=1.0, doc="discount")
    td_lambda: float = param(0.65, lo=0.0, hi=1.0, doc="λ of the λ-returns (0: one-step Q-learning targets)")
    eps_start: float = param(1.0, lo=0.0, hi=1.0, doc="ε of the ε-greedy policy at the start of training")
    eps_end: float = param(0.05, lo=0.0, hi=1.0, doc="ε after the decay")
    eps_decay_frac: float = param(0.1, lo=0.0, hi=1.0, lo_open=True, doc="share of training over which ε "
                                                                        "decays linearly")
    max_grad_norm: float = param(10.0, lo=0.0, lo_open=True, doc="global-norm gradient clip (initial; see "
                                                                  "precision.clip_decay_to)")
    optimizer: str = param("radam", choices=tuple(OPTIMIZERS), doc="optax optimiser (PQN's reference uses "
                                                                   "RAdam)")
    torso: str = param("mlp", choices=("mlp", "cnn", "nature_cnn") + RNN_TORSOS,
                       doc="mlp: dense layers of widths `hidden`; cnn: the MinAtar CNN (image observations) with one "
                           "dense layer of width hidden[0]; nature_cnn: Mnih et al. 2015's convolutions, then dense "
                           "layers of widths `hidden` ([512]); lstm or gru: the dense layers, then a recurrent cell "
                           "of width rnn_width (truncated BPTT over the rollout, minibatches of whole env sequences)")
    rnn_width: int = param(128, lo=1, doc="torso: lstm | gru: width of the recurrent cell (its hidden state)")
    hidden: tuple[int, ...] = param((128, 128), lo=1, doc="mlp: hidden widths; cnn: one width, of the dense "
                                                          "layer after the convolution")
    activation: str = param("relu", choices=("relu", "tanh", "gelu", "silu", "elu"), doc="hidden activation")
    layer_norm: bool = param(True, doc="LayerNorm before each hidden activation (PQN's stabiliser in place "
                                       "of a target network)")

    def validate(self):
        if self.torso == "cnn" and len(self.hidden) != 1:
            raise ConfigError(f"agent.hidden: the cnn torso has one dense layer, so give one width, e.g. [128]; "
                              f"got {list(self.hidden)}")

    def validate_with(self, env, train):
        from rmtjax.envs import env_spec

        spec = env_spec(env)
        if not spec.discrete:
            raise ConfigError(f"algo: pqn needs discrete actions; {env.id} has continuous (box) actions. Use rmt "
                              f"(bins each action dimension), ppo or sac")
        batch = env.num_envs * self.rollout_len
        if batch % self.num_minibatches:
            raise ConfigError(f"agent.num_minibatches: {self.num_minibatches} must divide env.num_envs × "
                              f"agent.rollout_len = {batch}")
        if self.torso in RNN_TORSOS and env.num_envs % self.num_minibatches:
            raise ConfigError(f"agent.num_minibatches: {self.num_minibatches} must divide env.num_envs = "
                              f"{env.num_envs} with torso: {self.torso} (a minibatch is whole env sequences)")
        if train.total_steps < batch:
            raise ConfigError(f"train.total_steps: {train.total_steps} is less than one iteration "
                              f"(env.num_envs × agent.rollout_len = {batch})")
        from rmtjax.networks import check_image_torso

        check_image_torso(self.torso, spec.obs_shape, env.id)


@struct.dataclass
class PQNHParams:
    lr: jax.Array = hparam("lr")
    gamma: jax.Array = hparam("gamma")
    td_lambda: jax.Array = hparam()
    eps_start: jax.Array = hparam("eps")
    eps_end: jax.Array = hparam("eps")
    max_grad_norm: jax.Array = hparam()


@struct.dataclass
class PQNState:
    params: Any  # the Q-network's (the only network: no target copy)
    opt_state: Any
    env_state: VecEnvState
    obs: jax.Array  # [num_envs, *obs_shape] current observation
    precision: PrecisionState
    hparams: PQNHParams
    key: jax.Array


def lambda_returns(reward, next_q, terminated, done, gamma, lam):
    """λ-returns G [T, N] of a rollout, computed backwards.

    `next_q[t]` is max_a Q(s'_t, a) of the observation step t ended in (pre-reset). Inside an
    episode G_t = r_t + γ (1 − terminated_t) [(1 − λ) next_q_t + λ G_{t+1}]; at an episode end
    (`done`) or the rollout's last step G_t = r_t + γ (1 − terminated_t) next_q_t. So a truncated
    step bootstraps, a terminal one does not, and no return crosses an episode boundary.
    """
    def back(g_next, x):
        r, q, term, dn = x
        ahead = jnp.where(dn, q, (1.0 - lam) * q + lam * g_next)
        g = r + gamma * (1.0 - term.astype(jnp.float32)) * ahead
        return g, g

    # seeding the carry with the last step's own bootstrap makes its mix (1-λ)q + λq = q
    _, g = jax.lax.scan(back, next_q[-1], (reward, next_q, terminated, done), reverse=True)
    return g


class PQN(Agent):
    Config = PQNConfig
    HParams = PQNHParams

    def __init__(self, config):
        super().__init__(config)
        c = self.cfg
        # one module per compute dtype (same float32 parameters); `net` is the float32 one
        self.nets = per_dtype(self._q_network, self.precision.dtypes)
        self.net = self.nets[jnp.dtype(jnp.float32)]
        # the clip is the guard's; the lr is injected each iteration (the decay)
        self.tx = self.guarded(optax.inject_hyperparams(OPTIMIZERS[c.optimizer])(learning_rate=c.lr))

    def _q_network(self, dtype):
        """The Q-network computing in `dtype`."""
        c = self.cfg
        torso = make_torso(c.torso, c.hidden, c.activation, c.layer_norm, dtype)
        return QNetwork(torso, QHead(self.spec.num_actions, False, dtype))

    @property
    def steps_per_iteration(self) -> int:
        return self.config.env.num_envs * self.cfg.rollout_len

    def q_values(self, params, obs, dtype=jnp.float32):
        """Q of every action [B, A], float32, with the network computing in `dtype`."""
        return self.nets[jnp.dtype(dtype)].apply(params, obs)

    def init(self, key, hparams=None) -> PQNState:
        k_env, k_net, key = jax.random.split(key, 3)
        obs, env_state = self.env.reset(k_env)
        params = self.net.init(k_net, obs)
        return PQNState(params=params, opt_state=self.tx.init(params), env_state=env_state, obs=obs,
                        precision=self.precision.init(), hparams=self.default_hparams(hparams), key=key)

    def act(self, params, obs, key=None):
        """Greedy action [B] (argmax of Q, in float32)."""
        return self.greedy(self.q_values(params, obs))

    def greedy(self, q):
        """The greedy action of Q values [B, A]."""
        return jnp.argmax(q, axis=-1)

    def _schedule(self, hp: PQNHParams, t):
        """(ε, learning rate, clip threshold) in force at iteration `t`."""
        progress = self.progress(t)
        return (exploration.linear_schedule(hp.eps_start, hp.eps_end, progress, self.cfg.eps_decay_frac),
                lr_in_force(hp.lr, progress, self.cfg.lr_end_frac),
                self.precision.clip_threshold(hp.max_grad_norm, progress))

    def _learn(self, state: PQNState, k_epochs, lr, clip, loss_fn, epoch_minibatches, prepare=lambda mb: mb):
        """The learning phase every PQN variant shares: `num_epochs` passes, each over the
        minibatches `epoch_minibatches(k)` stacks on a leading axis (a key `k` per epoch), each
        minibatch prepared by `prepare` and taken by one guarded step of `loss_fn(params, mb,
        dtype) -> (loss, aux)`. -> (params, opt_state, precision state, metrics summarised over
        the accepted updates)."""
        prec = self.precision
        opt_state = with_lr(state.opt_state, lr)

        def update_minibatch(carry, mb):
            params, opt_state, prec_state = carry
            mb = prepare(mb)
            out = prec.step(prec_state, lambda p, dt: loss_fn(p, mb, dt), params, opt_state, self.tx, clip)
            return (out.params, out.opt_state, out.precision), {"loss": out.loss, **out.aux, **out.stats}

        def update_epoch(carry, k):
            return jax.lax.scan(update_minibatch, carry, epoch_minibatches(k))

        (params, opt_state, prec_state), aux = jax.lax.scan(
            update_epoch, (state.params, opt_state, state.precision), jax.random.split(k_epochs, self.cfg.num_epochs))
        return params, opt_state, prec_state, summarize(aux)  # means over the updates the guard accepted

    def _metrics(self, state: PQNState, t, env_state, stats, targets, traj, epsilon, lr, prec_state, clip) -> dict:
        """An iteration's metrics, the same for every PQN variant."""
        return {"env_steps": self.env_steps_after(t), **episode_metrics(state.env_state, env_state), **stats,
                "target_mean": targets.mean(), "q_max_mean": traj["q_max"].mean(),
                "epsilon": epsilon, "lr_in_force": lr, "explore_frac": traj["explore"].mean(),
                "nongreedy_frac": traj["nongreedy"].mean(), **hparam_metrics(state.hparams),
                **self.precision.metrics(prec_state, clip)}

    def step(self, state: PQNState, t):
        c, hp, prec = self.cfg, state.hparams, self.precision
        epsilon, lr, clip = self._schedule(hp, t)

        # 1. act
        def env_step(carry, k):
            obs, env_state = carry
            k_act, k_env = jax.random.split(k)
            q = prec.select(state.precision, lambda dt: self.q_values(state.params, obs, dt))
            action, info, _ = exploration.select_action(k_act, q, epsilon, jnp.float32(1.0), boltzmann=False)
            next_obs, env_state, reward, term, _, env_info = self.env.step(k_env, env_state, action)
            tr = dict(obs=obs, action=action, reward=reward, terminated=term, done=env_info["done"],
                      final_obs=env_info["final_obs"], q_max=q.max(-1), explore=info["explore_frac"],
                      nongreedy=info["nongreedy_frac"])
            return (next_obs, env_state), tr

        key, k_roll, k_epochs = jax.random.split(state.key, 3)
        (obs, env_state), traj = jax.lax.scan(env_step, (state.obs, state.env_state),
                                              jax.random.split(k_roll, c.rollout_len))

        # 2. λ-returns; the one extra forward pass: the pre-reset observations, before any update
        T, N = traj["reward"].shape
        flat_final = traj["final_obs"].reshape((T * N,) + traj["final_obs"].shape[2:])
        next_q = prec.select(state.precision, lambda dt: self.q_values(state.params, flat_final, dt))
        next_q = jax.lax.stop_gradient(next_q.max(-1).reshape(T, N))
        targets = lambda_returns(traj["reward"], next_q, traj["terminated"], traj["done"], hp.gamma, hp.td_lambda)
        batch = {"obs": traj["obs"].reshape((T * N,) + traj["obs"].shape[2:]),
                 "action": traj["action"].reshape(-1), "target": targets.reshape(-1)}

        # 3. learn
        def loss_fn(params, mb, dtype):
            q = jnp.take_along_axis(self.q_values(params, mb["obs"], dtype), mb["action"][:, None], axis=-1)[:, 0]
            err = q - mb["target"]
            return 0.5 * jnp.mean(err**2), {"q_mean": q.mean(), "td_abs": jnp.abs(err).mean()}

        def epoch_minibatches(k):
            perm = jax.random.permutation(k, T * N)
            return jax.tree.map(lambda x: x[perm].reshape((c.num_minibatches, -1) + x.shape[1:]), batch)

        params, opt_state, prec_state, stats = self._learn(state, k_epochs, lr, clip, loss_fn, epoch_minibatches)
        new_state = state.replace(params=params, opt_state=opt_state, env_state=env_state, obs=obs,
                                  precision=prec_state, key=key)
        return new_state, self._metrics(state, t, env_state, stats, targets, traj, epsilon, lr, prec_state, clip)

    # -- the protocol --------------------------------------------------------------------------
    def signals(self, metrics) -> Signals:
        return Signals(episode_return=metrics["episode_return"], episodes=metrics["episode_count"],
                       value_loss=metrics["loss"], explore=metrics["nongreedy_frac"],
                       q_magnitude=metrics["q_max_mean"], skipped_frac=metrics["skipped_frac"])

    def learner(self, state: PQNState) -> Learner:
        return Learner(params=state.params, opt_state=state.opt_state)

    def with_learner(self, state: PQNState, learner: Learner) -> PQNState:
        return state.replace(params=learner.params, opt_state=learner.opt_state)
