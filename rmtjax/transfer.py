"""Transfer: start a run from another run's parameters, freeze or stage parts of the network,
and hold the policy near the source policy with a KL penalty.

    train(config, key, init_from=RUN_DIR | TrainResult | params)     rmtjax train --init-from RUN_DIR
    transfer:
      freeze: [torso]                        # never trained: bit-identical to the source
      unfreeze: {torso/Dense_1: 0.2, torso/Dense_0: 0.4}   # frozen until that share of training
      kl_coef: 0.1                           # + kl_coef · KL(source policy ‖ policy) in every update
      reinit: [head]                         # not loaded: the target's fresh initialisation
      source_seed: -1                        # -1: seed k from source seed k (or a 1-seed source's)

How it fits the layers (the agent is read only through `rmtjax.protocol`):

- the agent names the group of every parameter leaf (`param_groups(params)`, '/'-paths such as
  `torso/Dense_0` or `head/value`); a config names a group or a prefix of one at '/';
- freezing and staging live in the shared update path: the agent's `guarded(...)` optimiser gets
  `rmtjax.guard.Stages` from `stages(...)`, so every gradient step of the agent leaves frozen
  leaves exactly as they are; `compose` (the layer the driver puts over the batched agent) sets
  which stages are released before each iteration, from the share of training done then;
- the KL penalty: the agent passes its minibatch observations to `Agent.transfer_penalty`,
  which measures `kl(source, current)` between the agent's own `policy_distribution` under the
  source parameters (kept in the optimiser state, `rmtjax.guard.anchor`) and under the current
  ones; `Precision.step` adds it to the loss;
- the source: `Source` holds the source parameters mapped to the target's seeds; `compose`'s init
  puts them into the fresh state (parameters, the target network where the agent has one, the
  KL anchor). A run directory stores them (`transfer_source.npz`, its SHA-256 in run.json), so a
  resumed run needs neither the source directory nor the object it was given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from rmtjax.guard import Stages, release, with_anchor
from rmtjax.protocol import Categorical, Gaussian
from rmtjax.schema import ConfigError, Section, close_matches, param


@dataclasses.dataclass(frozen=True)
class TransferConfig(Section):
    """Transfer from a source run (train(..., init_from=RUN_DIR) / rmtjax train --init-from RUN_DIR):
    frozen and progressively released parameter groups, a KL penalty to the source policy, and
    which groups start fresh. Groups are the agent's (torso/<layer>, head/...); a name stands for
    every group it is a '/'-prefix of."""

    _section = "transfer"
    freeze: tuple[str, ...] = param((), doc="parameter groups never trained (they stay the source's, bit for "
                                           "bit), e.g. [torso]")
    unfreeze: dict = param({}, doc="group -> share of training (0 < share < 1) at which it is released; "
                                   "frozen until then, e.g. {torso/Dense_1: 0.2, torso/Dense_0: 0.4}")
    kl_coef: float = param(0.0, lo=0.0, doc="weight of KL(source policy ‖ policy) added to every update's loss "
                                            "(PPO: the action distributions; RMT/DQN: softmax(Q / temperature) with "
                                            "the agent's current Boltzmann temperature, which stays 1 for DQN); "
                                            "0: none")
    reinit: tuple[str, ...] = param((), doc="groups not loaded from the source but freshly initialised, e.g. "
                                           "[head] when the action space differs")
    source_seed: int = param(-1, lo=-1, doc="-1: target seed k starts from source seed k (the seed counts must "
                                            "match) or from the only seed of a one-seed source; s: every seed "
                                            "starts from source seed s")

    def validate(self):
        for name in ("freeze", "reinit"):
            for g in getattr(self, name):
                _check_group_name(f"transfer.{name}", g)
        for g, share in self.unfreeze.items():
            _check_group_name("transfer.unfreeze", g)
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < float(share) < 1.0:
                raise ConfigError(f"transfer.unfreeze.{g}: {share!r} must be a share of training strictly between "
                                  f"0 and 1 (a group trained from the start is not named; one never trained goes "
                                  f"in transfer.freeze)")
        both = sorted(set(self.freeze) & set(self.unfreeze))
        if both:
            raise ConfigError(f"transfer: {', '.join(both)} is in both transfer.freeze (never trained) and "
                              f"transfer.unfreeze (released during training); name each group in one of them")
        object.__setattr__(self, "unfreeze", {str(g): float(v) for g, v in self.unfreeze.items()})

    @property
    def staged(self) -> bool:
        """Does the update path change (frozen or staged groups, or a KL anchor)?"""
        return bool(self.freeze or self.unfreeze or self.kl_coef > 0)

    @property
    def is_default(self) -> bool:
        return self == TransferConfig()


def _check_group_name(field: str, name) -> None:
    if not isinstance(name, str) or not name or any(not part for part in name.split("/")):
        raise ConfigError(f"{field}: {name!r} is not a group name: give a group such as torso, head or "
                          f"torso/Dense_0 (parts separated by '/')")


def matches(name: str, group: str) -> bool:
    """Does the config's `name` stand for the agent's `group` (equal, or a prefix at '/')?"""
    return group == name or group.startswith(name + "/")


def check_agent(algo: str, agent_cls, cfg: TransferConfig, init_from: bool = False, torso: str | None = None) -> None:
    """Refuse transfer settings the agent cannot honour (it declares no groups or no policy, or
    its torso is recurrent: `torso`, the agent section's, when known)."""
    if torso in ("lstm", "gru") and (init_from or not cfg.is_default):
        raise ConfigError(f"transfer: agent.torso: {torso}: recurrent agents cannot be transferred yet (their "
                          f"parameter groups and the KL to a source policy need the memory unrolled); use a "
                          f"feed-forward torso")
    if (cfg.staged or cfg.reinit or init_from) and not hasattr(agent_cls, "param_groups"):
        raise ConfigError(f"transfer: {algo} declares no parameter groups (param_groups, rmtjax.protocol), so it "
                          f"cannot be transferred; ppo, rmt and dqn can")
    if cfg.kl_coef > 0 and not hasattr(agent_cls, "policy_distribution"):
        raise ConfigError(f"transfer.kl_coef: {algo} declares no policy_distribution (rmtjax.protocol), so no KL "
                          f"to the source policy can be measured; set transfer.kl_coef: 0")


# -- the groups and the stages -----------------------------------------------------------------
def leaf_groups(agent, params) -> dict[str, str]:
    """keystr path -> group of every parameter leaf of `params` (one seed's or its shapes)."""
    groups = agent.param_groups(params)
    return {jax.tree_util.keystr(p): g for p, g in jax.tree_util.tree_flatten_with_path(groups)[0]}


def _shares(cfg: TransferConfig) -> list[float]:
    return sorted(set(cfg.unfreeze.values()))


def stage_of(cfg: TransferConfig, group: str) -> int:
    """-1: frozen for the run; 0: trained from the start; k ≥ 1: released at the k-th share."""
    if any(matches(n, group) for n in cfg.freeze):
        return -1
    # the most specific name decides (torso: 0.5 with torso/Dense_0: 0.2 releases Dense_0 first)
    named = [n for n in cfg.unfreeze if matches(n, group)]
    if not named:
        return 0
    return 1 + _shares(cfg).index(cfg.unfreeze[max(named, key=len)])


def stages(cfg: TransferConfig, agent) -> Stages | None:
    """The guard's `Stages` for `agent` under `cfg`, or None when the update path is unchanged."""
    if not cfg.staged:
        return None

    def labels(params):
        return jax.tree.map(lambda g: stage_of(cfg, g), agent.param_groups(params))

    return Stages(labels=labels, count=1 + len(_shares(cfg)), anchor=cfg.kl_coef > 0)


def released_at(cfg: TransferConfig, progress) -> jax.Array:
    """bool [stages]: stage 0 always; stage k once `progress` (share of training done) reaches its share."""
    shares = jnp.asarray([0.0, *_shares(cfg)], jnp.float32)
    return jnp.asarray(progress, jnp.float32) >= shares


def check_groups(cfg: TransferConfig, agent, params_shapes) -> None:
    """Every group the config names must name at least one of the agent's groups."""
    groups = sorted(set(leaf_groups(agent, params_shapes).values()))
    for field, names in (("freeze", cfg.freeze), ("unfreeze", tuple(cfg.unfreeze)), ("reinit", cfg.reinit)):
        for n in names:
            if not any(matches(n, g) for g in groups):
                raise ConfigError(f"transfer.{field}: {n!r} names no parameter group of {agent.config.algo} here."
                                  f"{close_matches(n, groups)} Its groups: {', '.join(groups)}")
    trained = [g for g in groups if stage_of(cfg, g) == 0]
    if not trained and not cfg.unfreeze:
        raise ConfigError(f"transfer.freeze: {list(cfg.freeze)} freezes every parameter of {agent.config.algo}; "
                          f"nothing would be trained")


# -- the KL ---------------------------------------------------------------------------------------
def kl(source, current) -> jax.Array:
    """KL(source ‖ current) per row [B] of two policies of the same kind (`rmtjax.protocol.
    Categorical`: summed over independent choices, e.g. action dimensions; `Gaussian`: diagonal,
    summed over dimensions). float32."""
    if isinstance(source, Categorical) and isinstance(current, Categorical):
        logp_s = jax.nn.log_softmax(source.logits.astype(jnp.float32), axis=-1)
        logp = jax.nn.log_softmax(current.logits.astype(jnp.float32), axis=-1)
        per = jnp.sum(jnp.exp(logp_s) * (logp_s - logp), axis=-1)
    elif isinstance(source, Gaussian) and isinstance(current, Gaussian):
        ls_s, ls = source.log_std.astype(jnp.float32), current.log_std.astype(jnp.float32)
        mu_s, mu = source.mean.astype(jnp.float32), current.mean.astype(jnp.float32)
        per = ls - ls_s + (jnp.exp(2 * ls_s) + (mu_s - mu) ** 2) / (2 * jnp.exp(2 * ls)) - 0.5
    else:
        raise TypeError(f"kl: policies of different kinds, {type(source).__name__} and {type(current).__name__}")
    return per.reshape(per.shape[0], -1).sum(-1)


# -- the source -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Source:
    """Source parameters for every target seed: `params` keystr path -> array [num_seeds, ...]
    (the source's own shapes), with where they came from (`origin`, `source_seeds`, `seed_map`:
    the source seed of each target seed)."""

    params: dict[str, np.ndarray]
    origin: str
    source_seeds: int
    seed_map: list[int]

    def digest(self) -> str:
        h = hashlib.sha256()
        for k in sorted(self.params):
            a = np.ascontiguousarray(self.params[k])
            h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
        return h.hexdigest()

    def describe(self) -> dict:
        """What run.json records about it."""
        return {"origin": self.origin, "source_seeds": self.source_seeds, "seed_map": list(self.seed_map),
                "sha256": self.digest()}

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **{f"p{i}": self.params[k] for i, k in enumerate(sorted(self.params))},
                 __paths__=np.asarray(sorted(self.params)))
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, info: Mapping) -> "Source":
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            paths = [str(p) for p in z["__paths__"]]
            params = {k: z[f"p{i}"] for i, k in enumerate(paths)}
        src = cls(params, str(info["origin"]), int(info["source_seeds"]), [int(s) for s in info["seed_map"]])
        if src.digest() != info.get("sha256"):
            raise ValueError("the stored source parameters do not match their SHA-256 (damaged file)")
        return src


def seed_map(cfg: TransferConfig, source_seeds: int, num_seeds: int, origin: str) -> list[int]:
    """The source seed each of the `num_seeds` target seeds starts from."""
    if cfg.source_seed >= 0:
        if cfg.source_seed >= source_seeds:
            raise ConfigError(f"transfer.source_seed: {cfg.source_seed}, but {origin} has {source_seeds} seed(s) "
                              f"(0 to {source_seeds - 1})")
        return [cfg.source_seed] * num_seeds
    if source_seeds == num_seeds:
        return list(range(num_seeds))
    if source_seeds == 1:
        return [0] * num_seeds
    raise ConfigError(f"transfer.source_seed: -1 maps target seed k to source seed k, but {origin} has "
                      f"{source_seeds} seeds and train.num_seeds is {num_seeds}; set train.num_seeds: "
                      f"{source_seeds}, or transfer.source_seed to the one source seed every target seed starts from")


def make_source(cfg: TransferConfig, num_seeds: int, params, source_seeds: int | None, origin: str) -> Source:
    """A `Source` from `params`: batched over `source_seeds` seeds (a run's state), or one seed's
    (`source_seeds` None), mapped to the target's `num_seeds` seeds."""
    flat = {jax.tree_util.keystr(p): np.asarray(jax.device_get(x))
            for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    if source_seeds is None:
        flat = {k: v[None] for k, v in flat.items()}
        source_seeds = 1
    mapping = seed_map(cfg, source_seeds, num_seeds, origin)
    index = np.asarray(mapping)
    return Source({k: v[index] for k, v in flat.items()}, origin, source_seeds, mapping)


def check_source(cfg: TransferConfig, agent, source: Source, target_shapes) -> None:
    """Every target leaf outside `transfer.reinit` must come from the source with the same shape
    and dtype; otherwise a `ConfigError` lists the paths and shapes (and the groups to reinit)."""
    groups = leaf_groups(agent, target_shapes)
    target = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(target_shapes)[0]}
    problems, bad_groups = [], set()
    for path, want in target.items():
        if any(matches(n, groups[path]) for n in cfg.reinit):
            continue
        got = source.params.get(path)
        if got is None:
            problems.append(f"params{path} {tuple(want.shape)}: not in the source")
        elif got.shape[1:] != tuple(want.shape) or got.dtype != want.dtype:
            problems.append(f"params{path}: source {got.dtype}{list(got.shape[1:])}, target "
                            f"{jnp.dtype(want.dtype)}{list(want.shape)}")
        else:
            continue
        bad_groups.add(groups[path])
    extra = sorted(set(source.params) - set(target))
    problems += [f"params{p} {list(source.params[p].shape[1:])}: in the source, not in the target" for p in extra]
    if problems:
        hint = (f" Re-initialise those groups with transfer.reinit: [{', '.join(sorted(bad_groups))}] (or a prefix "
                f"such as head), or transfer from a run of the same network and spaces." if bad_groups else
                " The source is another network: transfer from a run of the same agent settings.")
        raise ConfigError(f"init_from: the parameters of {source.origin} do not fit {agent.config.algo} on "
                          f"{agent.config.env.id} ({len(problems)} of them): " + "; ".join(problems) + "." + hint)


def _merge(cfg: TransferConfig, agent, fresh_params, source: Source):
    """The batched parameters: the source's, except the `reinit` groups, which stay `fresh_params`'."""
    one = jax.tree.map(lambda x: x[0], fresh_params)
    groups = leaf_groups(agent, one)

    def pick(path, fresh):
        key = jax.tree_util.keystr(path)
        if any(matches(n, groups[key]) for n in cfg.reinit):
            return fresh
        return jnp.asarray(source.params[key], fresh.dtype)

    return jax.tree_util.tree_map_with_path(pick, fresh_params)


def compose(config, agent, init, step, source: Source | None):
    """The transfer layer over the driver's batched `init(keys, hparams)` and `step(state, t)`:
    the init puts `source` in (when given); the step releases the stages due at `t`. Both are
    returned unchanged when there is nothing to do."""
    cfg = config.transfer
    out_init, out_step = init, step
    if source is not None:
        def out_init(keys, hparams=None):
            state = init(keys, hparams)
            learner = agent.learner(state)
            params = _merge(cfg, agent, learner.params, source)
            target = learner.target
            if target is not None:
                if jax.tree.structure(target) != jax.tree.structure(params):
                    raise ConfigError(f"init_from: {config.algo}'s target network is not shaped like its parameters; "
                                      f"it cannot be started from the source")
                target = params
            learner = learner.replace(params=params, target=target, opt_state=with_anchor(learner.opt_state, params))
            return agent.with_learner(state, learner)

    if cfg.unfreeze:
        def out_step(state, t):
            released = released_at(cfg, agent.progress(t))
            state, metrics = step(release(state, released), t)
            seeds = metrics["env_steps"].shape
            return state, {**metrics, "transfer_released": jnp.broadcast_to(released.sum().astype(jnp.float32) - 1,
                                                                            seeds)}

    return out_init, out_step
