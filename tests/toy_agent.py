"""A toy agent implementing only `rmtjax.protocol` (on the clock of `rmtjax.agents.base.Agent`):
linear Q-learning, ε-greedy, a TD(0) step per iteration; `algo: toy`. It names no metric or state
field a shared layer looks for; tests/test_protocol.py shows it gets them all."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from rmtjax.agents import register_agent
from rmtjax.agents.base import Agent
from rmtjax.envs import VecEnvState, episode_metrics
from rmtjax.exploration import linear_schedule
from rmtjax.guard import with_lr
from rmtjax.precision import PrecisionState, summarize
from rmtjax.protocol import Learner, Signals, hparam
from rmtjax.schema import Section, param


@dataclasses.dataclass(frozen=True)
class ToyConfig(Section):
    _section = "agent"
    step_size: float = param(0.01, lo=0.0, hi=1.0, lo_open=True)
    discount: float = param(0.99, lo=0.0, hi=1.0)
    eps_from: float = param(1.0, lo=0.0, hi=1.0)
    eps_to: float = param(0.05, lo=0.0, hi=1.0)
    clip: float = param(10.0, lo=0.0)


@struct.dataclass
class ToyHParams:  # names of its own: the groups say what the meta-controller may move
    step_size: jax.Array = hparam("lr")
    discount: jax.Array = hparam("gamma")
    eps_from: jax.Array = hparam("eps")
    eps_to: jax.Array = hparam("eps")
    clip: jax.Array = hparam()


@struct.dataclass
class ToyState:
    params: Any
    opt_state: Any
    env_state: VecEnvState
    obs: jax.Array
    precision: PrecisionState
    hparams: ToyHParams
    key: jax.Array


class Toy(Agent):
    Config = ToyConfig
    HParams = ToyHParams
    data_parallel = True  # its update goes through the guard, which fuses gradients across devices

    def __init__(self, config):
        super().__init__(config)
        self.tx = self.guarded(optax.inject_hyperparams(optax.sgd)(learning_rate=self.cfg.step_size))

    @property
    def steps_per_iteration(self) -> int:
        return self.config.env.num_envs

    def q(self, params, obs, dtype=jnp.float32):
        return (obs.astype(dtype) @ params["w"].astype(dtype) + params["b"].astype(dtype)).astype(jnp.float32)

    def init(self, key, hparams=None) -> ToyState:
        k_env, k_w, key = jax.random.split(key, 3)
        obs, env_state = self.env.reset(*self.device_keys(k_env))  # each device its own envs
        shape = (obs.shape[-1], self.spec.num_actions)
        params = {"w": 0.01 * jax.random.normal(k_w, shape), "b": jnp.zeros(shape[1:])}
        return ToyState(params, self.tx.init(params), env_state, obs, self.precision.init(),
                        self.default_hparams(hparams), key)

    def act(self, params, obs, key=None):
        return jnp.argmax(self.q(params, obs), -1)

    def step(self, state: ToyState, t):
        hp, prec = state.hparams, self.precision
        key, k_eps, k_rand, k_env = jax.random.split(state.key, 4)
        k_eps, k_rand, k_env = self.device_keys(k_eps, k_rand, k_env)
        eps = linear_schedule(hp.eps_from, hp.eps_to, self.progress(t), 0.5)
        greedy = self.act(state.params, state.obs)
        explore = jax.random.uniform(k_eps, greedy.shape) < eps
        action = jnp.where(explore, jax.random.randint(k_rand, greedy.shape, 0, self.spec.num_actions), greedy)
        obs, env_state, reward, terminated, _, info = self.env.step(k_env, state.env_state, action)
        target = reward + hp.discount * (1.0 - terminated) * self.q(state.params, info["final_obs"]).max(-1)
        up = self.learn(state.params, state.opt_state, state.precision, state.obs, action, target, hp)
        stats = summarize({"td_loss": up.loss[None], **{k: v[None] for k, v in up.stats.items()}})
        new = state.replace(params=up.params, opt_state=up.opt_state, env_state=env_state, obs=obs,
                            precision=up.precision, key=key)
        metrics = {"env_steps": self.env_steps_after(t), **episode_metrics(state.env_state, env_state), **stats,
                   "random_share": explore.mean(), **{f.name: getattr(hp, f.name) for f in dataclasses.fields(hp)},
                   **prec.metrics(up.precision, hp.clip)}
        return new, metrics

    def learn(self, params, opt_state, prec_state, obs, action, target, hp):
        """One guarded TD step on a batch of transitions (a `rmtjax.precision.Step`)."""
        def loss_fn(p, dtype):
            q = jnp.take_along_axis(self.q(p, obs, dtype), action[:, None], -1)[:, 0]
            return jnp.mean((q - jax.lax.stop_gradient(target)) ** 2), {}

        return self.precision.step(prec_state, loss_fn, params, with_lr(opt_state, hp.step_size), self.tx, hp.clip)

    def signals(self, metrics) -> Signals:
        return Signals(episode_return=metrics["episode_return"], episodes=metrics["episode_count"],
                       value_loss=metrics["td_loss"], explore=metrics["random_share"])

    def learner(self, state: ToyState) -> Learner:
        return Learner(params=state.params, opt_state=state.opt_state)

    def with_learner(self, state: ToyState, learner: Learner) -> ToyState:
        return state.replace(params=learner.params, opt_state=learner.opt_state)


register_agent("toy", Toy)
