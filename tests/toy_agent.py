"""A toy agent that implements only `rmtjax.protocol` (on the clock of `rmtjax.agents.base.Agent`):
linear Q-learning with ε-greedy actions, one TD(0) step per iteration on the envs' transitions.
Registered as `algo: toy`. It never names a metric or state field any shared layer looks for;
tests/test_protocol.py checks that it gets the meta-controller, PBT, curriculum, low precision
with the guard, several devices and run directories all the same."""

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

    def __init__(self, config):
        super().__init__(config)
        self.tx = optax.inject_hyperparams(optax.sgd)(learning_rate=self.cfg.step_size)

    @property
    def steps_per_iteration(self) -> int:
        return self.config.env.num_envs

    def q(self, params, obs, dtype=jnp.float32):
        return (obs.astype(dtype) @ params["w"].astype(dtype) + params["b"].astype(dtype)).astype(jnp.float32)

    def init(self, key, hparams=None) -> ToyState:
        k_env, k_w, key = jax.random.split(key, 3)
        obs, env_state = self.env.reset(k_env)
        shape = (obs.shape[-1], self.spec.num_actions)
        params = {"w": 0.01 * jax.random.normal(k_w, shape), "b": jnp.zeros(shape[1:])}
        hp = self.default_hparams(hparams)
        opt_state = self.tx.init(params)
        return ToyState(params, opt_state, env_state, obs, self.precision.init(), hp, key)

    def act(self, params, obs, key=None):
        return jnp.argmax(self.q(params, obs), -1)

    def step(self, state: ToyState, t):
        hp, prec = state.hparams, self.precision
        key, k_eps, k_rand, k_env = jax.random.split(state.key, 4)
        eps = linear_schedule(hp.eps_from, hp.eps_to, self.progress(t), 0.5)
        greedy = self.act(state.params, state.obs)
        explore = jax.random.uniform(k_eps, greedy.shape) < eps
        action = jnp.where(explore, jax.random.randint(k_rand, greedy.shape, 0, self.spec.num_actions), greedy)
        obs, env_state, reward, terminated, _, info = self.env.step(k_env, state.env_state, action)
        target = reward + hp.discount * (1.0 - terminated) * self.q(state.params, info["final_obs"]).max(-1)

        def loss_fn(params, dtype):
            q = jnp.take_along_axis(self.q(params, state.obs, dtype), action[:, None], -1)[:, 0]
            return jnp.mean((q - jax.lax.stop_gradient(target)) ** 2), {}

        opt_state = state.opt_state._replace(hyperparams={"learning_rate": hp.step_size})
        params, opt_state, prec_state, loss, _, guard = prec.update(state.precision, loss_fn, state.params,
                                                                    opt_state, self.tx, hp.clip)
        stats = summarize({"td_loss": loss[None], **{k: v[None] for k, v in guard.items()}})
        new = state.replace(params=params, opt_state=opt_state, env_state=env_state, obs=obs, precision=prec_state,
                            key=key)
        metrics = {"env_steps": self.env_steps_after(t), **episode_metrics(state.env_state, env_state), **stats,
                   "random_share": explore.mean(), **{f.name: getattr(hp, f.name) for f in dataclasses.fields(hp)},
                   **prec.metrics(prec_state, hp.clip)}
        return new, metrics

    def signals(self, metrics) -> Signals:
        return Signals(episode_return=metrics["episode_return"], episodes=metrics["episode_count"],
                       value_loss=metrics["td_loss"], explore=metrics["random_share"])

    def learner(self, state: ToyState) -> Learner:
        return Learner(params=state.params, opt_state=state.opt_state)

    def with_learner(self, state: ToyState, learner: Learner) -> ToyState:
        return state.replace(params=learner.params, opt_state=learner.opt_state)


register_agent("toy", Toy)
