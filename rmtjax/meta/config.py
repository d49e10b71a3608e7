"""The `meta:` and `curriculum:` config sections, and their checks against the agent and env.

`meta.mode` chooses the meta-controller (`off`, `rules`, `bandit`, `pbt`); the bounds say
where it may move the learning rate(s), γ and ε. `curriculum.stages` lists thresholds on a
metric and what each stage sets. Both sections are validated on their own when built, and
against the agent's hyperparameters and the env (`check_meta`) when the whole `Config` is.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from rmtjax.protocol import GROUPS, group_of, hparam_groups, hparam_names
from rmtjax.schema import ConfigError, Section, close_matches, param

MODES = ("off", "rules", "bandit", "pbt")

# A group name (lr, gamma, eps) may be given instead of an agent's own hyperparameter field: it
# stands for every field the agent's `HParams` declares in that group (`rmtjax.protocol.hparam`;
# SAC's actor_lr and critic_lr are both in "lr").

DEFAULT_ARMS = (
    {"lr": 1e-4, "gamma": 0.99}, {"lr": 3e-4, "gamma": 0.99}, {"lr": 1e-3, "gamma": 0.99},
    {"lr": 1e-4, "gamma": 0.97}, {"lr": 3e-4, "gamma": 0.97}, {"lr": 1e-3, "gamma": 0.97},
)


@dataclasses.dataclass(frozen=True)
class MetaConfig(Section):
    """The hyperparameter meta-controller, run inside the compiled loop after every iteration."""

    _section = "meta"
    mode: str = param("off", choices=MODES, doc="off: hyperparameters stay as configured; rules: moves by "
                                                "rules on the learning signals; bandit: sliding-window UCB over "
                                                "`arms`; pbt: population-based training across the seeds")
    # bounds every move keeps to
    lr_min: float = param(1e-5, lo=0.0, hi=1.0, lo_open=True, doc="lowest learning rate (every lr field)")
    lr_max: float = param(1e-3, lo=0.0, hi=1.0, lo_open=True, doc="highest learning rate")
    gamma_min: float = param(0.9, lo=0.0, hi=1.0, doc="lowest discount")
    gamma_max: float = param(0.99, lo=0.0, hi=1.0, doc="highest discount")
    eps_min: float = param(0.01, lo=0.0, hi=1.0, doc="lowest ε (eps_start and eps_end of the schedule)")
    eps_max: float = param(1.0, lo=0.0, hi=1.0, doc="highest ε")
    # timing and signals
    interval: int = param(10, lo=1, doc="iterations between decisions (a rule move, a bandit play, a PBT round)")
    warmup: int = param(20, lo=0, doc="iterations of signals before the first decision")
    fast_rate: float = param(0.3, lo=0.0, hi=1.0, lo_open=True, doc="rate of the fast moving averages of signals")
    slow_rate: float = param(0.05, lo=0.0, hi=1.0, lo_open=True, doc="rate of the slow moving averages")
    # rules
    loss_tolerance: float = param(0.1, lo=0.0, doc="rules: |log(fast/slow value-loss average)| below this "
                                                   "is converged, above it rising")
    return_tolerance: float = param(0.05, lo=0.0, doc="rules: return trend (fast - slow)/(|slow| + 1) below "
                                                      "-this is falling")
    entropy_tolerance: float = param(0.05, lo=0.0, doc="rules: entropy rate of change below this is settled")
    explore_target: float = param(0.05, lo=0.0, hi=1.0, doc="rules: ε decays only while the share of "
                                                            "exploratory actions is above this")
    lr_factor: float = param(0.7, lo=0.0, hi=1.0, lo_open=True, hi_open=True, doc="rules: lr ×= this when the "
                                                                                 "value loss rises while the "
                                                                                 "return falls")
    gamma_factor: float = param(0.9, lo=0.0, hi=1.0, lo_open=True, hi_open=True,
                                doc="rules: (1 - γ) ×= this when the value loss has converged")
    eps_factor: float = param(0.9, lo=0.0, hi=1.0, lo_open=True, hi_open=True,
                              doc="rules: ε ×= this when the policy has matured")
    # bandit
    arms: tuple[dict, ...] = param(DEFAULT_ARMS, doc="bandit: the hyperparameter settings it chooses among, "
                                                     "each a mapping name -> value (lr, gamma, eps or a field "
                                                     "of the agent's hparams)")
    window: int = param(20, lo=1, hi=100_000, doc="bandit: plays remembered by the sliding-window UCB")
    ucb_c: float = param(1.0, lo=0.0, doc="bandit: weight of the UCB exploration bonus")
    bandit_eps: float = param(0.0, lo=0.0, hi=1.0, doc="bandit: probability of a uniformly random arm")
    # pbt
    pbt_quantile: float = param(0.25, lo=0.0, hi=0.5, lo_open=True, doc="pbt: share of seeds replaced by the "
                                                                        "best ones each round")
    perturb: float = param(1.25, lo=1.0, hi=10.0, lo_open=True, doc="pbt: a copied hyperparameter is "
                                                                    "multiplied or divided by this")

    def validate(self):
        for lo, hi in (("lr_min", "lr_max"), ("gamma_min", "gamma_max"), ("eps_min", "eps_max")):
            if getattr(self, lo) > getattr(self, hi):
                raise ConfigError(f"meta.{lo}: {getattr(self, lo)} is above meta.{hi} = {getattr(self, hi)}")
        if self.slow_rate >= self.fast_rate:
            raise ConfigError(f"meta.slow_rate: {self.slow_rate} must be below meta.fast_rate = {self.fast_rate}")
        if not self.arms:
            raise ConfigError("meta.arms: the bandit needs at least one arm, e.g. [{lr: 0.0003}, {lr: 0.0001}]")
        arms = []
        for i, arm in enumerate(self.arms):
            if not arm:
                raise ConfigError(f"meta.arms[{i}]: an arm sets at least one hyperparameter, e.g. {{lr: 0.0003}}")
            arms.append({str(k): _number(f"meta.arms[{i}].{k}", v) for k, v in arm.items()})
        object.__setattr__(self, "arms", tuple(arms))

    @property
    def active(self) -> bool:
        return self.mode != "off"

    def group_bounds(self) -> dict[str, tuple[float, float]]:
        """group -> (low, high): where a move may take every field of the group."""
        return {"lr": (self.lr_min, self.lr_max), "gamma": (self.gamma_min, self.gamma_max),
                "eps": (self.eps_min, self.eps_max)}

    def bounds(self, hparams) -> dict[str, tuple[float, float]]:
        """field -> (low, high) for every field of `hparams` (an `HParams` class or instance)
        that belongs to a group."""
        groups = self.group_bounds()
        return {f: groups[g] for g, fields in hparam_groups(hparams).items() for f in fields}


@dataclasses.dataclass(frozen=True)
class CurriculumConfig(Section):
    """Stages entered when a metric reaches their thresholds; each sets hyperparameters (and,
    for gymnax envs, env parameters)."""

    _section = "curriculum"
    metric: str = param("episode_return", doc="the per-iteration metric compared with the thresholds")
    patience: int = param(1, lo=1, doc="iterations in a row the metric must be at or above a threshold")
    stages: tuple[dict, ...] = param((), doc="stages after the first (the config as given), in order: each "
                                             "{threshold: x, hparams: {name: value}, env: {param: value}}")

    def validate(self):
        stages, last = [], -math.inf
        for i, stage in enumerate(self.stages):
            path = f"curriculum.stages[{i}]"
            unknown = set(stage) - {"threshold", "hparams", "env"}
            if unknown:
                k = sorted(unknown, key=str)[0]  # YAML keys need not all be strings
                raise ConfigError(f"unknown key {path}.{k}.{close_matches(str(k), ('threshold', 'hparams', 'env'))}")
            if "threshold" not in stage:
                raise ConfigError(f"{path}: missing threshold (the value of curriculum.metric that enters it)")
            threshold = _number(f"{path}.threshold", stage["threshold"])
            if threshold < last:
                raise ConfigError(f"{path}.threshold: {threshold} is below the previous stage's {last}; "
                                  f"stages are entered in order, so thresholds must not decrease")
            last = threshold
            hp = _mapping(f"{path}.hparams", stage.get("hparams"))
            env = _mapping(f"{path}.env", stage.get("env"))
            if not hp and not env:
                raise ConfigError(f"{path}: a stage sets hparams or env parameters (or both)")
            stages.append({"threshold": threshold, "hparams": {str(k): _number(f"{path}.hparams.{k}", v)
                                                               for k, v in hp.items()}, "env": dict(env)})
        object.__setattr__(self, "stages", tuple(stages))

    @property
    def active(self) -> bool:
        return bool(self.stages)


def _number(path: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{path}: expected a finite number, got {v!r}")
    return float(v)


def _mapping(path: str, v: Any) -> dict:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"{path}: expected a mapping of name: value, got {v!r}")
    return dict(v)


def resolve_names(path: str, names, hparams, algo: str) -> dict[str, tuple[str, ...]]:
    """Each given name -> the fields of `hparams` (the agent's `HParams` class) it sets (a group
    name -> the fields declared in it). A name that is neither a group the agent has a field
    of, nor a field, is an error."""
    hparam_fields, groups = hparam_names(hparams), hparam_groups(hparams)
    out = {}
    for name in names:
        if name in GROUPS:
            fields = groups.get(name, ())
            if not fields:
                raise ConfigError(f"{path}.{name}: {algo} has no {name} hyperparameter; its hyperparameters are "
                                  f"{', '.join(hparam_fields)}")
        elif name in hparam_fields:
            fields = (name,)
        else:
            raise ConfigError(f"{path}.{name}: not a hyperparameter of {algo}.{close_matches(name, (*hparam_fields, *GROUPS))}")
        out[name] = fields
    return out


def check_meta(config) -> CurriculumConfig:
    """Cross-checks of `config.meta` and `config.curriculum` against the agent and env. Returns
    the curriculum with its stages' env parameters converted to the env's kinds (a new
    section; the one passed in is not changed)."""
    from rmtjax.agents import agent_class

    meta, cur, algo = config.meta, config.curriculum, config.algo
    cls = agent_class(algo)
    settings = config.agent
    bounds = meta.bounds(cls.HParams)
    if meta.active:
        for f in hparam_names(cls.HParams):
            if f in bounds:
                lo, hi = bounds[f]
                v = getattr(settings, f)
                if not lo <= v <= hi:
                    group = group_of(cls.HParams, f)
                    raise ConfigError(f"agent.{f}: {v} lies outside the meta-controller's bounds [{lo}, {hi}] "
                                      f"(meta.{group}_min, meta.{group}_max); move agent.{f} inside them or "
                                      f"widen the bounds")
    if meta.mode == "bandit":
        for i, arm in enumerate(meta.arms):
            _check_values(config, settings, f"meta.arms[{i}]", arm, cls.HParams, bounds)
    if meta.mode == "pbt" and config.train.num_seeds < 2:
        raise ConfigError(f"meta.mode: pbt trains a population across the seeds of one run and needs "
                          f"train.num_seeds ≥ 2 (it is {config.train.num_seeds})")
    stages = []
    for i, stage in enumerate(cur.stages):
        path = f"curriculum.stages[{i}]"
        _check_values(config, settings, f"{path}.hparams", stage["hparams"], cls.HParams,
                      bounds if meta.active else {})
        if stage["env"]:
            if ":" in config.env.id:
                raise ConfigError(f"{path}.env: env parameters in a curriculum are supported for gymnax "
                                  f"environments only; {config.env.id!r} keeps its parameters in its own "
                                  f"(host or brax) code. Not yet supported; leave {path}.env out.")
            from rmtjax.envs import check_env_params, default_env_params

            try:
                checked = check_env_params(config.env.id, default_env_params(config.env.id), stage["env"])
            except ConfigError as e:
                raise ConfigError(str(e).replace("env.params.", f"{path}.env.", 1)) from None
            stage = {**stage, "env": checked}
        stages.append(stage)
    return dataclasses.replace(cur, stages=tuple(stages)) if cur.stages else cur


def _check_values(config, settings, path, values: Mapping[str, float], hparams, bounds) -> None:
    resolved = resolve_names(path, values, hparams, config.algo)
    for name, targets in resolved.items():
        v = values[name]
        for f in targets:
            if f in bounds and not bounds[f][0] <= v <= bounds[f][1]:
                lo, hi = bounds[f]
                raise ConfigError(f"{path}.{name}: {v} lies outside the meta-controller's bounds [{lo}, {hi}] "
                                  f"for {f}")
            try:
                dataclasses.replace(settings, **{f: v})  # the agent's own range for the field
            except ConfigError as e:
                raise ConfigError(f"{path}.{name}: {e}") from None
