"""The driver: vmap over seeds, `lax.scan` of `agent.step` in compiled chunks, progress, results.

`make_train(config)` gives the whole run as one pure function for users who want to
`jit`/`vmap` it themselves; `train(config, key)` runs it in `train.num_chunks` compiled
chunks so that a progress bar can report between them. Both keep only the per-iteration
scalars an agent returns, so memory is flat however long the run.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np

from rmtjax.agents import build_agent
from rmtjax.config import Config
from rmtjax.envs import final_return


@dataclasses.dataclass
class TrainResult:
    """What a run produced.

    `metrics[name]` is a numpy array `[num_seeds, num_iterations]`; `final_return` is `[num_seeds]`,
    each seed's mean over its envs of the return of the last completed episode.
    """

    config: Config
    state: Any
    metrics: dict[str, np.ndarray]
    final_return: np.ndarray
    compile_seconds: float
    run_seconds: float

    @property
    def env_steps(self) -> int:
        """Environment steps per seed."""
        return int(self.metrics["env_steps"][0, -1])

    def summary(self) -> str:
        fr = self.final_return
        return (f"{self.config.algo} on {self.config.env.id}: {self.env_steps:,} env steps × "
                f"{fr.shape[0]} seed(s) in {self.run_seconds:.1f}s (+{self.compile_seconds:.1f}s compile); "
                f"final return mean {np.nanmean(fr):.1f}, min {np.nanmin(fr):.1f}, max {np.nanmax(fr):.1f}")


def _scan_steps(agent, length: int) -> Callable:
    def run(state):
        return jax.lax.scan(lambda s, _: jax.vmap(agent.step)(s), state, None, length)

    return run


def _masked_chunk(agent, max_length: int) -> Callable:
    """`(state, length) -> (state, metrics)`: scan `max_length` iterations, stepping only the
    first `length` (a traced number) so one compile serves chunks of any length up to it."""
    vstep = jax.vmap(agent.step)

    def run(state, length):
        zero_metrics = jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), jax.eval_shape(vstep, state)[1])

        def body(s, i):
            return jax.lax.cond(i < length, vstep, lambda s_: (s_, zero_metrics), s)

        return jax.lax.scan(body, state, jax.numpy.arange(max_length))

    return run


def make_train(config: Config) -> Callable:
    """The whole run as one pure function `train_fn(key, hparams=None) -> (state, metrics)`.

    `hparams` optionally overrides initial hyperparameters (name -> scalar array), so a grid
    is `jax.vmap(train_fn, in_axes=(None, 0))(key, {"lr": lrs})`. Metrics are `[num_seeds,
    num_iterations]` arrays; the state is batched over seeds.
    """
    agent = build_agent(config)
    run = _scan_steps(agent, agent.num_iterations)

    def train_fn(key, hparams: Mapping[str, Any] | None = None):
        keys = jax.random.split(key, config.train.num_seeds)
        state = jax.vmap(lambda k: agent.init(k, hparams))(keys)
        state, metrics = run(state)
        return state, jax.tree.map(lambda m: m.T, metrics)

    return train_fn


def train(config: Config, key: jax.Array, *, hparams: Mapping[str, Any] | None = None,
          progress: bool | None = None, on_chunk: Callable | None = None) -> TrainResult:
    """Train `config.train.num_seeds` seeds side by side from `key`.

    `on_chunk(state, metrics_so_far, iteration)` is called on the host after every chunk.
    """
    agent = build_agent(config)
    n_iter = agent.num_iterations
    n_chunks = min(config.train.num_chunks, n_iter)
    chunk_len = math.ceil(n_iter / n_chunks)
    show = config.train.progress if progress is None else progress

    t0 = time.perf_counter()
    keys = jax.random.split(key, config.train.num_seeds)
    state = jax.jit(jax.vmap(lambda k: agent.init(k, hparams)))(keys)
    # One compiled chunk serves every chunk: the last, shorter one skips its surplus iterations.
    chunk = jax.jit(_masked_chunk(agent, chunk_len), donate_argnums=0).lower(state, np.int32(chunk_len)).compile()
    compile_seconds = time.perf_counter() - t0

    bar = None
    if show:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_iter * agent.steps_per_iteration, unit="step", unit_scale=True,
                   desc=f"{config.algo} {config.env.id}", dynamic_ncols=True)
    chunks: list[dict] = []
    done = 0
    t1 = time.perf_counter()
    while done < n_iter:
        length = min(chunk_len, n_iter - done)
        state, metrics = chunk(state, np.int32(length))
        metrics = {k: v[:length] for k, v in jax.device_get(metrics).items()}
        chunks.append(metrics)
        done += length
        if bar is not None:
            seeds = config.train.num_seeds
            elapsed = time.perf_counter() - t1
            bar.update(length * agent.steps_per_iteration)
            bar.set_postfix(sps=f"{done * agent.steps_per_iteration * seeds / elapsed:,.0f}",
                            ret=f"{float(np.mean(metrics['episode_return'][-1])):.1f}")
        if on_chunk is not None:
            on_chunk(state, chunks, done)
    jax.block_until_ready(state)
    run_seconds = time.perf_counter() - t1
    if bar is not None:
        bar.close()

    stacked = {k: np.concatenate([c[k] for c in chunks], axis=0).T for k in chunks[0]}
    fr = np.asarray(jax.vmap(final_return)(state.env_state))
    return TrainResult(config, state, stacked, fr, compile_seconds, run_seconds)
