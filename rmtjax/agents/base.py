"""What every agent shares: the env, the iteration clock, hyperparameters held as arrays, and
the defaults of the protocol (`rmtjax.protocol`) every agent implements."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import jax
import jax.numpy as jnp

from rmtjax.distributed import Fusion, device_index
from rmtjax.envs import make_env
from rmtjax import transfer
from rmtjax.guard import anchor, guard
from rmtjax.precision import Precision
from rmtjax.protocol import Learner, Signals
from rmtjax.schema import ConfigError


class Agent:
    """Base of the agents. Subclasses set `Config` (a config section), `HParams` (a
    `flax.struct.dataclass` of float scalars made with `rmtjax.protocol.hparam`, whose names
    match fields of `Config`) and implement `init(key, hparams)`, `step(state, t)`, `act(params,
    obs, key)`, `signals(metrics)`, `learner(state)` and `with_learner(state, learner)` — the
    protocol of `rmtjax.protocol.AgentProtocol`, which the meta-controller, PBT, precision,
    devices and checkpoints rely on and nothing else.

    The clock: `step(state, t)` takes `t`, the index of the iteration it runs (an int32 scalar,
    0 for the first), from the driver's scan. `t` is the same for every seed and is never batched
    (the driver vmaps `step` with `in_axes=(0, None)`), so whatever depends only on it — the
    schedules, whether learning has started, target-network periods, diagnostic intervals — is
    a real branch (`lax.cond`) under `vmap`, not a select that computes both sides. Counters
    that follow from `t` (env steps, gradient steps) are derived from it, not kept in the state.

    `state.hparams` holds the numbers a user may sweep or the meta-controller may move; the
    rest of `Config` is static structure baked into the compiled program. Every gradient
    update goes through `self.precision.step` (see `rmtjax.precision`), whose per-seed state
    is `state.precision`; the optimiser is wrapped in the update guard with `self.guarded(...)`.

    With `distributed.devices` D > 1 the agent's `init` and `step` run on one device of the
    mesh (inside `shard_map`): `self.env` holds that device's `num_envs / D` environments,
    `self.device_keys` gives each device its own random streams, and the guard fuses the
    devices' gradients (`self.fusion`), so the agent's code is the same on one device or many.
    The driver reduces an iteration's metrics across the devices (`rmtjax.distributed.
    reduced_step`), before the meta-controller reads them.
    """

    Config: type
    HParams: type
    data_parallel = False  # True: `step` fuses its gradients across devices (see `check_devices`)
    device_shares: tuple[str, ...] = ()  # fields of the agent's section each device holds an equal share of

    def __init__(self, config):
        self.config = config
        self.cfg = config.agent
        # data-parallel runs (rmtjax.distributed): each device steps its share of the envs
        self.shards = config.distributed.devices
        local_env = config.env if self.shards == 1 else dataclasses.replace(
            config.env, num_envs=config.env.num_envs // self.shards)
        self.env = make_env(local_env)
        self.spec = self.env.spec
        self.precision = Precision(config.precision)  # compute dtype, loss scaling, the update guard
        # the gradient fusion across devices (in the guard's state), None on one device
        self.fusion = Fusion(config.distributed) if self.shards > 1 else None

    def guarded(self, inner):
        """The optimiser `inner` wrapped in the update guard (`rmtjax.guard`): finiteness skip,
        loss scaling, the clip in force, on several devices the gradient fusion and, in a
        transferred run, the frozen and staged parameter groups (`rmtjax.transfer`)."""
        return guard(inner, self.fusion, transfer.stages(self.config.transfer, self))

    def transfer_penalty(self, opt_state, obs, temperature=None):
        """For `Precision.step(..., penalty=)`: `transfer.kl_coef` × the mean over `obs` of
        KL(source policy ‖ policy), both from `policy_distribution` (at `temperature` where the
        policy has one), the source's parameters being the anchor in `opt_state`; None when the
        run has no KL penalty."""
        coef = self.config.transfer.kl_coef
        if not coef:
            return None
        source = anchor(opt_state)

        def penalty(params, dtype):
            reference = jax.lax.stop_gradient(self.policy_distribution(source, obs, dtype, temperature))
            kl = transfer.kl(reference, self.policy_distribution(params, obs, dtype, temperature)).mean()
            return coef * kl, kl

        return penalty

    def device_keys(self, *keys):
        """`keys` folded with this device's index on several devices (each device its own envs
        and random streams), unchanged on one."""
        if self.fusion is None:
            return keys
        return tuple(jax.random.fold_in(k, device_index()) for k in keys)

    @property
    def steps_per_iteration(self) -> int:
        """Environment steps taken by one call of `step`, per seed."""
        raise NotImplementedError

    @property
    def num_iterations(self) -> int:
        return max(1, self.config.train.total_steps // self.steps_per_iteration)

    @property
    def initial_env_steps(self) -> int:
        """Env steps per seed taken by `init` (before the first iteration)."""
        return 0

    def env_steps_after(self, t):
        """Env steps per seed once iteration `t` (0-based; an int or an int32 array) is done."""
        return self.initial_env_steps + (t + 1) * self.steps_per_iteration

    @property
    def first_learning_iteration(self) -> int:
        """The first iteration that updates (0: all do). The ones before it only act and store,
        so they run faster: a wall-clock budget (`train(budget_seconds=...)`) measures anew after it."""
        return 0

    def first_iteration_with(self, env_steps: int) -> int:
        """The first iteration after which at least `env_steps` env steps per seed are done."""
        return max(0, -(-(env_steps - self.initial_env_steps) // self.steps_per_iteration) - 1)

    def progress(self, t):
        """Share of training done when iteration `t` starts (float32, 0 at the first)."""
        return jnp.asarray(t, jnp.float32) / self.num_iterations

    # -- the protocol's defaults ------------------------------------------------------------
    recurrent = False  # a recurrent agent (agent.torso: lstm | gru) sets True and overrides the two below

    def initial_carry(self, batch: int):
        """The hidden state of the policy for `batch` envs: none, `()`, for a feed-forward agent."""
        return ()

    def act_step(self, params, carry, obs, reset, key=None):
        """(greedy action, carry): a feed-forward agent's is its `act`, the carry passed through."""
        return self.act(params, obs, key), carry

    @property
    def max_entropy(self) -> float | None:
        """log of the number of choices the policy's entropy is measured over (discrete actions)."""
        return math.log(self.spec.num_actions) if self.spec.discrete else None

    @classmethod
    def check_devices(cls, config, devices: int) -> None:
        """Refuse, with a `ConfigError`, a config that cannot train on `devices` > 1 devices."""
        if not cls.data_parallel:
            raise ConfigError(f"distributed.devices: {config.algo} does not train on several devices (its step "
                              f"fuses no gradients); set distributed.devices: 1")
        if config.env.num_envs % devices:
            raise ConfigError(f"env.num_envs: {config.env.num_envs} must be a multiple of distributed.devices "
                              f"({devices}): each device steps an equal share")
        for name in cls.device_shares:
            if getattr(config.agent, name) % devices:
                raise ConfigError(f"agent.{name}: {getattr(config.agent, name)} must be a multiple of "
                                  f"distributed.devices ({devices}): each device holds an equal share")

    def between_chunks(self, seeds: int, run_dir=None, seed: int = 0):
        """Host-side work between compiled chunks (`rmtjax.protocol.BetweenChunks`), or None."""
        return None

    def signals(self, metrics) -> Signals:
        raise NotImplementedError(f"{type(self).__name__}.signals: the meta-controller needs it")

    def learner(self, state) -> Learner:
        raise NotImplementedError(f"{type(self).__name__}.learner: PBT needs it")

    def with_learner(self, state, learner: Learner):
        raise NotImplementedError(f"{type(self).__name__}.with_learner: PBT needs it")

    def default_hparams(self, overrides: Mapping[str, jax.Array] | None = None):
        """The initial hyperparameters from config, with `overrides` (name -> scalar array) on top."""
        names = [f.name for f in dataclasses.fields(self.HParams)]
        values = {n: jnp.asarray(getattr(self.cfg, n), jnp.float32) for n in names}
        for k, v in (overrides or {}).items():
            if k not in values:
                raise ConfigError(f"hparams: {k!r} is not a hyperparameter of {self.config.algo}; "
                                  f"those are {', '.join(names)}")
            values[k] = jnp.asarray(v, jnp.float32)
        return self.HParams(**values)


def hparam_metrics(hparams) -> dict:
    """Every hyperparameter as a metric of the same name."""
    return {f.name: getattr(hparams, f.name) for f in dataclasses.fields(hparams)}
