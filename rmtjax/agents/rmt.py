"""The RMT agent: value-based learning with tiered replay and entropy-driven exploration.

One iteration (see the design notes), each phase under `jax.named_scope("phase/<name>")` so
`benchmarks/profile_step.py` can charge its cost:
1. `act`: `rollout_len` steps in `num_envs` envs with ε-greedy mixed with Boltzmann over Q
   (temperature adapted towards a target policy entropy); the steps become n-step transitions
   (a per-env window of the last n steps; a return is cut at the first episode end,
   bootstrapping through truncation but never through a terminal state);
2. `store`: each new transition gets its TD error under the current networks (only where the
   replay uses it: tiered and prioritised, not uniform) and goes into the replay — the tiered
   buffer routes it to the hot, warm or cold tier by that error;
3. `learn` (from the iteration after which `learning_starts` env steps are done; a real branch,
   since the clock `t` is not batched over seeds): `num_updates` gradient steps on minibatches
   drawn across tiers with importance weights — Double-DQN n-step targets, a Huber or squared
   loss, global-norm clipping, Adam (or RMSProp) with an injectable lr, each through the
   update guard (`rmtjax.guard`: a non-finite update is skipped); the new TD errors are
   written back, so items move between tiers;
4. diagnostics: tier shares of the minibatches, the TD-error moving average, the grad norm, the
   precision monitors, and every `diagnostics_every` iterations the top-TD share (it costs a
   quantile over a pool of items; the metric holds its last value in between).

Networks compute in the precision policy's dtype; a transition whose TD error is not finite
(a NaN in its reward or observation) gets priority 0, so it cannot poison the replay's
statistics, and any update that samples it is skipped.

With `distributed.devices` D > 1 (`rmtjax.distributed`) each device acts in its `num_envs / D`
envs, stores into its own replay shard (`buffer_size / D`) and samples `batch_size / D` of each
minibatch; the gradients are fused across the devices before the guard, so every device
applies the same update; `env_steps` counts the steps of all devices.

Discrete actions use one Q head; continuous actions are discretised into `bins` values per
dimension with one head per dimension, Q(s, a) = mean_d Q_d(s, a_d).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from rmtjax import exploration
from rmtjax.agents.base import Agent, hparam_metrics
from rmtjax.envs import VecEnvState, episode_metrics
from rmtjax.guard import lr_in_force, with_lr
from rmtjax.networks import TORSOS, PerDimQHead, QHead, QNetwork, make_torso, per_dtype
from rmtjax.networks.recurrent import RNN_TORSOS
from rmtjax.precision import PrecisionState, Step, ema, finite_abs, summarize
from rmtjax.protocol import Categorical, Learner, Signals, hparam
from rmtjax.schema import ConfigError, Section, param
from rmtjax.tracing import trace_once, zeros
from rmtjax.replay import demonstrations, make_replay, tiered
from rmtjax.replay.hierarchical import HierarchicalReplay, Levels
from rmtjax.replay.prefetch import PrefetchLevels, PrefetchReplay

# RMSProp as the MinAtar paper's DQN ran it (PyTorch's centered RMSprop, eps added outside the root)
RMSPROP = {"decay": 0.95, "eps": 0.01, "centered": True, "eps_in_sqrt": False}


@dataclasses.dataclass(frozen=True)
class RMTConfig(Section):
    _section = "agent"
    # acting and learning schedule
    rollout_len: int = param(4, lo=1, doc="env steps per env per iteration")
    updates_per_step: float = param(0.25, lo=0.0, lo_open=True, doc="gradient updates per env step (replay ratio)")
    batch_size: int = param(128, lo=1)
    buffer_size: int = param(50_000, lo=16, doc="total replay capacity (all tiers)")
    learning_starts: int = param(1_000, lo=0, doc="env steps per seed before learning starts")
    # targets and optimisation
    lr: float = param(5e-4, lo=0.0, hi=1.0, lo_open=True)
    lr_end_frac: float = param(1.0, lo=0.0, hi=1.0, doc="learning rate at the end of training as a share of lr "
                                                        "(linear decay from the start; 1 keeps it constant)")
    optimizer: str = param("adam", choices=("adam", "rmsprop"), doc="adam, or centered RMSProp (decay 0.95, "
                                                                     "eps 0.01: the MinAtar paper's DQN)")
    gamma: float = param(0.99, lo=0.0, hi=1.0)
    n_step: int = param(3, lo=1, hi=32, doc="n of the n-step return")
    double_q: bool = param(True, doc="Double-DQN targets (online argmax, target value)")
    target_update: str = param("hard", choices=("hard", "polyak"))
    target_update_every: int = param(500, lo=1, doc="gradient steps between hard target updates")
    tau: float = param(0.005, lo=0.0, hi=1.0, lo_open=True, doc="Polyak rate")
    loss: str = param("huber", choices=("huber", "mse"), doc="huber (quadratic within huber_delta of the target, "
                                                              "linear beyond) or mse (the mean squared TD error)")
    huber_delta: float = param(1.0, lo=0.0, lo_open=True)
    max_grad_norm: float = param(0.5, lo=0.0, doc="global-norm gradient clip (initial; see precision.clip_decay_to); "
                                                  "0: no clipping")
    # network
    torso: str = param("fractal", choices=TORSOS + RNN_TORSOS,
                       doc="mlp, fractal, residual, cnn (the MinAtar CNN) or nature_cnn (Mnih et al. 2015's three "
                           "convolutions, then dense layers of widths `hidden`: [512] in the paper); lstm or gru: "
                           "dense layers of widths `hidden`, then a recurrent cell of width rnn_width, learning from "
                           "stored sequences with their hidden state and a burn-in (R2D2; replay: uniform, n_step: 1)")
    rnn_width: int = param(128, lo=1, doc="torso: lstm | gru: width of the recurrent cell (its hidden state)")
    seq_len: int = param(16, lo=2, hi=4096, doc="torso: lstm | gru: steps per stored sequence (the env's last seq_len "
                                                "steps, stored every iteration; ≥ rollout_len)")
    burn_in: int = param(4, lo=0, doc="torso: lstm | gru: the first burn_in steps of a sequence only refresh the "
                                      "stored hidden state (no loss, no gradient)")
    hidden: tuple[int, ...] = param((128, 128), lo=1, doc="MLP widths, or (width,) × blocks for fractal/residual, "
                                                          "or the dense widths after nature_cnn's convolutions")
    activation: str = param("relu", choices=("relu", "tanh", "gelu", "silu", "elu"))
    layer_norm: bool = param(True)
    dueling: bool = param(True)
    bins: int = param(11, lo=2, hi=1001, doc="continuous actions: values per action dimension")
    # replay
    replay: str = param("tiered", choices=("tiered", "uniform", "prioritized", "hierarchical"),
                        doc="hierarchical: a capacity beyond device memory, held in host RAM and on disk, the "
                            "device holding what the next chunk draws (rmtjax.replay.hierarchical and .prefetch; "
                            "the options below)")
    tier_fractions: tuple[float, ...] = param((0.01, 0.1, 0.89), lo=0.0, hi=1.0,
                                              doc="hot/warm/cold shares of the capacity: the tier thresholds track "
                                                  "the matching quantiles of |TD error|")
    tier_proportions: tuple[float, ...] = param((0.25, 0.35, 0.4), lo=0.0, hi=1.0, doc="hot/warm/cold sampling shares")
    priority_alpha: float = param(0.6, lo=0.0, hi=1.0, doc="prioritized replay exponent")
    device_fraction: float = param(0.1, lo=0.0, hi=1.0, lo_open=True, doc="hierarchical: share of buffer_size the "
                                                                           "device may hold (prefetch: the staged draws "
                                                                           "and outbox must fit in it; cache: the "
                                                                           "tiered buffer)")
    disk_fraction: float = param(0.0, lo=0.0, hi=1.0, doc="hierarchical: share of buffer_size held on disk "
                                                          "(memory-mapped files); host RAM holds the rest")
    disk_dir: str = param("", doc="hierarchical: directory of the disk level's files; '' for the run directory's "
                                  "replay_disk/ (a temporary directory without a run directory)")
    sync_every: int = param(4, lo=1, doc="hierarchical: iterations between moves across levels (the driver's "
                                           "chunks are at most this long)")
    refresh_share: float = param(0.25, lo=0.0, hi=1.0, doc="hierarchical, cache: share of the device's cold tier "
                                                           "replaced at each move by lower-level items drawn by priority")
    priority: str = param("|td|^0.6 + 0.01", doc="hierarchical, cache: priority of an item from its last |TD error| `td` "
                                                 "(numbers, + - * / ^, |...|, sqrt, log, log1p, exp, min, max)")
    replay_warmup: int = param(0, lo=0, doc="hierarchical: items the lower levels hold before refreshes (cache) or "
                                            "stagings (prefetch) begin")
    hier_sampling: str = param("prefetch", choices=("prefetch", "cache"),
                               doc="hierarchical: what minibatches are drawn from. prefetch: the whole capacity, "
                                   "ranked into tiers by |TD| on the host, each chunk's draws staged on the device "
                                   "before it (rmtjax.replay.prefetch; the device holds sync_every × updates per "
                                   "iteration × batch_size draws and one chunk's outbox); cache: the device level's "
                                   "tiered buffer, its cold tier refreshed from the lower levels by `priority`")
    beta_start: float = param(0.4, lo=0.0, hi=1.0, doc="importance-weight exponent, annealed to 1")
    # exploration
    exploration: str = param("eps_boltzmann", choices=("eps_boltzmann", "eps_greedy"))
    eps_start: float = param(1.0, lo=0.0, hi=1.0)
    eps_end: float = param(0.05, lo=0.0, hi=1.0)
    eps_decay_frac: float = param(0.5, lo=0.0, hi=1.0, lo_open=True, doc="share of training over which ε decays")
    eps_hold: int = param(1, lo=1, hi=10_000, doc="an ε-draw's uniform action is held for 1..eps_hold steps "
                                                  "(temporally extended ε-greedy); 1: a fresh draw each step")
    entropy_target_start: float = param(0.5, lo=0.0, hi=1.0, doc="Boltzmann entropy target, share of log|A|")
    entropy_target_end: float = param(0.05, lo=0.0, hi=1.0)
    temperature_lr: float = param(0.1, lo=0.0, doc="rate of the log-temperature update")
    init_temperature: float = param(1.0, lo=1e-3, hi=1e3)
    # demonstrations (rmtjax.replay.demonstrations; DQfD-style)
    demonstrations: str = param("", doc="path of an .npz of demonstration transitions (obs, action, reward, "
                                        "terminated, truncated, next_obs) or minari:<dataset_id> (a local Minari "
                                        "dataset), kept apart from the replay and never evicted; '' for none")
    demo_share: float = param(0.25, lo=0.0, hi=1.0, doc="with demonstrations: share of each minibatch drawn from "
                                                        "them at the start of training")
    demo_share_end: float = param(0.0, lo=0.0, hi=1.0, doc="the share once demo_decay_frac of training is done")
    demo_decay_frac: float = param(0.5, lo=0.0, hi=1.0, lo_open=True, doc="share of training over which the "
                                                                           "demonstration share moves linearly")
    demo_margin: float = param(0.0, lo=0.0, doc="weight of the large-margin loss on demonstration actions "
                                                "(DQfD's J_E: max_a [Q(s,a) + l(a_E,a)] - Q(s,a_E)); 0: off")
    demo_margin_value: float = param(0.8, lo=0.0, lo_open=True, doc="the margin l(a_E, a) for a != a_E")
    demo_pretrain: int = param(0, lo=0, doc="with demonstrations: gradient steps on minibatches of demonstrations "
                                            "alone before the first env step (DQfD's pre-training; with "
                                            "demo_margin > 0 the margin loss too); 0: none")
    # diagnostics
    diagnostics_every: int = param(100, lo=1, doc="iterations between computations of top_td_share (a quantile "
                                                  "over 1,024 replay items); the metric holds its last value between")

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

    def validate_with(self, env, train):
        if self.batch_size > self.buffer_size:
            raise ConfigError(f"agent.batch_size: {self.batch_size} exceeds agent.buffer_size {self.buffer_size}")
        per_iter = env.num_envs * self.rollout_len
        if per_iter > self.buffer_size:
            raise ConfigError(f"agent.buffer_size: {self.buffer_size} cannot hold one iteration's {per_iter} "
                              f"transitions (env.num_envs × agent.rollout_len)")
        if train.total_steps < per_iter:
            raise ConfigError(f"train.total_steps: {train.total_steps} is less than one iteration ({per_iter})")
        if self.replay == "hierarchical":
            self._validate_levels(per_iter, env)
        if self.torso in RNN_TORSOS:
            self._check_recurrent(env)
        if self.torso in ("cnn", "nature_cnn"):
            from rmtjax.envs import env_spec
            from rmtjax.networks import check_image_torso

            check_image_torso(self.torso, env_spec(env).obs_shape, env.id)
        if self.demonstrations:
            for flag in ("normalize_obs", "normalize_reward"):
                if getattr(env, flag):
                    raise ConfigError(f"agent.demonstrations: env.{flag} is on; demonstrations hold raw observations "
                                      f"and rewards, which running statistics would not match")
            load_demonstrations(self, env)

    def _check_recurrent(self, env):
        """What a recurrent torso needs (`rmtjax.agents.r2d2`): whole sequences in a uniform replay."""
        why = f"with agent.torso: {self.torso} (sequences of seq_len steps are stored whole"
        if self.replay != "uniform":
            raise ConfigError(f"agent.replay: {self.replay!r} {why}; tiered and prioritized replay rank single "
                              f"transitions): set agent.replay: uniform")
        if self.n_step != 1:
            raise ConfigError(f"agent.n_step: {self.n_step} {why}, with one-step targets inside them): set "
                              f"agent.n_step: 1")
        if self.demonstrations:
            raise ConfigError(f"agent.demonstrations: not supported {why}; demonstrations are single transitions)")
        if self.rollout_len > self.seq_len:
            raise ConfigError(f"agent.seq_len: {self.seq_len} is shorter than agent.rollout_len {self.rollout_len} "
                              f"{why}, one per env per iteration: every step must be in one)")
        if self.burn_in >= self.seq_len:
            raise ConfigError(f"agent.burn_in: {self.burn_in} leaves no step of agent.seq_len {self.seq_len} to learn "
                              f"from")
        if self.buffer_size // self.seq_len < max(self.batch_size, env.num_envs):
            raise ConfigError(f"agent.buffer_size: {self.buffer_size} holds {self.buffer_size // self.seq_len} "
                              f"sequences of agent.seq_len {self.seq_len}; it must hold agent.batch_size "
                              f"({self.batch_size} sequences) and one iteration's {env.num_envs} (env.num_envs)")


    def level_capacities(self) -> tuple[int, int, int]:
        """hierarchical: (device, host, disk) capacities in items."""
        disk = int(round(self.disk_fraction * self.buffer_size))
        return int(round(self.device_fraction * self.buffer_size)), self.buffer_size - disk, disk

    def _validate_levels(self, per_iter: int, env) -> None:
        from rmtjax.replay.hierarchical import priority_function

        device, host, disk = self.level_capacities()
        if self.hier_sampling == "prefetch":
            self._validate_prefetch(per_iter, device, env)
        elif device < per_iter:
            raise ConfigError(f"agent.device_fraction: {self.device_fraction} of agent.buffer_size {self.buffer_size} "
                              f"is {device} items on the device, less than one iteration's {per_iter} transitions")
        if self.hier_sampling == "cache":
            try:
                tiered.tier_capacities(device, self.tier_fractions)
            except ValueError as e:
                raise ConfigError(f"agent.device_fraction: the device level of {device} items cannot be tiered: "
                                  f"{e}") from None
        if self.batch_size > device:
            raise ConfigError(f"agent.batch_size: {self.batch_size} exceeds the device level's {device} items "
                              f"(agent.device_fraction × agent.buffer_size)")
        if host < self.sync_every * per_iter:
            raise ConfigError(f"agent.disk_fraction: the host level's {host} items cannot take the "
                              f"{self.sync_every * per_iter} transitions of agent.sync_every={self.sync_every} "
                              f"iterations; lower disk_fraction or sync_every")
        if self.replay_warmup > self.buffer_size:
            raise ConfigError(f"agent.replay_warmup: {self.replay_warmup} items exceed the lower levels' capacity "
                              f"(agent.buffer_size {self.buffer_size}), so refreshes would never begin")
        priority_function(self.priority)


    def updates_per_iteration(self, env) -> int:
        return max(1, round(self.updates_per_step * env.num_envs * self.rollout_len))

    def stage_size(self, env) -> int:
        """hierarchical, prefetch: draws staged on the device per chunk (sync_every iterations)."""
        return self.sync_every * self.updates_per_iteration(env) * self.batch_size

    def _validate_prefetch(self, per_iter: int, device: int, env) -> None:
        need = self.stage_size(env) + self.sync_every * per_iter
        if need > device:
            raise ConfigError(f"agent.hier_sampling: prefetch stages agent.sync_every={self.sync_every} iterations' "
                              f"draws ({self.sync_every} × {self.updates_per_iteration(env)} updates × "
                              f"{self.batch_size}) and their {self.sync_every * per_iter} new transitions on the "
                              f"device, {need} items; the device level (agent.device_fraction × agent.buffer_size) "
                              f"is {device}: lower agent.sync_every or raise agent.device_fraction")


def load_demonstrations(cfg: RMTConfig, env_cfg) -> dict[str, np.ndarray]:
    """`agent.demonstrations` read and checked against the env (`rmtjax.replay.demonstrations`)."""
    from rmtjax.envs import env_spec

    spec = env_spec(env_cfg)
    return demonstrations.load(cfg.demonstrations, obs_shape=spec.obs_shape, discrete=spec.discrete,
                               num_actions=spec.num_actions, action_shape=spec.action_shape,
                               action_low=spec.action_low, action_high=spec.action_high,
                               reward_scale=env_cfg.reward_scale, reward_clip=env_cfg.reward_clip)


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
class NStepWindow:
    """The last n steps of every env, [N, n, ...]; index 0 is the oldest."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    next_obs: jax.Array  # the observation each step ended in (pre-reset)


@struct.dataclass
class RMTState:
    params: Any
    target_params: Any
    opt_state: Any  # the guarded optimiser's (rmtjax.guard.GuardState; the gradient fusion's state inside)
    env_state: VecEnvState
    obs: jax.Array
    window: NStepWindow
    replay: Any
    log_temperature: jax.Array
    hold: exploration.Hold  # the held ε-actions (agent.eps_hold)
    td_ema: jax.Array  # moving average of |TD error| over learning steps
    key_share: jax.Array  # top_td_share when last computed (every `diagnostics_every` iterations)
    precision: PrecisionState
    hparams: RMTHParams
    key: jax.Array
    demos: Any  # the demonstration transitions [D, ...] (agent.demonstrations), or None


@struct.dataclass
class Schedule:
    """The numbers an iteration runs with, from the hyperparameters and the share of training done."""

    epsilon: jax.Array
    entropy_frac: jax.Array
    beta: jax.Array
    clip: jax.Array
    lr: jax.Array
    demo_rows: jax.Array  # minibatch rows drawn from the demonstrations (int32; 0 without them)
    temperature: jax.Array | None = None  # with a transfer KL penalty: the Boltzmann temperature after acting


class RMT(Agent):
    Config = RMTConfig
    HParams = RMTHParams
    data_parallel = True  # the guard fuses the gradients across devices
    device_shares = ("batch_size", "buffer_size")  # each device samples and holds an equal share

    def __init__(self, config):
        super().__init__(config)
        self.cfg = self.settings(config.agent)
        c, spec = self.cfg, self.spec
        self.per_dim = not spec.discrete
        if self.per_dim:
            self.num_dims = int(np.prod(spec.action_shape))
            self.action_values = np.linspace(spec.action_low.reshape(-1), spec.action_high.reshape(-1), c.bins).T

        # one module per compute dtype (same float32 parameters); `net` is the float32 one
        self.nets = per_dtype(self._q_network, self.precision.dtypes)
        self.net = self.nets[jnp.dtype(jnp.float32)]
        self.num_updates = c.updates_per_iteration(config.env)
        optimizer = optax.adam if c.optimizer == "adam" else (lambda learning_rate: optax.rmsprop(learning_rate, **RMSPROP))
        self.tx = self.guarded(optax.inject_hyperparams(optimizer)(learning_rate=c.lr))  # the clip: in the guard
        # this device's share of each minibatch and of the replay capacity (all of it on one device)
        self.local_batch = c.batch_size // self.shards
        self.local_envs = config.env.num_envs // self.shards
        if c.replay == "hierarchical" and c.hier_sampling == "prefetch":
            self.replay = PrefetchReplay(c.stage_size(config.env), outbox=c.sync_every * self.steps_per_iteration)
        elif c.replay == "hierarchical":
            self.replay = HierarchicalReplay(c.level_capacities()[0], c.tier_fractions, c.tier_proportions,
                                             outbox=c.sync_every * self.steps_per_iteration)
        else:
            self.replay = make_replay(c.replay, capacity=c.buffer_size // self.shards, fractions=c.tier_fractions,
                                      proportions=c.tier_proportions, alpha=c.priority_alpha)
        self.demos = self._demo_transitions(load_demonstrations(c, config.env)) if c.demonstrations else None
        self.max_demo_rows = math.ceil(max(c.demo_share, c.demo_share_end) * self.local_batch)

    @classmethod
    def check_devices(cls, config, devices: int) -> None:
        super().check_devices(config, devices)
        if cls.settings(config.agent).replay == "hierarchical":
            raise ConfigError("agent.replay: hierarchical moves items between a device and the host of one process; "
                              "it does not run on several devices yet (set distributed.devices: 1 or use tiered)")
        if cls.settings(config.agent).demo_pretrain and devices > 1:
            raise ConfigError("agent.demo_pretrain: pre-training on demonstrations runs on one device; set "
                              "distributed.devices: 1 or agent.demo_pretrain: 0")

    def _q_network(self, dtype):
        """The Q-network computing in `dtype`."""
        c = self.cfg
        torso = make_torso(c.torso, c.hidden, c.activation, c.layer_norm, dtype)
        return QNetwork(torso, self._q_head(dtype))

    def _q_head(self, dtype):
        c = self.cfg
        return (PerDimQHead(self.num_dims, c.bins, c.dueling, dtype) if self.per_dim
                else QHead(self.spec.num_actions, c.dueling, dtype))

    @staticmethod
    def settings(agent_cfg) -> RMTConfig:
        """The full RMT settings this agent runs with (a baseline maps its own section onto them)."""
        return agent_cfg

    @property
    def steps_per_iteration(self) -> int:
        return self.config.env.num_envs * self.cfg.rollout_len

    def between_chunks(self, seeds: int, run_dir=None, seed: int = 0):
        """agent.replay: hierarchical: the host and disk levels the driver syncs between chunks."""
        c = self.cfg
        if c.replay != "hierarchical":
            return None
        device, host, disk = c.level_capacities()
        disk_dir = c.disk_dir or (None if run_dir is None else Path(run_dir) / "replay_disk")
        if c.hier_sampling == "prefetch":
            return PrefetchLevels(seeds=seeds, host_capacity=host, disk_capacity=disk,
                                  stage=c.stage_size(self.config.env), batch_size=c.batch_size,
                                  fractions=c.tier_fractions, proportions=c.tier_proportions, warmup=c.replay_warmup,
                                  disk_dir=disk_dir if disk else None, seed=seed, max_iterations=c.sync_every)
        caps = tiered.tier_capacities(device, c.tier_fractions)
        return Levels(seeds=seeds, host_capacity=host, disk_capacity=disk, cold_rows=(caps[0] + caps[1], caps[2]),
                      refresh_share=c.refresh_share, warmup=c.replay_warmup, priority=c.priority,
                      disk_dir=disk_dir if disk else None, seed=seed, max_iterations=c.sync_every)

    @property
    def initial_env_steps(self) -> int:
        return self.config.env.num_envs * (self.cfg.n_step - 1)  # `init` fills the n-step window

    @property
    def first_learning_iteration(self) -> int:
        """The first iteration that updates: the one after which `learning_starts` env steps are done."""
        return self.first_iteration_with(self.cfg.learning_starts)

    # -- Q-value helpers: q_all is [B, A] or [B, D, bins]; an action is [B] or [B, D] -------------
    def q_values(self, params, obs, dtype=jnp.float32):
        """Q of every action, float32, with the network computing in `dtype`."""
        return self.nets[jnp.dtype(dtype)].apply(params, obs)

    @staticmethod
    def _q_of(q_all, action):
        picked = jnp.take_along_axis(q_all, action[..., None], axis=-1)[..., 0]
        return picked.mean(-1) if picked.ndim == 2 else picked

    def env_action(self, action):
        """Bin indices -> env actions (continuous); identity for discrete."""
        if not self.per_dim:
            return action
        values = jnp.asarray(self.action_values)  # [D, bins]
        a = jnp.take_along_axis(values[None], action[..., None], axis=-1)[..., 0]
        return a.reshape((action.shape[0],) + self.spec.action_shape)

    def _demo_transitions(self, raw: dict) -> dict:
        """Demonstrations as this agent's stored transitions: one-step (`steps` 1, the reward
        first in `rewards`), continuous actions mapped to their nearest bins."""
        n, c = raw["obs"].shape[0], self.cfg
        if self.per_dim:
            flat = raw["action"].reshape(n, -1)  # [D, dims]
            action = np.abs(flat[:, :, None] - self.action_values[None]).argmin(-1).astype(np.int32)
        else:
            action = raw["action"]
        rewards = np.zeros((n, c.n_step), np.float32)
        rewards[:, 0] = raw["reward"]
        return {"obs": jnp.asarray(raw["obs"], self.spec.obs_dtype), "action": jnp.asarray(action),
                "rewards": jnp.asarray(rewards), "steps": jnp.ones((n,), jnp.int32),
                "boot_obs": jnp.asarray(raw["next_obs"], self.spec.obs_dtype),
                "terminated": jnp.asarray(raw["terminated"])}

    def _mix_demos(self, demos, batch, weight, rows, key):
        """The minibatch with `rows` of its rows (at random positions, so the replay's draw keeps
        its tier proportions) replaced by uniform draws from the demonstrations; their weight is
        1. Returns (batch with a `demo` row mask, weight, the mask)."""
        k_pick, k_place = jax.random.split(key)
        count = demos["obs"].shape[0]
        picked = jax.tree.map(lambda x: x[jax.random.randint(k_pick, (self.max_demo_rows,), 0, count)], demos)
        rank = jax.random.permutation(k_place, self.local_batch)  # row j takes demonstration rank[j] if rank[j] < rows
        is_demo = rank < rows
        source = jnp.minimum(rank, self.max_demo_rows - 1)

        def mix(ours, theirs):
            mask = is_demo.reshape(is_demo.shape + (1,) * (ours.ndim - 1))
            return jnp.where(mask, theirs[source].astype(ours.dtype), ours)

        mixed = jax.tree.map(mix, batch, picked)
        return {**mixed, "demo": is_demo}, jnp.where(is_demo, 1.0, weight), is_demo

    def _margin(self, q_all, action, is_demo):
        """DQfD's large-margin loss J_E over the demonstration rows: max_a [Q(s,a) + l·(a != a_E)]
        - Q(s,a_E), per action dimension for binned continuous actions (their mean)."""
        other = jax.nn.one_hot(action, q_all.shape[-1], dtype=q_all.dtype) == 0
        per = (q_all + self.cfg.demo_margin_value * other).max(-1) - jnp.take_along_axis(
            q_all, action[..., None], axis=-1)[..., 0]
        per = per.mean(-1) if per.ndim == 2 else per
        return (per * is_demo).sum() / jnp.maximum(is_demo.sum(), 1)

    def act(self, params, obs, key=None):
        """Greedy action (env units)."""
        return self.greedy(self.q_values(params, obs))

    def greedy(self, q):
        """The greedy action, in env units, of Q values [B, A] (or [B, D, bins])."""
        return self.env_action(jnp.argmax(q, axis=-1))

    # -- n-step transitions ------------------------------------------------------------------
    def _push(self, window: NStepWindow, obs, action, reward, terminated, done, next_obs) -> NStepWindow:
        def push(buf, x):
            return jnp.concatenate([buf[:, 1:], x[:, None].astype(buf.dtype)], axis=1)

        return NStepWindow(push(window.obs, obs), push(window.action, action), push(window.reward, reward),
                           push(window.terminated, terminated), push(window.done, done),
                           push(window.next_obs, next_obs))

    def _emit(self, window: NStepWindow) -> dict:
        """The transition that starts at the window's oldest step, cut at its first episode end."""
        n = self.cfg.n_step
        k = jnp.arange(n)
        first_end = jnp.where(window.done.any(1), jnp.argmax(window.done, axis=1), n - 1)  # [N]
        rewards = jnp.where(k[None] <= first_end[:, None], window.reward, 0.0)
        rows = jnp.arange(window.obs.shape[0])
        return {
            "obs": window.obs[:, 0],
            "action": window.action[:, 0],
            "rewards": rewards,
            "steps": (first_end + 1).astype(jnp.int32),
            "boot_obs": window.next_obs[rows, first_end],
            "terminated": window.terminated[rows, first_end],
        }

    def _td(self, params, target_params, batch, gamma, dtype=jnp.float32, one_pass=False, with_q_all=False):
        """(TD errors [B], Q of the taken actions [B]) of stored transitions under n-step
        (Double-)DQN targets, float32, the networks computing in `dtype`; the target is a
        constant for gradients.

        `one_pass` (where no gradient is taken: TD errors at insertion): the online network sees
        `obs` and `boot_obs` in one forward pass. Under a gradient the two are separate passes:
        a joint one would run the backward pass over both halves, and on a CPU, where these
        networks are compute-bound, that cost more than the second forward pass it saves
        (measured: 3.7 vs 2.0 ms per update for the 128-wide fractal torso, batch 128)."""
        c = self.cfg
        b = batch["obs"].shape[0]
        if c.double_q and one_pass:
            both = self.q_values(params, jnp.concatenate([batch["obs"], batch["boot_obs"]]), dtype)
            q_all, chooser = both[:b], both[b:]
        elif c.double_q:
            q_all = self.q_values(params, batch["obs"], dtype)
            chooser = jax.lax.stop_gradient(self.q_values(params, batch["boot_obs"], dtype))
        else:
            q_all = self.q_values(params, batch["obs"], dtype)
        q_next_target = self.q_values(target_params, batch["boot_obs"], dtype)
        if not c.double_q:
            chooser = q_next_target
        ret = (batch["rewards"] * gamma ** jnp.arange(c.n_step, dtype=jnp.float32)).sum(-1)
        boot = self._q_of(q_next_target, jnp.argmax(chooser, axis=-1))
        discount = gamma ** batch["steps"].astype(jnp.float32) * (1.0 - batch["terminated"].astype(jnp.float32))
        q = self._q_of(q_all, batch["action"])
        td = jax.lax.stop_gradient(ret + discount * boot) - q
        return (td, q, q_all) if with_q_all else (td, q)

    def _targets(self, params, target_params, batch, gamma, dtype=jnp.float32):
        """n-step (Double-)DQN targets [B] for stored transitions (float32; networks in `dtype`)."""
        td, q = self._td(params, target_params, batch, gamma, dtype)
        return td + q

    def _loss(self, td, weight):
        """Importance-weighted TD loss: Huber, or mean squared error."""
        per_item = td**2 if self.cfg.loss == "mse" else optax.huber_loss(td, delta=self.cfg.huber_delta)
        return (weight * per_item).mean()

    # -- protocol ------------------------------------------------------------------------------
    def init(self, key, hparams=None) -> RMTState:
        c, spec = self.cfg, self.spec
        k_env, k_net, k_fill, key = jax.random.split(key, 4)
        # each device its own envs and random streams; the parameters the same on all
        k_env, k_fill, key = self.device_keys(k_env, k_fill, key)
        obs, env_state = self.env.reset(k_env)
        params = self.net.init(k_net, obs)
        hp = self.default_hparams(hparams)
        N = self.local_envs
        action_shape = (N, self.num_dims) if self.per_dim else (N,)
        zeros_obs = jnp.zeros((N, c.n_step) + spec.obs_shape, spec.obs_dtype)
        window = NStepWindow(zeros_obs, jnp.zeros((N, c.n_step) + action_shape[1:], jnp.int32),
                             jnp.zeros((N, c.n_step)), jnp.zeros((N, c.n_step), bool),
                             jnp.zeros((N, c.n_step), bool), zeros_obs)

        # fill the window with n-1 uniformly random steps, so every later step emits a real transition
        def random_step(carry, k):
            obs, env_state, window = carry
            k_a, k_e = jax.random.split(k)
            num = c.bins if self.per_dim else spec.num_actions
            action = jax.random.randint(k_a, action_shape, 0, num)
            next_obs, env_state, reward, term, _, info = self.env.step(k_e, env_state, self.env_action(action))
            window = self._push(window, obs, action, reward, term, info["done"], info["final_obs"])
            return (next_obs, env_state, window), None

        (obs, env_state, window), _ = jax.lax.scan(
            random_step, (obs, env_state, window), jax.random.split(k_fill, c.n_step - 1))
        example = jax.tree.map(lambda x: x[0], self._emit(window))
        state = RMTState(
            params=params, target_params=params, opt_state=self.tx.init(params), env_state=env_state, obs=obs,
            window=window, replay=self.replay.init(example), log_temperature=jnp.log(jnp.float32(c.init_temperature)),
            hold=exploration.Hold.empty(action_shape), td_ema=jnp.zeros(()), key_share=jnp.zeros(()),
            precision=self.precision.init(), hparams=hp, key=key, demos=self.demos)
        if c.demo_pretrain and self.demos is not None:
            state, _ = self.pretrain(state, jax.random.fold_in(key, 1))  # a stream of its own: `key` stays the run's
        return state

    def pretrain(self, state: RMTState, key):
        """DQfD's pre-training (Hester et al. 2018): `agent.demo_pretrain` guarded gradient steps,
        each on a minibatch drawn uniformly from the demonstrations alone (weight 1; with the
        margin loss when `agent.demo_margin` > 0), the target network following as it does in
        training (a hard copy every `target_update_every` steps, or Polyak), at the initial
        learning rate and clip threshold. `init` runs it before the first env step. Returns the
        state and the loss of every step [demo_pretrain]."""
        c, hp = self.cfg, state.hparams
        count = state.demos["obs"].shape[0]
        clip = self.precision.clip_threshold(hp.max_grad_norm, jnp.float32(0.0))
        weight = jnp.ones((self.local_batch,), jnp.float32)

        def one(carry, x):
            params, target_params, opt_state, prec_state = carry
            k, i = x
            rows = jax.random.randint(k, (self.local_batch,), 0, count)
            batch = {**jax.tree.map(lambda a: a[rows], state.demos), "demo": jnp.ones((self.local_batch,), bool)}
            out = self.gradient_step(params, target_params, opt_state, prec_state, batch, weight, hp.gamma, clip)
            if c.target_update == "polyak":
                target_params = optax.incremental_update(out.params, target_params, hp.tau)
            else:
                target_params = jax.lax.cond((i + 1) % c.target_update_every == 0, lambda: out.params,
                                             lambda: target_params)
            return (out.params, target_params, out.opt_state, out.precision), out.loss

        carry = (state.params, state.target_params, with_lr(state.opt_state, hp.lr), state.precision)
        xs = (jax.random.split(key, c.demo_pretrain), jnp.arange(c.demo_pretrain))
        (params, target_params, opt_state, prec_state), losses = jax.lax.scan(one, carry, xs)
        return state.replace(params=params, target_params=target_params, opt_state=opt_state,
                             precision=prec_state), losses

    def gradient_step(self, params, target_params, opt_state, prec_state, batch, weight, gamma, clip,
                      temperature=None) -> Step:
        """One guarded (and, on several devices, fused) step on this device's minibatch `batch`
        with importance weights `weight` [B]: a `rmtjax.precision.Step` whose `aux` is `(td, q)`
        and whose `loss` is the mean over the devices. `temperature`: of the transfer KL penalty's
        policies (`policy_distribution`), when the run has one."""

        if "demo" in batch and self.cfg.demo_margin > 0:
            def loss_fn(p, dtype):
                td, q, q_all = self._td(p, target_params, batch, gamma, dtype, with_q_all=True)
                return self._loss(td, weight) + self.cfg.demo_margin * self._margin(q_all, batch["action"],
                                                                                     batch["demo"]), (td, q)
        else:
            def loss_fn(p, dtype):
                td, q = self._td(p, target_params, batch, gamma, dtype)
                return self._loss(td, weight), (td, q)

        return self.precision.step(prec_state, loss_fn, params, opt_state, self.tx, clip,
                                   penalty=self.transfer_penalty(opt_state, batch["obs"], temperature))

    def schedule(self, hp: RMTHParams, t) -> Schedule:
        c = self.cfg
        progress = self.progress(t)
        return Schedule(
            epsilon=exploration.linear_schedule(hp.eps_start, hp.eps_end, progress, c.eps_decay_frac),
            entropy_frac=exploration.linear_schedule(hp.entropy_target_start, hp.entropy_target_end, progress,
                                                     c.eps_decay_frac),
            beta=hp.beta_start + (1.0 - hp.beta_start) * progress,
            clip=self.precision.clip_threshold(hp.max_grad_norm, progress),
            lr=lr_in_force(hp.lr, progress, c.lr_end_frac),
            demo_rows=self._demo_rows(progress))

    def _demo_rows(self, progress):
        """How many rows of this device's minibatch come from the demonstrations."""
        if self.demos is None:
            return jnp.zeros((), jnp.int32)
        c = self.cfg
        share = exploration.linear_schedule(jnp.float32(c.demo_share), jnp.float32(c.demo_share_end), progress,
                                            c.demo_decay_frac)
        return jnp.minimum(jnp.round(share * self.local_batch).astype(jnp.int32), self.max_demo_rows)

    @jax.named_scope("phase/act")
    def _act(self, state: RMTState, sched: Schedule, key):
        """`rollout_len` steps of every env: (obs, env_state, window, log_temperature, hold) after
        them, the emitted transitions [T*N, ...] and the exploration statistics [T]."""
        c, prec, hp = self.cfg, self.precision, state.hparams
        boltzmann = c.exploration == "eps_boltzmann"

        def env_step(carry, keys):
            obs, env_state, window, log_temp, hold = carry
            k_act, k_env = keys
            q = prec.select(state.precision, lambda dt: self.q_values(state.params, obs, dt))
            action, info, hold = exploration.select_action(k_act, q, sched.epsilon, jnp.exp(log_temp), boltzmann,
                                                           hold, c.eps_hold)
            if boltzmann:
                adapted = exploration.adapt_temperature(log_temp, info["policy_entropy"],
                                                        sched.entropy_frac * info["max_entropy"], hp.temperature_lr)
                log_temp = jnp.where(jnp.isfinite(adapted), adapted, log_temp)  # a NaN observation must not stick
            next_obs, env_state, reward, term, _, env_info = self.env.step(k_env, env_state, self.env_action(action))
            window = self._push(window, obs, action, reward, term, env_info["done"], env_info["final_obs"])
            return (next_obs, env_state, window, log_temp, hold), (self._emit(window), info)

        carry = (state.obs, state.env_state, state.window, state.log_temperature, state.hold)
        carry, (new, act_info) = jax.lax.scan(env_step, carry, jax.random.split(key, (c.rollout_len, 2)))
        new = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), new)  # [T*N, ...]
        return carry, new, act_info

    @jax.named_scope("phase/store")
    def _store(self, state: RMTState, new: dict, gamma):
        """(replay with the new transitions, their |TD| or None where the replay keeps no priority)."""
        if not self.replay.needs_td:
            return self.replay.add(state.replay, new), None
        td, _ = self.precision.select(
            state.precision, lambda dt: self._td(state.params, state.target_params, new, gamma, dt, one_pass=True))
        td_abs = finite_abs(td)
        return self.replay.add(state.replay, new, td_abs), td_abs

    def _learn(self, learner, t, key, sched: Schedule, hp: RMTHParams, key_share, demos=None):
        """`num_updates` guarded gradient steps of iteration `t`, each with its sample, target
        update and write-back. Returns the learner tuple and the iteration's statistics."""
        c = self.cfg
        first = (t - self.first_learning_iteration) * self.num_updates + 1  # run-wide number of the first update
        keys = jax.random.split(key, self.num_updates + 1)
        k_share = keys[-1]
        share_due = t % c.diagnostics_every == 0

        def update(carry, x):
            (params, target_params, opt_state, replay, prec_state), share = carry
            k, index = x
            with jax.named_scope("phase/sample"):
                if demos is None:
                    batch, info = self.replay.sample(replay, k, self.local_batch, sched.beta)
                    weight, keep = info.weight, None
                else:
                    k, k_demo = jax.random.split(k)
                    batch, info = self.replay.sample(replay, k, self.local_batch, sched.beta)
                    batch, weight, is_demo = self._mix_demos(demos, batch, info.weight, sched.demo_rows, k_demo)
                    keep = ~is_demo  # the replay's own rows are written back, the demonstrations' not
            with jax.named_scope("phase/grad_step"):
                out = self.gradient_step(params, target_params, opt_state, prec_state, batch, weight, hp.gamma,
                                         sched.clip, sched.temperature)
                params, opt_state, prec_state, loss, (td, q) = (out.params, out.opt_state, out.precision, out.loss,
                                                                out.aux)
            with jax.named_scope("phase/target"):
                if c.target_update == "polyak":
                    target_params = optax.incremental_update(params, target_params, hp.tau)
                else:
                    # the update's number is the same for every seed: a real branch
                    target_params = jax.lax.cond((first + index) % c.target_update_every == 0, lambda: params,
                                                 lambda: target_params)
            with jax.named_scope("phase/diagnostics"):
                stats = {"loss": loss, "td_abs": jnp.abs(td).mean(), "q_mean": q.mean(), **out.stats,
                         **self.replay.batch_stats(replay, info)}
                if demos is not None:
                    stats["demo_share"] = is_demo.mean()
                # the top-TD share of the iteration's last minibatch, every `diagnostics_every` iterations
                share = jax.lax.cond(share_due & (index == self.num_updates - 1),
                                     lambda: self.replay.key_share(replay, info, k_share), lambda: share)
            # the write-back comes last: reading the batch after it would make XLA copy the buffer
            with jax.named_scope("phase/write_back"):
                replay = self.replay.update(replay, info, finite_abs(td), keep)
            return ((params, target_params, opt_state, replay, prec_state), share), stats

        xs = (keys[:-1], jnp.arange(self.num_updates, dtype=jnp.int32))
        (learner, key_share), stats = jax.lax.scan(update, (learner, key_share), xs)
        return learner, {**summarize(stats), "top_td_share": key_share}

    def step(self, state: RMTState, t):
        c, hp, prec = self.cfg, state.hparams, self.precision
        sched = self.schedule(hp, t)
        key, k_roll, k_learn = jax.random.split(state.key, 3)

        (obs, env_state, window, log_temp, hold), new, act_info = self._act(state, sched, k_roll)
        if self.config.transfer.kl_coef:  # the KL to the source is taken at the temperature in force
            sched = sched.replace(temperature=jnp.exp(log_temp))
        replay, td_new = self._store(state, new, hp.gamma)

        learner = (state.params, state.target_params, with_lr(state.opt_state, sched.lr), replay, state.precision)
        learning = t >= self.first_learning_iteration  # `t` is not batched: a real branch under vmap

        # one trace of the updates serves both branches: the stats' shapes for the skip
        args = (learner, t, k_learn, sched, hp, state.key_share, state.demos)
        learn, (_, stats_shape) = trace_once(self._learn, *args)

        def skip(args):
            return args[0], {**zeros(stats_shape), "top_td_share": args[5]}

        learner, stats = jax.lax.cond(learning, lambda a: learn(*a), skip, args)
        params, target_params, opt_state, replay, prec_state = learner
        td_ema = ema(state.td_ema, stats["td_abs"], learning & (stats["skipped_frac"] < 1.0))

        new_state = state.replace(
            params=params, target_params=target_params, opt_state=opt_state, env_state=env_state, obs=obs,
            window=window, replay=replay, log_temperature=log_temp, hold=hold, td_ema=td_ema,
            key_share=stats["top_td_share"], precision=prec_state, key=key)
        with jax.named_scope("phase/diagnostics"):
            metrics = {
                "env_steps": self.env_steps_after(t), **episode_metrics(state.env_state, env_state), **stats,
                "td_error_ema": td_ema, "lr_in_force": sched.lr, "epsilon": sched.epsilon,
                "temperature": jnp.exp(log_temp), "beta": sched.beta,
                "policy_entropy": act_info["policy_entropy"].mean(), "explore_frac": act_info["explore_frac"].mean(),
                "nongreedy_frac": act_info["nongreedy_frac"].mean(),
                **({} if td_new is None else {"td_new_abs": td_new.mean()}),
                **self.replay.buffer_stats(replay), **hparam_metrics(hp), **prec.metrics(prec_state, sched.clip),
            }
        return new_state, metrics

    # -- the protocol --------------------------------------------------------------------------
    @property
    def max_entropy(self) -> float | None:
        # discrete actions, or continuous ones as `bins` choices per dimension
        return math.log(self.spec.num_actions if self.spec.discrete else self.cfg.bins)

    def signals(self, metrics) -> Signals:
        return Signals(episode_return=metrics["episode_return"], episodes=metrics["episode_count"],
                       value_loss=metrics["loss"], entropy=metrics["policy_entropy"],
                       explore=metrics["nongreedy_frac"])

    def learner(self, state: RMTState) -> Learner:
        return Learner(params=state.params, opt_state=state.opt_state, target=state.target_params,
                       extra={"log_temperature": state.log_temperature})

    def param_groups(self, params):
        """torso/<module> (each layer or block of the torso), head/<module> (advantage, value)."""
        return jax.tree_util.tree_map_with_path(lambda path, _: f"{path[1].key}/{path[2].key}", params)

    def policy_distribution(self, params, obs, dtype=jnp.float32, temperature=None):
        """softmax(Q / temperature) over each action (per dimension for binned actions): the
        Boltzmann policy RMT acts with (without its ε share); DQN's temperature stays 1."""
        q = self.q_values(params, obs, dtype)
        return Categorical(q if temperature is None else q / temperature)

    def with_learner(self, state: RMTState, learner: Learner) -> RMTState:
        return state.replace(params=learner.params, opt_state=learner.opt_state, target_params=learner.target,
                             log_temperature=learner.extra["log_temperature"])
