"""A run directory: what a run writes so that it can be read, resumed and evaluated.

    DIR/config.yaml      the resolved config
    DIR/run.json         how the run began: its PRNG key, rmtjax version, times it was resumed
    DIR/metrics.jsonl    one JSON object per (iteration, seed): {"iteration", "seed", metrics...}
    DIR/metrics.csv      the same rows and columns as CSV
    DIR/checkpoints/     orbax checkpoints at chunk boundaries (`rmtjax.checkpoint`)
    DIR/tensorboard/     TensorBoard events, with `train.tensorboard: true`
    DIR/summary.json     written when the run finishes
    DIR/doctor.jsonl     the training doctor's findings (`rmtjax.doctor`), rewritten after each chunk
    DIR/transfer_source.npz   a run started from another's parameters (`init_from`): them, mapped to
                         this run's seeds (what, from where and their SHA-256: run.json's `init_from`)
    DIR/unusable_checkpoints/   damaged checkpoints a resume stepped over (kept for a look)
    DIR/replay_levels/   agent.replay: hierarchical: the host and disk levels at each checkpoint
                         (their checksum kept in the checkpoint); DIR/replay_disk/ its live disk level
    DIR/timing.jsonl     wall-clock seconds of the replay's moves per chunk (apart from the metrics,
                         which are the same bytes however often a run was resumed)

`iteration` counts from 1 (the metrics after that many iterations). The checkpoint holds
every metric so far, so on resume the two log files are rewritten from it: rows logged after
the checkpoint by the interrupted process are dropped and computed again. Non-finite numbers
are `null` in JSON and `nan`/`inf` in CSV; floats are written in their shortest exact form.
The driver (`rmtjax.driver`) calls `restore`, `begin`, `record` after each chunk, and `finish`.
"""

from __future__ import annotations

import csv
import datetime
import errno
import io
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rmtjax import safefs
from rmtjax.checkpoint import Checkpoints, CheckpointWarning, Snapshot
from rmtjax.config import RUN_INDEPENDENT_FIELDS, Config, ConfigError, load_config

# what marks a directory as holding a run
_RUN_FILES = ("config.yaml", "run.json", "metrics.jsonl", "metrics.csv", "checkpoints", "summary.json",
              "transfer_source.npz")
# what a run writes besides: a new run refuses a directory holding any of these too
_RUN_EXTRAS = (".lock", "unusable_checkpoints", "tensorboard", "sweep.csv", "heatmap.png", "replay_levels",
               "replay_disk", "timing.jsonl", "doctor.jsonl")
# the columns that lead every row, in this order; the other metrics follow sorted by name
_LEADING = ("iteration", "seed", "env_steps", "episode_return", "episode_length", "episode_count")


class RunDirError(ValueError):
    """A run directory that cannot be used as asked (already holds a run, holds none, or
    belongs to another key); the message says what to do instead."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` atomically, never writing through a planted link (`rmtjax.safefs`)."""
    safefs.write_atomic(path, text)


def key_to_json(key) -> dict:
    """A single PRNG key (typed or raw uint32) as JSON: {"impl": name or null, "data": [...]}."""
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return {"impl": str(jax.random.key_impl(key)), "data": np.asarray(jax.random.key_data(key)).tolist()}
    return {"impl": None, "data": np.asarray(key).tolist()}


def key_from_json(data: dict):
    raw = np.asarray(data["data"], np.uint32)
    return jax.random.wrap_key_data(raw, impl=data["impl"]) if data["impl"] else jax.numpy.asarray(raw)


def _column_order(names, cells: bool = False) -> list[str]:
    lead = [n for n in _LEADING[2:] if n in names]
    return ["iteration", *(["cell"] if cells else []), "seed", *lead, *sorted(n for n in names if n not in lead)]


def _json_number(x: np.generic):
    if x.dtype.kind == "b":
        return bool(x)
    if x.dtype.kind in "iu":
        return int(x)
    f = float(x)
    # str() of a numpy float is its shortest exact form: 0.1 for float32(0.1), not 0.10000000149
    return float(str(x)) if math.isfinite(f) else None


_INDEX = ("iteration", "cell", "seed")  # the columns that say which row it is (plain integers)


def _rows(chunk: dict[str, np.ndarray], first_iteration: int, seeds_per_cell: int | None = None):
    """Yield one dict per (iteration, seed) of `chunk` (name -> [length, num_seeds]). In a sweep
    (`seeds_per_cell`), the run's seeds are the cells' seeds one cell after another: the row of
    run seed i has `cell` i // seeds_per_cell and `seed` i % seeds_per_cell."""
    length, seeds = next(iter(chunk.values())).shape[:2]
    for t in range(length):
        for s in range(seeds):
            row = {"iteration": first_iteration + t, "seed": s}
            if seeds_per_cell:
                row.update(cell=s // seeds_per_cell, seed=s % seeds_per_cell)
            row.update({k: v[t, s] for k, v in chunk.items()})
            yield row


def format_rows(chunk: dict[str, np.ndarray], first_iteration: int, columns: list[str],
                seeds_per_cell: int | None = None) -> tuple[str, str]:
    """The JSONL and CSV text of `chunk`'s rows."""
    jsonl, buf = [], io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in _rows(chunk, first_iteration, seeds_per_cell):
        jsonl.append(json.dumps({c: (row[c] if c in _INDEX else _json_number(row[c]))
                                 for c in columns}, allow_nan=False))
        writer.writerow([row[c] if c in _INDEX else str(row[c]) for c in columns])
    return "".join(line + "\n" for line in jsonl), buf.getvalue()


_EVAL_COLUMNS = ("eval_return", "eval_length")  # NaN on iterations without a periodic evaluation
LEVELS_DIR = "replay_levels"  # the hierarchical replay's host and disk levels at each checkpoint
TIMING = "timing.jsonl"  # wall-clock seconds of host-side work between chunks, one line per chunk


class RunDir:
    """One run directory, opened by the driver for a new run (`create`), a resumed one
    (`resume`), or only to read it (`open`)."""

    def __init__(self, path, config: Config, key, info: dict):
        self.path = Path(path)
        self.config = config
        self.key = key
        self.info = info  # the contents of run.json
        # the initial hyperparameter overrides the run began with (name -> float32 array), or None
        hp = info.get("hparams")
        self.hparams = None if hp is None else {k: np.asarray(v, np.float32) for k, v in hp.items()}
        self.checkpoints: Checkpoints | None = None
        self._lock = None
        self.resuming = False  # opened to continue the run (set by `resume`)
        self.resumed_from: int | None = None
        self._columns: list[str] | None = None
        self._tb = None
        # a sweep (`rmtjax.sweep`): {"grid": {field: values}, "seeds": seeds per cell}, else None
        self.sweep = info.get("sweep")
        self.seeds_per_cell = None if self.sweep is None else int(self.sweep["seeds"])
        # the agent's host-side state between chunks (rmtjax.protocol.BetweenChunks; the hierarchical
        # replay's host and disk levels), saved beside each checkpoint in LEVELS_DIR; set by the driver
        self.between = None

    # -- opening ------------------------------------------------------------------------
    @classmethod
    def create(cls, path, config: Config, key, hparams=None, sweep: dict | None = None, source=None,
               wandb_id: str | None = None) -> "RunDir":
        """A new run in `path` (created if missing; refused if it already holds a run).
        `hparams`: the initial hyperparameter overrides the run is given, kept for a restart;
        `sweep`: the grid of a sweep (`rmtjax.sweep`), kept in run.json; `source`: the
        `rmtjax.transfer.Source` the run starts from, kept in transfer_source.npz."""
        path = _nonempty_path(path, "run directory")
        if path.exists() and not path.is_dir():
            raise RunDirError(f"run directory {path} is a file, not a directory")
        found = [n for n in _RUN_FILES if os.path.lexists(path / n)]
        if found:
            raise RunDirError(f"{path} already holds a run ({', '.join(found)}); continue it with "
                              f"resume={str(path)!r} (rmtjax train --resume {path}) or choose a new directory")
        extras = [n for n in _RUN_EXTRAS if os.path.lexists(path / n)]
        if extras:
            raise RunDirError(f"{path} holds {', '.join(extras)} (left by another run, or planted) but no run; "
                              f"a new run writes these itself: remove them or choose a new directory")
        links = safefs.find_links(path) if os.path.lexists(path) else []
        if links:
            raise RunDirError(f"{path} holds symbolic link(s) ({', '.join(map(str, links))}); a run writes only into "
                              f"its own directory, never through a link (rmtjax makes none): remove them or choose "
                              f"a new directory")
        _check_tensorboard(config)
        path.mkdir(parents=True, exist_ok=True)
        lock = _lock(path)
        info = {"rmtjax_version": _version(), "created": _now(), "key": key_to_json(key),
                "hparams": None if hparams is None else
                {k: np.asarray(v, np.float32).tolist() for k, v in hparams.items()},
                "resumed": []}
        if sweep is not None:
            info["sweep"] = sweep
        if wandb_id is not None:  # the W&B run started for it (`train.wandb`)
            info["wandb_id"] = wandb_id
        if source is not None:
            info["init_from"] = source.describe()
            safefs.write_atomic(path / "transfer_source.npz", source.to_bytes())
        _write_atomic(path / "config.yaml", config.to_yaml())
        _write_atomic(path / "run.json", json.dumps(info, indent=2) + "\n")
        run = cls(path, config, key, info)
        run._lock = lock
        return run

    @classmethod
    def open(cls, path) -> "RunDir":
        """An existing run directory, read only: its config and key."""
        path = _nonempty_path(path, "run directory")
        if not (path / "config.yaml").is_file():
            what = "does not exist" if not path.exists() else "holds no run (no config.yaml)"
            raise RunDirError(f"run directory {path} {what}")
        config = load_config(path / "config.yaml")
        try:
            with safefs.open_regular(path / "run.json") as f:
                text = f.read(MAX_RUN_JSON_BYTES + 1)
            if len(text) > MAX_RUN_JSON_BYTES:
                raise ValueError(f"larger than {MAX_RUN_JSON_BYTES:,} bytes")
            info = json.loads(text.decode("utf-8"))
            key = key_from_json(info["key"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            raise RunDirError(f"{path / 'run.json'} is missing or unreadable ({type(e).__name__}: "
                              f"{str(e)[:200]}); it holds the run's PRNG key") from None
        _check_info(path / "run.json", info, config)
        return cls(path, config, key, info)

    @classmethod
    def resume(cls, path, config: Config | None = None, key=None, hparams=None) -> "RunDir":
        """An existing run to continue. `config` (if given) must match the run's config.yaml
        except in `RUN_INDEPENDENT_FIELDS`; `key` and `hparams` (if given) those it began with."""
        run = cls.open(path)
        links = safefs.find_links(run.path)
        if links:
            raise RunDirError(f"{run.path} holds symbolic link(s) ({', '.join(map(str, links))}); a run writes only "
                              f"into its own directory, never through a link (rmtjax makes none): remove them "
                              f"(or copy the run with cp -rL) and resume again")
        if config is not None:
            diffs = run.config.differences(config, ignore=RUN_INDEPENDENT_FIELDS)
            if diffs:
                listing = "; ".join(f"{k}: {a!r} in the run, {b!r} given" for k, a, b in diffs)
                raise ConfigError(f"{run.path} was made with another config, so it cannot be resumed with this one. "
                                  f"Fields that differ: {listing}. Resume without a config (it is read from "
                                  f"{run.path / 'config.yaml'}) or start a new run directory.")
            run.config = config
        if key is not None and key_to_json(key) != run.info["key"]:
            raise RunDirError(f"{run.path} began with another PRNG key ({run.info['key']}); resume it with that "
                              f"key or with none (the stored one is used)")
        if hparams is not None:
            given = {k: np.asarray(v, np.float32).tolist() for k, v in hparams.items()}
            if given != run.info.get("hparams"):
                raise ConfigError(f"hparams: {run.path} began with hparams {run.info.get('hparams')}, not {given}; "
                                  f"resume it without hparams (its checkpoint holds them)")
        _check_tensorboard(run.config)
        run._lock = _lock(run.path)
        run.resuming = True
        return run

    def source(self, init_from=None):
        """The `rmtjax.transfer.Source` this run began from (None if it began fresh), read back
        from transfer_source.npz and checked against its SHA-256. `init_from` (as given to a
        resume; None: not given) must name the same source."""
        from rmtjax.transfer import Source

        info = self.info.get("init_from")
        if info is None:
            if init_from is not None:
                raise RunDirError(f"{self.path} began without init_from; resume it without one")
            return None
        if isinstance(init_from, (str, os.PathLike)) and str(Path(init_from).absolute()) != info["origin"]:
            raise RunDirError(f"{self.path} began from {info['origin']}, not {Path(init_from).absolute()}; resume "
                              f"it without init_from (its source parameters are kept in the run directory)")
        try:
            with safefs.open_regular(self.path / "transfer_source.npz") as f:
                source = Source.from_bytes(f.read(), info)
        except Exception as e:  # noqa: BLE001 - a damaged zip raises BadZipFile, zlib.error, ValueError, ...
            text = str(e).strip().splitlines()
            raise RunDirError(f"{self.path / 'transfer_source.npz'} is missing or unreadable ({type(e).__name__}: "
                              f"{text[0][:200] if text else ''}); it holds the source parameters the run began "
                              f"from") from None
        if init_from is not None and not isinstance(init_from, (str, os.PathLike)):
            from rmtjax.transfer import make_source

            given = init_from.state.params if hasattr(init_from, "state") else init_from
            seeds = init_from.config.train.num_seeds if hasattr(init_from, "state") else None
            if make_source(self.config.transfer, self.config.train.num_seeds, given, seeds, "").digest() != \
                    source.digest():
                raise RunDirError(f"{self.path} began from other parameters than the ones given; resume it without "
                                  f"init_from (its source parameters are kept in the run directory)")
        return source

    def wandb_id(self) -> str:
        """The id of this run's W&B run (`train.wandb`), made and kept in run.json at first use."""
        if not self.info.get("wandb_id"):
            from rmtjax.loggers import new_run_id

            self.info["wandb_id"] = new_run_id()
            _write_atomic(self.path / "run.json", json.dumps(self.info, indent=2) + "\n")
        return self.info["wandb_id"]

    # -- the driver's calls ----------------------------------------------------------------
    def restore(self, like, *, set_aside: bool = True) -> Snapshot | None:
        """The newest usable checkpoint (None if none was written yet), with the state shaped
        like `like`, the run's fresh state (where the checkpoint holds no training doctor state
        that fits, `like`'s is taken, with a `DoctorWarning` on a resume). With `set_aside`,
        unusable newer ones are moved to unusable_checkpoints/ so that the resumed run can write
        its own checkpoints at those iterations."""
        from rmtjax import doctor

        ckpt = Checkpoints(self.path / "checkpoints")
        bare, doctor_like = doctor.split(like)  # the doctor's state is kept apart (rmtjax.checkpoint)
        try:
            self._check_config_unchanged(ckpt.saved_config())
            # a checkpoint is usable only with every part saved beside it present and intact (the
            # replay levels); otherwise the one before it is taken
            snap = ckpt.restore(bare, verify=None if self.between is None else self._verify_levels,
                                doctor_like=doctor_like)
            if snap is not None and snap.skipped and set_aside:
                moved = ckpt.set_aside([s for s, _ in snap.skipped], self.path / "unusable_checkpoints")
                warnings.warn(f"moved {len(moved)} unusable checkpoint(s) to {self.path / 'unusable_checkpoints'}",
                              CheckpointWarning, stacklevel=2)
        finally:
            ckpt.close()
        if snap is not None and doctor_like is not None:
            if snap.doctor is None:  # the agent goes on exactly; the doctor starts afresh from here
                if self.resuming:
                    warnings.warn(f"the training doctor starts afresh at iteration {snap.iterations}: the checkpoint "
                                  f"there has no doctor state to go on from ({snap.doctor_note}); the agent goes on "
                                  f"exactly", doctor.DoctorWarning, stacklevel=2)
                snap.doctor = doctor_like
            snap.state = doctor.join(like, snap.state, snap.doctor)
        finished_at = (self.read_summary() or {}).get("iterations")
        if snap is None and self.resuming:
            warnings.warn(f"{self.path} has no checkpoint yet: the run starts again from its beginning "
                          f"(same key, so the same run)", CheckpointWarning, stacklevel=2)
        elif (snap is not None and finished_at is not None and finished_at > snap.iterations
              and finished_at not in [step for step, _ in snap.skipped]):  # damaged ones were reported already
            warnings.warn(f"the final checkpoint of {self.path} (iteration {finished_at}, per summary.json) is "
                          f"missing; using the one at iteration {snap.iterations}", CheckpointWarning, stacklevel=2)
        return snap

    def _verify_levels(self, snap: Snapshot) -> None:
        self.between.restore(self.path / LEVELS_DIR, snap.iterations, snap.state, snap.parts.get(LEVELS_DIR))

    def _check_config_unchanged(self, saved) -> None:
        """Refuse to go on when config.yaml (or the config given) differs from the one the
        newest checkpoint was written with, in any field that changes what the run computes."""
        if saved is None:  # no checkpoint yet, or one written before configs were stored
            return
        step, stored = saved
        now, then = _flatten(self.config.to_dict()), _flatten(stored)
        diffs = [(k, then.get(k, "<unset>"), now.get(k, "<unset>")) for k in sorted(set(now) | set(then))
                 if k not in RUN_INDEPENDENT_FIELDS and now.get(k, "<unset>") != then.get(k, "<unset>")]
        if diffs:
            listing = "; ".join(f"{k}: {a!r} at the checkpoint, {b!r} now" for k, a, b in diffs)
            raise ConfigError(f"{self.path / 'config.yaml'} was edited after the checkpoint at iteration {step} "
                              f"was written, so the run cannot go on from it. Fields that differ: {listing}. "
                              f"Put the values back, or start a new run directory with the new config.")

    def begin(self, history: dict[str, np.ndarray] | None, done: int) -> None:
        """Start writing: logs rewritten to hold exactly the `done` iterations of `history`,
        checkpoints opened for saving, TensorBoard opened."""
        if self.resuming:
            self.resumed_from = done
            self.info.setdefault("resumed", []).append({"at": _now(), "from_iteration": done})
            _write_atomic(self.path / "run.json", json.dumps(self.info, indent=2) + "\n")
            _write_atomic(self.path / "config.yaml", self.config.to_yaml())
        jsonl, csv_text = "", ""
        if history:
            self._columns = _column_order(history, cells=self.sweep is not None)
            jsonl, csv_text = format_rows(history, 1, self._columns, self.seeds_per_cell)
            csv_text = ",".join(self._columns) + "\n" + csv_text
        _write_atomic(self.path / "metrics.jsonl", jsonl)
        _write_atomic(self.path / "metrics.csv", csv_text)
        t = self.config.train
        self.checkpoints = Checkpoints(self.path / "checkpoints", keep=t.keep_checkpoints, writable=True)
        if t.tensorboard:
            from tensorboardX import SummaryWriter

            last = int(history["env_steps"][-1, 0]) if history else 0
            # events a killed process logged after the checkpoint are hidden (purged) by TensorBoard
            purge = last + 1 if self.resumed_from is not None else None
            self._tb = SummaryWriter(logdir=str(self.path / "tensorboard"), purge_step=purge)

    def record(self, state, history: list[dict[str, np.ndarray]], chunk: dict[str, np.ndarray], done: int,
               chunks_done: int, *, final: bool) -> None:
        """After a chunk: append its rows to the logs, then checkpoint when due (every
        `train.checkpoint_every` chunks and after the last). `history` is every chunk's metrics
        so far ([length, num_seeds] each), this one included."""
        length = next(iter(chunk.values())).shape[0]
        first = done - length + 1
        if self._columns is None:
            self._columns = _column_order(chunk, cells=self.sweep is not None)
            safefs.append_text(self.path / "metrics.csv", ",".join(self._columns) + "\n")
        jsonl, csv_text = format_rows(chunk, first, self._columns, self.seeds_per_cell)
        for name, text in (("metrics.jsonl", jsonl), ("metrics.csv", csv_text)):
            safefs.append_text(self.path / name, text)
        timing = getattr(self.between, "timing", None)
        if timing is not None:  # wall-clock seconds: not metrics (a resumed run's metrics are the same bytes)
            safefs.append_text(self.path / TIMING, json.dumps({"iteration": done, **timing()}) + "\n")
        if self._tb is not None:
            self._log_tensorboard(chunk)
        if final or chunks_done % self.config.train.checkpoint_every == 0:
            stacked = {k: np.concatenate([c[k] for c in history], axis=0) for k in chunk}
            try:
                # the levels first, their checksum in the checkpoint: a crash between the two leaves
                # a level file no checkpoint names (pruned later), never a checkpoint without levels
                parts = None if self.between is None else {LEVELS_DIR: self.between.save(self.path / LEVELS_DIR, done)}
                from rmtjax import doctor

                bare, doctor_state = doctor.split(state)  # kept apart: see rmtjax.checkpoint
                self.checkpoints.save(bare, stacked, done, chunks_done, config=self.config.to_dict(), parts=parts,
                                      doctor=doctor_state)
                if self.between is not None:
                    self.between.prune(self.path / LEVELS_DIR, self.checkpoints.steps())
            except Exception as e:  # a full disk, a vanished directory: orbax raises many kinds
                kept = [s for s in self.checkpoints.steps() if s != done]
                last = f"the checkpoint at iteration {max(kept)} is kept" if kept else "no earlier checkpoint exists"
                raise RunDirError(f"could not write the checkpoint at iteration {done} into {self.path / 'checkpoints'} "
                                  f"({_os_reason(e)}); {last}: fix the cause and continue with "
                                  f"rmtjax train --resume {self.path}") from e

    def _log_tensorboard(self, chunk):
        for t in range(next(iter(chunk.values())).shape[0]):
            step = int(chunk["env_steps"][t, 0])
            for name in self._columns[len(_INDEX) if self.sweep is not None else 2:]:
                if name in _EVAL_COLUMNS and not np.isfinite(chunk[name][t]).any():
                    continue  # no periodic evaluation after this iteration (train.eval_every)
                self._tb.add_scalar(f"{name}/mean", float(np.mean(chunk[name][t])), step)
            for s, value in enumerate(chunk["episode_return"][t]):
                self._tb.add_scalar(f"episode_return/seed_{s}", float(value), step)
        self._tb.flush()

    def finish(self, result) -> None:
        """Write summary.json for a finished run (a resume that found nothing left to train
        keeps the summary of the run that did the training)."""
        iterations = int(result.metrics["env_steps"].shape[1])
        if self.resumed_from == iterations and self.read_summary() is not None:
            return
        fr = [None if not math.isfinite(x) else float(str(np.float32(x))) for x in np.asarray(result.final_return)]
        summary = {
            "algo": self.config.algo, "env": self.config.env.id, "num_seeds": self.config.train.num_seeds,
            "iterations": iterations, "env_steps_per_seed": result.env_steps,
            "final_return": fr,
            "final_return_mean": None if all(x is None for x in fr) else float(np.nanmean(result.final_return)),
            "last_episode_return": [_json_number(x) for x in result.metrics["episode_return"][:, -1]],
            "compile_seconds": round(result.compile_seconds, 3), "run_seconds": round(result.run_seconds, 3),
            "resumed_from_iteration": self.resumed_from,
            # signs that the run stopped learning (rmtjax.health); empty when there were none
            "warnings": list(getattr(result, "warnings", [])),
            "last_checkpoint": str(self.path / "checkpoints" / str(max(self.checkpoints.steps()))),
            **_best_eval(result.state),
            "finished": _now(),
        }
        _write_atomic(self.path / "summary.json", json.dumps(summary, indent=2) + "\n")

    def read_summary(self) -> dict | None:
        try:
            return json.loads((self.path / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self.checkpoints is not None:
            self.checkpoints.close()
            self.checkpoints = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._lock is not None:
            self._lock.close()  # closing the file releases the lock
            self._lock = None


def _best_eval(state) -> dict:
    """With periodic evaluation (`train.eval_every`): each seed's best evaluation return and the
    iteration it followed (its parameters are in the checkpoint: load_policy(DIR, which="best"))."""
    best = getattr(state, "best_return", None)
    if best is None:
        return {}
    ret = [_json_number(x) for x in np.asarray(jax.device_get(best))]
    return {"best_eval_return": ret,
            "best_eval_iteration": [int(x) for x in np.asarray(jax.device_get(state.best_iteration))]}


def _lock(path: Path):
    """Hold an exclusive lock on `path/.lock` while this process writes the run, so that a
    second writer is refused instead of interleaving checkpoints. The operating system drops
    the lock when the process ends, however it ends (SIGKILL included)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return None
    try:
        f = safefs.open_lock_file(path / ".lock")
    except safefs.UnsafePathError as e:
        raise RunDirError(f"{path / '.lock'} {e.strerror}; it may have been planted to make the run write "
                          f"elsewhere") from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise RunDirError(f"{path} is being written by another process (pid {holder}); wait for it to end "
                              f"or stop it before resuming") from None
        raise
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


MAX_RUN_JSON_BYTES = 64 << 20


def _check_info(where: Path, info, config: Config) -> None:
    """Refuse a run.json whose parts are not what rmtjax writes (edited or damaged): one line
    naming the part, instead of a traceback wherever it is used."""
    def bad(part: str, why: str):
        return RunDirError(f"{where}: '{part}' {why}; the file was edited or damaged (it is written by rmtjax)")

    if not isinstance(info, dict):
        raise bad("run.json", "is not a JSON object")
    seeds = config.train.num_seeds
    hp = info.get("hparams")
    if hp is not None:
        if not isinstance(hp, dict) or not all(isinstance(k, str) for k in hp):
            raise bad("hparams", "is not a mapping of names to values")
        for k, v in hp.items():
            flat = v if isinstance(v, list) else [v]
            if (len(flat) not in (1, seeds) or
                    not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in flat)):
                raise bad(f"hparams.{k[:40]}", f"is not a number or {seeds} numbers (one per seed)")
    sweep = info.get("sweep")
    if sweep is not None:
        grid = sweep.get("grid") if isinstance(sweep, dict) else None
        per_cell = sweep.get("seeds") if isinstance(sweep, dict) else None
        if (not isinstance(grid, dict) or not grid or not all(isinstance(k, str) for k in grid)
                or not all(isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                             for x in v) for v in grid.values())):
            raise bad("sweep.grid", "is not a mapping of fields to lists of numbers")
        if not isinstance(per_cell, int) or isinstance(per_cell, bool) or per_cell < 1:
            raise bad("sweep.seeds", "is not a positive integer")
        cells = math.prod(len(v) for v in grid.values())
        if cells * per_cell != seeds:
            raise bad("sweep", f"has {cells} cell(s) × {per_cell} seed(s), but config.yaml's train.num_seeds is {seeds}")
    source = info.get("init_from")
    if source is not None:
        if not isinstance(source, dict):
            raise bad("init_from", "is not a JSON object")
        n = source.get("source_seeds")
        seed_map = source.get("seed_map")
        if not isinstance(source.get("origin"), str):
            raise bad("init_from.origin", "is not a path")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise bad("init_from.source_seeds", "is not a positive integer")
        if (not isinstance(seed_map, list) or len(seed_map) != seeds or
                not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n for x in seed_map)):
            raise bad("init_from.seed_map", f"is not {seeds} source seed(s) in [0, {n - 1}]")
        digest = source.get("sha256")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise bad("init_from.sha256", "is not a SHA-256")
    wandb_id = info.get("wandb_id")
    if wandb_id is not None and (not isinstance(wandb_id, str) or not wandb_id.isalnum() or len(wandb_id) > 64):
        raise bad("wandb_id", "is not a W&B run id")
    if not isinstance(info.get("resumed", []), list):
        raise bad("resumed", "is not a list")


def _flatten(data, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _nonempty_path(path, what: str) -> Path:
    if path is None or str(path).strip() == "":
        raise RunDirError(f"{what}: an empty path was given; name a directory, e.g. --run-dir runs/ppo1")
    if "\x00" in str(path):
        raise RunDirError(f"{what}: {str(path)!r} holds a NUL character, which no path can hold")
    return Path(path)


def _os_reason(e: BaseException) -> str:
    """The operating-system cause within `e` (its chain included), else its first line."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return f"{seen.strerror}" + (f": {seen.filename}" if seen.filename else "")
        seen = seen.__cause__ or seen.__context__
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:240]}" if text else type(e).__name__


def _check_tensorboard(config: Config) -> None:
    if config.train.tensorboard:
        try:
            import tensorboardX  # noqa: F401
        except ImportError:
            raise ConfigError("train.tensorboard: true needs tensorboardX; install it with "
                              "pip install 'rmtjax[tensorboard]' or set train.tensorboard: false") from None


def _version() -> str:
    from rmtjax import __version__

    return __version__
