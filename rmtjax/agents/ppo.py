"""PPO (clipped objective, GAE) for discrete and continuous actions, as one pure `step`.

One iteration: roll out `rollout_len` steps in `num_envs` envs, compute GAE advantages
(bootstrapping through time-limit truncations from the pre-reset observation, never through
terminal states), then `num_epochs` passes of `num_minibatches` clipped-objective updates,
each through the precision guard (`rmtjax.precision`: a non-finite update is skipped).
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
from rmtjax.networks.init import orthogonal
from rmtjax.precision import PrecisionState, ema, summarize
from rmtjax.protocol import Learner, Signals, hparam
from rmtjax.schema import ConfigError, Section, param

LOG_2PI = float(np.log(2 * np.pi))


@dataclasses.dataclass(frozen=True)
class PPOConfig(Section):
    _section = "agent"
    rollout_len: int = param(128, lo=1, doc="steps per env per iteration")
    num_epochs: int = param(4, lo=1, doc="passes over each rollout")
    num_minibatches: int = param(4, lo=1, doc="minibatches per epoch")
    lr: float = param(2.5e-4, lo=0.0, hi=1.0, lo_open=True, doc="Adam learning rate (start of annealing)")
    anneal_lr: bool = param(True, doc="decay the learning rate linearly to 0 over training")
    gamma: float = param(0.99, lo=0.0, hi=1.0, doc="discount")
    gae_lambda: float = param(0.95, lo=0.0, hi=1.0, doc="GAE lambda")
    clip_eps: float = param(0.2, lo=0.0, lo_open=True, doc="PPO ratio clip")
    ent_coef: float = param(0.01, lo=0.0, doc="entropy bonus")
    vf_coef: float = param(0.5, lo=0.0, doc="value-loss weight")
    max_grad_norm: float = param(0.5, lo=0.0, lo_open=True, doc="global-norm gradient clip (initial; see "
                                                                "precision.clip_decay_to)")
    normalize_advantages: bool = param(True, doc="normalise advantages per minibatch")
    hidden: tuple[int, ...] = param((64, 64), lo=1, doc="hidden layer widths of actor and critic")
    activation: str = param("tanh", choices=("tanh", "relu", "gelu", "silu", "elu"))
    init_log_std: float = param(0.0, lo=-5.0, hi=2.0, doc="continuous actions: initial log std")

    def validate_with(self, env, train):
        batch = env.num_envs * self.rollout_len
        if batch % self.num_minibatches:
            raise ConfigError(f"agent.num_minibatches: {self.num_minibatches} must divide env.num_envs × "
                              f"agent.rollout_len = {batch}")
        if train.total_steps < batch:
            raise ConfigError(f"train.total_steps: {train.total_steps} is less than one iteration "
                              f"(env.num_envs × agent.rollout_len = {batch})")


@struct.dataclass
class PPOHParams:
    lr: jax.Array = hparam("lr")
    gamma: jax.Array = hparam("gamma")
    gae_lambda: jax.Array = hparam()
    clip_eps: jax.Array = hparam()
    ent_coef: jax.Array = hparam()
    vf_coef: jax.Array = hparam()
    max_grad_norm: jax.Array = hparam()


@struct.dataclass
class PPOState:
    params: Any  # {"actor": ..., "critic": ...}
    opt_state: Any
    env_state: VecEnvState
    obs: jax.Array  # [num_envs, *obs_shape] current observation
    value_loss_ema: jax.Array  # moving average of the value loss over iterations
    precision: PrecisionState
    hparams: PPOHParams
    key: jax.Array


class ActorNet(nn.Module):
    hidden: tuple
    activation: str
    out_dim: int
    continuous: bool
    init_log_std: float
    dtype: Any = jnp.float32  # compute dtype; parameters and outputs are float32

    @nn.compact
    def __call__(self, obs):
        x = MLP(self.hidden, self.activation, dtype=self.dtype)(obs)
        out = nn.Dense(self.out_dim, kernel_init=orthogonal(0.01), dtype=self.dtype)(x)
        out = out.astype(jnp.float32)
        if self.continuous:
            log_std = self.param("log_std", nn.initializers.constant(self.init_log_std), (self.out_dim,))
            return out, jnp.broadcast_to(log_std, out.shape)
        return out, None


class CriticNet(nn.Module):
    hidden: tuple
    activation: str
    dtype: Any = jnp.float32  # compute dtype; parameters and output are float32

    @nn.compact
    def __call__(self, obs):
        x = MLP(self.hidden, self.activation, dtype=self.dtype)(obs)
        return nn.Dense(1, kernel_init=orthogonal(1.0), dtype=self.dtype)(x)[:, 0].astype(jnp.float32)


class PPO(Agent):
    Config = PPOConfig
    HParams = PPOHParams

    def __init__(self, config):
        super().__init__(config)
        c, spec = self.cfg, self.spec
        self.continuous = not spec.discrete
        out_dim = int(np.prod(spec.action_shape)) if self.continuous else spec.num_actions
        # one module per compute dtype (same float32 parameters); `actor`/`critic` are the float32 ones
        dtypes = {jnp.dtype(dt) for dt in (*self.precision.dtypes, jnp.float32)}
        self.actors = {dt: ActorNet(c.hidden, c.activation, out_dim, self.continuous, c.init_log_std, dt)
                       for dt in dtypes}
        self.critics = {dt: CriticNet(c.hidden, c.activation, dt) for dt in dtypes}
        self.actor, self.critic = self.actors[jnp.dtype(jnp.float32)], self.critics[jnp.dtype(jnp.float32)]
        # clipping is done by the precision guard
        self.tx = optax.inject_hyperparams(lambda learning_rate: optax.adam(learning_rate, eps=1e-5))(
            learning_rate=c.lr)

    @property
    def steps_per_iteration(self) -> int:
        return self.config.env.num_envs * self.cfg.rollout_len

    # -- distributions (hand-checked formulas) --------------------------------------------
    def _log_prob_entropy(self, actor_out, action):
        logits, log_std = actor_out
        if self.continuous:
            a = action.reshape(logits.shape)
            z = (a - logits) * jnp.exp(-log_std)
            log_prob = jnp.sum(-0.5 * z**2 - log_std - 0.5 * LOG_2PI, axis=-1)
            entropy = jnp.sum(log_std + 0.5 * (1.0 + LOG_2PI), axis=-1)
            return log_prob, entropy
        logp_all = jax.nn.log_softmax(logits)
        log_prob = jnp.take_along_axis(logp_all, action[:, None], axis=-1)[:, 0]
        entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
        return log_prob, entropy

    def _sample(self, actor_out, key):
        logits, log_std = actor_out
        if self.continuous:
            a = logits + jnp.exp(log_std) * jax.random.normal(key, logits.shape)
            return a.reshape((a.shape[0],) + self.spec.action_shape)
        return jax.random.categorical(key, logits)

    # -- protocol -------------------------------------------------------------------------
    def init(self, key, hparams=None) -> PPOState:
        k_env, k_actor, k_critic, key = jax.random.split(key, 4)
        obs, env_state = self.env.reset(k_env)
        params = {"actor": self.actor.init(k_actor, obs), "critic": self.critic.init(k_critic, obs)}
        hp = self.default_hparams(hparams)
        opt_state = self.tx.init(params)
        return PPOState(params=params, opt_state=opt_state, env_state=env_state, obs=obs,
                        value_loss_ema=jnp.zeros(()), precision=self.precision.init(), hparams=hp, key=key)

    def act(self, params, obs, key=None):
        """Greedy action: the mode of the policy (argmax, or the Gaussian mean)."""
        logits, _ = self.actor.apply(params["actor"], obs)
        if self.continuous:
            return logits.reshape((logits.shape[0],) + self.spec.action_shape)
        return jnp.argmax(logits, axis=-1)

    def _forward(self, params, obs, dtype):
        """(actor output, value) with the networks computing in `dtype`."""
        return self.actors[jnp.dtype(dtype)].apply(params["actor"], obs), \
            self.critics[jnp.dtype(dtype)].apply(params["critic"], obs)

    def step(self, state: PPOState, t):
        c, hp, prec = self.cfg, state.hparams, self.precision

        def env_step(carry, _):
            obs, env_state, key = carry
            key, k_act, k_env = jax.random.split(key, 3)
            actor_out, value = prec.select(state.precision, lambda dt: self._forward(state.params, obs, dt))
            action = self._sample(actor_out, k_act)
            log_prob, _ = self._log_prob_entropy(actor_out, action)
            next_obs, env_state, reward, term, trunc, info = self.env.step(k_env, env_state, action)
            tr = dict(obs=obs, action=action, log_prob=log_prob, value=value, reward=reward,
                      terminated=term, done=info["done"], final_obs=info["final_obs"])
            return (next_obs, env_state, key), tr

        (obs, env_state, key), traj = jax.lax.scan(
            env_step, (state.obs, state.env_state, state.key), None, c.rollout_len)

        # value of the observation each step ended in (pre-reset): bootstraps truncations
        T, N = traj["reward"].shape
        flat_final = traj["final_obs"].reshape((T * N,) + traj["final_obs"].shape[2:])
        next_value = prec.select(state.precision, lambda dt: self.critics[jnp.dtype(dt)].apply(
            state.params["critic"], flat_final)).reshape(T, N)
        advantages = gae(traj["reward"], traj["value"], next_value, traj["terminated"], traj["done"],
                         hp.gamma, hp.gae_lambda)
        targets = advantages + traj["value"]

        batch = {k: v.reshape((T * N,) + v.shape[2:]) for k, v in traj.items()
                 if k in ("obs", "action", "log_prob", "value")}
        batch["advantage"] = advantages.reshape(-1)
        batch["target"] = targets.reshape(-1)

        progress = self.progress(t)
        lr = hp.lr * (1.0 - progress) if c.anneal_lr else hp.lr
        clip = prec.clip_threshold(hp.max_grad_norm, progress)
        opt_state = state.opt_state._replace(hyperparams={**state.opt_state.hyperparams, "learning_rate": lr})

        def loss_fn(params, mb, dtype):
            actor_out, value = self._forward(params, mb["obs"], dtype)
            log_prob, entropy = self._log_prob_entropy(actor_out, mb["action"])
            adv = mb["advantage"]
            if c.normalize_advantages:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            ratio = jnp.exp(log_prob - mb["log_prob"])
            pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - hp.clip_eps, 1 + hp.clip_eps) * adv).mean()
            v_clipped = mb["value"] + jnp.clip(value - mb["value"], -hp.clip_eps, hp.clip_eps)
            v_loss = 0.5 * jnp.maximum((value - mb["target"]) ** 2, (v_clipped - mb["target"]) ** 2).mean()
            ent = entropy.mean()
            loss = pg + hp.vf_coef * v_loss - hp.ent_coef * ent
            aux = {"policy_loss": pg, "value_loss": v_loss, "entropy": ent,
                   "approx_kl": ((ratio - 1) - jnp.log(ratio)).mean(),
                   "clip_frac": (jnp.abs(ratio - 1) > hp.clip_eps).mean()}
            return loss, aux

        def update_minibatch(carry, mb):
            params, opt_state, prec_state = carry
            params, opt_state, prec_state, _, aux, guard = prec.update(
                prec_state, lambda p, dt: loss_fn(p, mb, dt), params, opt_state, self.tx, clip)
            return (params, opt_state, prec_state), {**aux, **guard}

        def update_epoch(carry, k):
            perm = jax.random.permutation(k, T * N)
            mbs = jax.tree.map(lambda x: x[perm].reshape((c.num_minibatches, -1) + x.shape[1:]), batch)
            return jax.lax.scan(update_minibatch, carry, mbs)

        key, k_epochs = jax.random.split(key)
        (params, opt_state, prec_state), aux = jax.lax.scan(
            update_epoch, (state.params, opt_state, state.precision), jax.random.split(k_epochs, c.num_epochs))
        stats = summarize(aux)  # means over the updates the guard accepted
        value_loss_ema = ema(state.value_loss_ema, stats["value_loss"], stats["skipped_frac"] < 1.0)

        env_steps = self.env_steps_after(t)
        new_state = state.replace(params=params, opt_state=opt_state, env_state=env_state, obs=obs,
                                  value_loss_ema=value_loss_ema, precision=prec_state, key=key)
        metrics = {"env_steps": env_steps, **episode_metrics(state.env_state, env_state), **stats,
                   "value_loss_ema": value_loss_ema, **hparam_metrics(hp), "lr_effective": lr,
                   **prec.metrics(prec_state, clip)}
        return new_state, metrics

    # -- the protocol --------------------------------------------------------------------------
    def signals(self, metrics) -> Signals:
        entropy = metrics["entropy"]
        explore = entropy / self.max_entropy if self.max_entropy else None  # no ε: the entropy's share of its maximum
        return Signals(episode_return=metrics["episode_return"], episodes=metrics["episode_count"],
                       value_loss=metrics["value_loss"], entropy=entropy, explore=explore)

    def learner(self, state: PPOState) -> Learner:
        return Learner(params=state.params, opt_state=state.opt_state)

    def with_learner(self, state: PPOState, learner: Learner) -> PPOState:
        return state.replace(params=learner.params, opt_state=learner.opt_state)


def gae(reward, value, next_value, terminated, done, gamma, lam):
    """Generalised advantage estimates, [T, N].

    `next_value[t]` is V of the observation step t ended in (pre-reset), so a truncated
    step bootstraps from it while a terminated one does not; no advantage flows across an
    episode boundary (`done`).
    """
    delta = reward + gamma * next_value * (1.0 - terminated.astype(jnp.float32)) - value

    def back(carry, x):
        d, dn = x
        carry = d + gamma * lam * (1.0 - dn) * carry
        return carry, carry

    _, adv = jax.lax.scan(back, jnp.zeros_like(delta[0]), (delta, done.astype(jnp.float32)), reverse=True)
    return adv
