"""gymnasium environments (`gymnasium:<id>`), run on the host inside the compiled program.

A `GymnasiumEnv` holds one gymnasium vector env (`sync` or `async`, with same-step
auto-reset, so a finished episode's last observation comes back beside the reset one) and is
stepped by one host call per vectorised step (`rmtjax.envs.host.batched_host_call`). It
plugs into `VecEnv` as a *batched* environment: the wrappers, the termination/truncation
semantics and the pre-reset `final_obs` are the same as for gymnax envs.

What differs from a JAX environment, and what this adapter does about it:

- **Seeds.** A host env cannot be `vmap`ped. Under `vmap` (the driver's seeds, a
  hyperparameter grid) the batches are folded into one host vector env of
  `num_seeds × num_envs` (× grid size) environments, stepped by one call; seed `s` owns
  environments `s·N … s·N+N-1`.
- **Keys.** `reset(key)` seeds every environment from `key` (one 32-bit seed each, drawn with
  `jax.random.bits`), so a run is reproducible from its key. Later automatic resets use each
  environment's own generator, seeded by that first reset; the per-step keys are not used.
- **State.** The JAX state holds only a token (generation, step count). The host env cannot
  rewind: stepping anything but the latest state raises a `RuntimeError`, as does a second
  run that resets the same host env while another run is still using it.
- **Cost.** Every step leaves the compiled program, copies observations to the host and back,
  and steps the environments one by one in Python: far slower than a native JAX env (see
  docs/guides/environments.md for numbers). Use it for environments that exist only in gymnasium.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rmtjax.envs.host import batched_host_call

VECTORIZATION_MODES = ("sync", "async")


class UnsupportedEnv(ValueError):
    """The gymnasium env has a space this adapter cannot carry."""


@struct.dataclass
class HostToken:
    """The JAX side of a host environment: which reset it belongs to and how far it has gone."""

    generation: jax.Array  # [N] int32
    step: jax.Array  # [N] int32


class GymnasiumEnv:
    """`num_envs` copies of the gymnasium env `name`, made with `gymnasium.make(name, **kwargs)`.

    `reset(key, params) -> (obs [N, *obs_shape], HostToken)`;
    `step(key, token, action [N, ...], params) -> (obs, token, reward, terminated, truncated,
    {"final_observation": obs before any reset})`, all batched over the N environments.
    """

    batched = True  # VecEnv calls reset/step on the whole batch instead of vmapping them

    def __init__(self, name: str, num_envs: int, kwargs: dict | None = None, vectorization: str = "sync",
                 wrappers: tuple = (), label: str | None = None):
        import gymnasium as gym

        if vectorization not in VECTORIZATION_MODES:
            raise ValueError(f"vectorization must be one of {VECTORIZATION_MODES}, got {vectorization!r}")
        self.name = name
        self.label = label or f"gymnasium:{name}"  # the id as the user wrote it, for messages
        self.num_envs = num_envs
        self.kwargs = dict(kwargs or {})
        self.vectorization = vectorization
        self.wrappers = tuple(wrappers)  # applied to each env after gymnasium.make (picklable, for async)
        probe = gym.make(name, **self.kwargs)
        for wrap in self.wrappers:
            probe = wrap(probe)
        try:
            self._obs_space = probe.observation_space
            self._action_space = probe.action_space
            spec = probe.spec
            self.max_episode_steps = None if spec is None else spec.max_episode_steps
        finally:
            probe.close()
        if not isinstance(self._obs_space, (gym.spaces.Box, gym.spaces.Discrete)):
            raise UnsupportedEnv(f"observation space {self._obs_space} is not supported (Box or Discrete only)")
        if not isinstance(self._action_space, (gym.spaces.Box, gym.spaces.Discrete)):
            raise UnsupportedEnv(f"action space {self._action_space} is not supported (Box or Discrete only)")
        self.obs_shape = tuple(self._obs_space.shape)
        self.obs_dtype = jax.dtypes.canonicalize_dtype(self._obs_space.dtype)  # float64 -> float32 without x64
        self._discrete = isinstance(self._action_space, gym.spaces.Discrete)

        self._vec = None  # the host vector env, made at the first reset (its size is known only then)
        self._size = 0
        self._generation = 0
        self._steps = 0

        def obs(m):
            return jax.ShapeDtypeStruct((m, *self.obs_shape), self.obs_dtype)

        def per_env(dtype):
            return lambda m: jax.ShapeDtypeStruct((m,), dtype)

        i32, f32, b = per_env(jnp.int32), per_env(jnp.float32), per_env(jnp.bool_)
        self._reset_call = batched_host_call(self._host_reset, lambda m: (obs(m), i32(m), i32(m)))
        self._step_call = batched_host_call(
            self._host_step, lambda m: (obs(m), f32(m), b(m), b(m), obs(m), i32(m), i32(m)))

    # -- gymnax-like interface (used by VecEnv) -------------------------------------------
    def action_space(self, params=None):
        return self._action_space

    def reset(self, key: jax.Array, params=None):
        seeds = jax.random.bits(key, (self.num_envs,), jnp.uint32)
        obs, generation, step = self._reset_call(seeds)
        return obs, HostToken(generation, step)

    def step(self, key: jax.Array, state: HostToken, action: jax.Array, params=None):
        del key  # automatic resets draw from each env's own generator, seeded at reset
        obs, reward, terminated, truncated, final, generation, step = self._step_call(
            state.generation, state.step, action)
        return obs, HostToken(generation, step), reward, terminated, truncated, {"final_observation": final}

    def render_index(self, token: HostToken, index: int) -> np.ndarray:
        """The current frame of host environment `index` (of the whole host batch: seed `s`
        owns `s·N … s·N+N-1`), uint8 [H, W, 3]. `token` is the JAX state's token, checked to
        be the host env's latest (a host env can draw only where it is now). Needs an env made
        with `render_mode="rgb_array"` (`env.params.render_mode: rgb_array`; the atari: adapter
        sets it)."""
        from rmtjax.envs.functional import as_uint8_frame

        generation, step = np.asarray(token.generation).reshape(-1), np.asarray(token.step).reshape(-1)
        if self._vec is None:
            raise RuntimeError(f"{self.label}: render before any reset")
        if np.any(generation != self._generation) or np.any(step != self._steps):
            raise RuntimeError(f"{self.label}: render of a stale state; a host env draws only its latest state")
        if not 0 <= index < self._size:
            raise IndexError(f"{self.label}: env index {index} is outside the host batch of {self._size}")
        if self.kwargs.get("render_mode") != "rgb_array":
            raise NotImplementedError(f"{self.label}: made without render_mode='rgb_array'; set "
                                      f"env.params.render_mode: rgb_array to draw frames")
        return as_uint8_frame(self._vec.call("render")[index])

    def close(self):
        if self._vec is not None:
            self._vec.close()
            self._vec, self._size = None, 0

    # -- host side ----------------------------------------------------------------------
    def _make_vec(self, size: int):
        import gymnasium as gym

        vector_kwargs = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        if self.vectorization == "async":
            vector_kwargs["context"] = "spawn"  # forking a process that runs JAX's thread pools can deadlock
        return gym.make_vec(self.name, num_envs=size, vectorization_mode=self.vectorization,
                            vector_kwargs=vector_kwargs, wrappers=self.wrappers or None, **self.kwargs)

    def _host_reset(self, seeds):
        seeds = np.asarray(seeds)
        if self._vec is None or self._size != seeds.shape[0]:
            self.close()
            self._vec, self._size = self._make_vec(seeds.shape[0]), seeds.shape[0]
        obs, _ = self._vec.reset(seed=[int(s) for s in seeds])
        self._generation += 1
        self._steps = 0
        m = self._size
        return (np.asarray(obs, self.obs_dtype), np.full(m, self._generation, np.int32), np.zeros(m, np.int32))

    def _host_step(self, generation, step, action):
        generation, step = np.asarray(generation), np.asarray(step)
        if self._vec is None:
            raise RuntimeError(f"{self.label}: stepped before any reset")
        if generation.shape[0] != self._size:
            raise RuntimeError(f"{self.label}: a step for {generation.shape[0]} environments reached a "
                               f"host vector env of {self._size}; reset with the same batching as you step")
        if np.any(generation != self._generation) or np.any(step != self._steps):
            raise RuntimeError(
                f"{self.label}: stepped from a stale state (reset #{generation.max()}, step {step.max()}) "
                f"while the host env is at reset #{self._generation}, step {self._steps}. A host environment only "
                f"moves forward: step each state once, in order, and do not run two programs on one env at a time.")
        action = np.asarray(action)
        if self._discrete:
            action = action.astype(np.int64) + int(self._action_space.start)
        else:
            action = action.astype(self._action_space.dtype)
        obs, reward, terminated, truncated, info = self._vec.step(action)
        obs = np.asarray(obs, self.obs_dtype)
        final = obs.copy()
        if "final_obs" in info:
            for i in np.flatnonzero(info["_final_obs"]):
                final[i] = info["final_obs"][i]
        self._steps += 1
        m = self._size
        return (obs, np.asarray(reward, np.float32), np.asarray(terminated, bool), np.asarray(truncated, bool),
                final, np.full(m, self._generation, np.int32), np.full(m, self._steps, np.int32))


# -- the adapter's registry interface ------------------------------------------------------
def _module_of(name: str) -> str | None:
    """The module of a `module:EnvId` name (gymnasium's own syntax for plugin envs), else None."""
    return name.split(":", 1)[0] if ":" in name else None


def _valid_module_name(module: str) -> bool:
    return bool(module) and all(part.isidentifier() for part in module.split("."))


def _import_allowed_module(name: str) -> None:
    """Import the module of a `module:EnvId` name, which only happens when the user allowed it
    (`rmtjax.envs.allow_import`, `--allow-import`) or imported it already: a config names the
    module, and importing runs its code."""
    import importlib
    import sys

    from rmtjax.schema import ConfigError
    from rmtjax.envs.imports import allowed_imports

    module = _module_of(name)
    if module is None or module in sys.modules:
        return
    if module not in allowed_imports():
        raise ConfigError(
            f"env.id: gymnasium:{name} asks to import the Python module {module!r}, which runs its code; rmtjax "
            f"imports a module named by a config only when you allow it: rmtjax train/eval --allow-import {module}, "
            f"or rmtjax.envs.allow_import({module!r}) in Python (or import it yourself first)")
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"env.id: gymnasium:{name}: the module {module!r} does not import ({e})") from None


def has(name: str) -> bool:
    """Whether gymnasium has `name`. A `module:EnvId` name is checked only as far as possible
    without importing its module (reading a config never runs code it names): its module
    name must be valid, and if the module is imported already, the id must be registered."""
    import sys

    import gymnasium as gym

    module = _module_of(name)
    env_id = name.split(":", 1)[1] if module is not None else name
    if module is not None:
        if not _valid_module_name(module) or not env_id:
            return False
        if module not in sys.modules:
            return True  # checked when the env is built, after the import is allowed
    return env_id in gym.registry


def names() -> list[str]:
    import gymnasium as gym

    return sorted(gym.registry)


def make(name: str, env_cfg):
    """A `VecEnv` over `GymnasiumEnv(name)`; `env.params` are keyword arguments of `gymnasium.make`."""
    import gymnasium as gym

    from rmtjax.schema import ConfigError
    from rmtjax.envs.vec import VecEnv

    _import_allowed_module(name)
    if not has(name):
        raise ConfigError(f"env.id: the module {_module_of(name)!r} does not register a gymnasium environment "
                          f"{name.split(':', 1)[1]!r}")
    try:
        env = GymnasiumEnv(name, env_cfg.num_envs, env_cfg.params, env_cfg.host_vectorization)
    except gym.error.DependencyNotInstalled as e:
        hint = " Box2D environments: pip install 'rmtjax[box2d]'." if "box2d" in str(e).lower() else ""
        raise ConfigError(f"env.id: gymnasium:{name} needs a package that is not installed: {e}.{hint}") from None
    except UnsupportedEnv as e:
        raise ConfigError(f"env.id: gymnasium:{name}: {e}") from None
    except TypeError as e:
        raise ConfigError(f"env.params: gymnasium.make({name!r}, **{env_cfg.params}) failed: {e}") from None
    return VecEnv(env, None, env_cfg)
