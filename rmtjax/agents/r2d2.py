"""Recurrent DQN and RMT (`agent.torso: lstm | gru`): sequences in replay with their stored hidden
state and a burn-in, as R2D2 (Kapturowski et al. 2019) learns.

Why sequences with stored state (and not single transitions with a hidden state each): a
Q-learning target for a recurrent network needs the memory at the next step too, and it must
be the memory the *current* network would have, not the one the acting network had; storing a
sequence with the hidden state at its start and unrolling the current network over it (the first
`burn_in` steps only refresh that stale state) gives both, with the gradient flowing back
through the cell over the rest of the sequence.

The pieces, on RMT's machinery (its schedules, exploration, learn-or-skip branch, target
updates, guarded update and metrics are used as they are):

- every env keeps a window of its last `seq_len` steps (observation, action, reward,
  terminated, done, the pre-reset next observation, whether the step began an episode) with
  the online network's hidden state *before* each step; acting carries the hidden state from
  step to step, zeroed where an episode begins;
- each iteration (`rollout_len` ≤ `seq_len` steps per env) stores every env's window as one
  sequence in a uniform replay of `buffer_size // seq_len` sequences; consecutive sequences of an
  env overlap by `seq_len - rollout_len` steps, so every step is learned from at least once
  beyond a burn-in when `rollout_len ≤ seq_len - burn_in`;
- a minibatch is `batch_size` sequences; the online network unrolls from the stored state over
  the burn-in (no gradient) and then over the rest; the target network unrolls from the stored
  state over the whole sequence; one-step (Double-)DQN targets at every step past the burn-in,
  bootstrapping from Q of the observation the step ended in (pre-reset) read from the hidden
  state after the step (`rmtjax.networks.recurrent.after`): through a truncation, never
  through a termination; steps before the env's first (window padding) carry no loss.

Left out (refused with a `ConfigError`): tiered and prioritised replay (they rank single
transitions; R2D2's sequence priorities would be the next step), n-step returns, demonstrations
and several devices.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from rmtjax import exploration
from rmtjax.agents.dqn import DQNConfig
from rmtjax.agents.qlearn import q_of
from rmtjax.agents.recurrent import RecurrentQ
from rmtjax.agents.rmt import RMT, RMTConfig, RMTState, Schedule
from rmtjax.networks import PerDimQHead, QHead
from rmtjax.networks.recurrent import RecurrentNet, RecurrentTorso, after
from rmtjax.replay import make_replay


@struct.dataclass
class SequenceWindow:
    """Every env's last `seq_len` steps, [N, L, ...] (index 0 the oldest), and the hidden state now."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    final_obs: jax.Array  # the observation each step ended in (pre-reset)
    reset: jax.Array  # the step's observation began an episode
    valid: jax.Array  # a real step (False: padding before the env's first steps)
    start: Any  # the online network's hidden state before each step, [N, L, ...] per leaf
    carry: Any  # the hidden state now, before the current observation, [N, ...]
    now_reset: jax.Array  # [N]: the current observation begins an episode


def _push(buf, x):
    return jnp.concatenate([buf[:, 1:], x[:, None].astype(buf.dtype)], axis=1)


class RecurrentRMT(RecurrentQ, RMT):
    """RMT (or, with `DQN`'s settings, DQN) with an LSTM or GRU torso, learning from sequences."""

    def __init__(self, config):
        super().__init__(config)
        c = self.cfg
        self.replay = make_replay("uniform", capacity=c.buffer_size // c.seq_len)

    def _q_network(self, dtype):
        c = self.cfg
        head = (PerDimQHead(self.num_dims, c.bins, c.dueling, dtype) if self.per_dim
                else QHead(self.spec.num_actions, c.dueling, dtype))
        return RecurrentNet(RecurrentTorso(c.torso, c.rnn_width, tuple(c.hidden), c.activation, c.layer_norm, dtype),
                            head)

    # -- sequences ------------------------------------------------------------------------------
    def _empty_window(self, obs) -> SequenceWindow:
        c, N = self.cfg, obs.shape[0]
        L = c.seq_len
        action_shape = (N, L, self.num_dims) if self.per_dim else (N, L)
        zeros_obs = jnp.zeros((N, L) + obs.shape[1:], obs.dtype)
        carry = self.initial_carry(N)
        return SequenceWindow(
            obs=zeros_obs, action=jnp.zeros(action_shape, jnp.int32), reward=jnp.zeros((N, L)),
            terminated=jnp.zeros((N, L), bool), done=jnp.zeros((N, L), bool), final_obs=zeros_obs,
            reset=jnp.ones((N, L), bool), valid=jnp.zeros((N, L), bool),
            start=jax.tree.map(lambda x: jnp.zeros((N, L) + x.shape[1:], x.dtype), carry),
            carry=carry, now_reset=jnp.ones((N,), bool))

    @staticmethod
    def _emit(window: SequenceWindow) -> dict:
        """Every env's window as one stored sequence [N, L, ...], with the hidden state at its start."""
        return {"obs": window.obs, "action": window.action, "reward": window.reward,
                "terminated": window.terminated, "done": window.done, "final_obs": window.final_obs,
                "reset": window.reset, "valid": window.valid,
                "start": jax.tree.map(lambda x: x[:, 0], window.start)}

    def init(self, key, hparams=None) -> RMTState:
        c = self.cfg
        k_env, k_net, _, key = jax.random.split(key, 4)
        obs, env_state = self.env.reset(k_env)
        window = self._empty_window(obs)
        params = self.net.init(k_net, window.carry, obs[None], window.now_reset[None])
        N = obs.shape[0]
        example = jax.tree.map(lambda x: x[0], self._emit(window))
        return RMTState(
            params=params, target_params=params, opt_state=self.tx.init(params), env_state=env_state, obs=obs,
            window=window, replay=self.replay.init(example), log_temperature=jnp.log(jnp.float32(c.init_temperature)),
            hold=exploration.Hold.empty((N, self.num_dims) if self.per_dim else (N,)), td_ema=jnp.zeros(()),
            key_share=jnp.zeros(()), precision=self.precision.init(), hparams=self.default_hparams(hparams), key=key)

    @jax.named_scope("phase/act")
    def _act(self, state: RMTState, sched: Schedule, key):
        """`rollout_len` steps of every env carrying the hidden state; the new sequences [N, L, ...]
        (every env's window once the steps are in it) and the exploration statistics [T]."""
        c, prec, hp = self.cfg, self.precision, state.hparams
        boltzmann = c.exploration == "eps_boltzmann"

        def env_step(carry, keys):
            obs, env_state, window, log_temp, hold = carry
            k_act, k_env = keys

            def forward(dt):
                rnn, q, _ = self.q_sequence(state.params, window.carry, obs[None], window.now_reset[None], dt)
                return q[0], rnn

            q, rnn = prec.select(state.precision, forward)
            action, info, hold = exploration.select_action(k_act, q, sched.epsilon, jnp.exp(log_temp), boltzmann,
                                                           hold, c.eps_hold)
            if boltzmann:
                adapted = exploration.adapt_temperature(log_temp, info["policy_entropy"],
                                                        sched.entropy_frac * info["max_entropy"], hp.temperature_lr)
                log_temp = jnp.where(jnp.isfinite(adapted), adapted, log_temp)
            next_obs, env_state, reward, term, _, env_info = self.env.step(k_env, env_state, self.env_action(action))
            window = SequenceWindow(
                obs=_push(window.obs, obs), action=_push(window.action, action), reward=_push(window.reward, reward),
                terminated=_push(window.terminated, term), done=_push(window.done, env_info["done"]),
                final_obs=_push(window.final_obs, env_info["final_obs"]), reset=_push(window.reset, window.now_reset),
                valid=_push(window.valid, jnp.ones_like(window.now_reset)),
                start=jax.tree.map(_push, window.start, window.carry), carry=rnn, now_reset=env_info["done"])
            return (next_obs, env_state, window, log_temp, hold), info

        carry = (state.obs, state.env_state, state.window, state.log_temperature, state.hold)
        carry, act_info = jax.lax.scan(env_step, carry, jax.random.split(key, (c.rollout_len, 2)))
        return carry, self._emit(carry[2]), act_info

    def _sequence_td(self, params, target_params, batch, gamma, dtype):
        """(TD errors [L-K, B], Q of the taken actions [L-K, B], the loss mask [L-K, B]) of stored
        sequences [B, L, ...] past the burn-in K; the targets are constants for gradients."""
        c = self.cfg
        K = c.burn_in
        seq = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), {k: v for k, v in batch.items() if k != "start"})
        start = batch["start"]
        net = self.nets[jnp.dtype(dtype)]
        if K:
            carry, _, _ = net.apply(params, start, seq["obs"][:K], seq["reset"][:K])
            carry = jax.lax.stop_gradient(carry)
        else:
            carry = start
        _, q_all, carries = net.apply(params, carry, seq["obs"][K:], seq["reset"][K:])
        _, _, t_carries = net.apply(target_params, start, seq["obs"], seq["reset"])
        rest = jax.tree.map(lambda x: x[K:], seq)
        q_next = after(net, target_params, jax.tree.map(lambda x: x[K:], t_carries), rest["final_obs"])
        chooser = jax.lax.stop_gradient(after(net, params, carries, rest["final_obs"])) if c.double_q else q_next

        def flat(x):
            return x.reshape((-1,) + x.shape[2:])

        shape = rest["reward"].shape
        boot = q_of(flat(q_next), jnp.argmax(flat(chooser), axis=-1)).reshape(shape)
        target = rest["reward"] + gamma * (1.0 - rest["terminated"].astype(jnp.float32)) * boot
        q = q_of(flat(q_all), flat(rest["action"])).reshape(shape)
        return jax.lax.stop_gradient(target) - q, q, rest["valid"].astype(jnp.float32)

    def gradient_step(self, params, target_params, opt_state, prec_state, batch, weight, gamma, clip,
                      temperature=None):
        """One guarded step on a minibatch of sequences; `aux` is (|TD| mean per sequence [B], Q mean
        per sequence [B]) over the steps that carry a loss. `temperature` (RMT's transfer KL) is not
        used: transfer refuses recurrent agents."""

        def loss_fn(p, dtype):
            td, q, mask = self._sequence_td(p, target_params, batch, gamma, dtype)
            per_step = td**2 if self.cfg.loss == "mse" else optax.huber_loss(td, delta=self.cfg.huber_delta)
            loss = jnp.sum(weight[None] * per_step * mask) / jnp.maximum(mask.sum(), 1.0)
            count = jnp.maximum(mask.sum(0), 1.0)
            return loss, (jnp.sum(jnp.abs(td) * mask, 0) / count, jnp.sum(q * mask, 0) / count)

        return self.precision.step(prec_state, loss_fn, params, opt_state, self.tx, clip)


class RecurrentDQN(RecurrentRMT):
    """DQN with a recurrent torso: RMT's recurrent machinery run with DQN's choices (uniform
    replay, ε-greedy, no dueling head, no LayerNorm, hard target updates) and DQN's fields."""

    Config = DQNConfig

    def __init__(self, config):
        c = config.agent
        fields = {f.name for f in dataclasses.fields(RMTConfig)}
        as_rmt = RMTConfig(**{k: v for k, v in dataclasses.asdict(c).items() if k in fields},
                           replay="uniform", exploration="eps_greedy", dueling=False, layer_norm=False,
                           target_update="hard")
        config = copy.copy(config)  # the run's config is unchanged; this agent reads its section as RMT's
        object.__setattr__(config, "agent", as_rmt)
        super().__init__(config)
