"""Data-parallel training over a device mesh, gradient fusion, and multi-host setup.

A run with `distributed.devices: D > 1` trains on a `jax.sharding.Mesh` of D devices with one
axis, `data`. The whole chunk of iterations runs under `jax.shard_map` over that axis:

- every device steps its own `env.num_envs / D` environments, keeps its own replay shard of
  `agent.buffer_size / D` items and samples `agent.batch_size / D` of each global minibatch;
- every device holds the same parameters, target parameters and optimiser state: each
  gradient step fuses the devices' gradients across the axis inside the compiled program
  (`Fusion.fuse`, called by the update guard `rmtjax.guard.guard`, whose state holds the
  fusion's), so all devices apply the same update;
- the metrics of an iteration are reduced across the axis (means; `episode_count` summed) by
  `reduced_step`, for every agent, before the meta-controller reads them.

The driver's state is the devices' local states stacked on a leading axis `[D, num_seeds,
...]`, sharded over `data` (parameters equal in every slot: that is their replication).
`TrainResult.state` is the first local device's state, shaped like a one-device state.

Fusion modes (`distributed.fusion`):

- `mean`: all-reduce mean of the float32 gradients;
- `topk`: each device sends the largest `topk_fraction` of its gradient entries by magnitude
  (values and int32 indices, all-gathered); with `error_feedback` the entries it did not send
  are added to its next gradient; the fused gradient is the momentum average
  `g = β·g + (1-β)·mean of the devices' sparse gradients` (β = `momentum`);
- `int8`: each tensor is quantised to integers in [-⌊127/D⌋, ⌊127/D⌋] on a scale shared by the
  devices (the all-reduced maximum), so the sum of D of them fits int8 and is all-reduced in
  int8; `error_feedback` carries the rounding error to the next step;
- `bf16`: all-reduce in bfloat16, with optional error feedback of the rounding.

The fused gradient then goes through the precision guard as on one device: clipped to the
global-norm threshold in force (which decays over training, `precision.clip_decay_to`) and
skipped on every device at once when any device's loss or gradient is not finite.

Several processes (hosts) join one mesh through `jax.distributed`: set
the environment variables `RMTJAX_COORDINATOR_ADDRESS`, `RMTJAX_NUM_PROCESSES` and
`RMTJAX_PROCESS_ID` (`rmtjax train` reads them first thing), or call `initialize(...)` with a
`DistributedConfig` before anything else in the process uses JAX; the mesh then spans every
device of every process.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rmtjax.schema import ConfigError, Section, param

AXIS = "data"
FUSIONS = ("mean", "topk", "int8", "bf16")
ENV_COORDINATOR = "RMTJAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "RMTJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "RMTJAX_PROCESS_ID"


@dataclasses.dataclass(frozen=True)
class DistributedConfig(Section):
    """Devices on the `data` mesh axis, how their gradients are fused, and multi-host setup."""

    _section = "distributed"
    devices: int = param(1, lo=1, doc="devices on the data axis, across all processes; 1: no mesh")
    fusion: str = param("mean", choices=FUSIONS, doc="how the devices' gradients are combined: mean (all-reduce), "
                                                     "topk (sparse, error feedback, momentum), int8 or bf16 "
                                                     "(quantised all-reduce)")
    topk_fraction: float = param(0.2, lo=0.0, hi=1.0, lo_open=True, doc="topk: share of gradient entries each "
                                                                         "device sends per step")
    # 0.5: on CartPole-v1 (DQN, Adam, 4 devices) β = 0.9 learnt far slower than 0.5 or 0
    momentum: float = param(0.5, lo=0.0, hi=1.0, hi_open=True, doc="topk: β of g = β·g + (1-β)·mean of the "
                                                                   "sparse gradients (0: no momentum)")
    error_feedback: bool = param(True, doc="topk/int8/bf16: add what compression dropped to the next gradient")
    coordinator_address: str = param("", doc="multi-host: host:port of process 0 (default: $"
                                             f"{ENV_COORDINATOR}); empty: one process")
    num_processes: int = param(0, lo=0, doc=f"multi-host: number of processes (0: ${ENV_NUM_PROCESSES})")
    process_id: int = param(-1, lo=-1, doc=f"multi-host: this process's index (-1: ${ENV_PROCESS_ID})")

    def validate(self):
        defaults = DistributedConfig.__dataclass_fields__
        # settings that would have no effect are refused rather than ignored
        if self.devices == 1 and self.fusion != "mean":
            raise ConfigError(f"distributed.fusion: {self.fusion!r} fuses the gradients of several devices; with "
                              f"distributed.devices: 1 there is nothing to fuse. Set devices > 1 or fusion: mean")
        for name in ("topk_fraction", "momentum"):
            if self.fusion != "topk" and getattr(self, name) != defaults[name].default:
                raise ConfigError(f"distributed.{name}: applies only with distributed.fusion: topk (it is "
                                  f"{self.fusion!r}); remove the setting or choose topk")
        if self.fusion == "mean" and self.error_feedback != defaults["error_feedback"].default:
            raise ConfigError("distributed.error_feedback: mean fusion is exact and has nothing to feed back; "
                              "remove the setting or choose topk, int8 or bf16")
        if self.fusion == "int8" and self.devices > 127:
            raise ConfigError(f"distributed.devices: {self.devices} devices leave no int8 range for each "
                              f"(the sum of their values must fit in ±127); use at most 127 or fusion: bf16")


# -- multi-host ------------------------------------------------------------------------------
def process_settings(cfg: DistributedConfig) -> tuple[str, int, int] | None:
    """(coordinator address, number of processes, this process's id) from the config, falling
    back on the RMTJAX_* environment variables; None for a single-process run."""
    address = cfg.coordinator_address or os.environ.get(ENV_COORDINATOR, "")
    if not address:
        return None
    def from_env(name, value, unset):
        if value != unset:
            return value
        raw = os.environ.get(name)
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"multi-host run ({address}): set the number of processes and this process's id "
                              f"in distributed.num_processes / distributed.process_id or ${name} "
                              f"(an integer; got {raw!r})") from None
    n = from_env(ENV_NUM_PROCESSES, cfg.num_processes, 0)
    pid = from_env(ENV_PROCESS_ID, cfg.process_id, -1)
    if n < 1 or not 0 <= pid < n:
        raise ConfigError(f"multi-host run: process id {pid} is not in [0, {n}) processes")
    return address, n, pid


def initialize(settings=None) -> bool:
    """Join the processes of a multi-host run (`jax.distributed.initialize`); True if this is one.

    `settings`: a `Config`, its `DistributedConfig`, or None (the RMTJAX_* environment
    variables alone). It must run before anything else in the process uses JAX — building a
    `Config` already does — so a script calls it first, e.g. with
    `DistributedConfig(devices=8, coordinator_address="10.0.0.1:1234", num_processes=2, process_id=i)`
    or the environment variables (`rmtjax train` reads those before anything else). On CPU the
    cross-process collectives go through gloo. Calling it again is harmless.
    """
    cfg = getattr(settings, "distributed", settings) or DistributedConfig()
    found = process_settings(cfg)
    if found is None:
        return False
    if jax.distributed.is_initialized():
        return True
    address, n, pid = found
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=address, num_processes=n, process_id=pid)
    except RuntimeError as e:
        raise RuntimeError(f"jax.distributed.initialize({address!r}, {n} processes, id {pid}) failed: {e} Call "
                           f"rmtjax.distributed.initialize(...) first thing in the process, before a config is "
                           f"built (see its docstring)") from e
    return True


def make_mesh(cfg: DistributedConfig) -> Mesh:
    """A one-axis (`data`) mesh of the first `cfg.devices` devices of all processes."""
    devices = jax.devices()
    if cfg.devices > len(devices):
        raise ConfigError(f"distributed.devices: {cfg.devices} devices asked for, {len(devices)} available "
                          f"({jax.process_count()} process(es)). On CPU, start Python with "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count={cfg.devices}")
    if jax.process_count() > 1 and cfg.devices != len(devices):
        raise ConfigError(f"distributed.devices: a multi-host mesh spans every device of every process "
                          f"({len(devices)}); got {cfg.devices}")
    return Mesh(np.asarray(devices[: cfg.devices]), (AXIS,))


# -- gradient fusion -------------------------------------------------------------------------
@struct.dataclass
class FusionState:
    """What a device carries between fused steps (None where the mode needs nothing).

    `residual`: this device's error feedback, shaped like the parameters (differs per device);
    `momentum`: the topk momentum average of the fused gradient (the same on every device).
    """

    residual: Any
    momentum: Any


def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


class Fusion:
    """The gradient fusion of a run with `cfg.devices` devices on mesh axis `axis`."""

    def __init__(self, cfg: DistributedConfig, axis: str = AXIS):
        self.cfg, self.axis, self.devices = cfg, axis, cfg.devices
        self.feedback = cfg.fusion != "mean" and cfg.error_feedback

    def init(self, params) -> FusionState:
        zeros = lambda: jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        return FusionState(residual=zeros() if self.feedback else None,
                           momentum=zeros() if self.cfg.fusion == "topk" else None)

    def fuse(self, grads, loss, state: FusionState):
        """Combine the devices' `grads` (and scalar `loss`) across the axis: `(grads, loss, state)`.

        Every device gets the same gradient and loss; the loss is NaN everywhere if any device's
        loss or gradient is not finite, so the guard skips the step on all of them at once.
        """
        finite = jnp.isfinite(loss) & _all_finite(grads)
        loss = jax.lax.pmean(jnp.where(finite, loss, jnp.nan), self.axis)
        grads = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)  # a NaN must not enter the residual
        if self.feedback:
            grads = jax.tree.map(jnp.add, grads, state.residual)
        mode = self.cfg.fusion
        if mode == "mean":
            return jax.lax.pmean(grads, self.axis), loss, state
        if mode == "bf16":
            sent = jax.tree.map(lambda g: g.astype(jnp.bfloat16), grads)
            fused = jax.tree.map(lambda s: s.astype(jnp.float32) / self.devices, jax.lax.psum(sent, self.axis))
            residual = jax.tree.map(lambda g, s: g - s.astype(jnp.float32), grads, sent)
        elif mode == "int8":
            fused, residual = self._int8(grads)
        else:
            return self._topk(grads, loss, state)
        return fused, loss, state.replace(residual=residual if self.feedback else None)

    def _int8(self, grads):
        levels = 127 // self.devices  # D values of at most `levels` sum within int8
        leaves, tree = jax.tree.flatten(grads)
        peak = jax.lax.pmax(jnp.stack([jnp.max(jnp.abs(g)) for g in leaves]), self.axis)
        scale = jnp.where(peak > 0, peak / levels, 1.0)
        q = [jnp.round(g / s).astype(jnp.int8) for g, s in zip(leaves, scale)]
        total = jax.lax.psum(q, self.axis)
        fused = [t.astype(jnp.float32) * s / self.devices for t, s in zip(total, scale)]
        residual = [g - x.astype(jnp.float32) * s for g, x, s in zip(leaves, q, scale)]
        return jax.tree.unflatten(tree, fused), jax.tree.unflatten(tree, residual)

    def _topk(self, grads, loss, state):
        flat, unravel = ravel_pytree(grads)
        n = flat.shape[0]
        k = max(1, math.ceil(self.cfg.topk_fraction * n))
        _, idx = jax.lax.top_k(jnp.abs(flat), k)
        values = flat[idx]
        all_values = jax.lax.all_gather(values, self.axis)  # [D, k]
        all_idx = jax.lax.all_gather(idx, self.axis)
        sparse_mean = jnp.zeros_like(flat).at[all_idx.reshape(-1)].add(all_values.reshape(-1)) / self.devices
        beta = self.cfg.momentum
        momentum = beta * ravel_pytree(state.momentum)[0] + (1.0 - beta) * sparse_mean
        residual = unravel(flat.at[idx].set(0.0)) if self.feedback else None
        return unravel(momentum), loss, FusionState(residual=residual, momentum=unravel(momentum))


def reduce_metrics(metrics: dict, axis: str = AXIS) -> dict:
    """An iteration's metrics over all devices: integer counts summed (`episode_count`, replay
    sizes), float statistics averaged; the clock's counts (`rmtjax.protocol.CLOCK_METRICS`:
    `env_steps`, `updates`) are the same everywhere and kept."""
    from rmtjax.protocol import CLOCK_METRICS

    out = dict(metrics)
    floats = sorted(k for k, v in metrics.items() if jnp.issubdtype(v.dtype, jnp.floating))
    if floats:
        means = jax.lax.pmean(jnp.stack([metrics[k].astype(jnp.float32) for k in floats]), axis)
        out.update({k: means[i].astype(metrics[k].dtype) for i, k in enumerate(floats)})
    ints = sorted(k for k in metrics if k not in floats and k not in CLOCK_METRICS)
    if ints:
        sums = jax.lax.psum(jnp.stack([metrics[k].astype(jnp.int32) for k in ints]), axis)
        out.update({k: sums[i].astype(metrics[k].dtype) for i, k in enumerate(ints)})
    return out


def reduced_step(config, step: Callable) -> Callable:
    """`step(state, t) -> (state, metrics)` of one device with its metrics reduced across the
    devices (`reduce_metrics`), so the meta-controller and the log see the whole run's; `step`
    itself on one device. The one place where an iteration's metrics cross the mesh."""
    if config.distributed.devices == 1:
        return step

    def reduced(state, t):
        state, metrics = step(state, t)
        return state, reduce_metrics(metrics)

    return reduced


def device_index(axis: str = AXIS) -> jax.Array:
    return jax.lax.axis_index(axis)


# -- the driver's side ------------------------------------------------------------------------
def _shard_map(f, mesh, in_specs, out_specs):
    # the stacked local states are not replication-typed; the agent reduces what must agree
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def _stack(tree):
    return jax.tree.map(lambda x: x[None], tree)


def _unstack(tree):
    return jax.tree.map(lambda x: x[0], tree)


class ShardedRun:
    """How the driver runs a config with `distributed.devices > 1` on its mesh.

    The run's state is every device's local state stacked on a leading axis `[D, ...]`,
    sharded over `data`; metrics come out replicated. Keys and hyperparameters enter as
    plain arrays (the same in every process), so the same code runs on one host or several.
    """

    def __init__(self, config, mesh: Mesh | None = None):
        self.config = config
        self.mesh = make_mesh(config.distributed) if mesh is None else mesh

    def init(self, init: Callable, compiler_options: dict | None = None) -> Callable:
        """`(keys, hparams) -> stacked state` from the batched `init(keys, hparams)`."""
        def local(key_data, hparams):
            return _stack(init(jax.random.wrap_key_data(key_data), hparams))

        sharded = jax.jit(_shard_map(local, self.mesh, (P(), P()), P(AXIS)), compiler_options=compiler_options)
        return lambda keys, hparams=None: sharded(np.asarray(jax.random.key_data(keys)), _host(hparams))

    def local_state_shapes(self, init: Callable, hparams=None):
        """The shapes of one device's batched state `init(keys, hparams)`, traced under the mesh
        (an agent's init may ask for its device index) without making it."""
        def local(key_data, hparams):
            return _stack(init(jax.random.wrap_key_data(key_data), hparams))

        seeds = self.config.train.num_seeds
        key_data = jax.eval_shape(lambda: jax.random.key_data(jax.random.split(jax.random.key(0), seeds)))
        stacked = jax.eval_shape(_shard_map(local, self.mesh, (P(), P()), P(AXIS)), key_data, _host(hparams))
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), stacked)

    def chunk(self, chunk: Callable) -> Callable:
        """`(stacked state, start, length) -> (stacked state, metrics)` from `chunk(state, start, length)`."""
        def local(state, start, length):
            state, metrics = chunk(_unstack(state), start, length)
            return _stack(state), metrics

        return _shard_map(local, self.mesh, (P(AXIS), P(), P()), (P(AXIS), P()))

    def train_fn(self, init: Callable, run: Callable) -> Callable:
        """The whole run, `(key, hparams) -> (stacked state, metrics)`, for `make_train`."""
        seeds = self.config.train.num_seeds

        def local(key_data, hparams):
            keys = jax.random.split(jax.random.wrap_key_data(key_data), seeds)
            state, metrics = run(init(keys, hparams))
            return _stack(state), metrics

        sharded = _shard_map(local, self.mesh, (P(), P()), (P(AXIS), P()))
        return lambda key, hparams=None: sharded(jax.random.key_data(key), hparams)

    def final_return(self, state) -> np.ndarray:
        """[num_seeds] mean over all devices' envs of their last completed episode's return."""
        def local(env_state):
            env_state = _unstack(env_state)
            seen = env_state.episodes_done > 0
            total = jax.lax.psum(jnp.sum(jnp.where(seen, env_state.last_return, 0.0), axis=-1), AXIS)
            count = jax.lax.psum(seen.sum(-1), AXIS)
            return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)

        fn = jax.jit(_shard_map(local, self.mesh, P(AXIS), P()))
        return np.asarray(fn(state.env_state))

    @staticmethod
    def local_state(state):
        """The first device of this process: its local state, shaped like a one-device state."""
        return jax.tree.map(lambda x: x.addressable_shards[0].data[0], state)


def _host(tree):
    return None if tree is None else jax.tree.map(np.asarray, dict(tree))


def sharded_run(config) -> ShardedRun | None:
    return ShardedRun(config) if config.distributed.devices > 1 else None


# -- what crosses the mesh -------------------------------------------------------------------
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
               "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_OP = re.compile(r"=\s*(?P<result>.+?)\s+(?P<op>" + "|".join(COLLECTIVES) + r")(?:-start)?\((?P<args>[^)]*)\)")
_SHAPE = re.compile(r"\b(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")


def _shape_bytes(text: str) -> int:
    total = 0
    for m in _SHAPE.finditer(text):
        if m.group("dtype") not in DTYPE_BYTES:
            continue
        dims = [int(d) for d in m.group("dims").split(",") if d]
        total += DTYPE_BYTES[m.group("dtype")] * int(np.prod(dims, dtype=np.int64))
    return total


def _group_size(line: str) -> int | None:
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if m:
        return len([x for x in m.group(1).split(",") if x])
    m = re.search(r"replica_groups=\[\d+,(\d+)\]", line)  # iota form: [groups, size]<=[n]
    return int(m.group(1)) if m else None


def collective_bytes(hlo_text: str) -> list[dict]:
    """Every collective in an HLO module's text: `{"op", "operand_bytes", "result_bytes",
    "group_size"}` per op. Operand bytes are what one device contributes (an all-gather's
    result is group-size times its operand); compiled HLO prints no operand types, so they
    are derived from the result type and the replica group. Ops inside loops are listed once."""
    out = []
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if m is None:
            continue
        op, result = m.group("op"), _shape_bytes(m.group("result"))
        group = _group_size(line)
        operand = _shape_bytes(m.group("args"))
        if not operand:  # no operand types printed: derive them
            if op == "all-gather":
                operand = result // group if group else result
            elif op == "reduce-scatter":
                operand = result * group if group else result
            else:
                operand = result
        out.append({"op": op, "operand_bytes": operand, "result_bytes": result, "group_size": group})
    return out
