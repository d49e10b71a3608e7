"""The RMT agent (Residual, Meta-controlled, Tiered): value-based learning with tiered replay keyed
on |TD error|, ε-greedy mixed with Boltzmann exploration at an entropy-driven temperature, and a
choice of torsos (the fractal residual block among them). One iteration, top to bottom (`step`):

1. **act**: `rollout_len` steps of every env, one forward pass each; ε-greedy over a Boltzmann
   draw whose temperature moves towards a target entropy; n-step transitions (`qlearn`: cut at
   an episode's end, bootstrapping through a truncation, never through a termination);
2. **store**: no forward pass at insertion: in the tiered replay (`rmtjax.replay.ranked`: one
   FIFO ring, tiers by exact rank of each item's last |TD|) a new item is hottest until drawn;
3. **learn** (once `learning_starts` env steps are done; `t` is the same for every seed, so a
   real branch): `num_updates` guarded steps on minibatches drawn across the tiers with
   importance weights, n-step (Double-)DQN targets; the drawn items' |TD| are written back, the
   ring is re-ranked every `rank_every` updates (top-k on the device), the target follows.
Torso: one 64-wide dense layer with LayerNorm (measured faster to a threshold than the fractal block);
the fractal `x + f1(x) + f2(f1(x))` as `dense_fractal` (images flattened) or `fractal` (3×3 convolutions
on images). On D devices each holds `num_envs / D` envs, `buffer_size / D` of the replay, `batch_size / D`
of a minibatch; the guard fuses the gradients. Continuous actions: `bins` values per dim, Q = mean_d Q_d.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax import exploration
from rmtjax.agents import qlearn
from rmtjax.agents.base import Agent, hparam_metrics
from rmtjax.envs import VecEnvState, episode_metrics
from rmtjax.guard import lr_in_force, with_lr
from rmtjax.networks import TORSOS, PerDimQHead, QHead, QNetwork, make_torso, per_dtype
from rmtjax.networks.recurrent import RNN_TORSOS
from rmtjax.precision import PrecisionState, ema, finite_abs, summarize
from rmtjax.protocol import Categorical, Learner, Signals, hparam
from rmtjax.replay import demonstrations, hier_options, make_replay, mixer
from rmtjax.replay.hier_options import HierOptions
from rmtjax.replay.mixer import DemoMixer, DemoOptions, margin_loss
from rmtjax.schema import ConfigError, Section, param
from rmtjax.tracing import trace_once, zeros


@dataclasses.dataclass(frozen=True)
class RMTConfig(Section, HierOptions, DemoOptions):
    _section = "agent"
    # acting and learning schedule
    rollout_len: int = param(8, lo=1, doc="env steps per env per iteration")
    updates_per_step: float = param(0.0625, lo=0.0, lo_open=True, doc="gradient updates per env step (replay ratio)")
    batch_size: int = param(128, lo=1)
    buffer_size: int = param(50_000, lo=16, doc="total replay capacity (all tiers)")
    learning_starts: int = param(1_000, lo=0, doc="env steps per seed before learning starts")
    # targets and optimisation
    lr: float = param(5e-4, lo=0.0, hi=1.0, lo_open=True)
    lr_end_frac: float = param(1.0, lo=0.0, hi=1.0, doc="lr at the end of training as a share of lr (linear decay)")
    optimizer: str = param("adam", choices=("adam", "rmsprop"), doc="adam, or centered RMSProp (the MinAtar paper's)")
    gamma: float = param(0.99, lo=0.0, hi=1.0)
    n_step: int = param(3, lo=1, hi=32, doc="n of the n-step return")
    double_q: bool = param(False, doc="Double-DQN targets (online argmax, target value): one more forward pass")
    target_update: str = param("hard", choices=("hard", "polyak"))
    target_update_every: int = param(125, lo=1, doc="gradient steps between hard target updates")
    tau: float = param(0.005, lo=0.0, hi=1.0, lo_open=True, doc="Polyak rate")
    loss: str = param("huber", choices=("huber", "mse"))
    huber_delta: float = param(1.0, lo=0.0, lo_open=True)
    max_grad_norm: float = param(0.5, lo=0.0, doc="global-norm gradient clip (see precision.clip_decay_to); 0: none")
    # network
    torso: str = param("mlp", choices=TORSOS + RNN_TORSOS,
                       doc="mlp; dense_fractal (x + f1(x) + f2(f1(x)) blocks; images flattened), fractal (3×3 convolutions "
                           "on images), residual, cnn, nature_cnn; lstm | gru: recurrent (R2D2; uniform, n_step 1)")
    hidden: tuple[int, ...] = param((64,), lo=1, doc="MLP widths; (width,) × blocks for the fractals/residual (fractal "
                                                     "on images: blocks of 16 channels, then a dense layer of width)")
    activation: str = param("relu", choices=("relu", "tanh", "gelu", "silu", "elu"))
    layer_norm: bool = param(True)
    dueling: bool = param(True)
    bins: int = param(11, lo=2, hi=1001, doc="continuous actions: values per action dimension")
    rnn_width: int = param(128, lo=1, doc="torso: lstm | gru: width of the recurrent cell")
    seq_len: int = param(16, lo=2, hi=4096, doc="torso: lstm | gru: steps per stored sequence (≥ rollout_len)")
    burn_in: int = param(4, lo=0, doc="torso: lstm | gru: leading steps of a sequence that only refresh its state")
    # replay
    replay: str = param("tiered", choices=("tiered", "uniform", "prioritized", "hierarchical"),
                        doc="tiered: hot/warm/cold by rank of |TD| over one FIFO ring; uniform; prioritized; "
                            "hierarchical: beyond device memory (rmtjax.replay.hier_options)")
    tier_fractions: tuple[float, ...] = param((0.01, 0.1, 0.89), lo=0.0, hi=1.0, doc="hot/warm/cold shares of items")
    tier_proportions: tuple[float, ...] = param((0.25, 0.35, 0.4), lo=0.0, hi=1.0, doc="hot/warm/cold sampling shares")
    rank_every: int = param(16, lo=1, doc="tiered: gradient updates between re-rankings of the ring (a top-k)")
    priority_alpha: float = param(0.6, lo=0.0, hi=1.0, doc="prioritized replay exponent")
    beta_start: float = param(0.4, lo=0.0, hi=1.0, doc="importance-weight exponent, annealed to 1")
    # exploration
    exploration: str = param("eps_boltzmann", choices=("eps_boltzmann", "eps_greedy"))
    eps_start: float = param(1.0, lo=0.0, hi=1.0)
    eps_end: float = param(0.05, lo=0.0, hi=1.0)
    eps_decay_frac: float = param(0.5, lo=0.0, hi=1.0, lo_open=True, doc="share of training over which ε decays")
    eps_hold: int = param(1, lo=1, hi=10_000, doc="an ε-draw's action is held 1..eps_hold steps (1: fresh each step)")
    entropy_target_start: float = param(0.5, lo=0.0, hi=1.0, doc="Boltzmann entropy target, share of log|A|")
    entropy_target_end: float = param(0.05, lo=0.0, hi=1.0)
    temperature_lr: float = param(0.1, lo=0.0, doc="rate of the log-temperature update")
    init_temperature: float = param(1.0, lo=1e-3, hi=1e3)
    diagnostics_every: int = param(100, lo=1, doc="iterations between computations of top_td_share")

    def validate(self):
        for name in ("tier_fractions", "tier_proportions"):
            v = getattr(self, name)
            if len(v) != 3 or abs(sum(v) - 1.0) > 1e-6:
                raise ConfigError(f"agent.{name}: {list(v)} must be three shares (hot, warm, cold) summing to 1")
        if min(self.tier_fractions) <= 0:
            raise ConfigError(f"agent.tier_fractions: {list(self.tier_fractions)}: every tier needs a share above 0")
        if self.demo_pretrain and not self.demonstrations:
            raise ConfigError(f"agent.demo_pretrain: {self.demo_pretrain} steps on demonstrations, but "
                              f"agent.demonstrations names none")
        if self.demonstrations:
            demonstrations.check_source(self.demonstrations)  # its form only: the file is read when training starts

    def validate_with(self, env, train):
        per_iter = env.num_envs * self.rollout_len
        if self.batch_size > self.buffer_size:
            raise ConfigError(f"agent.batch_size: {self.batch_size} exceeds agent.buffer_size {self.buffer_size}")
        if per_iter > self.buffer_size:
            raise ConfigError(f"agent.buffer_size: {self.buffer_size} cannot hold one iteration's {per_iter} "
                              f"transitions (env.num_envs × agent.rollout_len)")
        if train.total_steps < per_iter:
            raise ConfigError(f"train.total_steps: {train.total_steps} is less than one iteration ({per_iter})")
        if self.replay == "hierarchical":
            hier_options.check(self, per_iter, qlearn.updates_per_iteration(self, env))
        if self.torso in RNN_TORSOS:
            qlearn.check_recurrent(self, env)
        if self.torso in ("cnn", "nature_cnn"):
            from rmtjax.envs import env_spec
            from rmtjax.networks import check_image_torso

            check_image_torso(self.torso, env_spec(env).obs_shape, env.id)
        for flag in ("normalize_obs", "normalize_reward"):
            if self.demonstrations and getattr(env, flag):
                raise ConfigError(f"agent.demonstrations: env.{flag} is on; demonstrations hold raw observations "
                                  f"and rewards, which running statistics would not match")


@struct.dataclass
class RMTHParams:
    lr: jax.Array = hparam("lr")
    gamma: jax.Array = hparam("gamma")
    eps_start: jax.Array = hparam("eps")
    eps_end: jax.Array = hparam("eps")
    tau: jax.Array = hparam()
    max_grad_norm: jax.Array = hparam()
    entropy_target_start: jax.Array = hparam()
    entropy_target_end: jax.Array = hparam()
    temperature_lr: jax.Array = hparam()
    beta_start: jax.Array = hparam()


@struct.dataclass
class RMTState:
    params: Any
    target_params: Any
    opt_state: Any  # the guarded optimiser's (rmtjax.guard)
    env_state: VecEnvState
    obs: jax.Array
    window: Any  # qlearn.NStepWindow (the recurrent variant: its sequence window)
    replay: Any
    log_temperature: jax.Array
    hold: exploration.Hold  # the held ε-actions (agent.eps_hold)
    td_ema: jax.Array  # moving average of |TD error| over learning steps
    key_share: jax.Array  # top_td_share when last computed (every `diagnostics_every` iterations)
    precision: PrecisionState
    hparams: RMTHParams
    key: jax.Array


@struct.dataclass
class Schedule:  # the numbers an iteration runs with, from the hyperparameters and the share of training done
    progress: jax.Array
    epsilon: jax.Array
    entropy_frac: jax.Array
    beta: jax.Array
    clip: jax.Array
    lr: jax.Array
    temperature: jax.Array | None = None  # with a transfer KL penalty: the Boltzmann temperature after acting


class RMT(Agent):
    Config = RMTConfig
    HParams = RMTHParams
    data_parallel = True  # the guard fuses the gradients across devices
    device_shares = ("batch_size", "buffer_size")  # each device samples and holds an equal share

    def __init__(self, config):
        super().__init__(config)
        c, spec = self.cfg, self.spec
        self.per_dim = not spec.discrete
        if self.per_dim:
            self.num_dims = len(spec.action_low.reshape(-1))
            self.action_values = qlearn.bin_values(spec, c.bins)
        self.nets = per_dtype(self._q_network, self.precision.dtypes)  # one module per compute dtype
        self.net = self.nets[jnp.dtype(jnp.float32)]
        self.num_updates = qlearn.updates_per_iteration(c, config.env)
        self.tx = self.guarded(qlearn.optimizer(c.optimizer, c.lr))  # the clip: in the guard
        self.local_batch = c.batch_size // self.shards  # this device's share of a minibatch and of the envs
        self.local_envs = config.env.num_envs // self.shards
        self.replay = self._make_replay()

    def _make_replay(self):
        c, per_iter = self.cfg, self.steps_per_iteration
        if c.replay == "hierarchical":
            replay = hier_options.device_replay(c, per_iter, self.num_updates)
        else:
            replay = make_replay("ranked" if c.replay == "tiered" else c.replay, c.buffer_size // self.shards,
                                 c.tier_fractions, c.tier_proportions, c.priority_alpha, c.rank_every)
        if not c.demonstrations:
            return replay
        def load():  # when a training program is traced; an agent built only to act never reads the file
            raw = mixer.load_for(c.demonstrations, self.config.env, self.spec)
            action = qlearn.nearest_bins(raw["action"], self.action_values) if self.per_dim else raw["action"]
            return mixer.as_transitions(raw, action, c.n_step, self.spec.obs_dtype)

        return DemoMixer(replay, load, c, self.local_batch)

    @classmethod
    def check_devices(cls, config, devices: int) -> None:
        super().check_devices(config, devices)
        if config.agent.replay == "hierarchical":
            raise ConfigError("agent.replay: hierarchical moves items between a device and the host of one process; "
                              "it does not run on several devices (set distributed.devices: 1 or use tiered)")
        if config.agent.demo_pretrain and devices > 1:
            raise ConfigError("agent.demo_pretrain: pre-training on demonstrations runs on one device; set "
                              "distributed.devices: 1 or agent.demo_pretrain: 0")

    def _q_network(self, dtype):
        c = self.cfg
        image = len(self.spec.obs_shape) == 3
        head = (PerDimQHead(self.num_dims, c.bins, c.dueling, dtype) if self.per_dim
                else QHead(self.spec.num_actions, c.dueling, dtype))
        return QNetwork(make_torso(c.torso, c.hidden, c.activation, c.layer_norm, dtype, image=image), head)

    @property
    def steps_per_iteration(self) -> int:
        return self.config.env.num_envs * self.cfg.rollout_len

    @property
    def initial_env_steps(self) -> int:
        return self.config.env.num_envs * (self.cfg.n_step - 1)  # `init` fills the n-step window

    @property
    def first_learning_iteration(self) -> int:  # the one after which `learning_starts` env steps are done
        return self.first_iteration_with(self.cfg.learning_starts)

    def between_chunks(self, seeds: int, run_dir=None, seed: int = 0):  # hierarchical: the host levels
        if self.cfg.replay != "hierarchical":
            return None
        return hier_options.host_levels(self.cfg, self.num_updates, seeds, run_dir, seed)

    # -- Q values ------------------------------------------------------------------------------
    def q_values(self, params, obs, dtype=jnp.float32):  # [B, A] or [B, D, bins], float32; computed in `dtype`
        return self.nets[jnp.dtype(dtype)].apply(params, obs)

    def env_action(self, action):  # bin indices -> env actions (continuous); identity for discrete
        return qlearn.bins_to_env(action, self.action_values, self.spec.action_shape) if self.per_dim else action

    def act(self, params, obs, key=None):  # the greedy action, in env units
        return self.greedy(self.q_values(params, obs))

    def greedy(self, q):
        return self.env_action(jnp.argmax(q, axis=-1))

    # -- one iteration ---------------------------------------------------------------------------
    def init(self, key, hparams=None) -> RMTState:
        c, spec = self.cfg, self.spec
        k_env, k_net, k_fill, key = jax.random.split(key, 4)
        k_env, k_fill, key = self.device_keys(k_env, k_fill, key)  # each device its own envs and streams
        obs, env_state = self.env.reset(k_env)
        params = self.net.init(k_net, obs)
        action_shape = (self.local_envs, self.num_dims) if self.per_dim else (self.local_envs,)
        window = qlearn.empty_window(self.local_envs, c.n_step, spec.obs_shape, spec.obs_dtype, action_shape[1:])
        obs, env_state, window = qlearn.fill_window(self.env, env_state, obs, window, k_fill, c.n_step - 1,
                                                    c.bins if self.per_dim else spec.num_actions, action_shape,
                                                    self.env_action)
        example = jax.tree.map(lambda x: x[0], qlearn.emit(window))
        state = RMTState(
            params=params, target_params=params, opt_state=self.tx.init(params), env_state=env_state, obs=obs,
            window=window, replay=self.replay.init(example), log_temperature=jnp.log(jnp.float32(c.init_temperature)),
            hold=exploration.Hold.empty(action_shape), td_ema=jnp.zeros(()), key_share=jnp.zeros(()),
            precision=self.precision.init(), hparams=self.default_hparams(hparams), key=key)
        return self.pretrain(state, jax.random.fold_in(k_net, 1))[0] if c.demo_pretrain else state

    def schedule(self, hp: RMTHParams, t) -> Schedule:
        c, progress = self.cfg, self.progress(t)
        return Schedule(
            progress=progress,
            epsilon=exploration.linear_schedule(hp.eps_start, hp.eps_end, progress, c.eps_decay_frac),
            entropy_frac=exploration.linear_schedule(hp.entropy_target_start, hp.entropy_target_end, progress,
                                                     c.eps_decay_frac),
            beta=hp.beta_start + (1.0 - hp.beta_start) * progress,
            clip=self.precision.clip_threshold(hp.max_grad_norm, progress),
            lr=lr_in_force(hp.lr, progress, c.lr_end_frac))

    def step(self, state: RMTState, t):
        hp = state.hparams
        sched = self.schedule(hp, t)
        key, k_act, k_learn = jax.random.split(state.key, 3)

        # 1. act: the rollout and its n-step transitions
        (obs, env_state, window, log_temp, hold), new, act_info = self._act(state, sched, k_act)
        if self.config.transfer.kl_coef:  # the KL to the source is taken at the temperature in force
            sched = sched.replace(temperature=jnp.exp(log_temp))
        # 2. store: no forward pass; a tiered replay ranks a new item hottest until it is learned from
        replay = self.replay.add(state.replay, new)
        # 3. learn: a real branch (`t` is not batched); one trace serves both sides' shapes
        learner = (state.params, state.target_params, with_lr(state.opt_state, sched.lr), replay, state.precision)
        args = (learner, t, k_learn, sched, hp, state.key_share)
        learn, (_, stats_shape) = trace_once(self._learn, *args)
        learner, stats = jax.lax.cond(t >= self.first_learning_iteration, lambda a: learn(*a),
                                      lambda a: (a[0], {**zeros(stats_shape), "top_td_share": a[5]}), args)
        params, target_params, opt_state, replay, prec_state = learner
        learning = (t >= self.first_learning_iteration) & (stats["skipped_frac"] < 1.0)
        td_ema = ema(state.td_ema, stats["td_abs"], learning)

        metrics = {
            "env_steps": self.env_steps_after(t), **episode_metrics(state.env_state, env_state), **stats,
            "td_error_ema": td_ema, "lr_in_force": sched.lr, "epsilon": sched.epsilon,
            "temperature": jnp.exp(log_temp), "beta": sched.beta,
            "policy_entropy": act_info["policy_entropy"].mean(), "explore_frac": act_info["explore_frac"].mean(),
            "nongreedy_frac": act_info["nongreedy_frac"].mean(), **self.replay.buffer_stats(replay),
            **hparam_metrics(hp), **self.precision.metrics(prec_state, sched.clip)}
        return state.replace(params=params, target_params=target_params, opt_state=opt_state, env_state=env_state,
                             obs=obs, window=window, replay=replay, log_temperature=log_temp, hold=hold, td_ema=td_ema,
                             key_share=stats["top_td_share"], precision=prec_state, key=key), metrics

    def _act(self, state: RMTState, sched: Schedule, key):
        """`rollout_len` steps of every env: the carry after them, the transitions [T*N, ...], stats [T]."""
        c, hp = self.cfg, state.hparams
        boltzmann = c.exploration == "eps_boltzmann"

        def env_step(carry, keys):
            obs, env_state, window, log_temp, hold = carry
            k_act, k_env = keys
            q = self.precision.select(state.precision, lambda dt: self.q_values(state.params, obs, dt))
            action, info, hold = exploration.select_action(k_act, q, sched.epsilon, jnp.exp(log_temp), boltzmann,
                                                           hold, c.eps_hold)
            if boltzmann:
                adapted = exploration.adapt_temperature(log_temp, info["policy_entropy"],
                                                        sched.entropy_frac * info["max_entropy"], hp.temperature_lr)
                log_temp = jnp.where(jnp.isfinite(adapted), adapted, log_temp)  # a NaN observation must not stick
            next_obs, env_state, reward, term, _, env_info = self.env.step(k_env, env_state, self.env_action(action))
            window = qlearn.push(window, obs, action, reward, term, env_info["done"], env_info["final_obs"])
            return (next_obs, env_state, window, log_temp, hold), (qlearn.emit(window), info)

        carry = (state.obs, state.env_state, state.window, state.log_temperature, state.hold)
        carry, (new, info) = jax.lax.scan(env_step, carry, jax.random.split(key, (c.rollout_len, 2)))
        return carry, jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), new), info

    def _learn(self, learner, t, key, sched: Schedule, hp: RMTHParams, key_share):
        """`num_updates` guarded steps of iteration `t`: (learner tuple, the iteration's statistics)."""
        c = self.cfg
        first = (t - self.first_learning_iteration) * self.num_updates  # run-wide number of the first update
        keys = jax.random.split(key, self.num_updates + 1)
        share_due = t % c.diagnostics_every == 0
        mix = {"progress": sched.progress} if isinstance(self.replay, DemoMixer) else {}
        rerank = getattr(self.replay, "maybe_refresh", None)

        def update(carry, x):
            (params, target_params, opt_state, replay, prec_state), share = carry
            k, index = x
            n = first + index  # the same for every seed: real branches below
            if rerank is not None:
                replay = rerank(replay, self.replay.refresh_due(n))
            batch, info = self.replay.sample(replay, k, self.local_batch, sched.beta, **mix)
            out = self.gradient_step(params, target_params, opt_state, prec_state, batch, info.weight, hp.gamma,
                                     sched.clip, sched.temperature)
            td, q = out.aux
            target_params = qlearn.update_target(out.params, target_params, c.target_update == "polyak", hp.tau,
                                                 (n + 1) % c.target_update_every == 0)
            stats = {"loss": out.loss, "td_abs": jnp.abs(td).mean(), "q_mean": q.mean(), **out.stats,
                     **self.replay.batch_stats(replay, info)}
            share = jax.lax.cond(share_due & (index == self.num_updates - 1),
                                 lambda: self.replay.key_share(replay, info, keys[-1]), lambda: share)
            replay = self.replay.update(replay, info, finite_abs(td))  # last: reading the batch after would copy
            return ((out.params, target_params, out.opt_state, replay, out.precision), share), stats

        xs = (keys[:-1], jnp.arange(self.num_updates, dtype=jnp.int32))
        (learner, key_share), stats = jax.lax.scan(update, (learner, key_share), xs)
        return learner, {**summarize(stats), "top_td_share": key_share}

    def gradient_step(self, params, target_params, opt_state, prec_state, batch, weight, gamma, clip,
                      temperature=None):
        """One guarded step on a minibatch with weights [B]; `aux` is (TD errors, Q of the actions)."""
        c = self.cfg
        margin = "demo" in batch and c.demo_margin > 0

        def loss_fn(p, dtype):
            q_all = self.q_values(p, batch["obs"], dtype)
            q_next = self.q_values(target_params, batch["boot_obs"], dtype)
            chooser = jax.lax.stop_gradient(self.q_values(p, batch["boot_obs"], dtype)) if c.double_q else q_next
            td, q = qlearn.nstep_td(q_all, q_next, chooser, batch, gamma)
            loss = qlearn.td_loss(td, weight, c.loss, c.huber_delta)
            if margin:
                loss = loss + c.demo_margin * margin_loss(q_all, batch["action"], batch["demo"], c.demo_margin_value)
            return loss, (td, q)

        return self.precision.step(prec_state, loss_fn, params, opt_state, self.tx, clip,
                                   penalty=self.transfer_penalty(opt_state, batch["obs"], temperature))

    def pretrain(self, state: RMTState, key):
        """DQfD's pre-training: `demo_pretrain` guarded steps on demonstrations alone (weight 1);
        returns the state and each step's loss."""
        c, hp = self.cfg, state.hparams
        clip = self.precision.clip_threshold(hp.max_grad_norm, jnp.float32(0.0))
        weight = jnp.ones((self.local_batch,), jnp.float32)

        def one(carry, x):
            params, target_params, opt_state, prec_state = carry
            k, i = x
            batch = {**self.replay.demo_batch(k, self.local_batch), "demo": jnp.ones((self.local_batch,), bool)}
            out = self.gradient_step(params, target_params, opt_state, prec_state, batch, weight, hp.gamma, clip)
            target_params = qlearn.update_target(out.params, target_params, c.target_update == "polyak", hp.tau,
                                                 (i + 1) % c.target_update_every == 0)
            return (out.params, target_params, out.opt_state, out.precision), out.loss

        carry = (state.params, state.target_params, with_lr(state.opt_state, hp.lr), state.precision)
        (params, target_params, opt_state, prec_state), losses = jax.lax.scan(
            one, carry, (jax.random.split(key, c.demo_pretrain), jnp.arange(c.demo_pretrain)))
        return state.replace(params=params, target_params=target_params, opt_state=opt_state,
                             precision=prec_state), losses

    # -- the protocol --------------------------------------------------------------------------
    @property
    def max_entropy(self) -> float | None:
        return math.log(self.spec.num_actions if self.spec.discrete else self.cfg.bins)

    def signals(self, metrics) -> Signals:
        return Signals(episode_return=metrics["episode_return"], episodes=metrics["episode_count"],
                       value_loss=metrics["loss"], explore=metrics["nongreedy_frac"],
                       entropy=metrics["policy_entropy"] if self.cfg.exploration == "eps_boltzmann" else None,
                       q_magnitude=metrics["q_mean"], skipped_frac=metrics["skipped_frac"])

    def learner(self, state: RMTState) -> Learner:
        return Learner(params=state.params, opt_state=state.opt_state, target=state.target_params,
                       extra={"log_temperature": state.log_temperature})

    def with_learner(self, state: RMTState, learner: Learner) -> RMTState:
        return state.replace(params=learner.params, opt_state=learner.opt_state, target_params=learner.target,
                             log_temperature=learner.extra["log_temperature"])

    def param_groups(self, params):  # torso/<layer or block>, head/<advantage | value>
        return jax.tree_util.tree_map_with_path(lambda path, _: f"{path[1].key}/{path[2].key}", params)

    def policy_distribution(self, params, obs, dtype=jnp.float32, temperature=None):
        """softmax(Q / temperature) per action dimension: RMT's Boltzmann policy without its ε share."""
        q = self.q_values(params, obs, dtype)
        return Categorical(q if temperature is None else q / temperature)
