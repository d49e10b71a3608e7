"""The persistent compilation cache: a program compiled once is read back from disk next time.

XLA takes seconds to a minute to compile a training chunk on a CPU. JAX can keep compiled
programs on disk and reuse one whenever the same program is compiled again — the same config,
jax version, backend and flags — in this process or a later one. `rmtjax.train`, `make_train`,
`load_run`, `evaluate` and the `rmtjax` command turn it on at their first call:

- the directory is `$RMTJAX_CACHE_DIR`, else `$XDG_CACHE_HOME/rmtjax/jax`, else
  `~/.cache/rmtjax/jax`; it is capped at `MAX_BYTES` (least recently used entries go first);
- `RMTJAX_CACHE_DIR=off` (or `0`, `false`, `no`, `none`) turns it off, and so does
  `rmtjax train --no-compile-cache`;
- if the process has already given JAX a cache directory (`jax_compilation_cache_dir`), that
  one is used and left as it is.

Programs that compile in under `MIN_COMPILE_SECONDS` are not stored (reading them back would
cost about as much).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

ENV = "RMTJAX_CACHE_DIR"
OFF = {"off", "0", "false", "no", "none"}
MAX_BYTES = 2 * 1024**3
MIN_COMPILE_SECONDS = 0.5

_done = False


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rmtjax" / "jax"


def cache_dir() -> Path | None:
    """Where the cache is (or would be) kept; None when it is turned off."""
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return Path(configured)
    raw = os.environ.get(ENV)
    if raw is not None and raw.strip().lower() in OFF:
        return None
    return Path(raw).expanduser() if raw and raw.strip() else default_dir()


def enable(disable: bool = False) -> Path | None:
    """Turn the cache on for this process (once; later calls return the same answer).
    `disable=True` (the CLI's `--no-compile-cache`) keeps it off. Returns the directory or None."""
    global _done
    if disable:
        _done = True
        return None
    if _done:
        return Path(jax.config.jax_compilation_cache_dir) if jax.config.jax_compilation_cache_dir else None
    _done = True
    if jax.config.jax_compilation_cache_dir:
        return Path(jax.config.jax_compilation_cache_dir)  # the user's own setting
    path = cache_dir()
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # an unwritable home: run without a cache rather than fail
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    # JAX decides once, at its first compile, whether a cache is in use: if something was
    # compiled before this call, make it decide again
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()
    return path
