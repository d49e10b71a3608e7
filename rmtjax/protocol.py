"""The protocol between an agent and the layers it shares (driver, meta-controller, PBT,
curriculum, precision, devices, checkpoints).

An agent gets every shared layer by implementing what is declared here — typed structures and
methods — and nothing is found by the name of a metric or of a state field:

- `HParams`: a `flax.struct.dataclass` whose fields are made with `hparam(group)`. The group
  (`"lr"`, `"gamma"`, `"eps"` or None) says which `meta:` bounds apply to the field and which
  moves of the meta-controller and PBT touch it; a user may name a group in `meta.arms` or
  `curriculum.stages[].hparams` and it stands for every field of that group.
- `signals(metrics) -> Signals`: what one iteration of one seed tells the meta-controller. An
  agent fills the signals it has; a field left None is one it has not (PPO explores through its
  entropy and has no ε share), and the rules that read it then do nothing.
- `learner(state) -> Learner` and `with_learner(state, learner) -> state`: the learned parts of
  the state (parameters, target parameters, optimiser state, other learned values such as SAC's
  temperature); PBT copies exactly these, with the hyperparameters, from a good seed to a bad one.
- The state itself is a `flax.struct.dataclass` with at least `params` (what `act` takes),
  `env_state` (a `rmtjax.envs.VecEnvState`), `hparams` and `precision` (a
  `rmtjax.precision.PrecisionState`); the driver, evaluation and checkpoints read those.
- `data_parallel` and `check_devices(config, devices)`: whether the agent trains on several
  devices, and what its config must satisfy for it (say, a batch that splits evenly).
- Acting with memory: `initial_carry(batch)` and `act_step(params, carry, obs, reset, key) ->
  (action, carry)` are how every caller outside training (evaluation, `make_policy`,
  `load_policy`, video) acts. `carry` is the policy's hidden state for a batch of envs (a pytree
  of [batch, ...] arrays), `reset` [batch] is True where `obs` is the first observation of an
  episode (the carry is zeroed there before it is read). A feed-forward agent (`recurrent`
  False) has the empty carry `()` and `act_step` is its `act`; a recurrent one (`recurrent`
  True) keeps the carry in its training state too, so checkpoints hold it, and its `act`
  (which has no carry to read) raises.

- Transfer (`rmtjax.transfer`; optional: an agent without these cannot be transferred, and a
  config asking for it is refused): `param_groups(params)` names the group of every parameter
  leaf, a '/'-path such as `"torso/Dense_0"` or `"head/value"` (a config names a group or any
  prefix of one at '/': `torso` is every torso layer), and `policy_distribution(params, obs,
  dtype, temperature)` gives the policy as a `Categorical` or `Gaussian` below, so the transfer
  layer measures the KL to the source policy without knowing the agent's networks.

`rmtjax.agents.base.Agent` implements the clock and the bookkeeping; `AgentProtocol` below is
the whole contract, checked in the tests by a toy agent that implements only it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax
from flax import struct

# hyperparameter groups the meta-controller knows: each has bounds in `meta:` and a move
GROUPS = ("lr", "gamma", "eps")

# integer metrics that count the clock (env steps, gradient updates per seed): they follow from
# `t`, are the same on every device and are never summed across devices (other integer metrics
# are counts of this device's, e.g. `episode_count`, and are)
CLOCK_METRICS = ("env_steps", "updates")


def hparam(group: str | None = None):
    """A field of an agent's `HParams`; `group` is one of `GROUPS` or None (no meta move)."""
    if group is not None and group not in GROUPS:
        raise ValueError(f"hparam(group={group!r}): groups are {', '.join(GROUPS)} or None")
    return struct.field(pytree_node=True, metadata={"hparam_group": group})


def hparam_names(hparams) -> tuple[str, ...]:
    """The field names of an `HParams` class or instance."""
    return tuple(f.name for f in dataclasses.fields(hparams))


def hparam_groups(hparams) -> dict[str, tuple[str, ...]]:
    """group -> the fields of an `HParams` class or instance declared in it (groups with none
    are left out)."""
    out: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(hparams):
        group = f.metadata.get("hparam_group")
        if group is not None:
            out[group] = out.get(group, ()) + (f.name,)
    return out


def group_of(hparams, name: str) -> str | None:
    """The group of field `name` of an `HParams` class or instance (None if it has none)."""
    for f in dataclasses.fields(hparams):
        if f.name == name:
            return f.metadata.get("hparam_group")
    raise KeyError(name)


@struct.dataclass
class Signals:
    """One iteration of one seed, as the meta-controller reads it (float32 scalars).

    `episode_return`: mean return of the envs' last completed episodes (0 before the first);
    `episodes`: episodes completed this iteration; `value_loss`: the value (TD, critic) loss, 0
    where no gradient step was taken; `entropy`: the policy's entropy; `explore`: the share of
    exploratory actions (or the entropy over its maximum); `q_magnitude`: the size of the value
    estimates (e.g. the mean Q of the iteration's minibatches, 0 where none was taken);
    `skipped_frac`: the share of the iteration's updates the precision guard skipped as non-finite.
    None: the agent has no such signal. The training doctor (`rmtjax.doctor`) reads all of them.
    """

    episode_return: jax.Array
    episodes: jax.Array
    value_loss: jax.Array | None = None
    entropy: jax.Array | None = None
    explore: jax.Array | None = None
    q_magnitude: jax.Array | None = None
    skipped_frac: jax.Array | None = None

    def present(self) -> tuple[str, ...]:
        """The optional signals this agent reports (static: fixed by the agent)."""
        return tuple(n for n in ("value_loss", "entropy", "explore", "q_magnitude", "skipped_frac")
                     if getattr(self, n) is not None)


@struct.dataclass
class Learner:
    """The learned parts of an agent's state: what PBT copies between seeds.

    `target`: the target network's parameters (None without one); `extra`: other learned
    values (a mapping name -> array, e.g. SAC's log temperature; None without any)."""

    params: Any
    opt_state: Any
    target: Any = None
    extra: Any = None


@struct.dataclass
class Categorical:
    """A policy over discrete choices: `logits` [B, ..., choices] (the softmax over the last
    axis; further axes between are independent choices, e.g. one per action dimension)."""

    logits: jax.Array


@struct.dataclass
class Gaussian:
    """A diagonal Gaussian policy: `mean` and `log_std`, each [B, action dims]."""

    mean: jax.Array
    log_std: jax.Array


@runtime_checkable
class BetweenChunks(Protocol):
    """Work an agent does on the host between two compiled chunks (optional: an agent's
    `between_chunks(seeds, run_dir, seed)` returns one or None). The hierarchical replay
    (`rmtjax.replay.hierarchical.Levels`) is one: it moves items between device, host RAM and
    disk. The driver ends a chunk at least every `max_iterations` iterations (None: no bound),
    calls `after_chunk(state) -> (state, metrics)` (metrics: name -> [seeds] numpy arrays, logged
    on every iteration of the chunk), and `save(directory, iteration)` / `prune(directory, keep)`
    / `restore(directory, iteration, like_state, digest)` with each checkpoint, so a resumed run goes
    on exactly: `save` runs before the checkpoint is written and returns a checksum the checkpoint
    keeps; `restore` checks it and raises (a `ValueError` naming the file) when what was saved is
    missing or damaged, and the run directory falls back to the checkpoint before. `timing()`
    (optional): wall-clock seconds, kept apart from the deterministic metrics."""

    max_iterations: int | None

    def after_chunk(self, state) -> tuple[Any, dict]: ...

    def save(self, directory, iteration: int) -> str: ...

    def prune(self, directory, keep: list[int]) -> None: ...

    def restore(self, directory, iteration: int, like_state, digest: str | None = None) -> None: ...


@runtime_checkable
class AgentProtocol(Protocol):
    """What the shared layers call. `Config` is the agent's config section (`rmtjax.schema.
    Section`) and `HParams` its hyperparameters (fields from `hparam`)."""

    Config: type
    HParams: type
    data_parallel: bool

    @property
    def steps_per_iteration(self) -> int: ...

    @property
    def num_iterations(self) -> int: ...

    @property
    def first_learning_iteration(self) -> int:
        """The first iteration that updates (0: all do; an agent that learns after a warm-up of
        acting only says when it ends, so a wall-clock budget measures its speed anew there)."""

    @property
    def max_entropy(self) -> float | None:
        """log of the number of choices the policy's entropy is measured over, if finite."""

    def default_hparams(self, overrides=None): ...

    def init(self, key, hparams=None): ...

    def step(self, state, t) -> tuple[Any, dict]: ...

    def act(self, params, obs, key=None): ...

    @property
    def recurrent(self) -> bool:
        """True: the policy has a hidden state; act with `initial_carry` and `act_step`."""

    def initial_carry(self, batch: int) -> Any:
        """The policy's hidden state for `batch` envs before any step (`()` for a feed-forward agent)."""

    def act_step(self, params, carry, obs, reset, key=None) -> tuple[Any, Any]:
        """(greedy action, carry after `obs`): `carry` is zeroed where `reset` [B] is True first."""

    def signals(self, metrics) -> Signals: ...

    def learner(self, state) -> Learner: ...

    def with_learner(self, state, learner: Learner): ...

    @classmethod
    def check_devices(cls, config, devices: int) -> None: ...
