"""Demonstrations as a replay mixer: any replay of `make_replay` with a scheduled share of each
minibatch drawn from fixed demonstration transitions (DQfD, Hester et al. 2018).

The demonstrations are constants of the compiled program (read once when training starts,
`rmtjax.replay.demonstrations`), never part of the replay's state: they are never evicted and
a checkpoint does not copy them per seed. Acting (evaluation, `load_policy`) needs none of them.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax.schema import param


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    """The `agent.demo_*` fields of an agent that learns from demonstrations."""

    demonstrations: str = param("", doc="path of an .npz of demonstration transitions (obs, action, reward, "
                                        "terminated, truncated, next_obs) or minari:<dataset_id> (a local Minari "
                                        "dataset), read when training starts, never evicted; '' for none")
    demo_share: float = param(0.25, lo=0.0, hi=1.0, doc="share of each minibatch drawn from the demonstrations "
                                                        "at the start of training")
    demo_share_end: float = param(0.0, lo=0.0, hi=1.0, doc="the share once demo_decay_frac of training is done")
    demo_decay_frac: float = param(0.5, lo=0.0, hi=1.0, lo_open=True, doc="share of training over which the "
                                                                           "demonstration share moves linearly")
    demo_margin: float = param(0.0, lo=0.0, doc="weight of the large-margin loss on demonstration actions "
                                                "(DQfD's J_E: max_a [Q(s,a) + l(a_E,a)] - Q(s,a_E)); 0: off")
    demo_margin_value: float = param(0.8, lo=0.0, lo_open=True, doc="the margin l(a_E, a) for a != a_E")
    demo_pretrain: int = param(0, lo=0, doc="gradient steps on demonstrations alone before the first env step "
                                            "(DQfD's pre-training, with the margin loss when demo_margin > 0)")


@struct.dataclass
class MixedDraw:
    inner: object  # the inner replay's draw
    weight: jax.Array  # [B]: the inner weights, 1 on demonstration rows
    is_demo: jax.Array  # [B] bool


class DemoMixer:
    """`inner` (a replay of `make_replay`) mixed with the demonstrations `load()` returns ({obs,
    action, rewards, steps, boot_obs, terminated} [D, ...], the agent's transition layout).
    `sample` takes `progress` (the share of training done) for the share in force."""

    def __init__(self, inner, load, opts: DemoOptions, batch_size: int):
        self.inner, self._load, self._demos, self.opts, self.batch_size = inner, load, None, opts, batch_size
        self.needs_td = getattr(inner, "needs_td", False)
        self.max_rows = math.ceil(max(opts.demo_share, opts.demo_share_end) * batch_size)

    @property
    def demos(self) -> dict:
        """The transitions, read by `load()` on first use: when a training program is traced, never
        when an agent is only built to act."""
        if self._demos is None:
            self._demos = self._load()
        return self._demos

    @property
    def count(self) -> int:
        return jax.tree.leaves(self.demos)[0].shape[0]

    def rows(self, progress):
        """Minibatch rows drawn from the demonstrations at `progress` (int32)."""
        o = self.opts
        frac = jnp.minimum(progress / o.demo_decay_frac, 1.0)
        share = o.demo_share + (o.demo_share_end - o.demo_share) * frac
        return jnp.minimum(jnp.round(share * self.batch_size).astype(jnp.int32), self.max_rows)

    def init(self, example):
        return self.inner.init(example)

    def add(self, state, batch, td_abs=None):
        return self.inner.add(state, batch, td_abs)

    def demo_batch(self, key, size: int) -> dict:
        """`size` demonstrations drawn uniformly."""
        rows = jax.random.randint(key, (size,), 0, self.count)
        return jax.tree.map(lambda x: jnp.asarray(x)[rows], self.demos)

    def sample(self, state, key, batch_size, beta, progress=0.0):
        """The inner draw with `rows(progress)` of its rows (at random positions, so the inner
        draw keeps its proportions) replaced by demonstrations of weight 1; the batch gets a
        `demo` row mask."""
        k_inner, k_pick, k_place = jax.random.split(key, 3)
        batch, info = self.inner.sample(state, k_inner, batch_size, beta)
        picked = self.demo_batch(k_pick, self.max_rows)
        rank = jax.random.permutation(k_place, batch_size)  # row j takes demonstration rank[j] if rank[j] < rows
        is_demo = rank < self.rows(progress)
        source = jnp.minimum(rank, self.max_rows - 1)

        def mix(ours, theirs):
            mask = is_demo.reshape(is_demo.shape + (1,) * (ours.ndim - 1))
            return jnp.where(mask, theirs[source].astype(ours.dtype), ours)

        mixed = jax.tree.map(mix, batch, picked)
        return {**mixed, "demo": is_demo}, MixedDraw(info, jnp.where(is_demo, 1.0, info.weight), is_demo)

    def update(self, state, info: MixedDraw, td_abs, keep=None):
        ours = ~info.is_demo if keep is None else keep & ~info.is_demo  # demonstrations are not written back
        return self.inner.update(state, info.inner, td_abs, ours)

    def batch_stats(self, state, info: MixedDraw):
        return {**self.inner.batch_stats(state, info.inner), "demo_share": info.is_demo.mean()}

    def key_share(self, state, info: MixedDraw, key):
        return self.inner.key_share(state, info.inner, key)

    def buffer_stats(self, state):
        return self.inner.buffer_stats(state)

    def __getattr__(self, name):  # the inner replay's own extras (refresh, levels)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def margin_loss(q_all, action, is_demo, margin: float):
    """DQfD's large-margin loss J_E over the demonstration rows: max_a [Q(s,a) + l·(a != a_E)]
    - Q(s,a_E), per action dimension for binned continuous actions (their mean)."""
    other = jax.nn.one_hot(action, q_all.shape[-1], dtype=q_all.dtype) == 0
    per = (q_all + margin * other).max(-1) - jnp.take_along_axis(q_all, action[..., None], axis=-1)[..., 0]
    per = per.mean(-1) if per.ndim == 2 else per
    return (per * is_demo).sum() / jnp.maximum(is_demo.sum(), 1)


def load_for(text: str, env_cfg, spec) -> dict:
    """`agent.demonstrations` read and checked against the env (`rmtjax.replay.demonstrations.load`)."""
    from rmtjax.replay import demonstrations

    return demonstrations.load(text, obs_shape=spec.obs_shape, discrete=spec.discrete, num_actions=spec.num_actions,
                               action_shape=spec.action_shape, action_low=spec.action_low,
                               action_high=spec.action_high, reward_scale=env_cfg.reward_scale,
                               reward_clip=env_cfg.reward_clip)


def as_transitions(raw: dict, action, n_step: int, obs_dtype) -> dict:
    """Demonstrations (`rmtjax.replay.demonstrations.load`) in the value agents' replay layout,
    with `action` as the agent stores it: one-step (`steps` 1, the reward first in `rewards`)."""
    n = raw["obs"].shape[0]
    return {"obs": jnp.asarray(raw["obs"], obs_dtype), "action": jnp.asarray(action),
            "rewards": jnp.zeros((n, n_step), jnp.float32).at[:, 0].set(raw["reward"]),
            "steps": jnp.ones((n,), jnp.int32), "boot_obs": jnp.asarray(raw["next_obs"], obs_dtype),
            "terminated": jnp.asarray(raw["terminated"])}
