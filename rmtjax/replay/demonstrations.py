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
`minari download <dataset_id>`): reading never goes to the network and never creates that
directory. Only array observations and actions (Box, Discrete) of the `hdf5` data format are read,
straight from the dataset's `main_data.hdf5`; the dataset's stored `env_spec` is never used (no
environment is made from it: its entry point would be code). `from_minari` gives the arrays, to
`save` as an `.npz` or to inspect. The agents keep the transitions apart from the replay, in a
protected store that is never evicted, and draw a scheduled share of each minibatch from it
(`rmtjax.agents.rmt`: `agent.demonstrations`, `agent.demo_share`, ...).

Data is data (issue 34): `check_source` checks the config value's syntax without touching a file
(config validation calls it); `load` reads when training starts. A file is opened without
following a link at its last component and must be a regular file; with `root`, its real path
must lie under `root`. A Minari id is a name (`(namespace/)name-v<N>`), never a path. Before any
array is read, each `.npz` member's header (dtype: booleans and numbers only; shape) is read and
checked against the member's stored uncompressed size, and their total against `MAX_BYTES`.
"""

from __future__ import annotations

import os
import re
import stat
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


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
MAX_PATH = 4096  # characters of a demonstration path in a config
MAX_MEMBERS = 64  # members of an .npz (it needs six)
MAX_EPISODES = 1_000_000  # episodes of a Minari dataset
MAX_METADATA_BYTES = 1 << 20  # a Minari dataset's metadata.json
# a Minari id: (namespace/)name-v<version>, each part a name (no '.', '..', '~' or empty parts)
_MINARI_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,127}/){0,4}[A-Za-z0-9][A-Za-z0-9_.-]{0,127}-v[0-9]{1,9}")
_READABLE_KINDS = "biuf"  # booleans, integers, floats: no objects, strings, structures


def check_source(text, key: str = "agent.demonstrations") -> None:
    """Check `agent.demonstrations` by its syntax alone (no file is touched): '' (none), a path
    of an `.npz`, or `minari:<dataset id>` with a Minari id (`(namespace/)name-v<N>`)."""
    if not isinstance(text, str):
        raise ConfigError(f"{key}: expected a path or {MINARI}<dataset id> (a string), got {type(text).__name__}")
    if text == "":
        return
    if len(text) > MAX_PATH or "\x00" in text:
        raise ConfigError(f"{key}: {text[:80]!r}{'...' if len(text) > 80 else ''} is not a usable path "
                          f"(at most {MAX_PATH} characters, no NUL)")
    if text.startswith(MINARI):
        dataset_id = text[len(MINARI):]
        if not _MINARI_ID.fullmatch(dataset_id):
            raise ConfigError(f"{key}: {text!r}: a Minari dataset id is a name, (namespace/)name-v<version> "
                              f"(letters, digits, '_', '-', '.'; no '..', no leading '/'), e.g. "
                              f"{MINARI}D4RL/door/human-v2; not a path")


def _open_plain(path: Path, where: str):
    """`path` opened for reading: not through a link at its last component, and only if it is a
    regular file (not a FIFO, a device, a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file (an .npz with {', '.join(KEYS)}, or {MINARI}<dataset id>)") from None
    except OSError as e:
        if os.path.islink(path):
            raise ConfigError(f"{where}: is a symbolic link; name the file itself") from None
        raise ConfigError(f"{where}: cannot be read ({e.strerror or e})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ConfigError(f"{where}: not a regular file (an .npz with {', '.join(KEYS)})")
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), st.st_size


def _check_root(path: Path, root, where: str) -> None:
    if root is None:
        return
    real, top = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, top]) != top:
        raise ConfigError(f"{where}: lies outside {top} (it resolves to {real}); demonstrations are read from "
                          f"there only")


def _npz_members(zf, where: str) -> dict[str, tuple[np.dtype, tuple, int]]:
    """dtype, shape and data offset of each of the KEYS members, from their .npy headers alone,
    checked against the sizes the zip directory states (nothing else is decompressed)."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ConfigError(f"{where}: holds {len(infos)} members; a demonstration file holds {len(KEYS)}")
    by_name = {i.filename[:-4] if i.filename.endswith(".npy") else i.filename: i for i in infos}
    missing = [k for k in KEYS if k not in by_name]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)} (it has {', '.join(sorted(by_name)) or 'nothing'})")
    total = sum(by_name[k].file_size for k in KEYS)
    if total > MAX_BYTES:
        raise ConfigError(f"{where}: its arrays hold {total:,} bytes uncompressed; demonstrations are held in "
                          f"memory, at most {MAX_BYTES:,} bytes")
    out = {}
    for k in KEYS:
        info = by_name[k]
        with zf.open(info) as f:
            try:
                version = np.lib.format.read_magic(f)
                read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                               (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if read_header is None:
                    raise ValueError(f".npy format version {version}")
                shape, fortran, dtype = read_header(f, max_header_size=10_000)
            except (ValueError, SyntaxError, EOFError, TypeError) as e:
                raise ConfigError(f"{where}: '{k}' is not a readable .npy array ({_first_line(e)})") from None
            header = f.tell() if hasattr(f, "tell") else None
        if dtype.kind not in _READABLE_KINDS or dtype.hasobject or dtype.fields is not None or dtype.subdtype:
            raise ConfigError(f"{where}: '{k}' holds {dtype} values; demonstrations are booleans and numbers")
        count = int(np.prod(shape, dtype=object)) if shape else 1
        if header is None or count * dtype.itemsize != info.file_size - header:
            raise ConfigError(f"{where}: '{k}' claims shape {list(shape)} of {dtype} ({count * dtype.itemsize:,} "
                              f"bytes) but holds {info.file_size:,} bytes; the file is damaged")
        out[k] = (dtype, shape, fortran)
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def _read_npz(path: Path, where: str, root=None) -> dict[str, np.ndarray]:
    import zipfile

    f, size = _open_plain(path, where)
    with f:
        _check_root(path, root, where)
        if size > MAX_BYTES:
            raise ConfigError(f"{where}: {size:,} bytes; demonstrations are held in memory, at most "
                              f"{MAX_BYTES:,} bytes")
        try:
            with zipfile.ZipFile(f) as zf:
                _npz_members(zf, where)  # every header checked before any array is read
                out = {}
                for k in KEYS:
                    name = f"{k}.npy" if f"{k}.npy" in zf.namelist() else k
                    with zf.open(name) as member:
                        out[k] = np.lib.format.read_array(member, allow_pickle=False)
                return out
        except ConfigError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError) as e:
            # not a zip, truncated, a damaged member (zip's CRC), an unsupported compression
            raise ConfigError(f"{where}: not a readable .npz of arrays ({_first_line(e)})") from None


def minari_root() -> Path:
    """Where Minari keeps datasets: `MINARI_DATASETS_PATH`, else `~/.minari/datasets` (not created)."""
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env) if env else Path(os.path.expanduser("~")) / ".minari" / "datasets"


def from_minari(dataset_id: str, *, key: str = "agent.demonstrations") -> dict[str, np.ndarray]:
    """The transitions of the local Minari dataset `dataset_id` as the arrays of an `.npz`
    demonstration file (see the module docstring), unchecked against any env; `ConfigError`s
    name `key`. Read with h5py from the dataset's files: no environment is made, nothing is
    downloaded or created."""
    where = f"{key}: {MINARI}{dataset_id}"
    check_source(f"{MINARI}{dataset_id}", key)
    try:
        import h5py
    except ImportError:
        raise ConfigError(f"{where}: reading Minari datasets needs the minari extra "
                          f"(pip install 'rmtjax[minari]')") from None
    root = minari_root()
    data_dir = root / dataset_id / "data"
    if not data_dir.is_dir():
        raise ConfigError(f"{where}: no such dataset on this machine (Minari's datasets directory: {root}); fetch it "
                          f"first with `minari download {dataset_id}`")
    # every part below the datasets directory is a real directory of that name, not a link out of it
    part = root
    for name in [*dataset_id.split("/"), "data"]:
        part = part / name
        if part.is_symlink():
            raise ConfigError(f"{where}: {part} is a symbolic link; a dataset is read only from its own directory")
    meta_file, size = _open_plain(data_dir / "metadata.json", f"{where}: metadata.json")
    with meta_file:
        if size > MAX_METADATA_BYTES:
            raise ConfigError(f"{where}: metadata.json is {size:,} bytes, more than a dataset description holds")
        import json

        try:
            meta = json.loads(meta_file.read(MAX_METADATA_BYTES + 1).decode("utf-8"))
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"{where}: metadata.json is not readable JSON ({_first_line(e)})") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{where}: metadata.json is not a JSON object")
    if meta.get("data_format", "hdf5") != "hdf5":
        raise ConfigError(f"{where}: its data format is {str(meta.get('data_format'))[:40]!r}; rmtjax reads Minari's "
                          f"hdf5 format")
    main, _ = _open_plain(data_dir / "main_data.hdf5", f"{where}: main_data.hdf5")
    parts: dict[str, list] = {k: [] for k in KEYS}
    total = 0
    try:
        with main, h5py.File(main, "r") as h5:
            names = [n for n in h5.keys() if n.startswith("episode_")]
            if len(names) > MAX_EPISODES:
                raise ConfigError(f"{where}: holds {len(names):,} episodes, more than {MAX_EPISODES:,}")
            names.sort(key=lambda n: int(n[8:]) if n[8:].isdigit() else -1)
            for name in names:
                group = h5[name]
                arrays = {}
                for field in ("observations", "actions", "rewards", "terminations", "truncations"):
                    ds = group.get(field) if isinstance(group, h5py.Group) else None
                    if not isinstance(ds, h5py.Dataset):
                        raise ConfigError(f"{where}: {name}/{field} is not an array (a Dict or Tuple space, or a "
                                          f"damaged dataset); only array spaces are read")
                    if ds.dtype.kind not in _READABLE_KINDS or ds.dtype.fields is not None or ds.dtype.subdtype:
                        raise ConfigError(f"{where}: {name}/{field} holds {ds.dtype} values (encoded images, strings); "
                                          f"only numbers are read")
                    copies = 2 if field == "observations" else 1  # obs and next_obs
                    total += int(np.prod(ds.shape, dtype=object)) * ds.dtype.itemsize * copies
                    if total > MAX_BYTES:
                        raise ConfigError(f"{where}: more than {MAX_BYTES:,} bytes of transitions; demonstrations "
                                          f"are held in memory")
                    arrays[field] = ds[()]
                obs, steps = arrays["observations"], len(arrays["rewards"])
                if obs.ndim == 0 or obs.shape[0] != steps + 1:
                    raise ConfigError(f"{where}: {name} has {obs.shape[:1]} observations for {steps} steps "
                                      f"(Minari stores one more observation than steps)")
                parts["obs"].append(obs[:-1])
                parts["next_obs"].append(obs[1:])
                parts["action"].append(arrays["actions"])
                parts["reward"].append(np.asarray(arrays["rewards"]))
                parts["terminated"].append(np.asarray(arrays["terminations"], bool))
                parts["truncated"].append(np.asarray(arrays["truncations"], bool))
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - h5py's errors for a damaged or foreign file
        raise ConfigError(f"{where}: main_data.hdf5 is not a readable Minari dataset ({_first_line(e)})") from None
    if not parts["obs"]:
        raise ConfigError(f"{where}: holds no episodes")
    try:
        return {k: np.concatenate(v) for k, v in parts.items()}
    except ValueError as e:
        raise ConfigError(f"{where}: its episodes differ in shape ({_first_line(e)})") from None


def load(path, *, obs_shape: tuple, discrete: bool, num_actions: int = 0, action_shape: tuple = (),
         action_low=None, action_high=None, reward_scale: float = 1.0, reward_clip: float = 0.0,
         key: str = "agent.demonstrations", root=None) -> dict[str, np.ndarray]:
    """The transitions of the file at `path` (or of the Minari dataset `minari:<id>`), checked
    against the env (obs shape, action space) and with the env's static reward transform applied. Errors are `ConfigError`s that
    name `key`, the file and what is wrong. `root`: a directory the file's real path must lie
    under (None: anywhere). Call it when training starts, not when a config is read."""
    check_source(str(path), key)
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
        data = _read_npz(path, where, root)

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
