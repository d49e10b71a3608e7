"""Soft actor-critic (twin critics, tanh-Gaussian actor, automatic temperature) as one pure `step`.

One iteration: one step in each of `num_envs` envs (uniformly random actions until
`learning_starts` env steps), the transitions written to a uniform ring buffer, then
`updates_per_step` gradient updates, each of the critics, the actor and the temperature,
followed by a Polyak update of the target critics. Each of the three goes through the
precision guard (`rmtjax.precision`): a non-finite one is skipped.

The policy acts in [-1, 1]^|A| (the tanh of a Gaussian sample), which is what the critics see
and the buffer stores; the env gets it rescaled to its box. Log-probabilities are those of the
rescaled action: Gaussian density, tanh Jacobian and the box half-widths. Targets bootstrap
through time-limit truncations from the pre-reset observation and never through `terminated`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from rmtjax.agents.base import Agent, hparam_metrics
from rmtjax.envs import VecEnvState, episode_metrics
from rmtjax.networks import MLP
from rmtjax.precision import PrecisionState, ema, summarize
from rmtjax.protocol import Learner, Signals, hparam
from rmtjax.schema import ConfigError, Section, param
from rmtjax.replay import ring

LOG_2PI = float(np.log(2 * np.pi))
LOG_2 = float(np.log(2.0))


@dataclasses.dataclass(frozen=True)
class SACConfig(Section):
    _section = "agent"
    buffer_size: int = param(100_000, lo=1, doc="replay capacity in transitions")
    batch_size: int = param(256, lo=1, doc="transitions per gradient update (drawn uniformly, with replacement)")
    learning_starts: int = param(1_000, lo=0, doc="env steps (all envs) of uniformly random actions before the first update")
    updates_per_step: int = param(1, lo=1, doc="gradient updates per iteration (one step of every env)")
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
    opt_state: Any  # {"actor", "critic", "alpha"}: optax states with injected learning rates
    log_alpha: jax.Array  # log of the entropy temperature
    env_state: VecEnvState
    obs: jax.Array  # [num_envs, *obs_shape] current observation
    replay: ring.RingState  # obs, action ([-1, 1]), reward, next_obs (pre-reset), terminated
    td_error_ema: jax.Array  # moving average of the critics' mean |TD error|
    precision: PrecisionState
    hparams: SACHParams
    key: jax.Array


# -- the squashed Gaussian (hand-checked formulas) ----------------------------------------
def tanh_gaussian_log_prob(mean, log_std, pre_tanh, half_range):
    """Log density of `center + half_range * tanh(u)` at `u = pre_tanh`, u ~ N(mean, exp(log_std)^2)
    per dimension; [B, A] inputs, [B] output (independent dimensions summed)."""
    z = (pre_tanh - mean) * jnp.exp(-log_std)
    log_gauss = -0.5 * z**2 - log_std - 0.5 * LOG_2PI
    # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), which stays finite where tanh(u) rounds to ±1
    log_dtanh = 2.0 * (LOG_2 - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh))
    return jnp.sum(log_gauss - log_dtanh - jnp.log(half_range), axis=-1)


def polyak(target, online, tau):
    """`(1 - tau) * target + tau * online`, leaf by leaf."""
    return jax.tree.map(lambda t, o: (1.0 - tau) * t + tau * o, target, online)


def soft_td_target(reward, terminated, next_q, next_log_prob, alpha, gamma):
    """r + γ (1 - terminated) (min-target-Q(s', a') - α log π(a'|s')); truncation still bootstraps."""
    return reward + gamma * (1.0 - terminated.astype(jnp.float32)) * (next_q - alpha * next_log_prob)


# -- networks ------------------------------------------------------------------------------
class TanhGaussianActor(nn.Module):
    """obs [B, ...] -> (mean, log_std) of the pre-tanh Gaussian, each [B, A]."""

    hidden: tuple
    activation: str
    action_dim: int
    log_std_min: float
    log_std_max: float
    dtype: Any = jnp.float32  # compute dtype; parameters and outputs are float32

    @nn.compact
    def __call__(self, obs):
        x = MLP(self.hidden, self.activation, dtype=self.dtype)(obs)
        mean = nn.Dense(self.action_dim, dtype=self.dtype)(x).astype(jnp.float32)
        # a smooth squash into [min, max] keeps a gradient at the bounds, unlike a clip
        raw = nn.Dense(self.action_dim, dtype=self.dtype)(x).astype(jnp.float32)
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (jnp.tanh(raw) + 1.0)
        return mean, log_std


class QNet(nn.Module):
    """(obs [B, ...], action [B, A]) -> Q [B]."""

    hidden: tuple
    activation: str
    dtype: Any = jnp.float32  # compute dtype; parameters and output are float32

    @nn.compact
    def __call__(self, obs, action):
        x = jnp.concatenate([obs.reshape((obs.shape[0], -1)).astype(jnp.float32), action], axis=-1)
        x = MLP(self.hidden, self.activation, dtype=self.dtype)(x)
        return nn.Dense(1, dtype=self.dtype)(x)[:, 0].astype(jnp.float32)


class SAC(Agent):
    Config = SACConfig
    HParams = SACHParams

    def __init__(self, config):
        super().__init__(config)
        c, spec = self.cfg, self.spec
        self.action_dim = int(np.prod(spec.action_shape))
        low, high = spec.action_low.reshape(-1), spec.action_high.reshape(-1)
        self.center = jnp.asarray((high + low) / 2, jnp.float32)
        self.half_range = jnp.asarray((high - low) / 2, jnp.float32)
        # one module per compute dtype (same float32 parameters); `actor`/`critic` are the float32 ones
        dtypes = {jnp.dtype(dt) for dt in (*self.precision.dtypes, jnp.float32)}
        self.actors = {dt: TanhGaussianActor(c.hidden, c.activation, self.action_dim, c.log_std_min, c.log_std_max,
                                             dt) for dt in dtypes}
        self.critics = {dt: QNet(c.hidden, c.activation, dt) for dt in dtypes}
        self.actor, self.critic = self.actors[jnp.dtype(jnp.float32)], self.critics[jnp.dtype(jnp.float32)]
        self.tx = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)  # rates are set from hparams

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

    def _sample(self, actor_params, obs, key, dtype=jnp.float32):
        """A policy sample in [-1, 1]^A and the log-probability of its rescaled version (actor in `dtype`)."""
        mean, log_std = self.actors[jnp.dtype(dtype)].apply(actor_params, obs)
        u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
        return jnp.tanh(u), tanh_gaussian_log_prob(mean, log_std, u, self.half_range)

    def _q(self, critic_params, obs, unit_action, dtype=jnp.float32):
        """Both critics: [2, B] (computing in `dtype`)."""
        critic = self.critics[jnp.dtype(dtype)]
        return jax.vmap(critic.apply, in_axes=(0, None, None))(critic_params, obs, unit_action)

    def td_target(self, actor_params, target_critic, alpha, batch, key, gamma, dtype=jnp.float32):
        """The soft TD target [B] of a replay batch (next actions from the current actor), float32."""
        next_action, next_log_prob = self._sample(actor_params, batch["next_obs"], key, dtype)
        next_q = self._q(target_critic, batch["next_obs"], next_action, dtype).min(axis=0)
        return soft_td_target(batch["reward"], batch["terminated"], next_q, next_log_prob, alpha, gamma)

    def _set_lrs(self, opt_state, hp):
        def set_lr(s, lr):
            return s._replace(hyperparams={**s.hyperparams, "learning_rate": lr})

        return {"actor": set_lr(opt_state["actor"], hp.actor_lr), "critic": set_lr(opt_state["critic"], hp.critic_lr),
                "alpha": set_lr(opt_state["alpha"], hp.alpha_lr)}

    # -- protocol -------------------------------------------------------------------------
    def init(self, key, hparams=None) -> SACState:
        k_env, k_actor, k_critic, key = jax.random.split(key, 4)
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
        replay = ring.init(example, self.cfg.buffer_size)
        return SACState(params=params, target_critic=critic, opt_state=opt_state, log_alpha=log_alpha,
                        env_state=env_state, obs=obs, replay=replay, td_error_ema=jnp.zeros(()),
                        precision=self.precision.init(), hparams=hp, key=key)

    def act(self, params, obs, key=None):
        """Greedy action: the rescaled tanh of the Gaussian mean."""
        mean, _ = self.actor.apply(params["actor"], obs)
        return self._to_env(jnp.tanh(mean))

    def _update(self, learner, key, replay, hp, clip):
        """One gradient update of critics, actor and temperature (each guarded), then the target critics."""
        params, target_critic, opt_state, log_alpha, ps = learner
        prec = self.precision
        k_sample, k_next, k_pi = jax.random.split(key, 3)
        batch, _ = ring.sample(replay, k_sample, self.cfg.batch_size)
        alpha = jnp.exp(log_alpha)

        target = prec.select(ps, lambda dt: self.td_target(params["actor"], target_critic, alpha, batch, k_next,
                                                           hp.gamma, dt))

        def critic_loss_fn(cp, dtype):
            q = self._q(cp, batch["obs"], batch["action"], dtype)
            return 0.5 * jnp.sum(jnp.mean((q - target) ** 2, axis=1)), (q.mean(), jnp.abs(q - target).mean())

        critic, c_opt, ps, critic_loss, (q_mean, td_abs), c_guard = prec.update(
            ps, critic_loss_fn, params["critic"], opt_state["critic"], self.tx, clip)

        def actor_loss_fn(ap, dtype):
            action, log_prob = self._sample(ap, batch["obs"], k_pi, dtype)
            q = self._q(critic, batch["obs"], action, dtype).min(axis=0)
            return jnp.mean(alpha * log_prob - q), log_prob

        actor, a_opt, ps, actor_loss, log_prob, a_guard = prec.update(
            ps, actor_loss_fn, params["actor"], opt_state["actor"], self.tx, clip)

        target_entropy = -hp.target_entropy_scale * self.action_dim
        entropy = -jnp.mean(log_prob)

        def alpha_loss_fn(la, dtype):
            return la * (entropy - target_entropy), ()  # alpha grows while entropy is below target

        log_alpha, al_opt, ps, alpha_loss, _, al_guard = prec.update(
            ps, alpha_loss_fn, log_alpha, opt_state["alpha"], self.tx)

        target_critic = polyak(target_critic, critic, hp.tau)
        skipped = jnp.maximum(jnp.maximum(c_guard["update_skipped"], a_guard["update_skipped"]),
                              al_guard["update_skipped"])
        metrics = {"critic_loss": critic_loss, "actor_loss": actor_loss, "alpha_loss": alpha_loss,
                   "entropy": entropy, "q_mean": q_mean, "target_q_mean": target.mean(), "td_abs": td_abs,
                   "critic_grad_norm": c_guard["grad_norm"], "actor_grad_norm": a_guard["grad_norm"],
                   "update_skipped": skipped}
        new_opt = {"actor": a_opt, "critic": c_opt, "alpha": al_opt}
        return ({"actor": actor, "critic": critic}, target_critic, new_opt, log_alpha, ps), metrics

    def step(self, state: SACState, t):
        c, hp, prec = self.cfg, state.hparams, self.precision
        key, k_act, k_rand, k_env, k_learn = jax.random.split(state.key, 5)
        clip = prec.clip_threshold(hp.max_grad_norm, self.progress(t))
        env_steps = self.env_steps_after(t)
        learning = t >= self.first_learning_iteration  # the same for every seed: a real branch under vmap

        # act: uniformly random until learning starts, then a policy sample
        policy_action, _ = prec.select(state.precision,
                                       lambda dt: self._sample(state.params["actor"], state.obs, k_act, dt))
        random_action = jax.random.uniform(k_rand, policy_action.shape, minval=-1.0, maxval=1.0)
        # the env steps before this iteration's: random until `learning_starts` of them are done
        action = jnp.where(env_steps - self.steps_per_iteration < c.learning_starts, random_action, policy_action)
        obs, env_state, reward, terminated, _, info = self.env.step(k_env, state.env_state, self._to_env(action))
        replay = ring.add(state.replay, {"obs": state.obs, "action": action, "reward": reward,
                                         "next_obs": info["final_obs"], "terminated": terminated})

        # learn: `updates_per_step` updates once `learning_starts` env steps are in the buffer
        learner = (state.params, state.target_critic, self._set_lrs(state.opt_state, hp), state.log_alpha,
                   state.precision)

        def learn(learner):
            out, m = jax.lax.scan(lambda l, k: self._update(l, k, replay, hp, clip), learner,
                                  jax.random.split(k_learn, c.updates_per_step))
            return out, summarize(m)  # means over the updates the guard accepted

        zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(learn, learner)[1])
        learner, update_metrics = jax.lax.cond(learning, learn, lambda l: (l, zero_metrics), learner)
        params, target_critic, opt_state, log_alpha, prec_state = learner
        td_error_ema = ema(state.td_error_ema, update_metrics["td_abs"],
                           learning & (update_metrics["skipped_frac"] < 1.0))

        new_state = state.replace(
            params=params, target_critic=target_critic, opt_state=opt_state, log_alpha=log_alpha,
            env_state=env_state, obs=obs, replay=replay, td_error_ema=td_error_ema, precision=prec_state, key=key)
        updates = jnp.maximum(t - self.first_learning_iteration + 1, 0) * c.updates_per_step
        metrics = {"env_steps": env_steps, **episode_metrics(state.env_state, env_state), **update_metrics,
                   **hparam_metrics(hp), "alpha": jnp.exp(log_alpha), "updates": updates,
                   "buffer_size": replay.size, "td_error_ema": td_error_ema, **prec.metrics(prec_state, clip)}
        return new_state, metrics

    # -- the protocol --------------------------------------------------------------------------
    def signals(self, metrics) -> Signals:
        return Signals(episode_return=metrics["episode_return"], episodes=metrics["episode_count"],
                       value_loss=metrics["critic_loss"], entropy=metrics["entropy"])

    def learner(self, state: SACState) -> Learner:
        return Learner(params=state.params, opt_state=state.opt_state, target=state.target_critic,
                       extra={"log_alpha": state.log_alpha})

    def with_learner(self, state: SACState, learner: Learner) -> SACState:
        return state.replace(params=learner.params, opt_state=learner.opt_state, target_critic=learner.target,
                             log_alpha=learner.extra["log_alpha"])
