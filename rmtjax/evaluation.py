"""Greedy evaluation: the episodes loop shared by `rmtjax.evaluate` and the periodic
evaluation inside the compiled training loop (`train.eval_every`).

`greedy_runner(agent, env, episodes, limit)` is one compiled loop that plays `episodes`
greedy episodes (`agent.act_step`, so feed-forward and recurrent agents alike) per seed on
fresh environments, every seed one step per turn (a host env's callbacks cannot sit in a loop
batched over seeds).

`compose(config, agent, init, step)` is the evaluation layer the driver puts over the batched
agent (outermost, over the meta layer) when `train.eval_every > 0`: every `eval_every`
iterations (and at the last) a `lax.cond` on `t` (the same for every seed, so a real branch:
the other iterations pay nothing) plays `train.eval_episodes` greedy episodes per seed on its
own environments and reports `eval_return` and `eval_length` (NaN on iterations without an
evaluation). The state is an `EvalTrainState`: the agent's (read through for `params`,
`env_state`, `hparams`) and, per seed, the parameters of its best evaluation so far with that
return and the iteration, so checkpoints keep them and a resumed run goes on exactly.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax.schema import ConfigError

EVAL_METRICS = ("eval_return", "eval_length")
_EVAL_STREAM = 0x6576616C  # the evaluation envs' keys, folded from each seed's key


def greedy_runner(agent, env, episodes: int, limit: int) -> Callable:
    """`run(params, obs_stats, keys) -> (returns, lengths, finished)`, each `[seeds, episodes]`:
    `episodes` greedy episodes per seed (`params`, `obs_stats`, `keys` batched over seeds; the
    statistics frozen), each cut off after `limit` steps (then with its partial return and
    `finished` False). `env` is built with `num_envs == episodes`."""

    def start(obs_stats, key):
        key, k_reset = jax.random.split(key)
        obs, env_state = env.reset(k_reset, obs_stats=obs_stats)
        zeros = jnp.zeros(episodes, jnp.float32)
        return (obs, env_state, key, zeros, zeros.astype(jnp.int32), zeros.astype(bool),
                agent.initial_carry(episodes), jnp.ones(episodes, bool))

    def step_seed(params, c):
        obs, env_state, key, returns, lengths, finished, carry, reset = c
        key, k_act, k_env = jax.random.split(key, 3)
        action, carry = agent.act_step(params, carry, obs, reset, k_act)  # a recurrent agent's memory in `carry`
        obs, env_state, _, _, _, info = env.step(k_env, env_state, action, frozen=True)
        reset = info["done"]
        # each env's first episode counts: its statistics the moment it ends
        first = (env_state.episodes_done > 0) & ~finished
        returns = jnp.where(first, env_state.last_return, returns)
        lengths = jnp.where(first, env_state.last_length, lengths)
        return obs, env_state, key, returns, lengths, finished | first, carry, reset

    def run(params, obs_stats, keys):
        def running(c):
            t, (*_, finished, _, _) = c
            return (t < limit) & ~finished.all()

        def step(c):
            t, seeds = c
            return t + 1, jax.vmap(step_seed)(params, seeds)

        _, (_, env_state, _, returns, lengths, finished, *_) = jax.lax.while_loop(
            running, step, (0, jax.vmap(start)(obs_stats, keys)))
        returns = jnp.where(finished, returns, env_state.episode_return)
        lengths = jnp.where(finished, lengths, env_state.episode_length)
        return returns, lengths, finished

    return run


@struct.dataclass
class EvalTrainState:
    """The state of a run with periodic evaluation: the agent's (or the meta layer's) state and,
    per seed, `best_params` (the parameters of its best evaluation so far; the initial ones
    before any), `best_return` (-inf before any), `best_iteration` (0 before any) and the key
    of its evaluation envs."""

    agent: Any
    best_params: Any
    best_return: jax.Array
    best_iteration: jax.Array
    eval_key: jax.Array

    @property
    def params(self):
        return self.agent.params

    @property
    def env_state(self):
        return self.agent.env_state

    @property
    def hparams(self):
        return self.agent.hparams


def is_active(config) -> bool:
    return config.train.eval_every > 0


def check(config, agent) -> None:
    """What the evaluation layer cannot do yet, refused before anything is compiled."""
    if config.distributed.devices > 1:
        raise ConfigError(f"train.eval_every: {config.train.eval_every} is not supported on several devices yet "
                          f"(distributed.devices: {config.distributed.devices}); set train.eval_every: 0 and "
                          f"evaluate after training (rmtjax eval RUN_DIR)")
    if agent.between_chunks(1) is not None:
        raise ConfigError(f"train.eval_every: {config.train.eval_every} is not supported with work between chunks "
                          f"(agent.replay: hierarchical) yet; set train.eval_every: 0 and evaluate after training")


def eval_due(t, every: int, num_iterations: int):
    """True at iteration `t` (0-based) when an evaluation follows it: every `every` iterations
    and after the last."""
    return ((t + 1) % every == 0) | (t + 1 == num_iterations)


def compose(config, agent, init, step) -> tuple[Callable, Callable]:
    """The evaluation layer over the batched `init(keys, hparams)` and `step(state, t)`."""
    from rmtjax.envs import make_env

    check(config, agent)
    every, episodes = config.train.eval_every, config.train.eval_episodes
    n_iter = agent.num_iterations
    env = make_env(_eval_env_config(config, episodes))
    limit = env.spec.max_episode_steps or 100_000
    run = greedy_runner(agent, env, episodes, limit)

    def out_init(keys, hparams=None):
        state = init(keys, hparams)
        seeds = keys.shape[0]
        return EvalTrainState(state, state.params, jnp.full(seeds, -jnp.inf, jnp.float32),
                              jnp.zeros(seeds, jnp.int32),
                              jax.vmap(lambda k: jax.random.fold_in(k, _EVAL_STREAM))(keys))

    def evaluate(s: EvalTrainState, t):
        keys = jax.vmap(lambda k: jax.random.fold_in(k, t))(s.eval_key)
        returns, lengths, _ = run(s.params, s.env_state.obs_stats, keys)
        ret, length = returns.mean(axis=1), lengths.astype(jnp.float32).mean(axis=1)
        better = ret > s.best_return
        pick = lambda new, old: jnp.where(better.reshape(better.shape + (1,) * (new.ndim - 1)), new, old)  # noqa: E731
        s = s.replace(best_params=jax.tree.map(pick, s.params, s.best_params),
                      best_return=jnp.where(better, ret, s.best_return),
                      best_iteration=jnp.where(better, t + 1, s.best_iteration))
        return s, ret, length

    def skip(s: EvalTrainState, t):
        nan = jnp.full(s.best_return.shape, jnp.nan, jnp.float32)
        return s, nan, nan

    def out_step(state: EvalTrainState, t):
        inner, metrics = step(state.agent, t)
        s = state.replace(agent=inner)
        s, ret, length = jax.lax.cond(eval_due(t, every, n_iter), evaluate, skip, s, t)
        return s, {**metrics, "eval_return": ret, "eval_length": length}

    return out_init, out_step


def _eval_env_config(config, episodes: int):
    import dataclasses

    return dataclasses.replace(config.env, num_envs=episodes)


def check_which(which) -> None:
    if which not in ("last", "best"):
        raise ConfigError(f"which: expected 'last' (the parameters at the end) or 'best' (those of the best periodic "
                          f"evaluation, train.eval_every), got {which!r}")


def which_state(state, which: str):
    """`state` (which="last") or its best-by-evaluation view (which="best")."""
    check_which(which)
    return best_state(state) if which == "best" else state


def best_state(state):
    """A view of `state` (an `EvalTrainState`) whose `params` are each seed's best-by-evaluation
    ones: what `make_policy` reads (`params` and `env_state`)."""
    if not isinstance(state, EvalTrainState):
        raise ConfigError("which='best': this run has no periodic evaluation (train.eval_every: 0), so it kept no "
                          "best parameters; use which='last' or train with train.eval_every > 0")
    return _ParamsView(state.best_params, state.env_state)


@struct.dataclass
class _ParamsView:
    params: Any
    env_state: Any
