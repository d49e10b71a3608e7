"""Typed configuration: dataclass sections, YAML/dict I/O, dotted overrides, validation.

A `Config` has these parts: `algo` (registry name), `env` (`EnvConfig`), `train`
(`TrainConfig`), `agent` (the algorithm's own section, e.g. `PPOConfig`), and the optional
sections `precision` (`rmtjax.precision.PrecisionConfig`; the defaults are fp32), `meta`,
`curriculum` (`rmtjax.meta.config`) and `distributed` (`rmtjax.distributed.DistributedConfig`;
the default is one device) and `transfer` (`rmtjax.transfer.TransferConfig`; the default transfers
nothing, and a config.yaml leaves the section out while it is the default). Every field
declares its type and, where it has one, its allowed range or choices; a bad value raises a
`ConfigError` (a `ValueError`) naming the field, the value and what is allowed, at the moment
the config is built. Nothing is clamped or dropped silently.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import yaml

from rmtjax import configfile
from rmtjax.distributed import DistributedConfig
from rmtjax.doctor import DoctorConfig
from rmtjax.meta.config import CurriculumConfig, MetaConfig, check_meta
from rmtjax.precision import PrecisionConfig
from rmtjax.schema import INT_MAX, ConfigError, Section, close_matches, param  # noqa: F401 (re-exported)
from rmtjax.transfer import TransferConfig


@dataclasses.dataclass(frozen=True)
class EnvConfig(Section):
    """The environment and the wrappers around it (all pure JAX, vectorised over `num_envs`)."""

    _section = "env"
    id: str = param("CartPole-v1", doc="environment id: a gymnax id such as CartPole-v1, or prefix:name for "
                                        "another suite: gymnasium:, atari:, brax:, playground:, craftax:, navix:, "
                                        "jumanji:, xminigrid: (e.g. gymnasium:LunarLander-v3, brax:ant)")
    num_envs: int = param(4, lo=1, doc="environments stepped in parallel per seed")
    params: dict = param({}, doc="the environment's own parameters: gymnax EnvParams overrides; for "
                                 "gymnasium: ids, keyword arguments of gymnasium.make; for brax: ids, "
                                 "max_steps_in_episode and keyword arguments of brax.envs.get_environment; "
                                 "for the other suites see the Environments guide (docs/guides/environments.md)")
    host_vectorization: str = param("sync", choices=("sync", "async"),
                                    doc="gymnasium: and atari: ids only: step the host envs in this process (sync) or "
                                        "in worker processes (async)")
    normalize_obs: bool = param(False, doc="normalise observations by running mean/variance")
    obs_norm_window: int = param(0, lo=0, doc="0: statistics over the whole run; N: over the last N steps")
    normalize_reward: bool = param(False, doc="divide rewards by the std of the discounted return")
    reward_gamma: float = param(0.99, lo=0.0, hi=1.0, doc="discount used by reward normalisation")
    reward_scale: float = param(1.0, lo=0.0, lo_open=True, hi=1e6,
                                doc="constant factor on rewards (at most 1e6: returns are float32 sums)")
    reward_clip: float = param(0.0, lo=0.0, doc="clip rewards to [-c, c] after scaling; 0 disables")
    frame_stack: int = param(1, lo=1, hi=64, doc="number of most recent observations stacked")

    def validate(self):
        from rmtjax.envs import check_env_id, is_host_env

        check_env_id(self.id)
        if self.host_vectorization != "sync" and not is_host_env(self.id):
            raise ConfigError(f"env.host_vectorization: {self.host_vectorization!r} applies only to environments "
                              f"run on the host (gymnasium:<id>, atari:<game>); {self.id!r} runs in JAX. Leave it at 'sync'.")
        if self.params and ":" not in self.id:
            from rmtjax.envs import check_env_params, default_env_params

            # stored as checked: 2e2 for an integer parameter becomes 200
            object.__setattr__(self, "params", check_env_params(self.id, default_env_params(self.id), self.params))


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """What the driver does: how long, how many seeds, how the run is chunked and reported."""

    _section = "train"
    total_steps: int = param(500_000, lo=1, doc="environment steps per seed")
    num_seeds: int = param(1, lo=1, doc="independent seeds trained side by side (vmapped)")
    num_chunks: int = param(10, lo=1, doc="the scan is split into this many compiled chunks")
    progress: bool = param(True, doc="show a progress bar between chunks")
    seed: int = param(0, lo=0, doc="PRNG seed used by the CLI (Python callers pass a key)")
    checkpoint_every: int = param(1, lo=1, doc="with a run directory: checkpoint every N chunks (and after the last)")
    keep_checkpoints: int = param(3, lo=1, doc="with a run directory: checkpoints kept; older ones are deleted")
    tensorboard: bool = param(False, doc="with a run directory: also write TensorBoard events (needs tensorboardX)")
    wandb: bool = param(False, doc="also log to Weights & Biases: the TensorBoard scalars against env steps, "
                                   "the config and a summary (needs rmtjax[wandb])")
    wandb_project: str = param("rmtjax", doc="with train.wandb: the W&B project")
    wandb_mode: str = param("auto", choices=("auto", "online", "offline"),
                            doc="with train.wandb: offline writes the W&B run to disk only (no network; wandb "
                                "sync uploads it later), online streams it, auto leaves it to wandb (WANDB_MODE)")
    eval_every: int = param(0, lo=0, doc="every N iterations (and after the last) play train.eval_episodes greedy "
                                         "episodes per seed inside the compiled loop: metrics eval_return and "
                                         "eval_length (NaN between evaluations), each seed's best parameters kept "
                                         "(load_policy(run, which='best')); 0: off")
    eval_episodes: int = param(10, lo=1, hi=100_000, doc="with train.eval_every: greedy episodes per seed at each "
                                                          "evaluation (played side by side on their own envs)")


# Fields that only say how a run is watched or saved, not what it computes: a run may be
# resumed with other values for these (every other field must match the run's config.yaml).
RUN_INDEPENDENT_FIELDS = frozenset({"train.progress", "train.checkpoint_every", "train.keep_checkpoints",
                                    "train.tensorboard", "train.wandb", "train.wandb_project", "train.wandb_mode"})
# The training doctor only watches (rmtjax.doctor): it may be turned on or off, or its thresholds
# changed, on a resume (its state is kept apart in checkpoints; see rmtjax.checkpoint).
RUN_INDEPENDENT_FIELDS |= {f"doctor.{f.name}" for f in dataclasses.fields(DoctorConfig)}



@dataclasses.dataclass(frozen=True)
class Config:
    """A complete, validated training configuration."""

    algo: str
    env: EnvConfig
    train: TrainConfig
    agent: Section
    precision: PrecisionConfig = dataclasses.field(default_factory=PrecisionConfig)
    meta: MetaConfig = dataclasses.field(default_factory=MetaConfig)
    curriculum: CurriculumConfig = dataclasses.field(default_factory=CurriculumConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
    transfer: TransferConfig = dataclasses.field(default_factory=TransferConfig)
    doctor: DoctorConfig = dataclasses.field(default_factory=DoctorConfig)  # rmtjax.doctor

    def __post_init__(self):
        from rmtjax.agents import agent_class, agent_config_class

        cls = agent_config_class(self.algo)
        if not isinstance(self.agent, cls):
            raise ConfigError(f"agent: expected a {cls.__name__} for algo {self.algo!r}, got {type(self.agent).__name__}")
        if not isinstance(self.precision, PrecisionConfig):
            raise ConfigError(f"precision: expected a PrecisionConfig, got {type(self.precision).__name__}")
        if not isinstance(self.distributed, DistributedConfig):
            raise ConfigError(f"distributed: expected a DistributedConfig, got {type(self.distributed).__name__}")
        check = getattr(self.agent, "validate_with", None)
        if check is not None:
            check(self.env, self.train)
        # the curriculum's env parameters, converted to the env's kinds (a new, checked section)
        object.__setattr__(self, "curriculum", check_meta(self))
        if self.distributed.devices > 1:
            agent_class(self.algo).check_devices(self, self.distributed.devices)  # what the agent supports
        if not isinstance(self.transfer, TransferConfig):
            raise ConfigError(f"transfer: expected a TransferConfig, got {type(self.transfer).__name__}")
        if not self.transfer.is_default:
            from rmtjax.transfer import check_agent

            check_agent(self.algo, agent_class(self.algo), self.transfer, torso=getattr(self.agent, "torso", None))

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Config":
        from rmtjax.agents import agent_config_class

        if not isinstance(data, Mapping):
            raise ConfigError(f"a config must be a mapping with keys algo, env, train, agent; got {type(data).__name__}")
        top = {"algo", "env", "train", "agent", "precision", "meta", "curriculum", "distributed", "transfer", "doctor"}
        for key in data:
            if key not in top:
                raise ConfigError(f"unknown key {key}.{close_matches(str(key), top)}")
        algo = data.get("algo")
        if not isinstance(algo, str):
            raise ConfigError("algo: missing or not a string; give the algorithm name, e.g. algo: ppo")
        agent_cls = agent_config_class(algo)
        return cls(
            algo=algo,
            env=EnvConfig.from_dict(data.get("env")),
            train=TrainConfig.from_dict(data.get("train")),
            agent=agent_cls.from_dict(data.get("agent"), path="agent"),
            precision=PrecisionConfig.from_dict(data.get("precision")),
            meta=MetaConfig.from_dict(data.get("meta")),
            curriculum=CurriculumConfig.from_dict(data.get("curriculum")),
            distributed=DistributedConfig.from_dict(data.get("distributed")),
            transfer=TransferConfig.from_dict(data.get("transfer")),
            doctor=DoctorConfig.from_dict(data.get("doctor")),
        )

    def to_dict(self) -> dict:
        return {"algo": self.algo, "env": self.env.to_dict(), "train": _train_dict(self.train),
                "agent": self.agent.to_dict(), "precision": self.precision.to_dict(),
                "meta": self.meta.to_dict(), "curriculum": self.curriculum.to_dict(),
                "distributed": self.distributed.to_dict(),
                # left out while it is the default: the config.yaml (and checkpoints) of a run without
                # transfer are as they were before the section existed, so those runs still resume
                **({} if self.transfer.is_default else {"transfer": self.transfer.to_dict()}),
                # likewise the doctor's section while it is the default
                **({} if self.doctor == DoctorConfig() else {"doctor": self.doctor.to_dict()})}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def differences(self, other: "Config", ignore=()) -> list[tuple[str, Any, Any]]:
        """`(dotted field, value here, value in other)` for every field that differs, except
        the dotted names in `ignore`."""
        a, b = _flatten(self.to_dict()), _flatten(other.to_dict())
        return [(k, a.get(k, "<unset>"), b.get(k, "<unset>")) for k in sorted(set(a) | set(b))
                if k not in ignore and a.get(k, "<unset>") != b.get(k, "<unset>")]

    def override(self, overrides: Mapping[str, Any] | None) -> "Config":
        """A new config with dotted keys replaced, e.g. `{"agent.lr": 3e-4, "env.num_envs": 8}`."""
        data = self.to_dict()
        data.setdefault("transfer", self.transfer.to_dict())
        data["train"] = self.train.to_dict()  # every field, those left out at their defaults included
        data.setdefault("doctor", self.doctor.to_dict())
        for dotted, value in (overrides or {}).items():
            _set_dotted(data, dotted, value)
        try:
            return Config.from_dict(data)
        except ConfigError as e:
            if data.get("algo") == self.algo or not str(e).startswith("unknown key agent."):
                raise
            # `--set algo=X` keeps the agent section, which is the old algorithm's
            raise ConfigError(f"algo: changed from {self.algo!r} to {data['algo']!r}, but the agent section is "
                              f"{self.algo}'s and {data['algo']} does not take all of it ({e}). Choose the algorithm "
                              f"with --algo {data['algo']} (or make_config({data['algo']!r}, ...)), which starts from "
                              f"its own agent section, or give {data['algo']}'s agent fields in the config") from None


# train fields added after run directories existed: left out of a config's dict (config.yaml,
# checkpoints) while at their defaults, so a run written before them still resumes (its stored
# config has no such keys, and a resume compares the configs key by key)
_LATER_TRAIN_FIELDS = {"eval_every": 0, "eval_episodes": 10}


def _train_dict(train: TrainConfig) -> dict:
    return {k: v for k, v in train.to_dict().items() if _LATER_TRAIN_FIELDS.get(k, object()) != v}


def _flatten(data: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    parts = str(dotted).split(".")
    if parts == ["algo"]:
        data["algo"] = value
        return
    sections = ("env", "train", "agent", "precision", "meta", "curriculum", "distributed", "transfer", "doctor")
    if parts[0] not in sections or len(parts) < 2:
        raise ConfigError(f"unknown key {dotted}: a key is section.field with section one of "
                          f"{', '.join(sections)}.{close_matches(parts[0], sections) if parts[0] not in sections else ''}")
    node = data[parts[0]]
    for i, part in enumerate(parts[1:-1], start=1):
        if part not in node or not isinstance(node[part], dict):
            raise ConfigError(f"unknown key {'.'.join(parts[: i + 1])}.{close_matches(part, node)}")
        node = node[part]
    leaf = parts[-1]
    if leaf not in node and not _is_free_mapping(parts):
        raise ConfigError(f"unknown key {dotted}.{close_matches(leaf, node)}")
    node[leaf] = value


def _is_free_mapping(parts) -> bool:
    # env.params.<name> sets a field of the environment's own parameters; checked when the env is built;
    # transfer.unfreeze.<group> the share at which a parameter group is released
    return len(parts) == 3 and (parts[0], parts[1]) in (("env", "params"), ("transfer", "unfreeze"))


def _preset_path(algo: str, env: str) -> Path:
    slug = env.replace(":", "_").replace("/", "_")
    return Path(__file__).parent / "configs" / f"{algo}_{slug}.yaml"


def available_presets() -> list[str]:
    return sorted(p.stem for p in (Path(__file__).parent / "configs").glob("*.yaml"))


# the environment an algorithm trains on when none is named: CartPole-v1, or a continuous-action
# one for an algorithm that needs continuous actions
DEFAULT_ENVS = {"sac": "Pendulum-v1"}


def default_env(algo: str) -> str:
    """The environment `make_config(algo)` and `rmtjax train --algo ALGO` use when none is named."""
    return DEFAULT_ENVS.get(algo, "CartPole-v1")


def make_config(algo: str, env: str | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """The config for `algo` on `env`: the bundled preset when one exists, else the defaults,
    then `overrides` (dotted keys) on top. `env` is an id, or an environment object with gymnax's
    interface, which is registered under its class name (`rmtjax.envs.register_env`); None:
    the algorithm's default (`default_env`: CartPole-v1, Pendulum-v1 for SAC)."""
    from rmtjax.agents import agent_config_class

    if env is None and isinstance(algo, str):
        env = default_env(algo)

    if not isinstance(env, str) and hasattr(env, "step") and hasattr(env, "reset"):
        from rmtjax.envs import register_env

        env = register_env(type(env).__name__, env)  # an env object of the user's: trained under its class name
    if not isinstance(algo, str) or not isinstance(env, str):
        raise ConfigError(f"make_config(algo, env): both are names (strings), got {algo!r} and {env!r}")
    agent_config_class(algo)  # unknown algorithm names fail here, with close matches
    preset = _preset_path(algo, env)
    if preset.exists():
        base = load_config(preset)
        if base.algo != algo:
            raise ConfigError(f"preset {preset.name} declares algo {base.algo!r}, expected {algo!r}")
        data = base.to_dict()
        data["env"]["id"] = env
    else:
        data = {"algo": algo, "env": {"id": env}, "train": {}, "agent": {}}
    cfg = Config.from_dict(data)
    return cfg.override(overrides) if overrides else cfg


def load_config(path) -> Config:
    """Read a YAML config file; every problem is reported as a `ConfigError` naming the file."""
    path = Path(path)
    text = configfile.read_text(path, ConfigError)  # size-bounded read
    try:
        data = configfile.parse_yaml(text)  # a key given twice is an error
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ConfigError(f"{path} is not a usable config: its YAML is nested too deeply") from None
    except configfile.InputTooLarge as e:
        raise ConfigError(f"{path} is not a usable config: its YAML {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping with keys algo, env, train, agent")
    return Config.from_dict(data)


def parse_override(text: str) -> tuple[str, Any]:
    """`"agent.lr=3e-4"` -> `("agent.lr", 0.0003)`; the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. --set agent.lr=3e-4")
    key, raw = text.split("=", 1)
    if len(raw) > configfile.MAX_OVERRIDE_CHARS:
        raise ConfigError(f"--set {key.strip()}: a value of {len(raw):,} characters; at most "
                          f"{configfile.MAX_OVERRIDE_CHARS:,}")
    try:
        value = configfile.parse_yaml(raw) if raw.strip() else ""  # bounded: depth, aliases, number length
    except configfile.InputTooLarge as e:
        raise ConfigError(f"--set {key.strip()}: the value {e}") from None
    except RecursionError:
        raise ConfigError(f"--set {key.strip()}: the value is nested too deeply") from None
    except yaml.YAMLError:
        value = raw
    quoted = raw.strip()[:1] in ("'", '"')  # agent.priority='1': a string, as written
    if isinstance(value, str) and not quoted:  # YAML 1.1 reads 3e-4 (no dot) as a string
        try:
            value = float(value) if len(value) <= configfile.MAX_NUMBER_CHARS else value
        except ValueError:
            pass
    return key.strip(), value
