"""Soft actor-critic (twin critics, tanh-Gaussian actor, automatic temperature) as one pure `step`.

One iteration: one step in each of `num_envs` envs (uniformly random actions until
`learning_starts` env steps), the transitions written to a uniform replay (`make_replay`),
then `round(updates_per_step × num_envs)` gradient updates, each of the critics, the actor and
the temperature, followed by a Polyak update of the target critics (`optax.incremental_update`).
Each of the three goes through the update guard (`rmtjax.guard`): a non-finite one is
skipped.

With `distributed.devices` D > 1 each device steps its `num_envs / D` envs, keeps its own
replay shard of `buffer_size / D` and draws `batch_size / D` of each minibatch; the guard fuses
the devices' gradients, so every device applies the same update (`update_on_batch` is the
update on a given batch).

The policy acts in [-1, 1]^|A| (the tanh of a Gaussian sample), which is what the critics see
and the buffer stores; the env gets it rescaled to its box. Log-probabilities are those of the
rescaled action: Gaussian density, tanh Jacobian and the box half-widths. Targets bootstrap
through time-limit truncations from the pre-reset observation and never through `terminated`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from rmtjax.agents.base import Agent, hparam_metrics
from rmtjax.envs import VecEnvState, episode_metrics
from rmtjax.guard import with_lr
from rmtjax.networks import QNet, TanhGaussianActor, per_dtype
from rmtjax.networks.distributions import tanh_gaussian_log_prob
from rmtjax.precision import PrecisionState, ema, summarize
from rmtjax.protocol import Learner, Signals, hparam
from rmtjax.replay import make_replay
from rmtjax.schema import ConfigError, Section, param
from rmtjax.tracing import trace_once, zeros


@dataclasses.dataclass(frozen=True)
class SACConfig(Section):
    _section = "agent"
    buffer_size: int = param(100_000, lo=1, doc="replay capacity in transitions")
    batch_size: int = param(256, lo=1, doc="transitions per gradient update (drawn uniformly, with replacement)")
    learning_starts: int = param(1_000, lo=0, doc="env steps (all envs) of uniformly random actions before the first update")
    updates_per_step: float = param(0.25, lo=0.0, lo_open=True,
                                    doc="gradient updates per env step (replay ratio): round(updates_per_step × "
                                        "env.num_envs) per iteration, at least 1")
    actor_lr: float = param(3e-4, lo=0.0, hi=1.0, lo_open=True, doc="Adam learning rate of the actor")
    critic_lr: float = param(3e-4, lo=0.0, hi=1.0, lo_open=True, doc="Adam learning rate of the critics")
    alpha_lr: float = param(3e-4, lo=0.0, hi=1.0, doc="Adam learning rate of log(alpha); 0 keeps alpha at init_alpha")
    gamma: float = param(0.99, lo=0.0, hi=1.0, doc="discount")
    tau: float = param(0.005, lo=0.0, hi=1.0, lo_open=True, doc="Polyak rate of the target critics per update")
    init_alpha: float = param(1.0, lo=0.0, lo_open=True, doc="initial entropy temperature")
    target_entropy_scale: float = param(1.0, doc="target entropy = -scale × |A| nats (of the rescaled action)")
    hidden: tuple[int, ...] = param((256, 256), lo=1, doc="hidden layer widths of actor and critics")
    activation: str = param("relu", choices=("tanh", "relu", "gelu", "silu", "elu"))
    log_std_min: float = param(-5.0, lo=-20.0, hi=0.0, doc="lower bound of the actor's pre-tanh log std")
    log_std_max: float = param(2.0, lo=-5.0, hi=5.0, doc="upper bound of the actor's pre-tanh log std")
    max_grad_norm: float = param(0.0, lo=0.0, doc="global-norm clip of the actor's and the critics' gradients "
                                                  "(initial; see precision.clip_decay_to); 0: no clipping")

    def validate(self):
        if self.log_std_min >= self.log_std_max:
            raise ConfigError(f"agent.log_std_min: {self.log_std_min} must be below agent.log_std_max = "
                              f"{self.log_std_max}")

    def validate_with(self, env, train):
        from rmtjax.envs import env_spec

        if env_spec(env).discrete:
            raise ConfigError(f"algo: sac needs continuous (box) actions; {env.id} has discrete actions "
                              f"(use ppo, or a continuous env such as Pendulum-v1)")
        if self.buffer_size < env.num_envs:
            raise ConfigError(f"agent.buffer_size: {self.buffer_size} is smaller than one iteration's "
                              f"transitions (env.num_envs = {env.num_envs})")
        if self.learning_starts >= train.total_steps:
            raise ConfigError(f"agent.learning_starts: {self.learning_starts} leaves no step to learn in; it must "
                              f"be below train.total_steps = {train.total_steps}")


@struct.dataclass
class SACHParams:
    actor_lr: jax.Array = hparam("lr")
    critic_lr: jax.Array = hparam("lr")
    alpha_lr: jax.Array = hparam()
    gamma: jax.Array = hparam("gamma")
    tau: jax.Array = hparam()
    target_entropy_scale: jax.Array = hparam()
    max_grad_norm: jax.Array = hparam()


@struct.dataclass
class SACState:
    params: Any  # {"actor": ..., "critic": ...}; critic leaves are stacked [2, ...] (twin critics)
    target_critic: Any  # Polyak average of params["critic"]
    opt_state: Any  # {"actor", "critic", "alpha"}: guarded optax states with injected learning rates
    log_alpha: jax.Array  # log of the entropy temperature
    env_state: VecEnvState
    obs: jax.Array  # [num_envs, *obs_shape] current observation
    replay: Any  # uniform replay of obs, action ([-1, 1]), reward, next_obs (pre-reset), terminated
    td_error_ema: jax.Array  # moving average of the critics' mean |TD error|
    precision: PrecisionState
    hparams: SACHParams
    key: jax.Array


def soft_td_target(reward, terminated, next_q, next_log_prob, alpha, gamma):
    """r + γ (1 - terminated) (min-target-Q(s', a') - α log π(a'|s')); truncation still bootstraps."""
    return reward + gamma * (1.0 - terminated.astype(jnp.float32)) * (next_q - alpha * next_log_prob)


class SAC(Agent):
    Config = SACConfig
    HParams = SACHParams
    data_parallel = True  # the guard fuses the gradients across devices
    device_shares = ("batch_size", "buffer_size")  # each device samples and holds an equal share

    def __init__(self, config):
        super().__init__(config)
        c, spec = self.cfg, self.spec
        self.action_dim = int(np.prod(spec.action_shape))
        low, high = spec.action_low.reshape(-1), spec.action_high.reshape(-1)
        self.center = jnp.asarray((high + low) / 2, jnp.float32)
        self.half_range = jnp.asarray((high - low) / 2, jnp.float32)
        # one module per compute dtype (same float32 parameters); `actor`/`critic` are the float32 ones
        self.actors = per_dtype(lambda dt: TanhGaussianActor(c.hidden, c.activation, self.action_dim, c.log_std_min,
                                                             c.log_std_max, dt), self.precision.dtypes)
        self.critics = per_dtype(lambda dt: QNet(c.hidden, c.activation, dt), self.precision.dtypes)
        self.actor, self.critic = self.actors[jnp.dtype(jnp.float32)], self.critics[jnp.dtype(jnp.float32)]
        self.tx = self.guarded(optax.inject_hyperparams(optax.adam)(learning_rate=1e-3))  # rates: from hparams
        self.num_updates = max(1, round(c.updates_per_step * self.steps_per_iteration))
        # this device's share of each minibatch and of the replay capacity (all of it on one device)
        self.local_batch = c.batch_size // self.shards
        self.replay = make_replay("uniform", capacity=c.buffer_size // self.shards)

    @property
    def steps_per_iteration(self) -> int:
        return self.config.env.num_envs

    @property
    def first_learning_iteration(self) -> int:
        """The first iteration that updates: the one after which `learning_starts` env steps are done."""
        return self.first_iteration_with(self.cfg.learning_starts)

    # -- pieces ---------------------------------------------------------------------------
    def _to_env(self, unit_action):
        """[B, A] in [-1, 1] -> [B, *action_shape] in the env's box."""
        a = self.center + self.half_range * unit_action
        return a.reshape((a.shape[0],) + self.spec.action_shape)

    def noise(self, key, batch: int):
        """Standard normal noise [batch, A] for `batch` policy samples."""
        return jax.random.normal(key, (batch, self.action_dim))

    def _sample(self, actor_params, obs, noise, dtype=jnp.float32):
        """A policy sample in [-1, 1]^A from standard normal `noise` [B, A], and the
        log-probability of its rescaled version (actor in `dtype`)."""
        mean, log_std = self.actors[jnp.dtype(dtype)].apply(actor_params, obs)
        u = mean + jnp.exp(log_std) * noise
        return jnp.tanh(u), tanh_gaussian_log_prob(mean, log_std, u, self.half_range)

    def _q(self, critic_params, obs, unit_action, dtype=jnp.float32):
        """Both critics: [2, B] (computing in `dtype`)."""
        critic = self.critics[jnp.dtype(dtype)]
        return jax.vmap(critic.apply, in_axes=(0, None, None))(critic_params, obs, unit_action)

    def td_target(self, actor_params, target_critic, alpha, batch, noise, gamma, dtype=jnp.float32):
        """The soft TD target [B] of a replay batch (next actions from the current actor with
        standard normal `noise` [B, A]), float32."""
        next_action, next_log_prob = self._sample(actor_params, batch["next_obs"], noise, dtype)
        next_q = self._q(target_critic, batch["next_obs"], next_action, dtype).min(axis=0)
        return soft_td_target(batch["reward"], batch["terminated"], next_q, next_log_prob, alpha, gamma)

    @staticmethod
    def _set_lrs(opt_state, hp):
        return {"actor": with_lr(opt_state["actor"], hp.actor_lr), "critic": with_lr(opt_state["critic"], hp.critic_lr),
                "alpha": with_lr(opt_state["alpha"], hp.alpha_lr)}

    # -- protocol -------------------------------------------------------------------------
    def init(self, key, hparams=None) -> SACState:
        k_env, k_actor, k_critic, key = jax.random.split(key, 4)
        k_env, key = self.device_keys(k_env, key)  # each device its own envs; the parameters the same on all
        obs, env_state = self.env.reset(k_env)
        no_action = jnp.zeros((obs.shape[0], self.action_dim), jnp.float32)
        critic = jax.vmap(lambda k: self.critic.init(k, obs, no_action))(jax.random.split(k_critic, 2))
        params = {"actor": self.actor.init(k_actor, obs), "critic": critic}
        log_alpha = jnp.log(jnp.asarray(self.cfg.init_alpha, jnp.float32))
        hp = self.default_hparams(hparams)
        opt_state = self._set_lrs({"actor": self.tx.init(params["actor"]), "critic": self.tx.init(critic),
                                   "alpha": self.tx.init(log_alpha)}, hp)
        example = {"obs": obs[0], "action": no_action[0], "reward": jnp.zeros((), jnp.float32),
                   "next_obs": obs[0], "terminated": jnp.zeros((), bool)}
        replay = self.replay.init(example)
        return SACState(params=params, target_critic=critic, opt_state=opt_state, log_alpha=log_alpha,
                        env_state=env_state, obs=obs, replay=replay, td_error_ema=jnp.zeros(()),
                        precision=self.precision.init(), hparams=hp, key=key)

    def act(self, params, obs, key=None):
        """Greedy action: the rescaled tanh of the Gaussian mean."""
        mean, _ = self.actor.apply(params["actor"], obs)
        return self._to_env(jnp.tanh(mean))

    def _update(self, learner, key, replay, hp, clip):
        """One update on a minibatch drawn from this device's replay (`update_on_batch`)."""
        k_sample, k_next, k_pi = jax.random.split(key, 3)
        batch, _ = self.replay.sample(replay, k_sample, self.local_batch, 1.0)
        batch = {**batch, "next_noise": self.noise(k_next, self.local_batch),
                 "pi_noise": self.noise(k_pi, self.local_batch)}
        return self.update_on_batch(learner, batch, hp, clip)

    def update_on_batch(self, learner, batch, hp, clip):
        """One gradient update of critics, actor and temperature (each guarded; on several
        devices, fused), then the target critics, on this device's minibatch `batch` (replay
        fields and the standard normal noise of the next and the current policy samples,
        `next_noise` and `pi_noise` [B, A]). `learner`: (params, target critic, opt states,
        log alpha, precision state). Returns the new learner and the update's statistics."""
        params, target_critic, opt_state, log_alpha, ps = learner
        prec = self.precision
        alpha = jnp.exp(log_alpha)

        target = prec.select(ps, lambda dt: self.td_target(params["actor"], target_critic, alpha, batch,
                                                           batch["next_noise"], hp.gamma, dt))

        def critic_loss_fn(cp, dtype):
            q = self._q(cp, batch["obs"], batch["action"], dtype)
            return 0.5 * jnp.sum(jnp.mean((q - target) ** 2, axis=1)), (q.mean(), jnp.abs(q - target).mean())

        c_out = prec.step(ps, critic_loss_fn, params["critic"], opt_state["critic"], self.tx, clip)
        critic, (q_mean, td_abs) = c_out.params, c_out.aux

        def actor_loss_fn(ap, dtype):
            action, log_prob = self._sample(ap, batch["obs"], batch["pi_noise"], dtype)
            q = self._q(critic, batch["obs"], action, dtype).min(axis=0)
            return jnp.mean(alpha * log_prob - q), log_prob

        a_out = prec.step(c_out.precision, actor_loss_fn, params["actor"], opt_state["actor"], self.tx, clip)
        log_prob = a_out.aux

        target_entropy = -hp.target_entropy_scale * self.action_dim
        entropy = -jnp.mean(log_prob)

        def alpha_loss_fn(la, dtype):
            return la * (entropy - target_entropy), ()  # alpha grows while entropy is below target

        al_out = prec.step(a_out.precision, alpha_loss_fn, log_alpha, opt_state["alpha"], self.tx)

        target_critic = optax.incremental_update(critic, target_critic, hp.tau)
        c_guard, a_guard, al_guard = c_out.stats, a_out.stats, al_out.stats
        skipped = jnp.maximum(jnp.maximum(c_guard["update_skipped"], a_guard["update_skipped"]),
                              al_guard["update_skipped"])
        metrics = {"critic_loss": c_out.loss, "actor_loss": a_out.loss, "alpha_loss": al_out.loss,
                   "entropy": entropy, "q_mean": q_mean, "target_q_mean": target.mean(), "td_abs": td_abs,
                   "critic_grad_norm": c_guard["grad_norm"], "actor_grad_norm": a_guard["grad_norm"],
                   "update_skipped": skipped}
        new_opt = {"actor": a_out.opt_state, "critic": c_out.opt_state, "alpha": al_out.opt_state}
        return ({"actor": a_out.params, "critic": critic}, target_critic, new_opt, al_out.params, al_out.precision), \
            metrics

    def step(self, state: SACState, t):
        c, hp, prec = self.cfg, state.hparams, self.precision
        key, k_act, k_rand, k_env, k_learn = jax.random.split(state.key, 5)
        clip = prec.clip_threshold(hp.max_grad_norm, self.progress(t))
        env_steps = self.env_steps_after(t)
        learning = t >= self.first_learning_iteration  # the same for every seed: a real branch under vmap

        # act: uniformly random until learning starts, then a policy sample
        noise = self.noise(k_act, state.obs.shape[0])
        policy_action, _ = prec.select(state.precision,
                                       lambda dt: self._sample(state.params["actor"], state.obs, noise, dt))
        random_action = jax.random.uniform(k_rand, policy_action.shape, minval=-1.0, maxval=1.0)
        # the env steps before this iteration's: random until `learning_starts` of them are done
        action = jnp.where(env_steps - self.steps_per_iteration < c.learning_starts, random_action, policy_action)
        obs, env_state, reward, terminated, _, info = self.env.step(k_env, state.env_state, self._to_env(action))
        replay = self.replay.add(state.replay, {"obs": state.obs, "action": action, "reward": reward,
                                                "next_obs": info["final_obs"], "terminated": terminated})

        # learn: `num_updates` updates once `learning_starts` env steps are in the buffer
        learner = (state.params, state.target_critic, self._set_lrs(state.opt_state, hp), state.log_alpha,
                   state.precision)

        def learn(learner, replay, hp, clip, key):
            out, m = jax.lax.scan(lambda l, k: self._update(l, k, replay, hp, clip), learner,
                                  jax.random.split(key, self.num_updates))
            return out, summarize(m)  # means over the updates the guard accepted

        # one trace of the updates serves both branches: the metrics' shapes for the skip
        args = (learner, replay, hp, clip, k_learn)
        learn, (_, metric_shapes) = trace_once(learn, *args)
        learner, update_metrics = jax.lax.cond(learning, lambda a: learn(*a), lambda a: (a[0], zeros(metric_shapes)),
                                               args)
        params, target_critic, opt_state, log_alpha, prec_state = learner
        td_error_ema = ema(state.td_error_ema, update_metrics["td_abs"],
                           learning & (update_metrics["skipped_frac"] < 1.0))

        new_state = state.replace(
            params=params, target_critic=target_critic, opt_state=opt_state, log_alpha=log_alpha,
            env_state=env_state, obs=obs, replay=replay, td_error_ema=td_error_ema, precision=prec_state, key=key)
        updates = jnp.maximum(t - self.first_learning_iteration + 1, 0) * self.num_updates
        metrics = {"env_steps": env_steps, **episode_metrics(state.env_state, env_state), **update_metrics,
                   **hparam_metrics(hp), "alpha": jnp.exp(log_alpha), "updates": updates,
                   **self.replay.buffer_stats(replay), "td_error_ema": td_error_ema, **prec.metrics(prec_state, clip)}
        return new_state, metrics

    # -- the protocol --------------------------------------------------------------------------
    def signals(self, metrics) -> Signals:
        return Signals(episode_return=metrics["episode_return"], episodes=metrics["episode_count"],
                       value_loss=metrics["critic_loss"], entropy=metrics["entropy"], q_magnitude=metrics["q_mean"],
                       skipped_frac=metrics["skipped_frac"])

    def learner(self, state: SACState) -> Learner:
        return Learner(params=state.params, opt_state=state.opt_state, target=state.target_critic,
                       extra={"log_alpha": state.log_alpha})

    def with_learner(self, state: SACState, learner: Learner) -> SACState:
        return state.replace(params=learner.params, opt_state=learner.opt_state, target_critic=learner.target,
                             log_alpha=learner.extra["log_alpha"])
