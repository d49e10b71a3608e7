"""Checks made before anything is compiled: will the run's state fit in memory, and does the
config say exactly how many steps it trains.

**Memory.** The state a run keeps on each device (parameters, optimiser state, replay,
environment states, for every seed: `train.num_seeds` × whatever one seed holds) is known
exactly from the config by tracing `init` abstractly (`jax.eval_shape`: no array is made,
nothing is compiled). To it is added what an on-policy agent must hold during an iteration
(its rollout's observations), and what one gradient step must keep for backpropagation (each
hidden layer's output for every sample of the batch). The sum is a *lower bound* of what the run needs: a run
refused here could never fit, while one that passes may still need more for temporaries.
The memory compared against is, per device: an accelerator's allocator limit less what is in
use, or on the CPU the memory the operating system reports available (`MemAvailable`), or
`RMTJAX_MEMORY_LIMIT` (bytes, e.g. `8e9`) when that is set.

**Steps.** An iteration takes a fixed number of environment steps (e.g. `env.num_envs ×
agent.rollout_len`); a `train.total_steps` that is not a multiple of it is rounded down to
whole iterations, and said so with a `ConfigWarning`.
"""

from __future__ import annotations

import math
import os
import warnings

import jax
import numpy as np

from rmtjax.schema import ConfigError

ENV_MEMORY_LIMIT = "RMTJAX_MEMORY_LIMIT"


class MemoryLimitError(ConfigError):
    """The state a config asks for cannot fit in the device's memory; the message gives the
    estimate, the memory there is, and what to lower."""


class ConfigWarning(UserWarning):
    """A config value that is used, but not exactly as written (the message says how)."""


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"  # pragma: no cover


def tree_bytes(shapes) -> float:
    """Bytes of every array in a tree of shapes (float: sizes can exceed int64 in a bad config)."""
    total = 0.0
    for leaf in jax.tree.leaves(shapes):
        dtype = leaf.dtype
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            itemsize = 8  # a threefry key: two uint32
        else:
            itemsize = np.dtype(dtype).itemsize
        total += math.prod(float(d) for d in leaf.shape) * itemsize
    return total


def _parts(shapes) -> dict[str, float]:
    """Bytes per top-level part of a state (`replay`, `params`, `env_state`, ...)."""
    parts: dict[str, float] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        names = [getattr(k, "name", getattr(k, "key", None)) for k in path]
        names = [str(n) for n in names if n is not None and n not in ("agent", "inner")]  # the meta and doctor wrappers
        name = names[0] if names else "state"
        parts[name] = parts.get(name, 0.0) + tree_bytes(leaf)
    return parts


def device_memory(device=None) -> tuple[float, str]:
    """(bytes a run may use on `device`, where that number comes from)."""
    limit = os.environ.get(ENV_MEMORY_LIMIT)
    if limit:
        try:
            value = float(limit)
        except ValueError:
            raise ConfigError(f"${ENV_MEMORY_LIMIT}={limit!r}: expected a number of bytes, e.g. 8e9") from None
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"${ENV_MEMORY_LIMIT}={limit!r}: expected a positive number of bytes")
        return value, f"${ENV_MEMORY_LIMIT}"
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # some backends do not report
        stats = None
    if stats and stats.get("bytes_limit"):
        return float(stats["bytes_limit"] - stats.get("bytes_in_use", 0)), f"{device.platform}:{device.id} free"
    return _host_available(), "available host memory"


def _host_available() -> float:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def state_shapes(config, init, hparams=None):
    """The shapes of the batched state `init(keys, hparams)` makes for `train.num_seeds` seeds,
    without making it."""
    keys = jax.ShapeDtypeStruct((config.train.num_seeds,), jax.random.key(0).dtype)
    return jax.eval_shape(lambda k: init(k, hparams), keys)


def _rollout_bytes(config, agent) -> float:
    """What an on-policy iteration holds besides the state: its rollout's observations."""
    length = getattr(config.agent, "rollout_len", None)
    if not length:
        return 0.0
    obs = math.prod(float(d) for d in agent.spec.obs_shape) * np.dtype(agent.spec.obs_dtype).itemsize
    envs = config.env.num_envs / max(1, config.distributed.devices)
    return float(config.train.num_seeds) * envs * length * obs


def _activation_bytes(config) -> float:
    """A floor on what one gradient step holds for backpropagation: every hidden layer's
    output for each sample of the update's batch (`agent.batch_size`, or an on-policy
    minibatch), in the compute dtype, per seed."""
    c = config.agent
    hidden = getattr(c, "hidden", None)
    if not hidden:
        return 0.0
    if getattr(c, "batch_size", None):
        batch = float(c.batch_size)
    elif getattr(c, "rollout_len", None) and getattr(c, "num_minibatches", None):
        envs = config.env.num_envs / max(1, config.distributed.devices)
        batch = envs * c.rollout_len / c.num_minibatches
    else:
        return 0.0
    itemsize = 2 if getattr(config.precision, "compute", "fp32") in ("bf16", "fp16") else 4
    return float(config.train.num_seeds) * batch * float(sum(hidden)) * itemsize


def check_train_fits(config, agent, init, hparams=None, shapes=None) -> float:
    """Raise `MemoryLimitError` when the state of the run `config` describes cannot fit on one
    device; returns the estimate in bytes. Traces `init` abstractly: milliseconds to a second,
    nothing compiled or allocated. `shapes`: one device's state shapes when they are traced
    elsewhere (under the mesh of a run on several devices, `ShardedRun.local_state_shapes`).
    An agent that keeps part of its state in host RAM between chunks (the hierarchical replay's
    host level: `host_bytes(shapes)` of its `between_chunks`) has that part checked too: on a CPU
    with the device state, else against the host's available memory alone."""
    if shapes is None:
        shapes = state_shapes(config, init, hparams)
    parts = _parts(shapes)
    between = agent.between_chunks(config.train.num_seeds)
    host = between.host_bytes(shapes) if between is not None and hasattr(between, "host_bytes") else 0.0
    if host and jax.local_devices()[0].platform == "cpu":
        parts["replay host level"] = host
    elif host:
        _refuse_if_too_big({"replay host level": host}, config.train.num_seeds, "training's host RAM",
                           "lower agent.buffer_size or raise agent.disk_fraction", "the replay's host level",
                           memory=(_host_available(), "available host memory"))
    rollout = _rollout_bytes(config, agent)
    if rollout:
        parts["rollout observations"] = rollout
    activations = _activation_bytes(config)
    if activations:
        parts["activations of one update"] = activations
    _refuse_if_too_big(parts, config.train.num_seeds, "training",
                       "lower train.num_seeds, env.num_envs, agent.buffer_size or agent.hidden"
                       + (" (or raise agent.disk_fraction)" if host else ""))
    return sum(parts.values())


def check_eval_fits(config, params, env, episodes: int) -> float:
    """Like `check_train_fits`, for `episodes` greedy episodes per seed on `env` (which has
    `num_envs == episodes`): each seed's parameters and its episodes' environment states."""
    env_state = jax.eval_shape(lambda k: env.reset(k)[1], jax.random.key(0))
    seeds = config.train.num_seeds
    parts = {"params": tree_bytes(params), f"environment states of {episodes:,} episodes": tree_bytes(env_state) * seeds}
    _refuse_if_too_big(parts, seeds, "evaluation", "lower --episodes (episodes=)", "its parameters and episodes")
    return sum(parts.values())


def _refuse_if_too_big(parts: dict[str, float], seeds: int, what: str, advice: str,
                       scope: str = "its state and one update", memory=None) -> None:
    total = sum(parts.values())
    memory, source = device_memory() if memory is None else memory
    if total <= memory:
        return
    biggest = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    listing = ", ".join(f"{name} {human_bytes(b)}" for name, b in biggest)
    raise MemoryLimitError(f"{what} needs at least {human_bytes(total)} of memory per device for {scope} "
                           f"({seeds:,} seed(s); largest parts: {listing}), but there is {human_bytes(memory)} "
                           f"({source}); {advice}")


def user_stacklevel() -> int:
    """The `stacklevel` for a `warnings.warn` made by the caller of this function that names the
    first frame outside the rmtjax package: the user's line that started it, not the library's
    (the warnings module then says it once per such line)."""
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(2), 2  # the frame calling warnings.warn is level 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def check_total_steps(config, agent) -> None:
    """Warn when `train.total_steps` is not a whole number of iterations (it is rounded down)."""
    per = agent.steps_per_iteration
    total = config.train.total_steps
    done = agent.num_iterations * per
    if total % per:
        choices = f"{done:,}" + (f" or {done + per:,}" if done + per <= 2**31 - 1 else "")
        warnings.warn(f"train.total_steps: {total:,} is not a multiple of the {per:,} env steps of one iteration; "
                      f"the run trains {agent.num_iterations:,} iteration(s) = {done:,} env steps per seed "
                      f"(set train.total_steps: {choices} to say so)", ConfigWarning,
                      stacklevel=user_stacklevel())
