"""DQN (Mnih et al. 2015), the plain baseline: uniform ring replay, ε-greedy, an MLP (or CNN)
torso, n-step targets (one step by default) from a hard-updated target network, Double DQN only
when asked. Discrete actions only.

One iteration (`step`): **act** `rollout_len` ε-greedy steps in every env → **store** the
transitions in the ring → **learn** (once `learning_starts` env steps are done; a real branch,
the clock `t` being the same for every seed) `num_updates` guarded gradient steps on uniform
minibatches, the target network copied every `target_update_every` of them.

The loss is the squared TD error by default (as CleanRL and PureJaxRL train DQN). A Huber loss
with δ = 1 — the DQN paper's clipped error, meant for Atari's clipped rewards — diverged on
CartPole-v1 at the CleanRL/PureJaxRL settings (early TD errors far above δ, whose gradient the
Huber loss caps): Q grew to ~6e7 and every seed stayed at a return of 10. With a Huber loss
choose δ on the scale of the returns.

Presets (`rmtjax/configs/dqn_*.yaml`) are published configurations: CleanRL's `dqn.py` (also
PureJaxRL's) for CartPole-v1 and Acrobot-v1, the MinAtar paper's DQN for Breakout-MinAtar.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax import exploration
from rmtjax.agents import qlearn
from rmtjax.agents.base import Agent, hparam_metrics
from rmtjax.envs import VecEnvState, episode_metrics
from rmtjax.guard import lr_in_force, with_lr
from rmtjax.networks import QHead, QNetwork, make_torso, per_dtype
from rmtjax.networks.recurrent import RNN_TORSOS
from rmtjax.precision import PrecisionState, summarize
from rmtjax.protocol import Categorical, Learner, Signals, hparam
from rmtjax.replay import make_replay
from rmtjax.schema import ConfigError, Section, param
from rmtjax.tracing import trace_once, zeros


@dataclasses.dataclass(frozen=True)
class DQNConfig(Section):
    _section = "agent"
    rollout_len: int = param(4, lo=1, doc="env steps per env per iteration")
    updates_per_step: float = param(0.25, lo=0.0, lo_open=True, doc="gradient updates per env step")
    batch_size: int = param(128, lo=1)
    buffer_size: int = param(50_000, lo=16)
    learning_starts: int = param(1_000, lo=0, doc="env steps per seed before learning starts")
    lr: float = param(5e-4, lo=0.0, hi=1.0, lo_open=True)
    lr_end_frac: float = param(1.0, lo=0.0, hi=1.0, doc="lr at the end of training as a share of lr (linear decay)")
    optimizer: str = param("adam", choices=("adam", "rmsprop"), doc="adam, or centered RMSProp (the MinAtar paper's)")
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
                       doc="mlp, cnn (the MinAtar CNN) or nature_cnn (give hidden: [512]); lstm or gru: dense layers, "
                           "then a recurrent cell of width rnn_width learning from stored sequences (R2D2)")
    rnn_width: int = param(128, lo=1, doc="torso: lstm | gru: width of the recurrent cell")
    seq_len: int = param(16, lo=2, hi=4096, doc="torso: lstm | gru: steps per stored sequence (≥ rollout_len)")
    burn_in: int = param(4, lo=0, doc="torso: lstm | gru: leading steps of a sequence that only refresh its state")
    eps_start: float = param(1.0, lo=0.0, hi=1.0)
    eps_end: float = param(0.05, lo=0.0, hi=1.0)
    eps_decay_frac: float = param(0.5, lo=0.0, hi=1.0, lo_open=True)

    def validate_with(self, env, train):
        from rmtjax.envs import env_spec
        from rmtjax.networks import check_image_torso

        per_iter = env.num_envs * self.rollout_len
        if self.batch_size > self.buffer_size:
            raise ConfigError(f"agent.batch_size: {self.batch_size} exceeds agent.buffer_size {self.buffer_size}")
        if per_iter > self.buffer_size:
            raise ConfigError(f"agent.buffer_size: {self.buffer_size} cannot hold one iteration's {per_iter} "
                              f"transitions (env.num_envs × agent.rollout_len)")
        if train.total_steps < per_iter:
            raise ConfigError(f"train.total_steps: {train.total_steps} is less than one iteration ({per_iter})")
        spec = env_spec(env)
        if not spec.discrete:
            raise ConfigError(f"algo: dqn needs discrete actions; {env.id}'s are continuous (use rmt, which bins "
                              f"them, or sac)")
        if self.torso in RNN_TORSOS:
            qlearn.check_recurrent(self, env)
        check_image_torso(self.torso, spec.obs_shape, env.id)


@struct.dataclass
class DQNHParams:
    lr: jax.Array = hparam("lr")
    gamma: jax.Array = hparam("gamma")
    eps_start: jax.Array = hparam("eps")
    eps_end: jax.Array = hparam("eps")
    max_grad_norm: jax.Array = hparam()


@struct.dataclass
class DQNState:
    params: Any
    target_params: Any
    opt_state: Any
    env_state: VecEnvState
    obs: jax.Array
    window: Any  # qlearn.NStepWindow (the recurrent variant: its sequence window)
    replay: Any
    precision: PrecisionState
    hparams: DQNHParams
    key: jax.Array


class DQN(Agent):
    Config = DQNConfig
    HParams = DQNHParams
    data_parallel = True
    device_shares = ("batch_size", "buffer_size")

    def __init__(self, config):
        super().__init__(config)
        c = self.cfg
        self.nets = per_dtype(self._q_network, self.precision.dtypes)
        self.net = self.nets[jnp.dtype(jnp.float32)]
        self.num_updates = qlearn.updates_per_iteration(c, config.env)
        self.tx = self.guarded(qlearn.optimizer(c.optimizer, c.lr))
        self.local_batch = c.batch_size // self.shards
        self.local_envs = config.env.num_envs // self.shards
        self.replay = make_replay("uniform", capacity=c.buffer_size // self.shards)

    def _q_network(self, dtype):
        c = self.cfg
        return QNetwork(make_torso(c.torso, c.hidden, c.activation, False, dtype),
                        QHead(self.spec.num_actions, False, dtype))

    @property
    def steps_per_iteration(self) -> int:
        return self.config.env.num_envs * self.cfg.rollout_len

    @property
    def initial_env_steps(self) -> int:
        return self.config.env.num_envs * (self.cfg.n_step - 1)  # `init` fills the n-step window

    @property
    def first_learning_iteration(self) -> int:
        return self.first_iteration_with(self.cfg.learning_starts)

    def q_values(self, params, obs, dtype=jnp.float32):
        return self.nets[jnp.dtype(dtype)].apply(params, obs)

    def act(self, params, obs, key=None):
        return self.greedy(self.q_values(params, obs))

    @staticmethod
    def greedy(q):
        return jnp.argmax(q, axis=-1)

    # -- one iteration ---------------------------------------------------------------------------
    def init(self, key, hparams=None) -> DQNState:
        c, spec = self.cfg, self.spec
        k_env, k_net, k_fill, key = jax.random.split(key, 4)
        k_env, k_fill, key = self.device_keys(k_env, k_fill, key)
        obs, env_state = self.env.reset(k_env)
        params = self.net.init(k_net, obs)
        window = qlearn.empty_window(self.local_envs, c.n_step, spec.obs_shape, spec.obs_dtype)
        obs, env_state, window = qlearn.fill_window(self.env, env_state, obs, window, k_fill, c.n_step - 1,
                                                    spec.num_actions, (self.local_envs,), lambda a: a)
        example = jax.tree.map(lambda x: x[0], qlearn.emit(window))
        return DQNState(params=params, target_params=params, opt_state=self.tx.init(params), env_state=env_state,
                        obs=obs, window=window, replay=self.replay.init(example), precision=self.precision.init(),
                        hparams=self.default_hparams(hparams), key=key)

    def step(self, state: DQNState, t):
        c, hp = self.cfg, state.hparams
        progress = self.progress(t)
        epsilon = exploration.linear_schedule(hp.eps_start, hp.eps_end, progress, c.eps_decay_frac)
        lr = lr_in_force(hp.lr, progress, c.lr_end_frac)
        clip = self.precision.clip_threshold(hp.max_grad_norm, progress)
        key, k_act, k_learn = jax.random.split(state.key, 3)

        (obs, env_state, window), new, act_info = self._act(state, epsilon, k_act)
        replay = self.replay.add(state.replay, new)
        learner = (state.params, state.target_params, with_lr(state.opt_state, lr), replay, state.precision)
        args = (learner, t, k_learn, hp.gamma, clip)
        learn, (_, stats_shape) = trace_once(self._learn, *args)  # one trace serves both sides' shapes
        learner, stats = jax.lax.cond(t >= self.first_learning_iteration, lambda a: learn(*a),
                                      lambda a: (a[0], zeros(stats_shape)), args)
        params, target_params, opt_state, replay, prec_state = learner
        metrics = {"env_steps": self.env_steps_after(t), **episode_metrics(state.env_state, env_state), **stats,
                   "epsilon": epsilon, "lr_in_force": lr, "explore_frac": act_info["explore_frac"].mean(),
                   "nongreedy_frac": act_info["nongreedy_frac"].mean(), **self.replay.buffer_stats(replay), **hparam_metrics(hp),
                   **self.precision.metrics(prec_state, clip)}
        return state.replace(params=params, target_params=target_params, opt_state=opt_state, env_state=env_state,
                             obs=obs, window=window, replay=replay, precision=prec_state, key=key), metrics

    def _learn(self, learner, t, key, gamma, clip):
        """`num_updates` guarded gradient steps of iteration `t` on uniform minibatches."""
        first = (t - self.first_learning_iteration) * self.num_updates

        def update(learner, x):
            params, target_params, opt_state, replay, prec_state = learner
            k, index = x
            batch, info = self.replay.sample(replay, k, self.local_batch, 1.0)
            out = self.gradient_step(params, target_params, opt_state, prec_state, batch, info.weight, gamma, clip)
            td, q = out.aux
            due = (first + index + 1) % self.cfg.target_update_every == 0  # the same for every seed
            target_params = qlearn.update_target(out.params, target_params, False, 0.0, due)
            stats = {"loss": out.loss, "td_abs": jnp.abs(td).mean(), "q_mean": q.mean(), **out.stats}
            return (out.params, target_params, out.opt_state, replay, out.precision), stats

        xs = (jax.random.split(key, self.num_updates), jnp.arange(self.num_updates, dtype=jnp.int32))
        learner, stats = jax.lax.scan(update, learner, xs)
        return learner, summarize(stats)

    def _act(self, state: DQNState, epsilon, key):
        """`rollout_len` ε-greedy steps of every env: (obs, env_state, window), the transitions
        [T*N, ...] and the exploration statistics [T]."""

        def env_step(carry, keys):
            obs, env_state, window = carry
            k_act, k_env = keys
            q = self.precision.select(state.precision, lambda dt: self.q_values(state.params, obs, dt))
            action, act_info, _ = exploration.select_action(k_act, q, epsilon, 1.0, boltzmann=False)
            next_obs, env_state, reward, term, _, info = self.env.step(k_env, env_state, action)
            window = qlearn.push(window, obs, action, reward, term, info["done"], info["final_obs"])
            return (next_obs, env_state, window), (qlearn.emit(window), act_info)

        carry, (new, act_info) = jax.lax.scan(env_step, (state.obs, state.env_state, state.window),
                                  jax.random.split(key, (self.cfg.rollout_len, 2)))
        return carry, jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), new), act_info

    def gradient_step(self, params, target_params, opt_state, prec_state, batch, weight, gamma, clip,
                      temperature=None):
        """One guarded step on a minibatch; `aux` is (TD errors, Q of the taken actions)."""
        c = self.cfg

        def loss_fn(p, dtype):
            q_all = self.q_values(p, batch["obs"], dtype)
            q_next = self.q_values(target_params, batch["boot_obs"], dtype)
            chooser = jax.lax.stop_gradient(self.q_values(p, batch["boot_obs"], dtype)) if c.double_q else q_next
            td, q = qlearn.nstep_td(q_all, q_next, chooser, batch, gamma)
            return qlearn.td_loss(td, weight, c.loss, c.huber_delta), (td, q)

        return self.precision.step(prec_state, loss_fn, params, opt_state, self.tx, clip,
                                   penalty=self.transfer_penalty(opt_state, batch["obs"]))

    # -- the protocol --------------------------------------------------------------------------
    def signals(self, metrics) -> Signals:
        return Signals(episode_return=metrics["episode_return"], episodes=metrics["episode_count"],
                       value_loss=metrics["loss"], explore=metrics["nongreedy_frac"],
                       q_magnitude=metrics["q_mean"], skipped_frac=metrics["skipped_frac"])

    def learner(self, state: DQNState) -> Learner:
        return Learner(params=state.params, opt_state=state.opt_state, target=state.target_params, extra={})

    def with_learner(self, state: DQNState, learner: Learner) -> DQNState:
        return state.replace(params=learner.params, opt_state=learner.opt_state, target_params=learner.target)

    def param_groups(self, params):
        """torso/<module>, head/<module>."""
        return jax.tree_util.tree_map_with_path(lambda path, _: f"{path[1].key}/{path[2].key}", params)

    def policy_distribution(self, params, obs, dtype=jnp.float32, temperature=None):
        """softmax(Q): the policy the transfer layer compares (DQN acts ε-greedily on it)."""
        return Categorical(self.q_values(params, obs, dtype))
