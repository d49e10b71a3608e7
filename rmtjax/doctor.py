"""The training doctor: the design's troubleshooting guide, run inside the compiled loop.

Detectors read the typed signals every agent reports (`rmtjax.protocol.Signals`), so a new agent
gets them by reporting its signals; nothing is found by the name of a metric. They keep a few
float32 scalars per seed (`DoctorState`, beside the agent's state like the meta layer's), are
updated on the device at every iteration, and say what they see as metrics:

- `doctor_early_collapse`: within `doctor.early_steps` env steps the smoothed return fell below
  its first level (the mean return over the first `doctor.smoothing_steps`, at least 4
  iterations) by more than `doctor.collapse_drop` of that level's size (at least 1); it holds
  while the return stays down;
- `doctor_value_divergence`: the Q magnitude grew beyond `doctor.q_ratio` times the largest return
  size seen (at least 1), or (agents that report no Q) the value loss beyond `doctor.value_growth`
  times its lowest level (at least 1) and beyond the square of the largest return size seen (a
  squared error: the values off by more than any return), or more than `doctor.skipped_share` of
  the updates were skipped (non-finite);
- `doctor_entropy_collapse` (agents with a discrete policy entropy): the entropy fell below
  `doctor.entropy_floor` of its maximum (and so did the exploration share, where reported) while
  the return made no progress (an ε-greedy agent reports its greedy part's entropy, 0);
- `doctor_exploration_stuck` (agents reporting an exploration share): the share of exploratory
  actions (ε, temperature) stayed at or below `doctor.explore_floor` with no return progress for
  `doctor.patience_steps` env steps;
- `doctor_seed_disagreement` (several seeds; within each cell of a sweep): the seeds' smoothed
  returns spread by more than `doctor.seed_spread` of their size for `doctor.patience_steps`;
- `doctor_device_disagreement` (several devices): the devices' returns spread by more than
  `doctor.device_spread` for `doctor.patience_steps`.

"No progress" means the best smoothed return is less than `doctor.min_progress` of the first
one's size (at least 1) above it. Each finding is 1.0 while it holds, else 0.0; its evidence
(`doctor_return`, `doctor_q`, ...) is logged beside it. Between chunks the driver turns a finding's
first appearance into one `DoctorWarning` line (the likely cause and the config fields to change,
with values) and writes every finding into the run directory's `doctor.jsonl`; `rmtjax doctor RUN`
reads them back from a run's metrics. docs/doctor.md describes each finding and its fix.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rmtjax.schema import Section, param

PREFIX = "doctor_"
MAX_METRICS_BYTES = 1 << 31  # the largest metrics file `read_metrics` reads


@dataclasses.dataclass(frozen=True)
class DoctorConfig(Section):
    """The training doctor (`rmtjax.doctor`, docs/doctor.md): detectors of common failures run inside
    the loop from the signals every agent reports; each finding is a metric, a warning and a line of
    the run directory's doctor.jsonl. The thresholds only change what is reported, never training."""

    _section = "doctor"
    enabled: bool = param(True, doc="run the detectors (false: the loop is exactly the agent's)")
    smoothing_steps: int = param(2_000, lo=1, doc="env steps per seed over which returns and losses are "
                                                  "smoothed (an exponential moving average)")
    early_steps: int = param(50_000, lo=1, doc="early collapse: the window (env steps per seed) in which a "
                                               "fall of the return counts (the design's guide says 10k; the "
                                               "default leaves room for learning_starts)")
    collapse_drop: float = param(0.5, lo=0.0, lo_open=True, doc="early collapse: the fall below the first "
                                                                "return, as a share of its size (at least 1)")
    q_ratio: float = param(10.0, lo=1.0, doc="value divergence: |Q| above this times the largest return size "
                                             "seen (at least 1)")
    value_growth: float = param(100.0, lo=1.0, doc="value divergence: the value/TD loss above this times its "
                                                     "lowest level (at least 1) and above the largest return "
                                                     "size squared")
    skipped_share: float = param(0.5, lo=0.0, hi=1.0, lo_open=True,
                                 doc="value divergence: the smoothed share of skipped (non-finite) updates above this")
    entropy_floor: float = param(0.05, lo=0.0, hi=1.0, doc="entropy collapse: the policy entropy below this share "
                                                           "of its maximum, with no return progress")
    explore_floor: float = param(0.01, lo=0.0, hi=1.0, doc="exploration stuck: the exploratory share of actions "
                                                           "at or below this, with no return progress")
    min_progress: float = param(0.1, lo=0.0, doc="progress: the best smoothed return above the first by this "
                                                 "share of the first's size (at least 1)")
    patience_steps: int = param(20_000, lo=1, doc="env steps per seed a stuck exploration or a disagreement must "
                                                  "last before it is a finding")
    seed_spread: float = param(0.5, lo=0.0, lo_open=True, doc="seed disagreement: (max - min) of the seeds' "
                                                              "smoothed returns over the larger size (at least 1)")
    device_spread: float = param(0.3, lo=0.0, lo_open=True, doc="device disagreement: the same spread of the "
                                                                "devices' returns")


@struct.dataclass
class DoctorState:
    """One seed's detector state (float32 scalars; counters as float32 iterations)."""

    seen: jax.Array  # episodes completed so far
    n_ret: jax.Array  # iterations that completed episodes
    n_value: jax.Array  # iterations that reported a value loss
    n_q: jax.Array  # iterations that reported a Q magnitude
    ret_ema: jax.Array
    ret_first: jax.Array
    first_n: jax.Array  # iterations with episodes that made up `ret_first`
    ret_best: jax.Array
    ret_size: jax.Array  # the largest |smoothed return| seen
    value_ema: jax.Array
    value_low: jax.Array
    q_ema: jax.Array
    skipped_ema: jax.Array
    entropy_ema: jax.Array
    explore_ema: jax.Array
    collapsed: jax.Array  # 1.0 once the return collapsed inside the early window
    stuck: jax.Array  # iterations in a row with the exploration at its floor and no progress
    disagree: jax.Array  # iterations in a row with the seeds apart
    device_ema: jax.Array
    device_apart: jax.Array  # iterations in a row with the devices apart

    @classmethod
    def zeros(cls) -> "DoctorState":
        z = jnp.zeros((), jnp.float32)
        return cls(**{f.name: z for f in dataclasses.fields(cls)}).replace(value_low=jnp.float32(jnp.inf))


@struct.dataclass
class DoctorTrainState:
    """The state the driver scans with the doctor on: the inner state (the agent's, or the meta
    layer's) and the `DoctorState` beside it, both batched over seeds. Every other attribute reads
    through to the inner state, and `replace` of those fields writes through."""

    inner: Any
    doctor: DoctorState

    def __getattr__(self, name):
        if name in ("inner", "doctor") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def _replace(self, **changes):
    own = {k: changes.pop(k) for k in ("inner", "doctor") if k in changes}
    inner = own.pop("inner", self.inner)
    if changes:
        inner = inner.replace(**changes)
    return dataclasses.replace(self, inner=inner, **own)


DoctorTrainState.replace = _replace  # set after the decorator, which installs its own `replace`


def _f32(x):
    return jnp.asarray(x, jnp.float32)


# -- the doctor's level in a run's state, kept apart in checkpoints ---------------------------------
def _holder(state) -> str | None:
    """The field of a wrapping state (the evaluation layer's) on the way to the doctor's level, or None."""
    if not dataclasses.is_dataclass(state) or isinstance(state, (type, DoctorTrainState)):
        return None
    for f in dataclasses.fields(state):
        sub = getattr(state, f.name)
        if isinstance(sub, DoctorTrainState) or _holder(sub) is not None:
            return f.name
    return None


def split(state) -> tuple[Any, DoctorState | None]:
    """`(the state without the doctor's level, its DoctorState)`; `(state, None)` when the run has
    no doctor. A checkpoint stores the two apart, so that turning the doctor on or off (or a
    run from before the doctor) leaves the agent's state readable."""
    if isinstance(state, DoctorTrainState):
        return state.inner, state.doctor
    name = _holder(state)
    if name is None:
        return state, None
    inner, d = split(getattr(state, name))
    return dataclasses.replace(state, **{name: inner}), d


def join(like, state, d: DoctorState):
    """`state` (shaped like `split(like)[0]`) with the DoctorState `d` put back where `like` has it."""
    if isinstance(like, DoctorTrainState):
        return DoctorTrainState(state, d)
    name = _holder(like)
    if name is None:
        return state
    return dataclasses.replace(state, **{name: join(getattr(like, name), getattr(state, name), d)})


def _spread(hi, lo):
    return (hi - lo) / jnp.maximum(jnp.maximum(jnp.abs(hi), jnp.abs(lo)), 1.0)


class Doctor:
    """The detectors of one run: `init` the state of every seed, `update` after an iteration."""

    def __init__(self, cfg: DoctorConfig, steps_per_iteration: int, max_entropy: float | None, seeds: int,
                 cells: int = 1, devices: int = 1):
        self.cfg = cfg
        self.steps = steps_per_iteration
        self.alpha = min(0.25, steps_per_iteration / cfg.smoothing_steps)
        # the first window: the iterations whose returns make the first level (at least 4)
        self.first_iters = max(4, math.ceil(cfg.smoothing_steps / steps_per_iteration))
        self.patience = max(1, math.ceil(cfg.patience_steps / steps_per_iteration))
        self.max_entropy = max_entropy if max_entropy and math.isfinite(max_entropy) else None
        self.seeds, self.cells, self.devices = seeds, cells, devices
        self.per_cell = seeds // cells

    def init(self, seeds: int) -> DoctorState:
        return jax.tree.map(lambda x: jnp.broadcast_to(x, (seeds,)), DoctorState.zeros())

    def update(self, d: DoctorState, s, t, device_return=None) -> tuple[DoctorState, dict]:
        """`s`: the seeds' `Signals` ([S] float32 each); `t`: the iteration (shared); `device_return`:
        [S] this device's mean return (only with several devices, inside the mesh)."""
        c, a = self.cfg, self.alpha
        steps = (_f32(t) + 1.0) * self.steps

        def average(old, new, n):  # the mean of the first 1/a values, then an EMA (no start bias)
            return old + jnp.maximum(a, 1.0 / jnp.maximum(n, 1.0)) * (new - old)

        def smooth(old, new):  # the same over every iteration
            return average(old, new, _f32(t) + 1.0)

        got = (s.episodes > 0) & jnp.isfinite(s.episode_return)
        ret = jnp.where(got, s.episode_return, 0.0)
        n_ret = d.n_ret + got
        ret_ema = jnp.where(got, average(d.ret_ema, ret, n_ret), d.ret_ema)
        seen = d.seen + s.episodes
        known = n_ret > 0
        # the first level: the mean return over the first window (or the first episodes', if later)
        in_first = got & ((t < self.first_iters) | (d.first_n == 0))
        first_n = d.first_n + in_first
        ret_first = jnp.where(in_first, d.ret_first + (ret - d.ret_first) / jnp.maximum(first_n, 1.0), d.ret_first)
        ready = known & (t >= self.first_iters)  # the first level is set: later returns compare with it
        ret_best = jnp.where(ready, jnp.maximum(d.ret_best, ret_ema), ret_first)
        ret_size = jnp.maximum(d.ret_size, jnp.where(known, jnp.abs(ret_ema), 0.0))
        first_size = jnp.maximum(jnp.abs(ret_first), 1.0)
        progress = ready & (ret_best - ret_first > c.min_progress * first_size)
        d = d.replace(seen=seen, n_ret=n_ret, ret_ema=ret_ema, ret_first=ret_first, first_n=first_n,
                      ret_best=ret_best, ret_size=ret_size)
        out = {"return": ret_ema, "return_first": ret_first, "return_best": ret_best}
        found = {}

        # early collapse: a fall inside the early window, latched while the return stays down
        down = ready & (ret_ema < ret_first - c.collapse_drop * first_size)
        collapsed = jnp.where(down & (steps <= c.early_steps), 1.0, d.collapsed) * down
        d = d.replace(collapsed=collapsed)
        found["early_collapse"] = collapsed

        # value divergence: Q out of range (or, for agents that report no Q, the value loss far above
        # its lowest level), or the updates skipped
        diverged = jnp.zeros_like(ret_ema, bool)
        if s.value_loss is not None:
            v = jnp.abs(s.value_loss)
            learned = (v > 0) & jnp.isfinite(v)
            n_value = d.n_value + learned
            value_ema = jnp.where(learned, average(d.value_ema, v, n_value), d.value_ema)
            settled = n_value * a >= 1.0  # past the plain mean of the first values
            value_low = jnp.where(learned & settled, jnp.minimum(d.value_low, value_ema), d.value_low)
            d = d.replace(value_ema=value_ema, value_low=value_low, n_value=n_value)
            if s.q_magnitude is None:  # a loss that grew as the returns did (PPO's, once episodes lengthen) is
                # no divergence: a squared error counts once it is beyond the returns' own scale squared
                beyond = jnp.maximum(c.value_growth * jnp.maximum(value_low, 1.0), jnp.square(ret_size))
                diverged |= jnp.isfinite(value_low) & (value_ema > beyond)
            out["value"], out["value_low"] = value_ema, jnp.where(jnp.isfinite(value_low), value_low, 0.0)
        if s.q_magnitude is not None:
            q = jnp.abs(s.q_magnitude)
            q = jnp.where(jnp.isfinite(q), q, jnp.float32(3e38))
            n_q = d.n_q + (q > 0)
            q_ema = jnp.where(q > 0, average(d.q_ema, q, n_q), d.q_ema)
            d = d.replace(q_ema=q_ema, n_q=n_q)
            diverged |= known & (q_ema > c.q_ratio * jnp.maximum(ret_size, 1.0))
            out["q"] = q_ema
        if s.skipped_frac is not None:
            skipped_ema = smooth(d.skipped_ema, s.skipped_frac)
            d = d.replace(skipped_ema=skipped_ema)
            diverged |= skipped_ema > c.skipped_share
            out["skipped"] = skipped_ema
        if s.value_loss is not None or s.q_magnitude is not None or s.skipped_frac is not None:
            found["value_divergence"] = diverged

        # entropy collapse: a near-deterministic policy that never got anywhere
        if s.entropy is not None and self.max_entropy is not None:
            ratio = smooth(d.entropy_ema, s.entropy / self.max_entropy)
            d = d.replace(entropy_ema=ratio)
            low = ready & (ratio < c.entropy_floor) & ~progress
            if s.explore is not None:  # an ε-greedy policy reports the greedy part's entropy: ε must be low too
                low &= smooth(d.explore_ema, s.explore) <= c.explore_floor
            found["entropy_collapse"] = low
            out["entropy"] = ratio

        # exploration stuck: at its floor, no progress, for `patience` iterations
        if s.explore is not None:
            explore = smooth(d.explore_ema, s.explore)
            at_floor = ready & (explore <= c.explore_floor) & ~progress
            stuck = jnp.where(at_floor, d.stuck + 1.0, 0.0)
            d = d.replace(stuck=stuck, explore_ema=explore)
            found["exploration_stuck"] = stuck >= self.patience
            out["explore"] = explore

        # seed disagreement inside each cell of seeds
        if self.per_cell > 1:
            by_cell = ret_ema.reshape(self.cells, self.per_cell)
            all_in = known.reshape(self.cells, self.per_cell).all(axis=1)
            spread = jnp.where(all_in, _spread(by_cell.max(axis=1), by_cell.min(axis=1)), 0.0)
            spread = jnp.repeat(spread, self.per_cell)
            disagree = jnp.where(spread > c.seed_spread, d.disagree + 1.0, 0.0)
            d = d.replace(disagree=disagree)
            found["seed_disagreement"] = disagree >= self.patience
            out["seed_spread"] = spread

        # device disagreement (inside the mesh): the spread of the devices' own returns
        if device_return is not None:
            from rmtjax.distributed import AXIS

            hi, lo = jax.lax.pmax(device_return, AXIS), jax.lax.pmin(device_return, AXIS)
            device_ema = d.device_ema + a * (_spread(hi, lo) - d.device_ema)
            apart = jnp.where(known & (device_ema > c.device_spread), d.device_apart + 1.0, 0.0)
            d = d.replace(device_ema=device_ema, device_apart=apart)
            found["device_disagreement"] = apart >= self.patience
            out["device_spread"] = device_ema

        metrics = {PREFIX + k: _f32(v) for k, v in found.items()}
        metrics.update({PREFIX + k: _f32(v) for k, v in out.items()})
        return d, metrics


def _device_return(env_state):
    """[S] this device's mean return of its envs' last completed episodes (0 before any)."""
    seen = env_state.episodes_done > 0
    total = jnp.sum(jnp.where(seen, env_state.last_return, 0.0), axis=-1)
    return _f32(total / jnp.maximum(seen.sum(-1), 1))


def compose(config, agent, init, step, cells: int = 1):
    """The doctor over the driver's batched `init(keys, hparams) -> states` and `step(states, t) ->
    (states, metrics)`: the same two functions with a `DoctorState` beside the inner state, or
    `init` and `step` themselves when `doctor.enabled` is false."""
    if not config.doctor.enabled:
        return init, step
    seeds, devices = config.train.num_seeds, config.distributed.devices
    doc = Doctor(config.doctor, agent.steps_per_iteration, agent.max_entropy, seeds, cells, devices)

    def doctor_init(keys, hparams=None):
        return DoctorTrainState(init(keys, hparams), doc.init(seeds))

    def doctor_step(state, t):
        inner, metrics = step(state.inner, t)
        signals = jax.vmap(agent.signals)(metrics)
        signals = jax.tree.map(_f32, signals)
        device_return = _device_return(inner.env_state) if devices > 1 else None
        d, found = doc.update(state.doctor, signals, t, device_return)
        return DoctorTrainState(inner, d), {**metrics, **found}

    return doctor_init, doctor_step


# -- the host side: findings from the metrics, warnings, doctor.jsonl -----------------------------
class DoctorWarning(UserWarning):
    """A training doctor finding (`rmtjax.doctor`): the likely cause and what to change."""


@dataclasses.dataclass(frozen=True)
class Kind:
    cause: str
    evidence: tuple[str, ...]  # metric names (without the prefix) shown as evidence
    # (config field, suggested value or change) or (field, suggestion, at_least): a fix of the last form
    # is left out where the config's value is already at least `at_least` (8 seeds need no "3 or more", an
    # ε starting at 1.0 no "start exploring more")
    fixes: tuple[tuple, ...]


KINDS: dict[str, Kind] = {
    "early_collapse": Kind(
        "the return fell far below its first level early on: the policy settled on bad actions before it explored "
        "(too little initial exploration, rewards on a large scale, or one unlucky seed)",
        ("return", "return_first"),
        (("agent.eps_start", "0.9 (an initial exploration rate of 0.8-0.99)", 0.8), ("agent.ent_coef", "0.01"),
         ("env.reward_scale", "so that rewards lie within [-1, 1]"), ("train.num_seeds", "3 or more", 3))),
    "value_divergence": Kind(
        "the value estimates diverged: Q or the TD/value loss grew far beyond the returns, or updates were "
        "skipped as non-finite (learning rate too high, unclipped gradients, a target updated too often, "
        "a Huber delta far below the returns' scale)",
        ("q", "return", "value", "value_low", "skipped"),
        (("agent.max_grad_norm", "0.5"), ("agent.target_update_every", "500-2000"), ("agent.tau", "0.005"),
         ("agent.lr", "a third of the current value"), ("agent.critic_lr", "a third of the current value"),
         ("agent.loss", "mse (or a huber_delta on the returns' scale)"), ("env.normalize_reward", "true"))),
    "entropy_collapse": Kind(
        "the policy became nearly deterministic before the return improved: it stopped exploring too early",
        ("entropy", "return", "return_best"),
        (("agent.ent_coef", "0.01 (more entropy bonus)"), ("agent.entropy_target_end", "a larger share"),
         ("agent.lr", "half of the current value"))),
    "exploration_stuck": Kind(
        "exploration is at its floor (ε or temperature) and the return makes no progress: the agent no longer "
        "tries actions that could find reward (a sparse reward needs exploration)",
        ("explore", "return", "return_first", "return_best"),
        (("agent.eps_end", "0.05", 0.05), ("agent.eps_start", "1.0", 1.0),
         ("agent.eps_decay_frac", "0.5 (a longer decay)"),
         ("agent.ent_coef", "0.01"), ("agent.entropy_target_end", "a larger share"))),
    "seed_disagreement": Kind(
        "the seeds' returns stay far apart: the result depends on the seed (or the seeds were given different "
        "hyperparameters on purpose)",
        ("seed_spread", "return"),
        (("train.num_seeds", "5 or more, and report an interval", 5), ("agent.lr", "half of the current value"))),
    "device_disagreement": Kind(
        "the devices' returns differ by more than the threshold: the workers are desynchronised (their "
        "parameters or statistics drift apart, or a lossy gradient fusion loses too much)",
        ("device_spread", "return"),
        (("distributed.fusion", "mean (exact averaging)"), ("agent.lr", "half of the current value"))),
}


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str
    seed: int  # the run's seed index (cell * seeds_per_cell + seed in a sweep)
    iteration: int  # from 1, as in metrics.jsonl
    env_steps: int
    evidence: dict
    message: str

    def to_json(self) -> dict:
        return {"finding": self.kind, "seed": self.seed, "iteration": self.iteration, "env_steps": self.env_steps,
                "evidence": self.evidence, "message": self.message}


def fixes(kind: str, config=None) -> list[str]:
    """`field: suggestion` lines for a finding; with a config, only the fields it has (and their values),
    less those already at the suggested minimum."""
    out = []
    data = None if config is None else config.to_dict()
    for field, hint, *at_least in KINDS[kind].fixes:
        if data is not None:
            section, name = field.split(".", 1)
            if name not in (data.get(section) or {}):
                continue
            now = data[section][name]
            if at_least and now >= at_least[0]:
                continue
            out.append(f"{field}: {hint} (now {now!r})")
        else:
            out.append(f"{field}: {hint}")
    return out


def _number(x) -> float | None:
    x = float(x)
    return float(f"{x:.6g}") if math.isfinite(x) else None


def findings(history: Mapping[str, np.ndarray], config=None) -> list[Finding]:
    """Every finding in a run's metrics (name -> [iterations, seeds]): per kind and seed, the first
    iteration at which the `doctor_*` finding holds, with its evidence there and the number of
    iterations it held in all."""
    out = []
    steps = history.get("env_steps")
    for kind in KINDS:
        flag = history.get(PREFIX + kind)
        if flag is None:
            continue
        flag = np.asarray(flag) > 0.5
        for seed in np.flatnonzero(flag.any(axis=0)):
            it = int(np.argmax(flag[:, seed]))
            ev = {name: _number(history[PREFIX + name][it, seed]) for name in KINDS[kind].evidence
                  if PREFIX + name in history}
            ev["iterations_held"] = int(flag[:, seed].sum())
            env_steps = int(steps[it, seed]) if steps is not None else -1
            out.append(Finding(kind, int(seed), it + 1, env_steps, ev,
                               message(kind, [int(seed)], it + 1, env_steps, ev, config)))
    out.sort(key=lambda f: (f.iteration, f.seed, f.kind))
    return out


def message(kind: str, seeds, iteration: int, env_steps: int, evidence: dict, config=None) -> str:
    """One line: what was seen, where, the likely cause and the config fields to change."""
    shown = ", ".join(f"{k} {v:.4g}" if v is not None else f"{k} nan" for k, v in evidence.items()
                      if k != "iterations_held")
    change = "; ".join(fixes(kind, config)) or "see docs/doctor.md"
    who = "seed " + ", ".join(str(s) for s in seeds)
    return (f"doctor: {kind.replace('_', ' ')} in {who} at iteration {iteration} (env step {env_steps:,}; {shown}): "
            f"{KINDS[kind].cause}. Change {change}")


class Watch:
    """The driver's side, between chunks: warns once per kind of finding (first seed and iteration),
    keeps `notes()` for the summary and rewrites `doctor.jsonl` in the run directory."""

    def __init__(self, config, run_path=None):
        self.config, self.path = config, run_path
        self._warned: set[str] = set()
        self._found: list[Finding] = []

    def after_chunk(self, chunks: list[dict]) -> None:
        if not chunks or not any(k.startswith(PREFIX) for k in chunks[-1]):
            return
        names = [k for k in chunks[-1] if k.startswith(PREFIX) or k == "env_steps"]
        history = {k: np.concatenate([np.asarray(c[k]) for c in chunks if k in c], axis=0) for k in names}
        self._found = findings(history, self.config)
        for f in self._found:
            if f.kind not in self._warned:
                self._warned.add(f.kind)
                warnings.warn(f.message, DoctorWarning, stacklevel=3)
        if self.path is not None:
            from rmtjax import safefs

            text = "".join(json.dumps(f.to_json()) + "\n" for f in self._found)
            safefs.write_atomic(self.path / "doctor.jsonl", text)

    def notes(self) -> list[str]:
        """The first finding of each kind (for the run's summary)."""
        first: dict[str, str] = {}
        for f in self._found:
            first.setdefault(f.kind, f.message)
        return list(first.values())


# -- reading a run back (rmtjax doctor RUN) ---------------------------------------------------------
def read_metrics(path) -> tuple[dict[str, np.ndarray], Any]:
    """A run directory's (or a metrics.jsonl / metrics.csv file's) metrics as name -> [iterations,
    seeds] float arrays, and the path of the run's config.yaml when one is beside them (else None).
    Data only: nothing in the directory is run."""
    import csv
    from pathlib import Path

    from rmtjax import configfile
    from rmtjax.schema import ConfigError

    path = Path(path)
    config = None
    if path.is_dir():
        if (path / "config.yaml").is_file():
            config = path / "config.yaml"
        for name in ("metrics.jsonl", "metrics.csv"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise ConfigError(f"{path}: no metrics.jsonl or metrics.csv (not a run directory)")
    elif (path.parent / "config.yaml").is_file():
        config = path.parent / "config.yaml"
    text = configfile.read_text(path, ConfigError, limit=MAX_METRICS_BYTES)
    if path.suffix == ".csv":
        rows = [{k: (float(v) if v not in ("", None) else math.nan) for k, v in r.items()}
                for r in csv.DictReader(text.splitlines())]
    elif path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    raise ConfigError(f"{path}:{n}: not a JSON line") from None
                rows.append({k: (math.nan if v is None else float(v)) for k, v in row.items()})
    else:
        raise ConfigError(f"{path}: expected a run directory, metrics.jsonl or metrics.csv")
    if not rows:
        raise ConfigError(f"{path}: no metrics rows")
    # a sweep's rows carry a cell: its seeds are numbered cell * seeds_per_cell + seed
    per_cell = 1 + int(max(r.get("seed", 0) for r in rows))
    index = [int(r.get("cell", 0)) * per_cell + int(r.get("seed", 0)) for r in rows]
    iters = sorted({int(r["iteration"]) for r in rows})
    pos = {it: i for i, it in enumerate(iters)}
    seeds = 1 + max(index)
    names = sorted({k for r in rows for k in r} - {"iteration", "seed", "cell"})
    out = {k: np.full((len(iters), seeds), np.nan) for k in names}
    for r, s in zip(rows, index):
        i = pos[int(r["iteration"])]
        for k, v in r.items():
            if k in out:
                out[k][i, s] = v
    return out, config


def plot(history: Mapping[str, np.ndarray], found: list[Finding], path) -> None:
    """The signals the detectors used, one panel each, against env steps (every seed), with each
    finding's first iteration marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in ("return", "q", "value", "skipped", "entropy", "explore", "seed_spread", "device_spread")
             if PREFIX + k in history]
    if not names:
        raise ValueError("no doctor_* signals in these metrics (the run had doctor.enabled: false)")
    x = history.get("env_steps")
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.2 * len(names)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        y = history[PREFIX + name]
        for s in range(y.shape[1]):
            ax.plot(x[:, s] if x is not None else np.arange(1, y.shape[0] + 1), y[:, s], lw=1, label=f"seed {s}")
        if name in ("q", "value") and np.nanmax(np.abs(y)) > 1e3:
            ax.set_yscale("symlog")
        ax.set_ylabel(name)
        for f in found:
            if name in KINDS[f.kind].evidence:
                ax.axvline(f.env_steps if x is not None else f.iteration, color="red", ls="--", lw=0.8)
                ax.annotate(f.kind.replace("_", " "), (f.env_steps if x is not None else f.iteration, 0.95),
                            xycoords=("data", "axes fraction"), fontsize=7, color="red", va="top")
    axes[0, 0].legend(fontsize=7, loc="best")
    axes[-1, 0].set_xlabel("env steps per seed" if x is not None else "iteration")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
