"""Checkpoints of a run: the full typed state, the metrics so far and the driver's count of
iterations, saved with orbax at chunk boundaries and restored with fallback.

A checkpoint is one orbax step directory, `DIR/<iterations done>/`, holding three items:

- `state`: the agent state batched over seeds, as the driver holds it (typed PRNG keys
  included) but without the training doctor's level (`rmtjax.doctor.split`);
- `history`: every metric so far, name -> array `[iterations done, num_seeds]`;
- `meta`: JSON with the iterations and chunks done, a SHA-256 of `state` and of `history`,
  and the run's config (as a mapping, with its SHA-256) so that a resume can tell when the
  config.yaml beside it was edited since;

and a fourth, `doctor`, when the run has the training doctor on: its `DoctorState` (with its
SHA-256 in `meta`). It only observes, so a checkpoint without it (doctor off, or written before
the doctor existed) restores the same agent state, and one whose `doctor` item is missing,
unreadable or shaped otherwise restores with `Snapshot.doctor` None.

Orbax writes a step into `<step>.orbax-checkpoint-tmp` and renames it to `<step>` only after
everything is on disk (`commit_success.txt` last), so a process killed mid-write leaves the
earlier checkpoints as they were and the half-written one unlisted; a writer deletes such
leftovers when it opens the directory. The digests catch what a rename cannot: a checkpoint
damaged later. `restore` walks back from the newest checkpoint to the first usable one and
says with a `CheckpointWarning` which ones it skipped and why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

FORMAT = 1


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was needed; the message lists what was found and why
    each was rejected."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (damaged or unreadable) in favour of an earlier one."""


@dataclasses.dataclass
class Snapshot:
    """What one checkpoint holds."""

    state: Any  # the agent state, batched over seeds
    history: dict[str, np.ndarray]  # name -> [iterations, num_seeds]
    iterations: int  # iterations done per seed
    chunks: int  # compiled chunks done
    step: int  # the orbax step (== iterations)
    skipped: list[tuple[int, str]]  # newer checkpoints that were unusable: (step, reason)
    config: dict | None = None  # the config the run had when this checkpoint was written (None: older format)
    parts: dict = dataclasses.field(default_factory=dict)  # checksums of the run's files saved with it (`save(parts=)`)
    doctor: Any = None  # the training doctor's state saved with it (None: none saved, or not asked for)
    doctor_note: str = ""  # why `doctor` is None although it was asked for


def config_digest(config_dict: dict) -> str:
    """SHA-256 of a config mapping (`Config.to_dict()`), independent of key order."""
    return hashlib.sha256(json.dumps(config_dict, sort_keys=True).encode()).hexdigest()


def tree_digest(tree) -> str:
    """SHA-256 over every leaf's path, dtype, shape and bytes (typed PRNG keys by their data)."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        arr = np.ascontiguousarray(jax.device_get(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _ocp():
    # orbax is imported on first use: reading a config or training without a run directory
    # does not pay for it
    import orbax.checkpoint as ocp

    _quiet_closed_loop_callbacks()
    return ocp


def _quiet_closed_loop_callbacks() -> None:
    """When a restore fails, orbax closes its asyncio event loop while tensorstore reads are
    still in flight; each of them then reports "RuntimeError: Event loop is closed" through
    `sys.unraisablehook` from its own thread — dozens of tracebacks after the one clear
    message (issue 20). Those, and only those, are dropped; anything else still reaches the
    hook that was installed before."""
    import sys

    previous = sys.unraisablehook
    if getattr(previous, "_rmtjax_quiet", False):
        return

    def hook(unraisable):
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        previous(unraisable)

    hook._rmtjax_quiet = True
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_drop_unretrieved_read_errors)
    quiet_unawaited_metadata_reads()


def quiet_unawaited_metadata_reads() -> None:
    """The same failed restore can leave orbax's metadata read, a coroutine it created but
    never ran, for the garbage collector; collected at interpreter exit it prints
    "sys:1: RuntimeWarning: coroutine 'Store._get_array_metadatas' was never awaited" after
    the one clear message (seen in CI now and then: it depends on when the loop closes).
    This filter drops that warning and no other.

    At exit the `warnings` module is gone and CPython's C side filters with the list it read
    at the last warning it handled, which may be a copy a library made in its own
    `catch_warnings` block long before. So after adding the filter this issues one warning of
    a category that is always ignored, which makes the C side read the current list. The CLI
    calls this when a command has returned, outside its own `catch_warnings` block."""
    warnings.filterwarnings("ignore", message=r"coroutine 'Store\._get_array_metadatas' was never awaited",
                            category=RuntimeWarning)
    warnings.filterwarnings("ignore", category=_FiltersRead)
    warnings.warn("the filters, read", _FiltersRead)


class _FiltersRead(Warning):
    """Never shown (see `quiet_unawaited_metadata_reads`)."""


def _drop_unretrieved_read_errors(record) -> bool:
    """The same failed restore can leave futures whose tensorstore read error nobody awaited;
    when they are collected, asyncio logs "Future exception was never retrieved" with the
    whole traceback. `Checkpoints.restore` already reports that error in one line, so those
    records (a tensorstore read error or the closed loop, nothing else) are dropped."""
    if not record.getMessage().startswith(("Future exception was never retrieved",
                                           "Task exception was never retrieved")):
        return True
    exc = record.exc_info[1] if record.exc_info else None
    text = str(exc)
    return not (exc is not None and ("tensorstore_spec" in text or text == "Event loop is closed"))


class Checkpoints:
    """The checkpoints in one directory. `writable=True` opens it for saving (creating it,
    deleting half-written leftovers, keeping the newest `keep`); otherwise it is only read."""

    def __init__(self, directory, *, keep: int | None = None, writable: bool = False):
        ocp = _ocp()
        self.directory = Path(directory).absolute()
        self.writable = writable
        # A reader is a manager that never saves (orbax's read_only mode only adds log noise).
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=writable, cleanup_tmp_directories=writable,
            # the driver donates the state to the next chunk right after a save returns
            enable_async_checkpointing=False,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options,
            item_handlers={"state": ocp.StandardCheckpointHandler(), "history": ocp.StandardCheckpointHandler(),
                           "meta": ocp.JsonCheckpointHandler(), "doctor": ocp.StandardCheckpointHandler()})

    def steps(self) -> list[int]:
        """Finished checkpoints, oldest first (half-written ones are not listed)."""
        if not self.directory.exists():
            return []
        return sorted(self._manager.all_steps())

    def save(self, state, history: dict[str, np.ndarray], iterations: int, chunks: int,
             config: dict | None = None, parts: dict | None = None, doctor=None) -> None:
        """Write a checkpoint at step `iterations` and return when it is complete on disk.
        `config`: the run's config as a mapping, stored with its digest; `parts`: checksums of
        files written beside it (name -> str; the replay levels), which `restore`'s `verify` checks;
        `doctor`: the training doctor's state, kept apart from `state` (see the module's doc)."""
        assert self.writable, "a checkpoint directory opened for reading does not save"
        ocp = _ocp()
        history = {k: np.asarray(v) for k, v in history.items()}
        meta = {"format": FORMAT, "iterations": int(iterations), "chunks": int(chunks),
                "state_sha256": tree_digest(state), "history_sha256": tree_digest(history)}
        if config is not None:
            meta.update(config=config, config_sha256=config_digest(config))
        if parts:
            meta["parts"] = dict(parts)
        items = {}
        if doctor is not None:
            meta["doctor_sha256"] = tree_digest(doctor)
            items["doctor"] = ocp.args.StandardSave(doctor)
        self._manager.save(int(iterations), force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), history=ocp.args.StandardSave(history),
            meta=ocp.args.JsonSave(meta), **items))
        self._manager.wait_until_finished()

    def restore(self, like, verify=None, doctor_like=None) -> Snapshot | None:
        """The newest usable checkpoint, its state shaped and placed like `like` (an example
        state: arrays or `jax.ShapeDtypeStruct`s with shardings). None if there is no
        checkpoint at all; `CheckpointError` if there are some and none is usable. Each
        skipped one is reported with a `CheckpointWarning`. `verify(snapshot)`: also checks
        (and loads) the files saved beside a checkpoint; an exception it raises makes the
        checkpoint unusable, as damage within it does. `doctor_like`: an example training doctor
        state to restore too (None: not asked for); where it cannot be, `Snapshot.doctor` is None
        and `Snapshot.doctor_note` says why (the checkpoint stays usable)."""
        steps = self.steps()
        if not steps:
            return None
        skipped: list[tuple[int, str]] = []
        for step in reversed(steps):
            try:
                snap = self._restore_step(step, like)
                if doctor_like is not None:
                    snap.doctor, snap.doctor_note = self._restore_doctor(step, doctor_like)
                if verify is not None:
                    verify(snap)
            except Exception as e:  # orbax and tensorstore raise many kinds of error for damaged files
                skipped.append((step, _reason(e)))
                continue
            for bad, why in skipped:
                warnings.warn(f"checkpoint {self.directory / str(bad)} is unusable ({why}); "
                              f"falling back to the one at iteration {step}", CheckpointWarning, stacklevel=3)
            snap.skipped = skipped
            return snap
        listing = "; ".join(f"{self.directory / str(s)}: {why}" for s, why in skipped)
        raise CheckpointError(f"no usable checkpoint in {self.directory} ({len(skipped)} found, none readable): "
                              f"{listing}. Move them away to start the run again from its key.")

    def _restore_step(self, step: int, like) -> Snapshot:
        ocp = _ocp()
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # orbax's own notes about metadata are not for the user
            out = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), history=ocp.args.StandardRestore(),
                meta=ocp.args.JsonRestore()))
        meta, state = out.meta, out.state
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"meta is not an rmtjax checkpoint description (format {FORMAT})")
        history = {k: np.asarray(v) for k, v in out.history.items()}
        if meta["iterations"] != step:
            raise ValueError(f"meta says {meta['iterations']} iterations, the step is {step}")
        if jax.tree.structure(state) != jax.tree.structure(like):
            raise ValueError("the state's structure differs from this agent's")
        for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(like)):
            if got.shape != want.shape or got.dtype != want.dtype:
                raise ValueError(f"a state array is {got.dtype}{list(got.shape)}, this agent's is {want.dtype}{list(want.shape)}")
        if any(v.shape[:1] != (step,) for v in history.values()):
            raise ValueError(f"the metric history does not have {step} iterations")
        if tree_digest(state) != meta["state_sha256"]:
            raise ValueError("the state does not match its SHA-256 (damaged files)")
        if tree_digest(history) != meta["history_sha256"]:
            raise ValueError("the metric history does not match its SHA-256 (damaged files)")
        parts = meta.get("parts") or {}
        if not isinstance(parts, dict) or not all(isinstance(v, str) for v in parts.values()):
            raise ValueError("meta's parts are not checksums")
        return Snapshot(state, history, step, int(meta["chunks"]), step, [], _meta_config(meta), parts)

    def _restore_doctor(self, step: int, like) -> tuple[Any, str]:
        """The doctor's state saved at `step` shaped like `like`, or (None, why not)."""
        if not (self.directory / str(step) / "doctor").is_dir():
            return None, "none saved: written with doctor.enabled false, or before the doctor existed"
        ocp = _ocp()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = self._manager.restore(step, args=ocp.args.Composite(
                    doctor=ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, like)),
                    meta=ocp.args.JsonRestore()))
            got = out.doctor
            if jax.tree.structure(got) != jax.tree.structure(like) or any(
                    a.shape != b.shape or a.dtype != b.dtype for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(like))):
                raise ValueError("its training doctor state is shaped otherwise (another version)")
            if tree_digest(got) != out.meta.get("doctor_sha256"):
                raise ValueError("its training doctor state does not match its SHA-256 (damaged files)")
        except Exception as e:  # orbax raises many kinds of error for a damaged or foreign item
            return None, _reason(e)
        return got, ""

    def saved_config(self) -> tuple[int, dict] | None:
        """`(step, config mapping)` of the newest checkpoint whose meta holds a config whose
        digest matches (unreadable metas are passed over: `restore` reports those); None if
        no checkpoint has one. Reads only the small JSON item, not the state."""
        ocp = _ocp()
        for step in reversed(self.steps()):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
            except Exception:  # damaged: restore() says so when it walks past it
                continue
            config = _meta_config(meta) if isinstance(meta, dict) else None
            if config is not None:
                return step, config
        return None

    def set_aside(self, steps, destination) -> list[Path]:
        """Move the checkpoints at `steps` out of the way into `destination` (kept, not
        deleted: a person may want to look at them); returns where each went."""
        from rmtjax.safefs import move_within

        moved = []
        for step in steps:
            src = self.directory / str(step)
            if not src.exists() or src.is_symlink():
                continue
            # a rename within the run directory; a planted link at the destination is refused
            moved.append(move_within(src, destination, str(step)))
        self._manager.reload()
        return moved

    def close(self) -> None:
        self._manager.close()


def _meta_config(meta: dict) -> dict | None:
    config = meta.get("config")
    if not isinstance(config, dict) or meta.get("config_sha256") != config_digest(config):
        return None
    return config


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    if not text:
        return type(e).__name__
    first = text[0] if len(text[0]) <= 240 else text[0][:240] + "…"
    return f"{type(e).__name__}: {first}"
