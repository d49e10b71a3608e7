"""Demonstration transitions for the value-based agents (DQfD-style, Hester et al. 2018).

A demonstration file is an `.npz` with one row per transition:

| key | shape | meaning |
|---|---|---|
| `obs` | [D, *obs_shape] | the observation the action was taken in (as the agent sees it: frame-stacked where `env.frame_stack` > 1) |
| `action` | [D] int (discrete) or [D, *action_shape] float (continuous, env units) | the demonstrator's action |
| `reward` | [D] | the reward it got (raw: `env.reward_scale` and `env.reward_clip` are applied on loading, as the env wrapper applies them) |
| `terminated` | [D] bool | the episode ended in a terminal state (no bootstrap) |
| `truncated` | [D] bool | the episode was cut by a time limit (the target bootstraps through it) |
| `next_obs` | [D, *obs_shape] | the observation the step ended in (before any reset) |

`save` writes such a file; `load` reads one back and checks it against the env, naming the key
and the shape that disagree.

`load` also reads a Minari dataset (`minari:<dataset_id>`, the `minari` extra): each episode's
observations [T+1], actions, rewards, terminations and truncations [T] become T transitions
(`next_obs` the observation after each step). The dataset must be on this machine already,
where Minari keeps datasets (`MINARI_DATASETS_PATH`, default `~/.minari/datasets`; fetch one with
`minari download <dataset_id>`): reading a run's config never goes to the network. Only array
observations and actions (Box, Discrete) are read; `from_minari` gives the arrays, to `save` as
an `.npz` or to inspect. The agents keep the transitions apart from the replay, in a
protected store that is never evicted, and draw a scheduled share of each minibatch from it
(`rmtjax.agents.rmt`: `agent.demonstrations`, `agent.demo_share`, ...).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rmtjax.schema import ConfigError

KEYS = ("obs", "action", "reward", "terminated", "truncated", "next_obs")
MINARI = "minari:"  # the prefix of a Minari dataset id in agent.demonstrations
MAX_BYTES = 4 << 30  # a demonstration file is held in memory (once per seed on the device)


def save(path, *, obs, action, reward, terminated, truncated, next_obs) -> Path:
    """Write demonstration transitions to `path` (an `.npz`, see the module docstring)."""
    path = Path(path)
    arrays = {"obs": obs, "action": action, "reward": reward, "terminated": terminated, "truncated": truncated,
              "next_obs": next_obs}
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    lengths = {k: v.shape[0] if v.ndim else None for k, v in arrays.items()}
    if len(set(lengths.values())) != 1 or None in lengths.values():
        raise ValueError(f"every array needs the same leading length (one row per transition), got {lengths}")
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def _read_npz(path: Path, where: str) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise ConfigError(f"{where}: no such file (an .npz with {', '.join(KEYS)}, or {MINARI}<dataset id>)")
    if path.stat().st_size > MAX_BYTES:
        raise ConfigError(f"{where}: {path.stat().st_size:,} bytes; demonstrations are held in memory, "
                          f"at most {MAX_BYTES:,} bytes")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in KEYS if k not in z.files]
            if missing:
                raise ConfigError(f"{where}: missing {', '.join(missing)} (it has {', '.join(z.files) or 'nothing'})")
            return {k: np.asarray(z[k]) for k in KEYS}
    except ConfigError:
        raise
    except (OSError, ValueError) as e:  # not a zip, a damaged member, a pickled object array
        raise ConfigError(f"{where}: not a readable .npz of arrays ({e})") from None


def from_minari(dataset_id: str, *, key: str = "agent.demonstrations") -> dict[str, np.ndarray]:
    """The transitions of the local Minari dataset `dataset_id` as the arrays of an `.npz`
    demonstration file (see the module docstring), unchecked against any env; `ConfigError`s
    name `key`."""
    where = f"{key}: {MINARI}{dataset_id}"
    try:
        import minari
    except ImportError:
        raise ConfigError(f"{where}: reading Minari datasets needs the minari extra "
                          f"(pip install 'rmtjax[minari]')") from None
    try:
        dataset = minari.load_dataset(dataset_id)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such dataset on this machine (Minari's datasets directory: "
                          f"{os.environ.get('MINARI_DATASETS_PATH', '~/.minari/datasets')}); fetch it first with "
                          f"`minari download {dataset_id}`") from None
    except Exception as e:  # noqa: BLE001 - minari's own errors for a malformed id or a damaged dataset
        raise ConfigError(f"{where}: Minari could not load it ({type(e).__name__}: {e})") from None
    parts: dict[str, list] = {k: [] for k in KEYS}
    for episode in dataset.iterate_episodes():
        obs, action = episode.observations, episode.actions
        if not isinstance(obs, np.ndarray) or not isinstance(action, np.ndarray):
            raise ConfigError(f"{where}: its observations or actions are {type(obs).__name__} / "
                              f"{type(action).__name__} (a Dict or Tuple space); only array spaces are read")
        steps = len(episode.rewards)
        if obs.shape[0] != steps + 1:
            raise ConfigError(f"{where}: episode {episode.id} has {obs.shape[0]} observations for {steps} steps "
                              f"(Minari stores one more observation than steps)")
        parts["obs"].append(obs[:-1])
        parts["next_obs"].append(obs[1:])
        parts["action"].append(action)
        parts["reward"].append(np.asarray(episode.rewards))
        parts["terminated"].append(np.asarray(episode.terminations, bool))
        parts["truncated"].append(np.asarray(episode.truncations, bool))
    if not parts["obs"]:
        raise ConfigError(f"{where}: holds no episodes")
    return {k: np.concatenate(v) for k, v in parts.items()}


def load(path, *, obs_shape: tuple, discrete: bool, num_actions: int = 0, action_shape: tuple = (),
         action_low=None, action_high=None, reward_scale: float = 1.0, reward_clip: float = 0.0,
         key: str = "agent.demonstrations") -> dict[str, np.ndarray]:
    """The transitions of the file at `path` (or of the Minari dataset `minari:<id>`), checked
    against the env (obs shape, action space) and with the env's static reward transform applied. Errors are `ConfigError`s that
    name `key`, the file and what is wrong."""
    if str(path).startswith(MINARI):
        where = f"{key}: {path}"
        data = from_minari(str(path)[len(MINARI):], key=key)
        size = sum(v.nbytes for v in data.values())
        if size > MAX_BYTES:
            raise ConfigError(f"{where}: {size:,} bytes of transitions; demonstrations are held in memory, "
                              f"at most {MAX_BYTES:,} bytes")
    else:
        path = Path(os.path.expanduser(str(path)))
        where = f"{key}: {path}"
        data = _read_npz(path, where)

    n = data["obs"].shape[0] if data["obs"].ndim else 0
    if n == 0:
        raise ConfigError(f"{where}: holds no transitions")
    for k, v in data.items():
        if v.ndim == 0 or v.shape[0] != n:
            raise ConfigError(f"{where}: '{k}' has shape {list(v.shape)}; every array needs {n} rows, as 'obs' has")
    for k in ("obs", "next_obs"):
        if tuple(data[k].shape[1:]) != tuple(obs_shape):
            raise ConfigError(f"{where}: '{k}' rows are {list(data[k].shape[1:])}, this env's observations are "
                              f"{list(obs_shape)}")
        if not np.all(np.isfinite(data[k].astype(np.float64))):
            raise ConfigError(f"{where}: '{k}' holds non-finite values")
    action = data["action"]
    if discrete:
        if action.shape[1:] != () or not np.issubdtype(action.dtype, np.integer):
            raise ConfigError(f"{where}: 'action' must be [{n}] integers for this env's discrete actions, got "
                              f"{action.dtype}{list(action.shape)}")
        if action.min() < 0 or action.max() >= num_actions:
            raise ConfigError(f"{where}: 'action' holds values in [{action.min()}, {action.max()}]; this env has "
                              f"actions 0..{num_actions - 1}")
        action = action.astype(np.int32)
    else:
        if tuple(action.shape[1:]) != tuple(action_shape):
            raise ConfigError(f"{where}: 'action' rows are {list(action.shape[1:])}, this env's actions are "
                              f"{list(action_shape)}")
        action = action.astype(np.float32)
        low, high = np.asarray(action_low, np.float32), np.asarray(action_high, np.float32)
        if not np.all(np.isfinite(action)) or np.any(action < low - 1e-6) or np.any(action > high + 1e-6):
            raise ConfigError(f"{where}: 'action' leaves the env's action bounds [{low.min()}, {high.max()}]")
    reward = data["reward"].astype(np.float32)
    if reward.shape != (n,) or not np.all(np.isfinite(reward)):
        raise ConfigError(f"{where}: 'reward' must be {n} finite numbers, got {data['reward'].dtype}{list(reward.shape)}")
    reward = reward * np.float32(reward_scale)
    if reward_clip > 0:
        reward = np.clip(reward, -reward_clip, reward_clip)
    out = {"obs": data["obs"], "action": action, "reward": reward, "next_obs": data["next_obs"]}
    for k in ("terminated", "truncated"):
        v = data[k]
        if v.shape != (n,) or not (v.dtype == bool or np.isin(v, (0, 1)).all()):
            raise ConfigError(f"{where}: '{k}' must be {n} booleans, got {v.dtype}{list(v.shape)}")
        out[k] = v.astype(bool)
    return out
