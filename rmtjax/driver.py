"""The driver: vmap over seeds, a loop of `agent.step` in compiled chunks, progress, results.

`make_train(config)` gives the whole run as one pure function for users who want to
`jit`/`vmap` it themselves; `train(config, key)` runs it in `train.num_chunks` compiled
chunks so that a progress bar can report, and a run directory log and checkpoint, between
them. Both keep only the per-iteration scalars an agent returns, so memory is flat however
long the run. `load_run` reads a run directory back; `evaluate` plays greedy episodes. All of
them keep compiled programs in the persistent compilation cache (`rmtjax.cache`), so a second
identical run compiles in seconds.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import numpy as np

from rmtjax import cache, distributed, doctor, evaluation, health, limits, loggers, transfer
from rmtjax.agents import build_agent
from rmtjax.config import Config, ConfigError
from rmtjax.envs import final_return
from rmtjax.meta import controller as meta_controller
from rmtjax.tracing import trace_once, zeros

# A run's init program runs once, in milliseconds: compiled without LLVM's optimisation passes it
# compiles in about half the time (presets, 2 CPU cores: RMT 3.6 -> 1.6 s, DQN 2.1 -> 0.8 s, PQN,
# PPO, SAC 0.4-0.5x; benchmarks/results/init_compile/). Its floating-point results may differ from an optimised
# build's in the last bit (the initial parameters, the first observations). At level 0 the chunk
# ran 2.3-3.6x slower.
INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}

# The chunk, where the time goes, on the CPU: LLVM at optimisation level 2 instead of XLA's default
# (3) compiles it in 0.64-0.88x the time and steps it as fast (presets, 8 seeds, 2 CPU cores; the
# same floats bit for bit on those presets, not on every program; level 1 compiled no faster and
# rounded differently on most presets):
# benchmarks/results/chunk_compile/. Elsewhere (GPU) the chunk keeps XLA's defaults.
CPU_CHUNK_COMPILER_OPTIONS = {"xla_backend_optimization_level": 2}


def chunk_compiler_options() -> dict | None:
    """The options the driver compiles a chunk with on the default backend (None: XLA's defaults)."""
    return dict(CPU_CHUNK_COMPILER_OPTIONS) if jax.default_backend() == "cpu" else None


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
    run_dir: Path | None = None  # where the run was written, if it was
    warnings: list[str] = dataclasses.field(default_factory=list)  # signs it stopped learning (rmtjax.health)
    # wall-clock seconds of host-side work between chunks (the hierarchical replay's moves: replay_move_seconds,
    # replay_move_seconds_total), kept apart from `metrics`, which are the same however a run was resumed
    timing: dict = dataclasses.field(default_factory=dict)

    @property
    def env_steps(self) -> int:
        """Environment steps per seed."""
        return int(self.metrics["env_steps"][0, -1])

    def policy(self, seed: int = 0, which: str = "last") -> Callable:
        """Seed `seed`'s greedy policy as a jitted function `obs -> action` (`make_policy`);
        `which="best"`: its parameters of its best periodic evaluation (`train.eval_every`)."""
        return make_policy(self.config, _which_state(self.state, which), seed)

    @property
    def eval_return(self) -> np.ndarray | None:
        """`[num_seeds, evaluations]`: the mean greedy return of each periodic evaluation
        (`train.eval_every`; None without), and `eval_iterations` the iterations they followed."""
        if "eval_return" not in self.metrics:
            return None
        return self.metrics["eval_return"][:, self.eval_iterations - 1]

    @property
    def eval_iterations(self) -> np.ndarray | None:
        if "eval_return" not in self.metrics:
            return None
        return np.flatnonzero(np.isfinite(self.metrics["eval_return"]).any(axis=0)) + 1

    def summary(self) -> str:
        fr = self.final_return
        timing = (f" in {self.run_seconds:.1f}s (+{self.compile_seconds:.1f}s compile)"
                  if math.isfinite(self.run_seconds) else "")  # a run read back before it finished has none
        return (f"{self.config.algo} on {self.config.env.id}: {self.env_steps:,} env steps × "
                f"{fr.shape[0]} seed(s){timing}; "
                f"final return mean {np.nanmean(fr):.1f}, min {np.nanmin(fr):.1f}, max {np.nanmax(fr):.1f}"
                + "".join(f"\nWARNING: {w}" for w in self.warnings))


class _MetricPack:
    """An iteration's metrics (name -> [num_seeds] array) as one array per dtype, [num_seeds,
    metrics]: a scan then writes one row per dtype per iteration into its stacked output
    instead of one per metric (an agent reports dozens)."""

    def __init__(self, shapes: Mapping[str, Any]):
        groups: dict[str, list[str]] = {}
        for name in sorted(shapes):
            groups.setdefault(jax.numpy.dtype(shapes[name].dtype).name, []).append(name)
        self.groups = tuple((dt, tuple(names)) for dt, names in groups.items())

    def pack(self, metrics: Mapping[str, Any]) -> dict:
        return {dt: jax.numpy.stack([metrics[n] for n in names], -1) for dt, names in self.groups}


@jax.tree_util.register_pytree_node_class
class PackedMetrics:
    """A chunk's metrics as it leaves the program: one array `[..., metrics]` per dtype, the
    names static. `unpack()` names them (name -> `[...]`), on the host for a chunk: sliced
    inside the program, each metric was a kernel of its own to compile (RMT's CartPole preset
    chunk: 56 of them, 7.69 -> 6.88 s of compile, DQN's 3.94 -> 3.64 s, best of 5 rounds)."""

    def __init__(self, arrays: dict, groups: tuple):
        self.arrays, self.groups = arrays, groups

    def tree_flatten(self):
        return (self.arrays,), self.groups

    @classmethod
    def tree_unflatten(cls, groups, children):
        return cls(children[0], groups)

    def unpack(self) -> dict:
        out = {}
        for dt, names in self.groups:
            a = self.arrays[dt]
            for i, n in enumerate(names):  # a shape (jax.eval_shape's) has no [..., i]: its name's shape
                out[n] = (jax.ShapeDtypeStruct(a.shape[:-1], a.dtype) if isinstance(a, jax.ShapeDtypeStruct)
                          else a[..., i])
        return out


def _call_chunk(chunk, state, start: int, length: int):
    """`length` iterations of the compiled chunk from `start`: (state, name -> `[length, ...]`
    numpy array), once the call has finished."""
    state, packed = chunk(state, np.int32(start), np.int32(length))
    return state, {k: v[:length] for k, v in jax.device_get(packed).unpack().items()}


def _scan_steps(vstep: Callable, length: int) -> Callable:
    """`state -> (state, metrics)`: iterations 0 .. length-1 of the batched step `vstep(state, t)`."""

    def run(state):
        step_once, (_, probe) = trace_once(vstep, state, jax.numpy.int32(0))
        pack = _MetricPack(probe)

        def body(s, t):
            s, metrics = step_once(s, t)
            return s, pack.pack(metrics)

        state, packed = jax.lax.scan(body, state, jax.numpy.arange(length, dtype=jax.numpy.int32))
        return state, PackedMetrics(packed, pack.groups).unpack()

    return run


def _masked_chunk(vstep: Callable, max_length: int) -> Callable:
    """`(state, start, length) -> (state, PackedMetrics [max_length, ...])`: iterations `start`
    .. `start + length - 1` of the batched step `vstep(state, t)` (`length` up to `max_length`;
    both traced numbers), so one compile serves every chunk of the run and every piece of one.
    A while loop: a shorter call costs only the iterations it steps. The metrics' rows past
    `length` are zeros."""

    def run(state, start, length):
        # one trace of the step serves the metrics' shapes and the loop's body (tracing.py)
        step_once, (_, probe) = trace_once(vstep, state, jax.numpy.int32(0))
        pack = _MetricPack(probe)
        rows = {dt: jax.numpy.zeros((max_length,) + a.shape, a.dtype) for dt, a in pack.pack(zeros(probe)).items()}
        stop = jax.numpy.minimum(length, max_length)

        def body(carry):
            s, rows, i = carry
            s, metrics = step_once(s, start + i)
            rows = {dt: jax.lax.dynamic_update_index_in_dim(rows[dt], v, i, 0) for dt, v in pack.pack(metrics).items()}
            return s, rows, i + 1

        state, rows, _ = jax.lax.while_loop(lambda c: c[2] < stop, body, (state, rows, jax.numpy.int32(0)))
        return state, PackedMetrics(rows, pack.groups)

    return run


def _over_seeds(step: Callable, seeds: int) -> Callable:
    """`step(state, t)` over the seed axis of a batched state. One seed runs the unbatched step
    on the state's only row: XLA compiles a vmap of one into batched kernels (LayerNorm's above
    all) that cost up to twice the unbatched ones on a CPU (benchmarks/results/speed/speed_rmt.md)."""
    if seeds != 1:
        return jax.vmap(step, in_axes=(0, None))

    def one(state, t):
        state, metrics = step(jax.tree.map(lambda x: x[0], state), t)
        return jax.tree.map(lambda x: x[None], (state, metrics))

    return one


def _seed_axis(name: str, value, seeds: int) -> int | None:
    shape = np.shape(value)
    if shape == ():
        return None
    if shape == (seeds,):
        return 0
    raise ConfigError(f"hparams: {name!r} has shape {shape}; give a scalar (every seed) or one value per seed "
                      f"(shape ({seeds},))")


def seed_keys(key, seeds: int, cells: int = 1):
    """The keys of a run's `seeds` seeds: `split(key, seeds)`; in a sweep of `cells` cells of
    `seeds // cells` seeds each, every cell's seeds get the keys of a plain run with that many
    seeds (so cells are compared on the same seeds)."""
    per_cell = jax.random.split(key, seeds // cells)
    return per_cell if cells == 1 else jax.numpy.concatenate([per_cell] * cells)


class Program:
    """One run's composition, in one place for `make_train`, `train`, `load_run` and `evaluate`:
    the agent (`rmtjax.protocol`), vmapped over seeds → the transfer layer (`rmtjax.transfer`:
    the source parameters put in, stages released) → the meta layer (`rmtjax.meta.controller`,
    when on) → a loop of iterations → the devices (`rmtjax.distributed.ShardedRun`, when more
    than one).

    `init(keys, hparams) -> state` and `step(state, t) -> (state, metrics)` are batched over seeds
    (one device's view); `sharded` is None on one device. `source`: a `rmtjax.transfer.Source`
    the run starts from (None: a fresh start, or only the state's shapes are wanted).
    """

    def __init__(self, config: Config, source: "transfer.Source | None" = None, cells: int = 1):
        self.config = config
        self.agent = agent = build_agent(config)
        if not config.transfer.is_default or source is not None:
            # names and shapes checked against the agent's parameters before anything is compiled
            shapes = jax.eval_shape(agent.init, jax.random.key(0)).params
            transfer.check_groups(config.transfer, agent, shapes)
            if source is not None:
                transfer.check_source(config.transfer, agent, source, shapes)
        seeds = config.train.num_seeds

        def vinit(keys, hparams=None):
            # a hyperparameter is a scalar (every seed) or a [num_seeds] vector (one per seed: a sweep)
            axes = {k: _seed_axis(k, v, seeds) for k, v in (hparams or {}).items()}
            if hparams and hasattr(agent, "default_hparams"):  # an unknown name, refused before anything runs
                agent.default_hparams({k: 0.0 for k in hparams})
            return jax.vmap(agent.init, in_axes=(0, axes or None))(keys, hparams or None)

        # on several devices an iteration's metrics are reduced across them first, so the meta layer
        # and the log see the whole run's; `t` is the same for every seed
        vstep = _over_seeds(distributed.reduced_step(config, agent.step), seeds)
        vinit, vstep = transfer.compose(config, agent, vinit, vstep, source)
        self.init, self.step = meta_controller.compose(config, agent, vinit, vstep)
        # the training doctor's detectors (rmtjax.doctor) over the seeds, compared within each of `cells`
        self.init, self.step = doctor.compose(config, agent, self.init, self.step, cells)
        if evaluation.is_active(config):  # periodic greedy evaluation, outermost (rmtjax.evaluation)
            self.init, self.step = evaluation.compose(config, agent, self.init, self.step)
        self.sharded = distributed.sharded_run(config)

    @property
    def num_iterations(self) -> int:
        return self.agent.num_iterations

    def preflight(self, hparams=None) -> None:
        """What can be told from the config alone, before anything is compiled: whole iterations,
        and whether the state fits in the device's memory (`rmtjax.limits`)."""
        limits.check_total_steps(self.config, self.agent)
        # on several devices one device's state, traced under the mesh (an init may ask for its device index)
        shapes = None if self.sharded is None else self.sharded.local_state_shapes(self.init, hparams)
        limits.check_train_fits(self.config, self.agent, self.init, hparams, shapes=shapes)

    def initial_state(self, keys, hparams=None):
        """The batched state of a fresh run (on every device of the mesh, stacked, when sharded),
        compiled with `INIT_COMPILER_OPTIONS`."""
        if self.sharded is None:
            return jax.jit(lambda k: self.init(k, hparams), compiler_options=INIT_COMPILER_OPTIONS)(keys)
        return self.sharded.init(self.init, INIT_COMPILER_OPTIONS)(keys, hparams)

    def chunk(self, max_length: int) -> Callable:
        """`(state, start, length) -> (state, PackedMetrics)`: up to `max_length` iterations from
        `start`; the metrics' `unpack()` names them."""
        chunk = _masked_chunk(self.step, max_length)
        return chunk if self.sharded is None else self.sharded.chunk(chunk)

    def compile_chunk(self, state, length: int, compiler_options: dict | None | str = "driver"):
        """`chunk(length)` lowered for `state`'s shapes and compiled as a run compiles it: the state
        donated, with `chunk_compiler_options()` (or the `compiler_options` given; None: XLA's
        defaults). Probes and benchmarks that call this compile the very program `train` runs."""
        options = chunk_compiler_options() if compiler_options == "driver" else compiler_options
        return jax.jit(self.chunk(length), donate_argnums=0).lower(state, np.int32(0), np.int32(length)
                                                                   ).compile(options)

    def whole(self) -> Callable:
        """The whole run as one function `(key, hparams) -> (state, metrics [num_seeds, iterations])`."""
        run = _scan_steps(self.step, self.num_iterations)
        seeds = self.config.train.num_seeds
        if self.sharded is not None:
            fn = self.sharded.train_fn(self.init, run)  # the state comes back stacked over the devices
        else:
            def fn(key, hparams=None):
                return run(self.init(jax.random.split(key, seeds), hparams))

        def train_fn(key, hparams: Mapping[str, Any] | None = None):
            state, metrics = fn(key, hparams)
            return state, jax.tree.map(lambda m: m.T, metrics)

        return train_fn


def make_train(config: Config, init_from=None) -> Callable:
    """The whole run as one pure function `train_fn(key, hparams=None) -> (state, metrics)`.
    `init_from`: start from another run's parameters, as in `train`.

    `hparams` optionally overrides initial hyperparameters (name -> scalar array), so a grid
    is `jax.vmap(train_fn, in_axes=(None, 0))(key, {"lr": lrs})`. Metrics are `[num_seeds,
    num_iterations]` arrays; the state is batched over seeds (and stacked over the devices,
    `[D, num_seeds, ...]`, on several).
    """
    cache.enable()
    program = Program(config, resolve_source(config, init_from))
    if program.agent.between_chunks(1) is not None:
        raise ConfigError(f"make_train: {config.algo} with these settings works on the host between compiled chunks "
                          f"(agent.replay: hierarchical moves replay items across device, host and disk), so the run "
                          f"cannot be one function; use rmtjax.train")
    program.preflight()
    return program.whole()


def train(config: Config | None, key: "jax.Array | int | None" = None, *, hparams: Mapping[str, Any] | None = None,
          progress: bool | None = None, on_chunk: Callable | None = None, run_dir=None,
          resume=None, init_from=None, budget_seconds: float | None = None,
          _sweep: dict | None = None) -> TrainResult:
    """Train `config.train.num_seeds` seeds side by side from `key` (a PRNG key, an integer
    seed, or None: `train.seed`).

    `run_dir`: write the run there (config.yaml, metrics.jsonl/.csv, checkpoints every
    `train.checkpoint_every` chunks, summary.json; see `rmtjax.rundir`). `resume`: continue
    the run in that directory from its last usable checkpoint; `config` and `key` may then be
    None (the run's own are used) and must match the run's if given. A resumed run ends with
    the same parameters and metrics as one that was never interrupted.
    `on_chunk(state, metrics_so_far, iteration)` is called on the host after every chunk.
    `hparams` values are scalars (every seed) or `[num_seeds]` vectors (one per seed).
    `init_from`: start from another run's parameters (`rmtjax.transfer`): a run directory, a
    `TrainResult` (every seed of it), or one seed's parameters (a pytree shaped like this agent's);
    `config.transfer` says which seed each seed starts from, what is frozen, staged, re-initialised
    and the KL penalty. A run directory keeps the source parameters, so a resume needs no
    `init_from` (given, it must name the same source).
    `budget_seconds`: train for that many seconds of wall-clock (compilation not counted) or
    `train.total_steps`, whichever ends first; the run stops at the iteration boundary nearest
    the budget, its chunks run in pieces sized from the measured speed (the same run bit for bit).
    (`_sweep` is `rmtjax.sweep`'s: the grid a sweep's run directory records.)
    """
    key = _train_key(config, key, resume)
    if budget_seconds is not None and (isinstance(budget_seconds, bool) or not isinstance(budget_seconds, (int, float))
                                       or not 0 < budget_seconds < math.inf):
        raise ConfigError(f"budget_seconds: expected a number of seconds > 0, got {budget_seconds!r}")
    if config is not None:
        distributed.initialize(config)  # a multi-host run joins its processes first
        loggers.check_wandb(config, run_dir if resume is None else resume)
    cache.enable()
    program = source = None
    if resume is None and config is not None:
        source = resolve_source(config, init_from)
        program = Program(config, source, cells=1 if _sweep is None else len(config_cells(_sweep)))
        program.preflight(hparams)  # before a run directory is made
    logger = None
    if resume is None and config is not None and config.train.wandb:
        # W&B starts before the run directory is made: one that cannot start leaves none half-made
        logger = loggers.WandbLogger(config, run_id=loggers.new_run_id(),
                                     name=None if run_dir is None else Path(run_dir).name)
    try:
        run = _open_run(config, key, hparams, run_dir, resume, _sweep, source,
                        wandb_id=None if logger is None else logger.id)
    except BaseException:
        if logger is not None:
            logger.close()
        raise
    if run is not None:
        config, key, hparams = run.config, run.key, run.hparams
        if resume is not None:
            source = run.source(init_from)  # the one the run began with, from its directory
    try:
        if run is not None and (run.sweep is None) != (_sweep is None):
            from rmtjax.rundir import RunDirError

            raise RunDirError(f"{run.path} holds a sweep: continue it with rmtjax sweep --resume {run.path}"
                              if run.sweep is not None else f"{run.path} holds a training run, not a sweep: "
                              f"continue it with rmtjax train --resume {run.path}")
        sweep_info = _sweep if run is None else run.sweep
        cells = 1 if sweep_info is None else len(config_cells(sweep_info))
        if program is None:  # a resumed run: its own config
            loggers.check_wandb(config, run.path)
            program = Program(config, source, cells=cells)
            program.preflight(hparams)
        if config.train.wandb and logger is None:
            logger = loggers.WandbLogger(config, run_id=None if run is None else run.wandb_id(),
                                         name=None if run is None else run.path.name,
                                         resuming=run is not None and run.resuming)
        if budget_seconds is not None and jax.process_count() > 1:
            raise ConfigError("budget_seconds: each process would time the budget on its own and could stop at "
                              "another iteration than the others; give a multi-process run train.total_steps instead")
        result = _drive(program, key, hparams, progress, on_chunk, run, logger=logger, cells=cells,
                        budget_seconds=budget_seconds)
        if run is not None:
            run.finish(result)
            result.run_dir = run.path
        if logger is not None:
            logger.finish(result)
        return result
    finally:
        _CompileNote.stop_active()  # a run that failed while compiling leaves no ticking line
        if logger is not None:
            logger.close()
        if run is not None:
            run.close()


def _train_key(config, key, resume):
    """`train`'s key: a PRNG key as given, an int made into one, and None `train.seed`'s (a
    resumed run's None stays None: the run's own key)."""
    if key is None:
        return None if resume is not None or config is None else jax.random.key(config.train.seed)
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if not 0 <= int(key) <= 2**31 - 1:
            raise ConfigError(f"key: an integer seed must be in [0, {2**31 - 1}], got {key}")
        return jax.random.key(int(key))
    if not hasattr(key, "dtype"):
        raise ConfigError(f"key: expected a PRNG key (jax.random.key(0)), an integer seed or None "
                          f"(train.seed), got {type(key).__name__}")
    return key


def config_cells(sweep_info: dict) -> list[dict]:
    """The cells of a sweep's grid (`{field: [values]}`), row-major: every combination."""
    import itertools

    grid = sweep_info["grid"]
    return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]


def resolve_source(config: Config, init_from) -> "transfer.Source | None":
    """`init_from` (a run directory, a `TrainResult`, one seed's parameters, or None) as a
    `rmtjax.transfer.Source` mapped to `config`'s seeds; a config that freezes, stages or
    penalises needs one."""
    from rmtjax.agents import agent_class

    cfg = config.transfer
    if init_from is None:
        if cfg.staged or cfg.reinit:
            raise ConfigError("transfer: freeze, unfreeze, kl_coef and reinit act on a source's parameters; give "
                              "one: train(config, key, init_from=RUN_DIR or params), or rmtjax train --init-from RUN_DIR")
        return None
    transfer.check_agent(config.algo, agent_class(config.algo), cfg, init_from=True,
                         torso=getattr(config.agent, "torso", None))
    seeds = config.train.num_seeds
    if isinstance(init_from, (str, os.PathLike)):
        source = load_run(init_from)
        origin = str(Path(init_from).absolute())
        return _source_of(config, source, origin)
    if isinstance(init_from, TrainResult):
        return _source_of(config, init_from, "the TrainResult given")
    return transfer.make_source(cfg, seeds, init_from, None, "the parameters given")


def _source_of(config: Config, result: TrainResult, origin: str) -> "transfer.Source":
    if result.config.algo != config.algo:
        raise ConfigError(f"init_from: {origin} trained {result.config.algo}, this run is {config.algo}; transfer "
                          f"between runs of the same agent")
    return transfer.make_source(config.transfer, config.train.num_seeds, result.state.params,
                                result.config.train.num_seeds, origin)


def _open_run(config, key, hparams, run_dir, resume, sweep=None, source=None, wandb_id=None):
    if resume is not None:
        from rmtjax.rundir import RunDir

        if run_dir is not None and Path(run_dir).absolute() != Path(resume).absolute():
            raise ValueError(f"train(run_dir={run_dir!r}, resume={resume!r}): a resumed run stays in its directory")
        return RunDir.resume(resume, config, key, hparams)
    if config is None or key is None:
        raise TypeError("train(config, key): both are needed unless resume=RUN_DIR is given")
    if run_dir is not None:
        from rmtjax.rundir import RunDir

        return RunDir.create(run_dir, config, key, hparams, sweep=sweep, source=source, wandb_id=wandb_id)
    if config.train.tensorboard:
        raise ConfigError("train.tensorboard: TensorBoard events are written into a run directory; pass "
                          "run_dir=DIR (rmtjax train --run-dir DIR) or set train.tensorboard: false")
    return None


def _drive(program: Program, key, hparams, progress, on_chunk, run, *, logger=None, cells: int = 1,
           budget_seconds=None) -> TrainResult:
    config = program.config
    agent, sharded = program.agent, program.sharded  # sharded: None on one device
    n_iter = agent.num_iterations
    # host-side work between chunks (the hierarchical replay's moves), None for most agents
    between = agent.between_chunks(config.train.num_seeds, None if run is None else run.path,
                                   seed=int(np.asarray(jax.random.key_data(key)).ravel()[-1]))
    n_chunks = min(config.train.num_chunks, n_iter)
    if between is not None and between.max_iterations:
        n_chunks = max(n_chunks, math.ceil(n_iter / between.max_iterations))
    chunk_len = math.ceil(n_iter / n_chunks)
    show = config.train.progress if progress is None else progress

    t0 = time.perf_counter()
    note = _CompileNote(f"{config.algo} on {config.env.id}") if show else None  # "compiling …" until the first chunk
    keys = seed_keys(key, config.train.num_seeds, cells)
    fresh = state = program.initial_state(keys, hparams)
    compile_seconds = time.perf_counter() - t0

    chunks: list[dict] = []  # each chunk's metrics, name -> [length, num_seeds]
    done = 0
    if run is not None:
        # Checkpoints sit at chunk boundaries and the chunk is deterministic, so continuing
        # from one reproduces the uninterrupted run exactly.
        run.between = between
        snap = run.restore(fresh)
        if snap is not None:
            state, done = snap.state, snap.iterations
            chunks.append(_doctor_columns(program, fresh, snap.history, done))
        run.begin(chunks[0] if snap is not None else None, done)
    if done < n_iter:
        t0 = time.perf_counter()
        # One compiled chunk serves every chunk: the last, shorter one stops after its iterations.
        # It is always lowered from the fresh state (whose weak types a restored state lacks), so
        # a resumed run executes the very program the uninterrupted one does.
        chunk = program.compile_chunk(fresh, chunk_len)
        compile_seconds += time.perf_counter() - t0
    del fresh
    start = done
    if note is not None:
        note.done()

    bar = None
    if show:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_iter * agent.steps_per_iteration, initial=done * agent.steps_per_iteration, unit="step",
                   unit_scale=True, desc=f"{config.algo} {config.env.id}", dynamic_ncols=True)
    watch = health.Watch()
    doctor_watch = doctor.Watch(config, None if run is None else run.path)
    t1 = time.perf_counter()
    budget = None if budget_seconds is None else _Budget(budget_seconds, t1, agent.first_learning_iteration)
    # in pieces: to end where the budget does (the last chunk may be cut short), or, where that
    # costs nothing measurable, to move the bar within a chunk
    pieces = budget if budget is not None else _Pacer() if show and done < n_iter else None
    while done < n_iter:
        length = min(chunk_len, n_iter - done)
        if pieces is not None:
            state, metrics = pieces.run(chunk, state, done, length, bar, agent.steps_per_iteration)
            length = next(iter(metrics.values())).shape[0]
        else:
            state, metrics = _call_chunk(chunk, state, done, length)
        if between is not None:
            state, moved = between.after_chunk(state)  # per seed, at the chunk's end: one row each
            metrics.update({k: np.broadcast_to(np.asarray(v), (length,) + np.shape(v)).copy() for k, v in moved.items()})
        chunks.append(metrics)
        done += length
        watch.after_chunk(state, chunks)
        doctor_watch.after_chunk(chunks)
        stopping = budget is not None and done < n_iter and budget.spent()
        if run is not None:
            run.record(state, chunks, metrics, done, math.ceil(done / chunk_len), final=done >= n_iter or stopping)
        if logger is not None:
            logger.log(metrics, done - length + 1)
        if bar is not None:
            seeds = config.train.num_seeds
            elapsed = time.perf_counter() - t1
            bar.update(done * agent.steps_per_iteration - bar.n)  # what the pieces have not shown yet
            bar.set_postfix({"sps": f"{(done - start) * agent.steps_per_iteration * seeds / elapsed:,.0f}",
                             "ret": f"{float(np.mean(metrics['episode_return'][-1])):.1f}", **_postfix(metrics)})
        if on_chunk is not None:
            on_chunk(state, chunks, done)
        if stopping:
            break
    jax.block_until_ready(state)
    run_seconds = time.perf_counter() - t1
    if bar is not None:
        bar.close()

    stacked = {k: np.concatenate([c[k] for c in chunks], axis=0).T for k in chunks[0]}
    if sharded is None:
        fr = np.asarray(jax.vmap(final_return)(state.env_state))
    else:
        fr = sharded.final_return(state)
        state = sharded.local_state(state)  # this process's first device: a one-device-shaped state
    timing = between.timing() if hasattr(between, "timing") else {}
    return TrainResult(config, state, stacked, fr, compile_seconds, run_seconds, warnings=watch.notes() + doctor_watch.notes(),
                       timing=timing)


def _doctor_columns(program: Program, fresh, history: dict, done: int) -> dict:
    """A restored metric history with the training doctor's columns as this run has them: left out
    when the doctor is now off, NaN over the restored iterations when it is on and was not then."""
    had = any(k.startswith(doctor.PREFIX) for k in history)
    if had == program.config.doctor.enabled:
        return history
    if had:
        return {k: v for k, v in history.items() if not k.startswith(doctor.PREFIX)}
    _, packed = jax.eval_shape(program.chunk(1), fresh, np.int32(0), np.int32(1))  # the names, nothing run
    shapes = packed.unpack()
    return {**history, **{k: np.full((done,) + v.shape[1:], np.nan, v.dtype) for k, v in shapes.items()
                          if k.startswith(doctor.PREFIX)}}


_LOSS_SHOWN = 3  # at most this many losses in the bar's postfix


def _postfix(metrics: Mapping[str, np.ndarray]) -> dict[str, str]:
    """The bar's postfix beyond speed and return: the last iteration's losses (mean over seeds;
    every metric named *loss, at most `_LOSS_SHOWN`) and the last periodic evaluation's return."""
    out = {}
    for name in sorted(n for n in metrics if n.endswith("loss"))[:_LOSS_SHOWN]:
        out[name] = f"{float(np.mean(metrics[name][-1])):.3g}"
    if "eval_return" in metrics:
        done = np.flatnonzero(np.isfinite(metrics["eval_return"]).any(axis=1))
        if done.size:
            out["eval"] = f"{float(np.nanmean(metrics['eval_return'][done[-1]])):.1f}"
    return out


class _CompileNote:
    """The line a run shows before its first chunk: "compiling ALGO on ENV …" with the seconds
    so far (redrawn each second on a terminal), then how long it took and whether the programs
    came from the persistent compilation cache (`rmtjax.cache`)."""

    _counts = {"requests": 0, "hits": 0}
    _listening = False
    _active: "_CompileNote | None" = None

    def __init__(self, what: str):
        import sys
        import threading

        _CompileNote._listen()
        self.what, self.out = what, sys.stderr
        self.t0 = time.perf_counter()
        self.before = dict(self._counts)
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._print(f"compiling {what} …", end="" if self.tty else "\n")
        self._thread = None
        if self.tty:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        _CompileNote._active = self

    @classmethod
    def stop_active(cls) -> None:
        """Stop the ticking of a note whose run ended (by an error) before it compiled."""
        note, cls._active = cls._active, None
        if note is not None:
            note._stop.set()
            if note._thread is not None:
                note._thread.join()
                note._print("")  # end the ticking line

    @classmethod
    def _listen(cls) -> None:
        if cls._listening:
            return
        cls._listening = True

        def on_event(event: str, **_):
            if event == "/jax/compilation_cache/compile_requests_use_cache":
                cls._counts["requests"] += 1
            elif event == "/jax/compilation_cache/cache_hits":
                cls._counts["hits"] += 1

        jax.monitoring.register_event_listener(on_event)

    def _print(self, text: str, end: str = "\n") -> None:
        print(text, end=end, file=self.out, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._print(f"\rcompiling {self.what} … {time.perf_counter() - self.t0:.0f} s", end="")

    def done(self) -> None:
        _CompileNote._active = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        requests = self._counts["requests"] - self.before["requests"]
        hits = self._counts["hits"] - self.before["hits"]
        if not jax.config.jax_compilation_cache_dir:
            said = "persistent compilation cache off"
        elif requests == 0:
            said = "nothing new to compile"
        elif hits == requests:
            said = "read from the persistent compilation cache"
        elif hits:
            said = f"{hits} of {requests} programs read from the persistent compilation cache"
        else:
            said = "not in the persistent compilation cache yet: kept there for the next identical run"
        line = f"compiled {self.what} in {time.perf_counter() - self.t0:.1f} s ({said})"
        self._print(f"\r{line:<{len(self.what) + 24}}" if self.tty else line)  # over the whole ticking line


class _Pieces:
    """Runs a chunk in pieces: calls of the same compiled chunk with a shorter length (the run is
    the same bit for bit). A call steps only `length` iterations; what it costs beside them,
    `overhead` (the call, the metrics' transfer), is measured once with a call stepping none;
    each piece's seconds less that give `per_iteration`. `_size` says how long the next piece is."""

    def __init__(self):
        self.overhead: float | None = None
        self.per_iteration: float | None = None

    @staticmethod
    def _call(chunk, state, start: int, length: int):
        t = time.perf_counter()
        state, metrics = _call_chunk(chunk, state, start, length)
        return state, metrics, time.perf_counter() - t

    def _size(self, at: int, left: int) -> int:
        """Iterations of the next piece, which starts at iteration `at` with `left` of the chunk
        to go; under 1 ends the chunk there."""
        raise NotImplementedError

    def run(self, chunk, state, done: int, length: int, bar, steps_per_iteration: int):
        """Up to `length` iterations of the chunk from `done` (fewer where `_size` ends it)."""
        if self.overhead is None:
            state, _, self.overhead = self._call(chunk, state, done, 0)  # steps nothing: the state is unchanged
        pieces, at = [], done
        while at < done + length:
            n = self._size(at, done + length - at)
            if n < 1:
                break
            state, metrics, seconds = self._call(chunk, state, at, n)
            self.per_iteration = max(seconds - self.overhead, 1e-9) / n
            pieces.append(metrics)
            at += n
            if bar is not None and at < done + length:
                bar.update(at * steps_per_iteration - bar.n)
        if len(pieces) == 1:
            return state, pieces[0]
        return state, {k: np.concatenate([p[k] for p in pieces], axis=0) for k in pieces[0]}


class _Budget(_Pieces):
    """A wall-clock budget for a run: trains until `seconds` have passed since `start` and stops at
    the iteration boundary nearest that time. Chunks run in pieces, each sized from the measured
    seconds per iteration so that the last one ends close to the budget, however long a chunk
    takes (at least one iteration: a run trains one whatever its budget). The first piece steps
    one iteration, to measure; each later one at most `GROWTH` times the one before, so a rate
    misread from a short piece is corrected before it costs much. The agent's warm-up (iterations
    before `first_learning_iteration`, which only act and store and may run 50× faster than the
    ones that learn) is measured apart: no piece crosses its end, and the measuring starts again
    from one iteration after it."""

    GROWTH = 8

    def __init__(self, seconds: float, start: float, warmup_end: int = 0):
        super().__init__()
        self.seconds, self.start, self.warmup_end = float(seconds), start, warmup_end
        self.last = 0  # the iterations of the last piece

    def _fits(self) -> int:
        """Iterations that fit in the time left, rounded to the nearest (the last piece's call included)."""
        left = self.seconds - (time.perf_counter() - self.start) - self.overhead
        return max(0, int(left / self.per_iteration + 0.5))

    def spent(self) -> bool:
        return self.per_iteration is not None and self._fits() < 1

    def _size(self, at: int, left: int) -> int:
        if at == self.warmup_end and at > 0 and self.last:  # learning starts here: its own speed
            self.per_iteration, self.last = None, 0
        n = 1 if self.per_iteration is None else min(left, self._fits(), self.GROWTH * self.last)
        if n < 1:
            return 0
        if at < self.warmup_end < at + n:
            n = self.warmup_end - at
        self.last = n
        return n


class _Pacer(_Pieces):
    """Runs a chunk in pieces so that the progress bar moves within a long chunk, where that costs
    nothing measurable. The first chunk is split (its first sixteenth, then as below) only when
    `overhead` is under `FIRST_BUDGET` seconds; a later chunk into `k` pieces only where the (k-1)
    extra calls cost under `SHARE` of the chunk and each piece takes at least `PIECE_SECONDS`."""

    FIRST_BUDGET = 0.05
    SHARE = 0.01
    PIECE_SECONDS = 1.0

    def _size(self, at: int, left: int) -> int:
        if self.per_iteration is None:
            return math.ceil(left / 16) if self.overhead < self.FIRST_BUDGET and left >= 16 else left
        expected = self.per_iteration * left
        k = max(1, min(1 + int(self.SHARE * expected / max(self.overhead, 1e-9)), int(expected // self.PIECE_SECONDS)))
        return math.ceil(left / k)


def make_policy(config: Config, state, seed: int = 0) -> Callable:
    """The greedy policy (`agent.act`) of seed `seed` of a trained state batched over seeds, as a
    jitted function `obs -> action`. `obs` is one observation (the env's observation shape; with
    `env.frame_stack` the stacked one) or a batch of them, as the env gives it: the observation
    normalisation the agent trained with is applied inside, its statistics frozen. Only the
    parameters and those statistics are kept, so the function can be exported with `jax.export`
    and called where rmtjax is not installed. A recurrent agent's (`agent.torso: lstm | gru`) is a
    `RecurrentPolicy`: `policy(obs, carry=None, reset=None) -> (action, carry)`, its memory passed
    back in by the caller."""
    from rmtjax.envs import make_env

    seeds = config.train.num_seeds
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < seeds:
        raise ConfigError(f"seed: expected an integer in [0, {seeds - 1}] (the run has {seeds} seed(s)), got {seed!r}")
    agent = build_agent(dataclasses.replace(config, distributed=distributed.DistributedConfig()))
    env = make_env(dataclasses.replace(config.env, num_envs=1))
    pick = lambda x: x[seed]  # noqa: E731
    params = jax.tree.map(pick, state.params)
    stats = None if state.env_state.obs_stats is None else jax.tree.map(pick, state.env_state.obs_stats)
    obs_ndim = len(env.spec.obs_shape)
    if agent.recurrent:
        return RecurrentPolicy(agent, params, stats, env, obs_ndim)

    @jax.jit
    def policy(obs):
        obs = jax.numpy.asarray(obs)
        single = obs.ndim == obs_ndim
        batch = obs[None] if single else obs
        action = agent.act(params, env._normalise(stats, batch), None)
        return action[0] if single else action

    return policy


class RecurrentPolicy:
    """The greedy policy of a recurrent agent (`make_policy`): `policy(obs, carry=None, reset=None)
    -> (action, carry)`. Pass back the carry it returned with the next observation; `carry` None
    is the start of an episode (`initial_carry`), and `reset` (True where `obs` begins a new
    episode; a bool or one per observation of a batch) zeroes the memory of those envs. `obs` is
    one observation or a batch of them, normalised inside as in training; the step is jitted."""

    def __init__(self, agent, params, stats, env, obs_ndim: int):
        self.agent, self.obs_ndim = agent, obs_ndim

        @jax.jit
        def step(obs, carry, reset):
            return agent.act_step(params, carry, env._normalise(stats, obs), reset)

        self._step = step

    def initial_carry(self, batch: int | None = None):
        """The memory before an episode: for one observation (`batch` None) or a batch."""
        return self.agent.initial_carry(1 if batch is None else batch)

    def __call__(self, obs, carry=None, reset=None):
        obs = jax.numpy.asarray(obs)
        single = obs.ndim == self.obs_ndim
        batch = obs[None] if single else obs
        if carry is None:
            carry = self.initial_carry(batch.shape[0])
        reset = jax.numpy.zeros(batch.shape[0], bool) if reset is None else \
            jax.numpy.broadcast_to(jax.numpy.asarray(reset, bool), (batch.shape[0],))
        action, carry = self._step(batch, carry, reset)
        return (action[0] if single else action), carry


def load_policy(source, seed: int = 0, which: str = "last") -> Callable:
    """A saved greedy policy as a jitted `obs -> action`: `source` is a run directory
    (`load_run(source).policy(seed, which)`; `which="best"` takes the parameters of the seed's
    best periodic evaluation, `train.eval_every`) or a single policy file written by
    `export_policy` / `rmtjax export` (its own seed and parameters; `seed` and `which` were
    chosen when it was written)."""
    _check_which(which)
    if isinstance(source, (str, os.PathLike)) and Path(source).is_file():
        from rmtjax import policyfile

        config, params, stats = policyfile.read(source)
        return make_policy(config, policyfile.as_state(params, stats), 0)
    return load_run(source).policy(seed, which)


def export_policy(source, path, seed: int = 0, which: str = "last") -> Path:
    """Write seed `seed`'s greedy policy of `source` (a run directory or a `TrainResult`) into
    the single file `path` (`rmtjax.policyfile`; `rmtjax export RUN out.policy`); `which="best"`:
    the parameters of its best periodic evaluation. `load_policy(path)` reads it back."""
    from rmtjax import policyfile

    result = load_run(source) if isinstance(source, (str, os.PathLike)) else source
    seeds = result.config.train.num_seeds
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < seeds:
        raise ConfigError(f"seed: expected an integer in [0, {seeds - 1}] (the run has {seeds} seed(s)), got {seed!r}")
    state = _which_state(result.state, which)
    pick = lambda x: np.asarray(jax.device_get(x))[seed]  # noqa: E731
    stats = state.env_state.obs_stats
    return policyfile.write(path, result.config, jax.tree.map(pick, state.params),
                            None if stats is None else jax.tree.map(pick, stats))


_check_which = evaluation.check_which
_which_state = evaluation.which_state


def _without_demonstrations(config: Config) -> Config:
    """`config` with its agent's demonstrations (a file read when training starts) left out: they
    are constants of the training program, never part of its state, so a saved run is read, acted
    and evaluated without the file."""
    if not getattr(config.agent, "demonstrations", ""):
        return config
    agent = dataclasses.replace(config.agent, demonstrations="", demo_pretrain=0)
    return dataclasses.replace(config, agent=agent)


def load_run(run_dir) -> TrainResult:
    """The state and metrics of the newest usable checkpoint in `run_dir` (the final one for
    a finished run), as a `TrainResult`. Damaged checkpoints are skipped with a warning;
    nothing in the directory is changed."""
    from rmtjax.checkpoint import CheckpointError
    from rmtjax.rundir import RunDir

    cache.enable()
    run = RunDir.open(run_dir)
    config = run.config
    program = Program(_without_demonstrations(config))  # acting needs none; the run's state holds none
    like = program.initial_state(jax.random.split(run.key, config.train.num_seeds))
    snap = run.restore(like, set_aside=False)
    if snap is None:
        raise CheckpointError(f"{run.path} has no checkpoint yet (the run stopped before its first one)")
    summary = run.read_summary() or {}
    metrics = {k: v.T for k, v in snap.history.items()}
    state = snap.state
    if program.sharded is None:
        fr = np.asarray(jax.vmap(final_return)(state.env_state))
    else:  # a run on several devices: as `train` returns it, this process's first device's state
        fr = program.sharded.final_return(state)
        state = program.sharded.local_state(state)
    return TrainResult(config, state, metrics, fr, summary.get("compile_seconds", math.nan),
                       summary.get("run_seconds", math.nan), run_dir=run.path,
                       warnings=list(summary.get("warnings") or []))


@dataclasses.dataclass
class EvalResult:
    """Greedy evaluation episodes: `returns` and `lengths` are `[num_seeds, episodes]` (raw
    return and length of each seed's episodes; an episode cut off by `max_steps` counts with
    its partial return and `finished` False)."""

    returns: np.ndarray
    lengths: np.ndarray
    finished: np.ndarray

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))

    def summary(self) -> str:
        seeds, episodes = self.returns.shape
        per_seed = np.array2string(self.returns.mean(axis=1), precision=1, separator=", ")
        cut = int((~self.finished).sum())
        note = f"; {cut} episode(s) cut off at max_steps" if cut else ""
        return (f"{episodes} greedy episode(s) × {seeds} seed(s): return mean {self.mean:.2f}, std {self.std:.2f}; "
                f"per seed {per_seed}{note}")


def evaluate(source, episodes: int = 10, key: jax.Array | None = None, *, max_steps: int | None = None) -> EvalResult:
    """Run `episodes` greedy episodes (`agent.act`) per seed of a trained policy on fresh
    environments of the same config, all in one compiled loop.

    `source` is a run directory or a `TrainResult`. The agent's state must have `params` (what
    `act` takes) and `env_state` (a `VecEnvState`): its observation-normalisation statistics
    are used as they are, frozen. `max_steps` bounds each episode (default: the environment's
    time limit, or 100,000 steps if it has none).
    """
    from rmtjax.envs import make_env

    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 1:
        raise ConfigError(f"episodes: expected an integer ≥ 1, got {episodes!r}")
    if max_steps is not None and (not isinstance(max_steps, int) or isinstance(max_steps, bool)
                                  or not 1 <= max_steps <= 2**31 - 1):
        raise ConfigError(f"max_steps: expected an integer ≥ 1 (or None: the env's time limit), got {max_steps!r}")
    cache.enable()
    result = load_run(source) if isinstance(source, (str, os.PathLike)) else source
    config = result.config
    agent = build_agent(config)
    env = make_env(dataclasses.replace(config.env, num_envs=episodes))
    limits.check_eval_fits(config, result.state.params, env, episodes)  # before compiling
    limit = max_steps if max_steps is not None else (env.spec.max_episode_steps or 100_000)
    key = jax.random.key(0) if key is None else key

    run = evaluation.greedy_runner(agent, env, episodes, limit)  # every seed one step per turn

    state = result.state
    keys = jax.random.split(key, config.train.num_seeds)
    out = jax.jit(run)(state.params, state.env_state.obs_stats, keys)
    return EvalResult(*(np.asarray(x) for x in jax.device_get(out)))
