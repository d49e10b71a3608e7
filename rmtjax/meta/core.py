"""The meta-controller's pure parts: typed state, signals, bounded moves, rules, bandit, PBT,
curriculum. Everything here is traced into the compiled loop; nothing calls the host.

Per seed (vmapped by the driver):

- the agent's `signals(metrics)` -> `rmtjax.protocol.Signals`: the iteration's return, value
  (TD) loss, policy entropy and share of exploratory actions (those the agent has);
- `update(meta_state, signals, hparams)` (made by `make_update(cfg, ...)`): moving averages of
  the signals (trends), then, on a decision iteration, the `rules` or `bandit` move;
- `curriculum_update(...)`: the stage and what entering it sets.

Across seeds: `pbt_round(learner, hparams, env_params, meta_state, ...)` (leaves batched over
seeds), on the agent's `rmtjax.protocol.Learner`.

Hyperparameters are the agent's own `HParams` struct; a move of a group (lr, γ, ε) touches the
fields the struct declares in that group (PPO declares no ε, so ε moves are skipped for it),
and every moved field is clipped into its group's `meta:` bounds.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import struct

from rmtjax.meta.config import MetaConfig
from rmtjax.protocol import GROUPS, Learner, Signals, hparam_groups, hparam_names

__all__ = ["Signals"]  # with everything below: the meta-controller reads the agent's typed signals

@struct.dataclass
class MetaState:
    """Per seed: moving averages of the signals, the bandit's window, the curriculum stage."""

    seen: jax.Array  # iterations observed
    episodes_seen: jax.Array  # episodes completed so far: the return averages start with the first
    loss_seen: jax.Array  # iterations with a gradient step (non-zero value loss)
    return_fast: jax.Array
    return_slow: jax.Array
    log_loss_fast: jax.Array
    log_loss_slow: jax.Array
    entropy_fast: jax.Array
    entropy_slow: jax.Array
    explore: jax.Array  # fast average of the exploratory share
    # bandit
    arm: jax.Array  # the arm being played
    arm_start_return: jax.Array  # return_fast when it began
    window_arm: jax.Array  # [window] the last plays' arms (ring)
    window_reward: jax.Array  # [window] and their rewards
    plays: jax.Array  # plays finished
    improvement_scale: jax.Array  # moving average of |return improvement| over a play: rewards are relative to it
    # curriculum
    stage: jax.Array
    stage_hold: jax.Array  # iterations in a row the metric has reached the next threshold
    key: jax.Array


def init_state(key: jax.Array, window: int) -> MetaState:
    f = jnp.zeros((), jnp.float32)
    i = jnp.zeros((), jnp.int32)
    return MetaState(seen=i, episodes_seen=f, loss_seen=i, return_fast=f, return_slow=f, log_loss_fast=f,
                     log_loss_slow=f, entropy_fast=f, entropy_slow=f, explore=f, arm=i, arm_start_return=f,
                     window_arm=jnp.zeros((window,), jnp.int32), window_reward=jnp.zeros((window,), jnp.float32),
                     plays=i, improvement_scale=f, stage=i, stage_hold=i, key=key)


# -- trends ------------------------------------------------------------------------------------
def return_trend(m: MetaState) -> jax.Array:
    """(fast - slow) return average, relative to the slow one's size: > 0 improving."""
    return (m.return_fast - m.return_slow) / (jnp.abs(m.return_slow) + 1.0)


def loss_trend(m: MetaState) -> jax.Array:
    """log(fast / slow) of the value loss: > 0 rising, near 0 converged, < 0 falling."""
    return m.log_loss_fast - m.log_loss_slow


def entropy_rate(m: MetaState, max_entropy: float | None) -> jax.Array:
    """Signed rate of change of the policy entropy, relative to its maximum (or its size)."""
    scale = max_entropy if max_entropy else jnp.abs(m.entropy_slow) + 1.0
    return (m.entropy_fast - m.entropy_slow) / scale


def track(m: MetaState, s: Signals, cfg: MetaConfig) -> MetaState:
    """Fold one iteration's signals into the moving averages."""
    def ema(old, new, rate, first):
        return jnp.where(first, new, old + rate * (new - old))

    zero = jnp.zeros((), jnp.float32)
    s = s.replace(**{n: zero for n in ("value_loss", "entropy", "explore") if getattr(s, n) is None})
    first = m.seen == 0
    has_return = m.episodes_seen + s.episodes > 0  # before any episode ends the return reads 0: skip it
    first_return = m.episodes_seen == 0
    learning = s.value_loss > 0
    log_loss = jnp.log(jnp.maximum(s.value_loss, 1e-12))
    first_loss = m.loss_seen == 0
    return m.replace(
        seen=m.seen + 1,
        episodes_seen=m.episodes_seen + s.episodes,
        loss_seen=m.loss_seen + learning.astype(jnp.int32),
        return_fast=jnp.where(has_return, ema(m.return_fast, s.episode_return, cfg.fast_rate, first_return),
                              m.return_fast),
        return_slow=jnp.where(has_return, ema(m.return_slow, s.episode_return, cfg.slow_rate, first_return),
                              m.return_slow),
        log_loss_fast=jnp.where(learning, ema(m.log_loss_fast, log_loss, cfg.fast_rate, first_loss), m.log_loss_fast),
        log_loss_slow=jnp.where(learning, ema(m.log_loss_slow, log_loss, cfg.slow_rate, first_loss), m.log_loss_slow),
        entropy_fast=ema(m.entropy_fast, s.entropy, cfg.fast_rate, first),
        entropy_slow=ema(m.entropy_slow, s.entropy, cfg.slow_rate, first),
        explore=ema(m.explore, s.explore, cfg.fast_rate, first),
    )


# -- bounded moves -----------------------------------------------------------------------------
def group_fields(hparams, group: str) -> tuple[str, ...]:
    """The fields of `hparams` declared in a group (lr, gamma, eps); () if it has none."""
    return hparam_groups(hparams).get(group, ())


def clip_to_bounds(hparams, cfg: MetaConfig):
    """Every field of `hparams` in a group clipped into the group's `meta:` bounds."""
    bounds = cfg.bounds(hparams)
    new = {f: jnp.clip(getattr(hparams, f), *bounds[f]).astype(getattr(hparams, f).dtype) for f in bounds}
    return hparams.replace(**new)


def scale_group(hparams, group: str, factor: jax.Array, cfg: MetaConfig, when: jax.Array = True):
    """Multiply the group's fields by `factor` (for γ: multiply the horizon term 1 - γ), where
    `when`; the result is clipped into bounds. Fields the agent lacks are skipped."""
    bounds = cfg.bounds(hparams)
    new = {}
    for f in group_fields(hparams, group):
        old = getattr(hparams, f)
        moved = 1.0 - (1.0 - old) * factor if group == "gamma" else old * factor
        new[f] = jnp.where(when, jnp.clip(moved, *bounds[f]), old).astype(old.dtype)
    return hparams.replace(**new)


def set_values(hparams, values: Mapping[str, jax.Array], cfg: MetaConfig, when: jax.Array = True, clip=True):
    """Set named hyperparameters (group names or fields; NaN leaves a field as it is) where
    `when`, clipped into bounds."""
    bounds = cfg.bounds(hparams) if clip else {}
    new = {}
    for name, v in values.items():
        targets = group_fields(hparams, name) if name in GROUPS else ((name,) if name in hparam_names(hparams) else ())
        for f in targets:
            old = new.get(f, getattr(hparams, f))
            v_f = jnp.clip(v, *bounds[f]) if f in bounds else v
            new[f] = jnp.where(when & ~jnp.isnan(v), v_f, old).astype(old.dtype)
    return hparams.replace(**new)


# -- the per-seed update -----------------------------------------------------------------------
def decision_due(m: MetaState, cfg: MetaConfig) -> jax.Array:
    """True on the iterations a decision is made (after `m.seen` counts this one)."""
    return (m.seen >= max(cfg.warmup, 1)) & (m.seen % cfg.interval == 0)


def rules_move(m: MetaState, hparams, cfg: MetaConfig, max_entropy: float | None):
    """The `rules` mode's moves on a decision iteration:

    - value loss rising (loss trend > tolerance) while the return falls (return trend
      < -return_tolerance): lr ×= lr_factor;
    - value loss converged (|loss trend| ≤ tolerance): γ raised, (1 - γ) ×= gamma_factor;
    - policy matured (entropy settled, return not falling) while still exploring more than
      `explore_target`: ε ×= eps_factor.
    Loss rules wait until `warmup` iterations had a gradient step.

    The lr cut asks for a falling return as well because a value loss also rises when the
    learner is doing well: bootstrapped targets grow as values propagate (SAC's critic loss
    on Pendulum rises tenfold while the return climbs from -1200 to -150). Cutting on the loss
    alone took SAC's lr to the floor within a fifth of the run and it never learned
    (benchmarks/results/meta/meta_pendulum.md). A rising loss with a falling return is the
    signature of an update that is too large.
    """
    due = decision_due(m, cfg)
    loss_ready = m.loss_seen >= max(cfg.warmup, 1)
    lt, rt = loss_trend(m), return_trend(m)
    rising = due & loss_ready & (lt > cfg.loss_tolerance) & (rt < -cfg.return_tolerance)
    converged = due & loss_ready & (jnp.abs(lt) <= cfg.loss_tolerance)
    matured = (due & (jnp.abs(entropy_rate(m, max_entropy)) <= cfg.entropy_tolerance)
               & (rt >= -cfg.return_tolerance) & (m.explore > cfg.explore_target))
    hparams = scale_group(hparams, "lr", cfg.lr_factor, cfg, rising) if group_fields(hparams, "lr") else hparams
    hparams = scale_group(hparams, "gamma", cfg.gamma_factor, cfg, converged)
    hparams = scale_group(hparams, "eps", cfg.eps_factor, cfg, matured)
    return hparams


def arm_table(cfg: MetaConfig) -> dict[str, jax.Array]:
    """name -> [num_arms] values (NaN where an arm leaves that name alone)."""
    names = sorted({k for arm in cfg.arms for k in arm})
    return {n: jnp.asarray([arm.get(n, math.nan) for arm in cfg.arms], jnp.float32) for n in names}


def ucb_scores(m: MetaState, num_arms: int, cfg: MetaConfig) -> jax.Array:
    """Sliding-window UCB of every arm over the last `window` plays; untried arms score +inf."""
    window = m.window_arm.shape[0]
    filled = jnp.arange(window) < jnp.minimum(m.plays, window)
    onehot = (m.window_arm[None, :] == jnp.arange(num_arms)[:, None]) & filled[None, :]  # [arms, window]
    counts = onehot.sum(1).astype(jnp.float32)
    means = (onehot * m.window_reward[None, :]).sum(1) / jnp.maximum(counts, 1.0)
    horizon = jnp.maximum(jnp.minimum(m.plays, window), 1).astype(jnp.float32)
    bonus = cfg.ucb_c * jnp.sqrt(jnp.log(horizon) / jnp.maximum(counts, 1.0))
    return jnp.where(counts > 0, means + bonus, jnp.inf)


def bandit_move(m: MetaState, hparams, cfg: MetaConfig):
    """The `bandit` mode: when the current arm's interval is over, its reward enters the window
    and the next arm is the one of highest sliding-window UCB (a uniformly random one with
    `bandit_eps`). The reward is the improvement of the fast return average over the arm's
    interval, divided by a moving average of such improvements' sizes, so that it stays of
    order one whatever the env's return scale (and the UCB bonus weighs the same everywhere)."""
    due = decision_due(m, cfg)
    num_arms = len(cfg.arms)
    window = m.window_arm.shape[0]
    improvement = m.return_fast - m.arm_start_return
    scale = jnp.where(m.plays == 0, jnp.abs(improvement),
                      m.improvement_scale + cfg.slow_rate * (jnp.abs(improvement) - m.improvement_scale))
    reward = improvement / jnp.maximum(scale, 1e-6)
    slot = m.plays % window
    played = m.replace(window_arm=m.window_arm.at[slot].set(m.arm), window_reward=m.window_reward.at[slot].set(reward),
                       plays=m.plays + 1, improvement_scale=scale)
    key, k_coin, k_arm = jax.random.split(m.key, 3)
    best = jnp.argmax(ucb_scores(played, num_arms, cfg)).astype(jnp.int32)
    if cfg.bandit_eps > 0:
        random_arm = jax.random.randint(k_arm, (), 0, num_arms, jnp.int32)
        best = jnp.where(jax.random.uniform(k_coin) < cfg.bandit_eps, random_arm, best)
    played = played.replace(arm=best, arm_start_return=m.return_fast, key=key)
    m = jax.tree.map(lambda a, b: jnp.where(due, a, b), played, m)
    hparams = apply_arm(hparams, m.arm, cfg, due)
    return m, hparams


def apply_arm(hparams, arm: jax.Array, cfg: MetaConfig, when: jax.Array = True):
    return set_values(hparams, {n: v[arm] for n, v in arm_table(cfg).items()}, cfg, when)


def make_update(cfg: MetaConfig, max_entropy: float | None = None):
    """The per-seed `update(meta_state, signals, hparams) -> (meta_state, hparams)` of
    `cfg.mode` (signals are always tracked; `pbt` moves happen across seeds in `pbt_round`)."""

    def update(m: MetaState, s: Signals, hparams):
        m = track(m, s, cfg)
        if cfg.mode == "rules":
            hparams = rules_move(m, hparams, cfg, max_entropy)
        elif cfg.mode == "bandit":
            m, hparams = bandit_move(m, hparams, cfg)
        return m, hparams

    return update


# -- population-based training, across seeds ---------------------------------------------------
def pbt_sizes(num_seeds: int, cfg: MetaConfig) -> int:
    """Seeds replaced per round: the worst `pbt_quantile`, at least one, at most half."""
    return max(1, min(num_seeds // 2, int(num_seeds * cfg.pbt_quantile)))


def pbt_round(learner: Learner, hparams, env_params, m: MetaState, cfg: MetaConfig):
    """One PBT round over the seeds (every leaf batched [num_seeds, ...]) on a decision
    iteration: the worst seeds by fast return average each copy a random one of the best
    (its `Learner`: params, target params, optimiser state and other learned values; and its
    hyperparameters), then multiply or divide every lr, 1 - γ and ε by `perturb` at random,
    within bounds. Returns `(learner, hparams, env_params, meta state, source)`, `source`
    [num_seeds] being the seed each copied from, -1 where none did. A copy also takes the
    source's curriculum stage and env parameters, so it runs as its source did."""
    n = m.seen.shape[0]
    k = pbt_sizes(n, cfg)
    due = decision_due(jax.tree.map(lambda x: x[0], m), cfg)  # the seeds step in lockstep
    order = jnp.argsort(m.return_fast)  # ascending: worst first (ties: lower seed index first)
    worst, best = order[:k], order[n - k:]
    key = jax.random.fold_in(m.key[0], m.seen[0])
    k_pick, k_perturb = jax.random.split(key)
    src = best[jax.random.randint(k_pick, (k,), 0, k)]
    source = jnp.full((n,), -1, jnp.int32).at[worst].set(src.astype(jnp.int32))
    source = jnp.where(due, source, -1)

    def copy(x):
        return jnp.where(due, x.at[worst].set(x[src]), x)

    learner = jax.tree.map(copy, learner)
    hp = jax.tree.map(copy, hparams)
    # perturb the copies: each bounded group up or down by `perturb`, independently per seed and group
    replaced = source >= 0
    for i, group in enumerate(("lr", "gamma", "eps")):
        if not group_fields(hp, group):
            continue
        up = jax.random.bernoulli(jax.random.fold_in(k_perturb, i), 0.5, (n,))
        factor = jnp.where(up, cfg.perturb, 1.0 / cfg.perturb)
        if group == "gamma":
            factor = 1.0 / factor  # a larger 1 - γ factor lowers γ; keep "up" meaning larger γ
        hp = jax.vmap(lambda h, f, w: scale_group(h, group, f, cfg, w))(hp, factor, replaced)
    env_params = jax.tree.map(copy, env_params)
    # the copies take the source's return averages too, so they are judged afresh from there
    copied_meta = {f: copy(getattr(m, f)) for f in ("return_fast", "return_slow", "arm_start_return", "stage",
                                                    "stage_hold")}
    return learner, hp, env_params, m.replace(**copied_meta), source


# -- curriculum ----------------------------------------------------------------------------------
def curriculum_update(m: MetaState, value: jax.Array, hparams, env_params, stages, patience: int,
                      cfg: MetaConfig | None):
    """Advance at most one stage when `value` has been at or above the next stage's threshold
    for `patience` iterations in a row; entering a stage sets its hparams (clipped into the
    meta bounds when a meta mode is on) and env parameters. Returns (meta, hparams, env_params)."""
    num = len(stages)
    thresholds = jnp.asarray([s["threshold"] for s in stages] + [math.inf], jnp.float32)
    reached = (value >= thresholds[m.stage]) & (m.stage < num)
    hold = jnp.where(reached, m.stage_hold + 1, 0)
    enter = hold >= patience
    stage = jnp.where(enter, m.stage + 1, m.stage)
    hold = jnp.where(enter, 0, hold)
    for i, s in enumerate(stages):
        entered_i = enter & (stage == i + 1)
        if s["hparams"]:
            values = {k: jnp.float32(v) for k, v in s["hparams"].items()}
            hparams = set_values(hparams, values, cfg if cfg is not None else _NO_BOUNDS, entered_i,
                                 clip=cfg is not None)
        if s["env"]:
            env_new = {}
            for k, v in s["env"].items():
                old = getattr(env_params, k)
                old_arr = jnp.asarray(old)
                env_new[k] = jnp.where(entered_i, jnp.asarray(v, old_arr.dtype), old_arr)
            env_params = env_params.replace(**env_new)
    return m.replace(stage=stage, stage_hold=hold), hparams, env_params


_NO_BOUNDS = MetaConfig()  # only passed with clip=False


def meta_metrics(m: MetaState, cfg: MetaConfig, max_entropy: float | None, present=()) -> dict[str, Any]:
    """The signals the meta-controller acted on, as metrics (per seed); `present`: the optional
    signals the agent reports (`Signals.present()`)."""
    out = {"meta_return_trend": return_trend(m)}
    if "value_loss" in present:
        out["meta_loss_trend"] = loss_trend(m)
    if "entropy" in present:
        out["meta_entropy_rate"] = entropy_rate(m, max_entropy)
        if max_entropy:
            out["meta_entropy_ratio"] = m.entropy_fast / max_entropy
    if "explore" in present:
        out["meta_explore"] = m.explore
    if cfg.mode == "bandit":
        out["meta_arm"] = m.arm
    return out
