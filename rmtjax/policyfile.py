"""A single-file policy: one seed's greedy policy (parameters, observation statistics and the
config) in one `.policy` file, written by `rmtjax export RUN out.policy` / `export_policy` and
read by `rmtjax.load_policy(file)`.

The file is a NumPy `.npz` archive (a zip of `.npy` arrays): `config.yaml` (the run's config as
YAML text, with `train.num_seeds: 1`), `format` (this format's name and version) and one array
per parameter leaf (`params/<path>`) and observation-statistics leaf (`obs_stats/<path>`).
Reading it runs no code: arrays are loaded with `allow_pickle=False`, the config is parsed with
the safe YAML loader and validated like any config (an env id that would import a module is
refused unless allowed), every member's size is bounded before it is read, and the arrays must
match, by path, shape and dtype, the parameters the config's agent builds.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rmtjax.schema import ConfigError

FORMAT = "rmtjax-policy-1"
MAX_FILE_BYTES = 4 << 30  # far above any policy this project trains
MAX_MEMBERS = 100_000


class PolicyFileError(ConfigError):
    """A policy file that cannot be read (the message says why)."""


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _flat(tree, prefix: str) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {f"{prefix}/{_path_name(p)}": np.asarray(jax.device_get(v)) for p, v in leaves}


def write(path, config, params, obs_stats) -> Path:
    """Write one seed's `params` and `obs_stats` (unbatched pytrees; `obs_stats` may be None)
    with `config` into `path` (atomically, never through a link: `rmtjax.safefs`)."""
    from rmtjax import safefs

    path = Path(path)
    one = config.override({"train.num_seeds": 1})
    arrays = {**_flat(params, "params"), **({} if obs_stats is None else _flat(obs_stats, "obs_stats"))}
    buf = io.BytesIO()
    np.savez(buf, format=np.asarray(FORMAT), **{"config.yaml": np.asarray(one.to_yaml())}, **arrays)
    safefs.write_atomic(path, buf.getvalue())
    return path


def read(path) -> tuple[Any, Any, Any]:
    """`(config, params, obs_stats)` of a policy file, checked against the agent the config
    builds (`obs_stats` None when it trained without observation normalisation)."""
    from rmtjax import configfile
    from rmtjax.agents import build_agent
    from rmtjax.config import Config

    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise PolicyFileError(f"{path} is larger than {MAX_FILE_BYTES:,} bytes; it is not a policy file")
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise PolicyFileError(f"cannot read policy file {path}: {e.strerror or e}") from None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            infos = z.infolist()
            if len(infos) > MAX_MEMBERS or sum(i.file_size for i in infos) > MAX_FILE_BYTES:
                raise PolicyFileError(f"{path} holds more than a policy file may (members or unpacked size)")
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise PolicyFileError(f"{path} is not a policy file written by rmtjax export ({type(e).__name__}: {e})") from None
    if str(arrays.get("format", "")) != FORMAT:
        raise PolicyFileError(f"{path} is not a policy file of format {FORMAT} (write one with rmtjax export RUN "
                              f"out.policy)")
    text = str(arrays["config.yaml"]) if "config.yaml" in arrays else ""
    if len(text) > configfile.MAX_CONFIG_BYTES:
        raise PolicyFileError(f"{path}: its config is larger than {configfile.MAX_CONFIG_BYTES:,} bytes")
    try:
        config = Config.from_dict(configfile.parse_yaml(text))
    except Exception as e:  # noqa: BLE001 (YAML errors of every kind)
        if isinstance(e, ConfigError):
            raise PolicyFileError(f"{path}: its config: {e}") from None
        raise PolicyFileError(f"{path}: its config is not readable YAML ({type(e).__name__})") from None
    agent = build_agent(config)
    like = jax.eval_shape(agent.init, jax.random.key(0))
    params = _fill(path, like.params, arrays, "params")
    stats_like = like.env_state.obs_stats
    stats = None if stats_like is None else _fill(path, stats_like, arrays, "obs_stats")
    return config, params, stats


def _fill(path, like, arrays: dict, prefix: str):
    leaves, treedef = jax.tree_util.tree_flatten_with_path(like)
    out = []
    for p, shape in leaves:
        name = f"{prefix}/{_path_name(p)}"
        if name not in arrays:
            raise PolicyFileError(f"{path}: {name} is missing (the file does not fit its config's agent)")
        a = arrays[name]
        if a.shape != tuple(shape.shape) or a.dtype != shape.dtype:
            raise PolicyFileError(f"{path}: {name} is {a.dtype}{list(a.shape)}, the agent's is "
                                  f"{shape.dtype}{list(shape.shape)}")
        out.append(a)
    return jax.tree_util.tree_unflatten(treedef, out)


def as_state(params, obs_stats):
    """A one-seed view (`params`, `env_state.obs_stats`, each with a leading seed axis of 1)
    that `rmtjax.make_policy` reads."""
    from rmtjax.evaluation import _ParamsView

    batch = lambda x: np.asarray(x)[None]  # noqa: E731
    return _ParamsView(jax.tree.map(batch, params), _StatsView(None if obs_stats is None
                                                               else jax.tree.map(batch, obs_stats)))


class _StatsView:
    def __init__(self, obs_stats):
        self.obs_stats = obs_stats
