"""PPO (clipped objective, GAE) for discrete and continuous actions, as one pure `step`.

One iteration: roll out `rollout_len` steps in `num_envs` envs, compute GAE advantages
(bootstrapping through time-limit truncations from the pre-reset observation, never through
terminal states), then `num_epochs` passes of `num_minibatches` clipped-objective updates,
each through the update guard (`rmtjax.guard`: a non-finite update is skipped).

With `distributed.devices` D > 1 each device rolls out its `num_envs / D` envs, splits its
share of the rollout into `num_minibatches` minibatches and the guard fuses the devices'
gradients, so a global minibatch is the devices' minibatches together; the advantages are
normalised with the mean and standard deviation over all of them (`minibatch_step`), so mean
fusion on D devices is one device with the global minibatch.
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
from rmtjax.guard import lr_in_force, with_lr
from rmtjax.networks import ActorNet, CriticNet, per_dtype
from rmtjax.networks.actor_critic import PPO_TORSOS
from rmtjax.networks.distributions import gaussian_entropy, gaussian_log_prob
from rmtjax.networks.recurrent import RNN_TORSOS
from rmtjax.precision import PrecisionState, Step, ema, summarize
from rmtjax.protocol import Categorical, Gaussian, Learner, Signals, hparam
from rmtjax.schema import ConfigError, Section, param

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
    normalize_advantages: bool = param(True, doc="normalise advantages per minibatch (over all devices' shares)")
    hidden: tuple[int, ...] = param((64, 64), lo=1, doc="hidden layer widths of actor and critic (after the "
                                                        "convolutions with torso: nature_cnn)")
    torso: str = param("mlp", choices=PPO_TORSOS + RNN_TORSOS,
                       doc="mlp, or nature_cnn: Mnih et al. 2015's three convolutions before the dense layers, one "
                           "stack each in the actor and the critic (image observations; give hidden: [512]); lstm "
                           "or gru: the dense layers, then a recurrent cell of width rnn_width, in the actor and "
                           "the critic (hidden state carried through the rollout, reset at episode ends, truncated "
                           "BPTT over the rollout, minibatches of whole env sequences)")
    rnn_width: int = param(128, lo=1, doc="torso: lstm | gru: width of the recurrent cell (its hidden state)")
    activation: str = param("tanh", choices=("tanh", "relu", "gelu", "silu", "elu"))
    init_log_std: float = param(0.0, lo=-5.0, hi=2.0, doc="continuous actions: initial log std")

    def validate_with(self, env, train):
        if self.torso == "nature_cnn":
            from rmtjax.envs import env_spec
            from rmtjax.networks import check_image_torso

            check_image_torso(self.torso, env_spec(env).obs_shape, env.id)
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
    opt_state: Any  # the guarded optimiser's (rmtjax.guard.GuardState)
    env_state: VecEnvState
    obs: jax.Array  # [num_envs, *obs_shape] current observation
    value_loss_ema: jax.Array  # moving average of the value loss over iterations
    precision: PrecisionState
    hparams: PPOHParams
    key: jax.Array


class PPO(Agent):
    Config = PPOConfig
    HParams = PPOHParams
    data_parallel = True  # the guard fuses the gradients across devices

    def __init__(self, config):
        super().__init__(config)
        c, spec = self.cfg, self.spec
        self.continuous = not spec.discrete
        out_dim = int(np.prod(spec.action_shape)) if self.continuous else spec.num_actions
        # one module per compute dtype (same float32 parameters); `actor`/`critic` are the float32 ones
        self.actors = per_dtype(lambda dt: ActorNet(c.hidden, c.activation, out_dim, self.continuous,
                                                    c.init_log_std, dt, c.torso), self.precision.dtypes)
        self.critics = per_dtype(lambda dt: CriticNet(c.hidden, c.activation, dt, c.torso), self.precision.dtypes)
        self.actor, self.critic = self.actors[jnp.dtype(jnp.float32)], self.critics[jnp.dtype(jnp.float32)]
        # the clip is the guard's; the lr is injected each iteration (the annealing)
        self.tx = self.guarded(optax.inject_hyperparams(lambda learning_rate: optax.adam(learning_rate, eps=1e-5))(
            learning_rate=c.lr))

    @property
    def steps_per_iteration(self) -> int:
        return self.config.env.num_envs * self.cfg.rollout_len

    # -- distributions (hand-checked formulas) --------------------------------------------
    def _log_prob_entropy(self, actor_out, action):
        logits, log_std = actor_out
        if self.continuous:
            return gaussian_log_prob(logits, log_std, action.reshape(logits.shape)), gaussian_entropy(log_std)
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
        k_env, key = self.device_keys(k_env, key)  # each device its own envs; the parameters the same on all
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

    def _forward_batch(self, params, mb, dtype):
        """(actor output, value) of a minibatch's observations (a recurrent PPO unrolls its sequences)."""
        return self._forward(params, mb["obs"], dtype)

    def _normalize(self, adv):
        """Advantages with zero mean and unit standard deviation over the minibatch; on several
        devices the statistics are over all the devices' shares (the global minibatch)."""
        if self.fusion is None:
            return (adv - adv.mean()) / (adv.std() + 1e-8)
        mean = jax.lax.pmean(adv.mean(), self.fusion.axis)
        var = jax.lax.pmean(jnp.mean((adv - mean) ** 2), self.fusion.axis)
        return (adv - mean) / (jnp.sqrt(var) + 1e-8)

    def minibatch_step(self, params, opt_state, prec_state, mb, hp: PPOHParams, clip) -> Step:
        """One guarded (on several devices, fused) clipped-objective update on this device's
        minibatch `mb` (obs, action, log_prob, value, advantage, target): a `rmtjax.precision.Step`
        whose `aux` holds the loss terms and diagnostics."""
        c = self.cfg

        def loss_fn(params, dtype):
            actor_out, value = self._forward_batch(params, mb, dtype)
            log_prob, entropy = self._log_prob_entropy(actor_out, mb["action"])
            adv = mb["advantage"]
            if c.normalize_advantages:
                adv = self._normalize(adv)
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

        return self.precision.step(prec_state, loss_fn, params, opt_state, self.tx, clip,
                                   penalty=self.transfer_penalty(opt_state, mb["obs"]))

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

        def epoch_minibatches(k):
            perm = jax.random.permutation(k, T * N)
            return jax.tree.map(lambda x: x[perm].reshape((c.num_minibatches, -1) + x.shape[1:]), batch)

        learned, key, metrics = self._learn(state, key, t, epoch_minibatches)
        new_state = state.replace(env_state=env_state, obs=obs, key=key, **learned)
        metrics = {"env_steps": self.env_steps_after(t), **episode_metrics(state.env_state, env_state), **metrics}
        return new_state, metrics

    def _learn(self, state: PPOState, key, t, epoch_minibatches, prepare=lambda mb: mb):
        """The learning phase of iteration `t`, the same for every PPO variant: `num_epochs`
        passes, each over the minibatches `epoch_minibatches(k)` stacks on a leading axis (a
        fresh key `k` per epoch), each minibatch given to `minibatch_step` after `prepare`, at
        the learning rate and clip threshold in force. -> (the state's new params, opt_state,
        precision and value_loss_ema as a dict, the key after the epochs' split, metrics)."""
        c, hp, prec = self.cfg, state.hparams, self.precision
        progress = self.progress(t)
        lr = lr_in_force(hp.lr, progress, 0.0 if c.anneal_lr else 1.0)
        clip = prec.clip_threshold(hp.max_grad_norm, progress)
        opt_state = with_lr(state.opt_state, lr)

        def update_minibatch(carry, mb):
            params, opt_state, prec_state = carry
            out = self.minibatch_step(params, opt_state, prec_state, prepare(mb), hp, clip)
            return (out.params, out.opt_state, out.precision), {**out.aux, **out.stats}

        def update_epoch(carry, k):
            return jax.lax.scan(update_minibatch, carry, epoch_minibatches(k))

        key, k_epochs = jax.random.split(key)
        (params, opt_state, prec_state), aux = jax.lax.scan(
            update_epoch, (state.params, opt_state, state.precision), jax.random.split(k_epochs, c.num_epochs))
        stats = summarize(aux)  # means over the updates the guard accepted
        value_loss_ema = ema(state.value_loss_ema, stats["value_loss"], stats["skipped_frac"] < 1.0)
        learned = dict(params=params, opt_state=opt_state, precision=prec_state, value_loss_ema=value_loss_ema)
        metrics = {**stats, "value_loss_ema": value_loss_ema, **hparam_metrics(hp), "lr_in_force": lr,
                   **prec.metrics(prec_state, clip)}
        return learned, key, metrics

    # -- the protocol --------------------------------------------------------------------------
    @classmethod
    def check_devices(cls, config, devices: int) -> None:
        super().check_devices(config, devices)
        local = config.env.num_envs // devices * config.agent.rollout_len
        if local % config.agent.num_minibatches:
            raise ConfigError(f"agent.num_minibatches: {config.agent.num_minibatches} must divide each device's "
                              f"share of the rollout, env.num_envs / distributed.devices × agent.rollout_len = "
                              f"{local}")

    def signals(self, metrics) -> Signals:
        entropy = metrics["entropy"]
        explore = entropy / self.max_entropy if self.max_entropy else None  # no ε: the entropy's share of its maximum
        return Signals(episode_return=metrics["episode_return"], episodes=metrics["episode_count"],
                       value_loss=metrics["value_loss"], entropy=entropy, explore=explore,
                       skipped_frac=metrics["skipped_frac"])

    def learner(self, state: PPOState) -> Learner:
        return Learner(params=state.params, opt_state=state.opt_state)

    def param_groups(self, params):
        """torso/<layer>/actor|critic for the hidden layers of either network (so torso/Dense_0
        is the first layer of both), head/policy (logits or mean, log std), head/value."""

        def group(path, _):
            net, _, module = (k.key for k in path[:3])
            if module == "log_std" or not module.startswith(("MLP", "NatureCNN")):
                return "head/policy" if net == "actor" else "head/value"
            return f"torso/{path[3].key}/{net}"

        return jax.tree_util.tree_map_with_path(group, params)

    def policy_distribution(self, params, obs, dtype=jnp.float32, temperature=None):
        """The policy at `obs`: a `Categorical` over the actions, or the `Gaussian` it samples from."""
        logits, log_std = self.actors[jnp.dtype(dtype)].apply(params["actor"], obs)
        return Gaussian(logits, log_std) if self.continuous else Categorical(logits)

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
