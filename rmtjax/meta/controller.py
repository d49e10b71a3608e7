"""What the driver calls: the batched agent state wrapped with the meta state, and one step.

With `meta.mode: off` and no curriculum stages the driver does not use this at all (the run
is the agent's own scan, bit for bit as before). Otherwise the state the driver scans,
checkpoints and returns is a `MetaTrainState`: the agent's state and, beside it, the
`MetaState`, both batched over seeds. `params`, `env_state` and `hparams` read through to the
agent's, so evaluation and `final_return` see it like an agent state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax.schema import ConfigError
from rmtjax.meta import core


@struct.dataclass
class MetaTrainState:
    agent: Any  # the agent's own state
    meta: core.MetaState

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
    return config.meta.active or config.curriculum.active


# key of the meta state, derived from each seed's key without consuming it
_META_STREAM = 0x6D657461


class Controller:
    """Built from the config and agent; `init` one seed, `step` the batched state."""

    def __init__(self, config, agent, step=None):
        self.config, self.agent = config, agent
        self.agent_step = agent.step if step is None else step  # one seed's step (metrics reduced over devices)
        self.cfg = config.meta
        self.cur = config.curriculum
        self.max_entropy = agent.max_entropy
        self.update = core.make_update(self.cfg, self.max_entropy)

    def init(self, key, agent_state) -> MetaTrainState:
        """The wrapped state of one seed; a bandit starts playing its first arm."""
        meta = core.init_state(jax.random.fold_in(key, _META_STREAM), self.cfg.window if self.cfg.mode == "bandit" else 1)
        if self.cfg.mode == "bandit":
            agent_state = agent_state.replace(hparams=core.apply_arm(agent_state.hparams, meta.arm, self.cfg))
        return MetaTrainState(agent_state, meta)

    def step(self, state: MetaTrainState, t):
        """Iteration `t` of every seed: the vmapped agent step, then the meta update."""
        agent_state, metrics = jax.vmap(self.agent_step, in_axes=(0, None))(state.agent, t)
        signals = jax.vmap(self.agent.signals)(metrics)  # the agent's typed signals (rmtjax.protocol)
        signals = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), signals)
        meta = state.meta
        hp = agent_state.hparams
        meta, hp = jax.vmap(self.update)(meta, signals, hp)
        extra = {}
        if self.cfg.mode == "pbt":
            learner, hp, env_params, meta, source = core.pbt_round(
                self.agent.learner(agent_state), hp, agent_state.env_state.params, meta, self.cfg)
            agent_state = self.agent.with_learner(agent_state, learner)
            agent_state = agent_state.replace(env_state=agent_state.env_state.replace(params=env_params))
            extra["meta_pbt_source"] = source
        if self.cur.active:
            if self.cur.metric not in metrics:
                raise ConfigError(f"curriculum.metric: {self.cur.metric!r} is not a metric of {self.config.algo}; "
                                  f"those are {', '.join(sorted(metrics))}")
            bounds = self.cfg if self.cfg.active else None
            meta, hp, env_params = jax.vmap(
                lambda m, v, h, e: core.curriculum_update(m, v, h, e, self.cur.stages, self.cur.patience, bounds))(
                meta, metrics[self.cur.metric], hp, agent_state.env_state.params)
            agent_state = agent_state.replace(env_state=agent_state.env_state.replace(params=env_params))
            extra["curriculum_stage"] = meta.stage
        agent_state = agent_state.replace(hparams=hp)
        if self.cfg.active:
            extra.update(jax.vmap(lambda m: core.meta_metrics(m, self.cfg, self.max_entropy, signals.present()))(meta))
        # the hyperparameters after this iteration's moves (what the next iteration runs with)
        hp_metrics = {f.name: getattr(hp, f.name) for f in dataclasses.fields(hp)}
        return MetaTrainState(agent_state, meta), {**metrics, **hp_metrics, **extra}


def wrap(config, agent):
    """(batched init `(keys, hparams) -> state`, batched step `(state, t) -> (state, metrics)`)
    for the driver: the agent's own when the meta-controller and curriculum are off. The
    iteration index `t` is shared by the seeds (not batched). On several devices the agent's
    metrics are reduced across them first (`rmtjax.distributed.reduced_step`)."""
    from rmtjax.distributed import reduced_step

    step = reduced_step(config, agent.step)
    if not is_active(config):
        def init(keys, hparams=None):
            return jax.vmap(lambda k: agent.init(k, hparams))(keys)

        return init, jax.vmap(step, in_axes=(0, None))
    ctl = Controller(config, agent, step)

    def init(keys, hparams=None):
        return jax.vmap(lambda k: ctl.init(k, agent.init(k, hparams)))(keys)

    return init, ctl.step
