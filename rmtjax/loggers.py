"""Experiment trackers beside the run directory's own logs: Weights & Biases (`train.wandb`).

The scalars are those of the run directory's TensorBoard events: `<metric>/mean` (the mean over
seeds of every metric) and `episode_return/seed_<k>` per seed, plotted against `env_steps`
(each row also carries `env_steps` and `iteration`). The run's config is the W&B config; the
summary holds the final return per seed and its mean, env steps, timings and warnings.

wandb is an optional extra (`pip install 'rmtjax[wandb]'`). `train.wandb_mode: offline` writes
the W&B run to disk only (no network, no account; `wandb sync DIR` uploads it later), `online`
streams it, `auto` leaves the choice to wandb (`WANDB_MODE`, else online). W&B keeps its files
in its own directory (`$WANDB_DIR`, else `./wandb`), never in the run directory: it places
symbolic links among them, and a run directory holds none (see `rmtjax.safefs`); a W&B
directory inside the run directory is refused, as is online mode without an API key, before the
run directory is made. For a new run the W&B run is started before its directory is made, so a
W&B that cannot start (no network) leaves no half-made run directory. A run
directory records the W&B run id in `run.json`, and a resumed run continues that W&B run; rows
computed again after the checkpoint it resumes from are logged again at the same env steps.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from rmtjax.schema import ConfigError


def check_wandb(config, run_dir=None) -> None:
    """Refuse `train.wandb: true` without the package, with W&B's own directory inside the run
    directory `run_dir` (W&B places symbolic links there, and a run directory holds none), or in
    online mode without an API key: before anything is compiled or a run directory is made."""
    if not config.train.wandb:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError("train.wandb: true needs the wandb package; install it with "
                          "pip install 'rmtjax[wandb]' or set train.wandb: false") from None
    where = wandb_dir()
    if run_dir is not None:
        inside, top = os.path.realpath(where), os.path.realpath(run_dir)
        if os.path.commonpath([inside, top]) == top:
            raise ConfigError(f"train.wandb: W&B would keep its files (and the symbolic links it makes) in "
                              f"{Path(where) / 'wandb'}, inside the run directory {run_dir}; set WANDB_DIR to a "
                              f"directory outside it (or run from another working directory)")
    if wandb_mode(config) == "online" and not _have_api_key():
        raise ConfigError("train.wandb_mode: online (or auto without WANDB_MODE) needs a W&B API key: run "
                          "`wandb login` or set WANDB_API_KEY; or set train.wandb_mode: offline (wandb sync "
                          "uploads it later)")


def wandb_dir() -> str:
    """The directory W&B keeps its files in (its `wandb/` folder goes below): `$WANDB_DIR`, else
    the working directory."""
    return os.environ.get("WANDB_DIR") or os.getcwd()


def wandb_mode(config) -> str:
    """online, offline or disabled: `train.wandb_mode`, with auto resolved as wandb does."""
    mode = config.train.wandb_mode
    if mode == "auto":
        mode = (os.environ.get("WANDB_MODE") or "online").strip().lower()
        mode = {"run": "online", "dryrun": "offline"}.get(mode, mode)
    return mode


def _have_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        auth = netrc.netrc(os.environ.get("NETRC")).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def new_run_id() -> str:
    import secrets

    return secrets.token_hex(4)  # wandb's ids are short lowercase strings


def scalars(chunk: dict[str, np.ndarray], t: int) -> dict[str, float]:
    """The scalars of row `t` of a chunk (name -> [length, num_seeds]): every metric's mean over
    seeds as `<name>/mean`, each seed's `episode_return/seed_<k>`, and `env_steps`, `iteration`
    are added by the caller."""
    out = {f"{name}/mean": float(np.mean(values[t])) for name, values in sorted(chunk.items())
           # eval_return/eval_length are NaN between periodic evaluations (train.eval_every): left out there
           if not (name.startswith("eval_") and not np.isfinite(values[t]).any())}
    for s, value in enumerate(chunk["episode_return"][t]):
        out[f"episode_return/seed_{s}"] = float(value)
    return out


class WandbLogger:
    """One W&B run for one rmtjax run: `log(chunk, first_iteration)` after every chunk,
    `finish(result)` at the end, `close()` in any case."""

    def __init__(self, config, *, run_id: str | None = None, name: str | None = None, resuming: bool = False):
        check_wandb(config)
        import wandb

        t = config.train
        mode = None if t.wandb_mode == "auto" else t.wandb_mode
        settings = wandb.Settings(console="off", silent=True, save_code=False)
        try:
            self.run = wandb.init(project=t.wandb_project, mode=mode, id=run_id or new_run_id(), name=name,
                                  resume="allow" if resuming else None, config=config.to_dict(),
                                  dir=os.environ.get("WANDB_DIR") or None, settings=settings, reinit="create_new")
        except Exception as e:  # noqa: BLE001 - no network, a refused key, a W&B server error: wandb's many kinds
            text = str(e).strip().splitlines()
            raise ConfigError(f"train.wandb: W&B could not start the run ({type(e).__name__}: "
                              f"{text[0][:200] if text else ''}); check the network and `wandb login`, or set "
                              f"train.wandb_mode: offline") from None
        # every scalar is plotted against env steps (per seed, the same for every seed)
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")

    @property
    def id(self) -> str:
        return self.run.id

    def log(self, chunk: dict[str, np.ndarray], first_iteration: int) -> None:
        length = next(iter(chunk.values())).shape[0]
        for t in range(length):
            row = scalars(chunk, t)
            row.update(env_steps=int(chunk["env_steps"][t, 0]), iteration=first_iteration + t)
            self.run.log(row)

    def finish(self, result: Any) -> None:
        fr = np.asarray(result.final_return, np.float64)
        summary = {"final_return_mean": float(np.nanmean(fr)) if np.isfinite(fr).any() else None,
                   "env_steps_per_seed": int(result.env_steps), "num_seeds": int(fr.shape[0]),
                   "compile_seconds": float(result.compile_seconds), "run_seconds": float(result.run_seconds),
                   "warnings": list(result.warnings)}
        for s, x in enumerate(fr):
            summary[f"final_return/seed_{s}"] = float(x) if np.isfinite(x) else None
        self.run.summary.update(summary)
        self.close(exit_code=0)

    def close(self, exit_code: int = 1) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None
