"""What the value-based agents (DQN, RMT) share, as functions: n-step transitions from a per-env
window, (Double-)DQN n-step TD errors, the TD loss, binned continuous actions, target updates.

Each agent file reads top to bottom on its own (act → store → learn) and calls these; nothing
here holds state beyond the small typed window.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from rmtjax.schema import ConfigError

# RMSProp as the MinAtar paper's DQN ran it (PyTorch's centered RMSprop, eps added outside the root)
RMSPROP = {"decay": 0.95, "eps": 0.01, "centered": True, "eps_in_sqrt": False}


def optimizer(name: str, lr: float):
    """The optax optimiser `name` (adam | rmsprop) with an injectable learning rate."""
    inner = optax.adam if name == "adam" else (lambda learning_rate: optax.rmsprop(learning_rate, **RMSPROP))
    return optax.inject_hyperparams(inner)(learning_rate=lr)


def updates_per_iteration(c, env) -> int:
    """Gradient updates per iteration of the agent section `c`: its replay ratio × the env steps."""
    return max(1, round(c.updates_per_step * env.num_envs * c.rollout_len))


# -- n-step transitions ------------------------------------------------------------------------
@struct.dataclass
class NStepWindow:
    """The last n steps of every env, [N, n, ...]; index 0 is the oldest."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    next_obs: jax.Array  # the observation each step ended in (pre-reset)


def empty_window(num_envs: int, n: int, obs_shape, obs_dtype, action_shape=()) -> NStepWindow:
    obs = jnp.zeros((num_envs, n) + tuple(obs_shape), obs_dtype)
    flags = jnp.zeros((num_envs, n), bool)
    return NStepWindow(obs, jnp.zeros((num_envs, n) + tuple(action_shape), jnp.int32), jnp.zeros((num_envs, n)),
                       flags, flags, obs)


def push(window: NStepWindow, obs, action, reward, terminated, done, next_obs) -> NStepWindow:
    """The window with one more step of every env (the oldest dropped)."""

    def one(buf, x):
        return jnp.concatenate([buf[:, 1:], x[:, None].astype(buf.dtype)], axis=1)

    return NStepWindow(one(window.obs, obs), one(window.action, action), one(window.reward, reward),
                       one(window.terminated, terminated), one(window.done, done), one(window.next_obs, next_obs))


def emit(window: NStepWindow) -> dict:
    """The transition that starts at the window's oldest step, cut at its first episode end:
    `rewards` [N, n] (zero past the cut), `steps` (rewards summed), `boot_obs` (the observation
    the last of them ended in) and whether that was a termination (no bootstrap)."""
    n = window.reward.shape[1]
    k = jnp.arange(n)
    first_end = jnp.where(window.done.any(1), jnp.argmax(window.done, axis=1), n - 1)  # [N]
    rows = jnp.arange(window.obs.shape[0])
    return {
        "obs": window.obs[:, 0],
        "action": window.action[:, 0],
        "rewards": jnp.where(k[None] <= first_end[:, None], window.reward, 0.0),
        "steps": (first_end + 1).astype(jnp.int32),
        "boot_obs": window.next_obs[rows, first_end],
        "terminated": window.terminated[rows, first_end],
    }


def fill_window(env, env_state, obs, window: NStepWindow, key, steps: int, num_choices: int, action_shape, to_env):
    """`steps` uniformly random steps of every env pushed into the window (so that every later
    step emits a real transition): (obs, env_state, window)."""

    def random_step(carry, k):
        obs, env_state, window = carry
        k_a, k_e = jax.random.split(k)
        action = jax.random.randint(k_a, action_shape, 0, num_choices)
        next_obs, env_state, reward, term, _, info = env.step(k_e, env_state, to_env(action))
        return (next_obs, env_state, push(window, obs, action, reward, term, info["done"], info["final_obs"])), None

    (obs, env_state, window), _ = jax.lax.scan(random_step, (obs, env_state, window), jax.random.split(key, steps))
    return obs, env_state, window


# -- Q values and TD errors --------------------------------------------------------------------
def q_of(q_all, action):
    """Q of the taken actions: q_all [B, A] with action [B], or [B, D, bins] with [B, D] (the mean
    over dimensions)."""
    picked = jnp.take_along_axis(q_all, action[..., None], axis=-1)[..., 0]
    return picked.mean(-1) if picked.ndim == 2 else picked


def nstep_td(q_all, q_next_target, chooser, batch, gamma):
    """(TD errors [B], Q of the taken actions [B]) of n-step targets: the discounted `rewards`,
    then γ^steps · Q_target(boot_obs, argmax chooser) unless the transition ended in a
    termination. `chooser` is the online network's Q at `boot_obs` (Double DQN) or the target's
    (plain DQN). The target is a constant for gradients."""
    n = batch["rewards"].shape[-1]
    ret = (batch["rewards"] * gamma ** jnp.arange(n, dtype=jnp.float32)).sum(-1)
    boot = q_of(q_next_target, jnp.argmax(chooser, axis=-1))
    discount = gamma ** batch["steps"].astype(jnp.float32) * (1.0 - batch["terminated"].astype(jnp.float32))
    q = q_of(q_all, batch["action"])
    return jax.lax.stop_gradient(ret + discount * boot) - q, q


def td_loss(td, weight, kind: str, delta: float):
    """Importance-weighted TD loss: huber (quadratic within `delta`) or mse."""
    per_item = td**2 if kind == "mse" else optax.huber_loss(td, delta=delta)
    return (weight * per_item).mean()


def update_target(params, target, polyak: bool, tau, due):
    """Polyak averaging every update, or a hard copy where `due` (an unbatched bool: a real branch)."""
    if polyak:
        return optax.incremental_update(params, target, tau)
    return jax.lax.cond(due, lambda: params, lambda: target)


# -- continuous actions as bins ----------------------------------------------------------------
def bin_values(spec, bins: int) -> np.ndarray:
    """[D, bins]: the values of each action dimension's bins, evenly over its box."""
    return np.linspace(spec.action_low.reshape(-1), spec.action_high.reshape(-1), bins).T


def bins_to_env(action, values, action_shape):
    """Bin indices [B, D] -> env actions [B, *action_shape]."""
    a = jnp.take_along_axis(jnp.asarray(values)[None], action[..., None], axis=-1)[..., 0]
    return a.reshape((action.shape[0],) + tuple(action_shape))


def nearest_bins(actions: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Env actions [B, *shape] -> the nearest bin of each dimension [B, D] (int32)."""
    flat = actions.reshape(actions.shape[0], -1)
    return np.abs(flat[:, :, None] - values[None]).argmin(-1).astype(np.int32)


def check_recurrent(c, env) -> None:
    """What a recurrent torso needs of the agent section `c` (RMT's or DQN's): whole sequences in a
    uniform replay, one-step targets, no demonstrations, sequences that hold an iteration."""
    why = f"with agent.torso: {c.torso} (sequences of seq_len steps are stored whole"
    if getattr(c, "replay", "uniform") != "uniform":
        raise ConfigError(f"agent.replay: {c.replay!r} {why}; tiered and prioritized replay rank single "
                          f"transitions): set agent.replay: uniform")
    if c.n_step != 1:
        raise ConfigError(f"agent.n_step: {c.n_step} {why}, with one-step targets inside them): set agent.n_step: 1")
    if getattr(c, "demonstrations", ""):
        raise ConfigError(f"agent.demonstrations: not supported {why}; demonstrations are single transitions)")
    if c.rollout_len > c.seq_len:
        raise ConfigError(f"agent.seq_len: {c.seq_len} is shorter than agent.rollout_len {c.rollout_len} "
                          f"{why}, one per env per iteration: every step must be in one)")
    if c.burn_in >= c.seq_len:
        raise ConfigError(f"agent.burn_in: {c.burn_in} leaves no step of agent.seq_len {c.seq_len} to learn from")
    if c.buffer_size // c.seq_len < max(c.batch_size, env.num_envs):
        raise ConfigError(f"agent.buffer_size: {c.buffer_size} holds {c.buffer_size // c.seq_len} sequences of "
                          f"agent.seq_len {c.seq_len}; it must hold agent.batch_size ({c.batch_size} sequences) "
                          f"and one iteration's {env.num_envs} (env.num_envs)")
