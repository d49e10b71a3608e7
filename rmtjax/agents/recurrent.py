"""Recurrent PPO and PQN (`agent.torso: lstm | gru`): the on-policy agents with a hidden state.

Both learn from their own rollout, which is already a sequence per env, so the recurrence is
truncated backpropagation through time over the rollout (as PureJaxRL's PPO-RNN does):

- acting: the hidden state is carried from step to step and from one iteration to the next (it
  is in the state, so a checkpoint holds it); where an episode ends the next step starts from
  zeros (`reset`, from the env's `done`);
- bootstrapping: the value (PPO) or max-Q (PQN) of the observation a step ended in, before any
  reset, is read from the hidden state after that step (`rmtjax.networks.recurrent.after`), so a
  time-limit truncation bootstraps from the right memory and a termination never does;
- learning: a minibatch is whole env sequences (the rollout's [T, N] split over N), unrolled
  from the hidden state the rollout started with, with the same resets; the gradient of every
  step's loss flows back through the cell to the rollout's first step (or the episode's start,
  where the reset cuts it).

`build_agent` builds these for `algo: ppo | pqn` with a recurrent torso (the registry's
`recurrent_variant`); the value-based agents with replay (DQN, RMT) are in `rmtjax.agents.r2d2`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rmtjax import exploration
from rmtjax.agents.ppo import PPO, PPOState, gae
from rmtjax.agents.pqn import PQN, PQNState, lambda_returns
from rmtjax.envs import episode_metrics
from rmtjax.networks import QHead, per_dtype
from rmtjax.networks.recurrent import PolicyHead, RecurrentNet, RecurrentTorso, ValueHead, after, initial_carry
from rmtjax.schema import ConfigError

SEQUENCE_KEYS = ("obs", "reset", "carry")  # minibatch fields kept as sequences [T, b] (the rest are flat [T*b])


def refuse_devices(agent) -> None:
    if agent.shards > 1:
        raise ConfigError(f"distributed.devices: {agent.shards} with agent.torso: {agent.cfg.torso}: recurrent "
                          f"agents train on one device; set distributed.devices: 1")


class RecurrentQ:
    """What every recurrent value-based agent (`RecurrentPQN` here, `r2d2.RecurrentRMT` and its DQN)
    adds in front of its parent: one device only, Q read over sequences from a hidden state
    (`q_sequence`), and acting through `act_step` from `initial_carry`; `q_values` and `act`,
    which have no hidden state to read, refuse. The parent's `greedy(q)` maps Q to actions."""

    recurrent = True

    def __init__(self, config):
        super().__init__(config)
        refuse_devices(self)

    def initial_carry(self, batch: int):
        return initial_carry(self.cfg.torso, self.cfg.rnn_width, batch)

    def q_values(self, params, obs, dtype=jnp.float32):
        raise TypeError(f"{self.config.algo} with torso: {self.cfg.torso} has a hidden state: read Q with "
                        f"q_sequence(params, carry, obs [T, B, ...], reset [T, B])")

    def q_sequence(self, params, carry, obs, reset, dtype=jnp.float32):
        """(carry, Q [T, B, ...] float32, carries) of sequences obs [T, B, ...] from `carry`."""
        return self.nets[jnp.dtype(dtype)].apply(params, carry, obs, reset)

    def act(self, params, obs, key=None):
        raise TypeError(f"{self.config.algo} with torso: {self.cfg.torso} has a hidden state: act with "
                        f"act_step(params, carry, obs, reset, key) from initial_carry(batch) (rmtjax.protocol)")

    def act_step(self, params, carry, obs, reset, key=None):
        carry, q, _ = self.q_sequence(params, carry, obs[None], reset[None])
        return self.greedy(q[0]), carry


def env_minibatches(key, seqs: dict, num_minibatches: int) -> dict:
    """The rollout's sequences (every leaf [T, N, ...], except `carry` [N, ...]) split over a
    random permutation of the envs into `num_minibatches` minibatches [M, T, N/M, ...] (carry:
    [M, N/M, ...])."""
    N = seqs["reset"].shape[1]
    perm = jax.random.permutation(key, N)

    def split(path, x):
        if path[0].key == "carry":
            return x[perm].reshape((num_minibatches, N // num_minibatches) + x.shape[1:])
        x = x[:, perm].reshape((x.shape[0], num_minibatches, N // num_minibatches) + x.shape[2:])
        return jnp.moveaxis(x, 1, 0)

    return jax.tree_util.tree_map_with_path(split, seqs)


def flat_minibatch(mb: dict) -> dict:
    """A minibatch of sequences with every field but `SEQUENCE_KEYS` flattened to [T*b, ...]."""
    return {k: v if k in SEQUENCE_KEYS else v.reshape((-1,) + v.shape[2:]) for k, v in mb.items()}


@struct.dataclass
class RecurrentPPOState(PPOState):
    carry: Any = None  # {"actor": ..., "critic": ...}: the hidden states after the last step, [num_envs, ...]
    reset: Any = None  # [num_envs] bool: the current observation starts an episode


class RecurrentPPO(PPO):
    """PPO with an LSTM or GRU torso in the actor and in the critic (each its own)."""

    recurrent = True

    def __init__(self, config):
        super().__init__(config)
        refuse_devices(self)
        c = self.cfg

        def net(dtype, head):
            return RecurrentNet(RecurrentTorso(c.torso, c.rnn_width, tuple(c.hidden), c.activation, False, dtype), head)

        self.actors = per_dtype(lambda dt: net(dt, PolicyHead(self._out_dim, self.continuous, c.init_log_std, dt)),
                                self.precision.dtypes)
        self.critics = per_dtype(lambda dt: net(dt, ValueHead(dt)), self.precision.dtypes)
        self.actor, self.critic = self.actors[jnp.dtype(jnp.float32)], self.critics[jnp.dtype(jnp.float32)]

    @property
    def _out_dim(self) -> int:
        return int(np.prod(self.spec.action_shape)) if self.continuous else self.spec.num_actions

    def initial_carry(self, batch: int):
        """The actor's hidden state (what acting needs) for `batch` envs."""
        return initial_carry(self.cfg.torso, self.cfg.rnn_width, batch)

    def _carries(self, batch: int) -> dict:
        return {"actor": self.initial_carry(batch), "critic": self.initial_carry(batch)}

    def init(self, key, hparams=None) -> RecurrentPPOState:
        k_env, k_actor, k_critic, key = jax.random.split(key, 4)
        obs, env_state = self.env.reset(k_env)
        N = obs.shape[0]
        carry, reset = self._carries(N), jnp.ones((N,), bool)
        seq, rs = obs[None], reset[None]
        params = {"actor": self.actor.init(k_actor, carry["actor"], seq, rs),
                  "critic": self.critic.init(k_critic, carry["critic"], seq, rs)}
        return RecurrentPPOState(params=params, opt_state=self.tx.init(params), env_state=env_state, obs=obs,
                                 value_loss_ema=jnp.zeros(()), precision=self.precision.init(),
                                 hparams=self.default_hparams(hparams), key=key, carry=carry, reset=reset)

    def act(self, params, obs, key=None):
        raise TypeError(f"PPO with torso: {self.cfg.torso} has a hidden state: act with act_step(params, carry, obs, "
                        f"reset, key) from initial_carry(batch) (rmtjax.protocol)")

    def act_step(self, params, carry, obs, reset, key=None):
        carry, (logits, _), _ = self.actor.apply(params["actor"], carry, obs[None], reset[None])
        logits = logits[0]
        if self.continuous:
            return logits.reshape((logits.shape[0],) + self.spec.action_shape), carry
        return jnp.argmax(logits, axis=-1), carry

    def _unroll(self, params, carry, obs, reset, dtype):
        """(actor output, value, carries) of sequences obs [T, B, ...] from `carry`, outputs [T, B, ...]."""
        carry_a, actor_out, _ = self.actors[jnp.dtype(dtype)].apply(params["actor"], carry["actor"], obs, reset)
        _, value, carries = self.critics[jnp.dtype(dtype)].apply(params["critic"], carry["critic"], obs, reset)
        return actor_out, value, carries, carry_a

    def _forward_batch(self, params, mb, dtype):
        """The minibatch's sequences unrolled from their starting hidden state; outputs flat [T*b, ...]."""
        actor_out, value, _, _ = self._unroll(params, mb["carry"], mb["obs"], mb["reset"], dtype)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        return jax.tree.map(flat, actor_out), flat(value)

    def step(self, state: RecurrentPPOState, t):
        c, hp, prec = self.cfg, state.hparams, self.precision

        def env_step(carry, _):
            obs, env_state, key, rnn, reset = carry
            key, k_act, k_env = jax.random.split(key, 3)

            def forward(dt):
                out, value, carries, carry_a = self._unroll(state.params, rnn, obs[None], reset[None], dt)
                return jax.tree.map(lambda x: x[0], (out, value)), \
                    {"actor": carry_a, "critic": jax.tree.map(lambda x: x[0], carries)}

            (actor_out, value), rnn = prec.select(state.precision, forward)
            action = self._sample(actor_out, k_act)
            log_prob, _ = self._log_prob_entropy(actor_out, action)
            next_obs, env_state, reward, term, trunc, info = self.env.step(k_env, env_state, action)
            tr = dict(obs=obs, reset=reset, action=action, log_prob=log_prob, value=value, reward=reward,
                      terminated=term, done=info["done"], final_obs=info["final_obs"], critic_carry=rnn["critic"])
            return (next_obs, env_state, key, rnn, info["done"]), tr

        (obs, env_state, key, rnn, reset), traj = jax.lax.scan(
            env_step, (state.obs, state.env_state, state.key, state.carry, state.reset), None, c.rollout_len)

        # V of the observation each step ended in (pre-reset), from the critic's memory after that step
        next_value = prec.select(state.precision, lambda dt: after(
            self.critics[jnp.dtype(dt)], state.params["critic"], traj["critic_carry"], traj["final_obs"]))
        advantages = gae(traj["reward"], traj["value"], next_value, traj["terminated"], traj["done"],
                         hp.gamma, hp.gae_lambda)
        seqs = {k: traj[k] for k in ("obs", "reset", "action", "log_prob", "value")}
        seqs.update(advantage=advantages, target=advantages + traj["value"], carry=state.carry)

        learned, key, metrics = self._learn(
            state, key, t, lambda k: env_minibatches(k, seqs, c.num_minibatches), prepare=flat_minibatch)
        new_state = state.replace(env_state=env_state, obs=obs, key=key, carry=rnn, reset=reset, **learned)
        metrics = {"env_steps": self.env_steps_after(t), **episode_metrics(state.env_state, env_state), **metrics}
        return new_state, metrics


@struct.dataclass
class RecurrentPQNState(PQNState):
    carry: Any = None  # the Q-network's hidden state after the last step, [num_envs, ...]
    reset: Any = None  # [num_envs] bool: the current observation starts an episode


class RecurrentPQN(RecurrentQ, PQN):
    """PQN with an LSTM or GRU torso: λ-returns and TD updates over whole env sequences."""

    def _q_network(self, dtype):
        c = self.cfg
        return RecurrentNet(RecurrentTorso(c.torso, c.rnn_width, tuple(c.hidden), c.activation, c.layer_norm, dtype),
                            QHead(self.spec.num_actions, False, dtype))

    def init(self, key, hparams=None) -> RecurrentPQNState:
        k_env, k_net, key = jax.random.split(key, 3)
        obs, env_state = self.env.reset(k_env)
        carry, reset = self.initial_carry(obs.shape[0]), jnp.ones((obs.shape[0],), bool)
        params = self.net.init(k_net, carry, obs[None], reset[None])
        return RecurrentPQNState(params=params, opt_state=self.tx.init(params), env_state=env_state, obs=obs,
                                 precision=self.precision.init(), hparams=self.default_hparams(hparams), key=key,
                                 carry=carry, reset=reset)

    def step(self, state: RecurrentPQNState, t):
        c, hp, prec = self.cfg, state.hparams, self.precision
        epsilon, lr, clip = self._schedule(hp, t)

        # 1. act, carrying the hidden state
        def env_step(carry, k):
            obs, env_state, rnn, reset = carry
            k_act, k_env = jax.random.split(k)

            def forward(dt):
                rnn_next, q, _ = self.q_sequence(state.params, rnn, obs[None], reset[None], dt)
                return q[0], rnn_next

            q, rnn = prec.select(state.precision, forward)
            action, info, _ = exploration.select_action(k_act, q, epsilon, jnp.float32(1.0), boltzmann=False)
            next_obs, env_state, reward, term, _, env_info = self.env.step(k_env, env_state, action)
            tr = dict(obs=obs, reset=reset, action=action, reward=reward, terminated=term, done=env_info["done"],
                      final_obs=env_info["final_obs"], carry_after=rnn, q_max=q.max(-1),
                      explore=info["explore_frac"], nongreedy=info["nongreedy_frac"])
            return (next_obs, env_state, rnn, env_info["done"]), tr

        key, k_roll, k_epochs = jax.random.split(state.key, 3)
        (obs, env_state, rnn, reset), traj = jax.lax.scan(
            env_step, (state.obs, state.env_state, state.carry, state.reset), jax.random.split(k_roll, c.rollout_len))

        # 2. λ-returns, bootstrapping from max Q of the observation each step ended in (pre-reset),
        #    read from the hidden state after that step, under the networks before any update
        next_q = prec.select(state.precision, lambda dt: after(self.nets[jnp.dtype(dt)], state.params,
                                                               traj["carry_after"], traj["final_obs"]))
        next_q = jax.lax.stop_gradient(next_q.max(-1))
        targets = lambda_returns(traj["reward"], next_q, traj["terminated"], traj["done"], hp.gamma, hp.td_lambda)
        seqs = {"obs": traj["obs"], "reset": traj["reset"], "action": traj["action"], "target": targets,
                "carry": state.carry}

        # 3. learn: each minibatch is whole env sequences, unrolled from the rollout's first hidden state
        def loss_fn(params, mb, dtype):
            _, q_all, _ = self.q_sequence(params, mb["carry"], mb["obs"], mb["reset"], dtype)
            q_all = q_all.reshape((-1, q_all.shape[-1]))
            q = jnp.take_along_axis(q_all, mb["action"][:, None], axis=-1)[:, 0]
            err = q - mb["target"]
            return 0.5 * jnp.mean(err**2), {"q_mean": q.mean(), "td_abs": jnp.abs(err).mean()}

        params, opt_state, prec_state, stats = self._learn(
            state, k_epochs, lr, clip, loss_fn, lambda k: env_minibatches(k, seqs, c.num_minibatches),
            prepare=flat_minibatch)
        new_state = state.replace(params=params, opt_state=opt_state, env_state=env_state, obs=obs,
                                  precision=prec_state, key=key, carry=rnn, reset=reset)
        return new_state, self._metrics(state, t, env_state, stats, targets, traj, epsilon, lr, prec_state, clip)
