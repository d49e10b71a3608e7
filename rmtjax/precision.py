"""Precision policy, dynamic loss scaling, the non-finite guard and precision escalation.

A run computes its networks in `precision.compute`:

- `fp32`: everything in float32;
- `bf16`: network compute (matmuls, activations, layer norms) in bfloat16; parameters,
  optimiser state, TD targets and losses in float32 (heads cast their outputs to float32);
- `fp16`: as bf16 but in float16, with dynamic loss scaling: the loss is multiplied by a scale
  before the backward pass and the gradients divided by it; the scale doubles after
  `loss_scale_growth_interval` finite updates in a row and halves on an overflow, within
  [`loss_scale_min`, `loss_scale_max`].

Every gradient update of every agent goes through `Precision.step`: the gradient of the
(scaled) loss in the dtype in force, then the agent's optimiser wrapped in the update guard
(`rmtjax.guard.guard`, an optax `GradientTransformation`): an update whose loss or gradients
are not finite is skipped (parameters and inner optimiser state unchanged) and counted here.
After `escalate_after_consecutive` non-finite updates in a row, or `escalate_after_total` of them, while low precision is in force, the run escalates to fp32 for
`escalate_cooldown` guarded updates (0: for the rest of the run), then tries low precision
again. The switch happens inside the compiled loop: both the low-precision and the fp32
computations are traced and the flag in `PrecisionState` picks one (under `vmap` over seeds
the pick becomes a select, so both are computed; set both escalation thresholds to 0 to trace
the low-precision path alone).

The guard also clips the gradients by global norm (the agent passes the threshold in force,
see `clip_threshold`), so the norm is computed once per update and reported. `PrecisionState`
(loss scale, skip count, escalation) stays beside the optimiser state: one serves all the
optimisers of an agent (SAC has three), and the dtype it selects is needed before the
gradient exists.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from rmtjax.guard import GuardState, stats as guard_stats
from rmtjax.schema import ConfigError, Section, param

LOW_DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16}
BITS = {"fp32": 32, "bf16": 16, "fp16": 16}


@dataclasses.dataclass(frozen=True)
class PrecisionConfig(Section):
    """Compute precision of the networks and the numerical safety net of every update."""

    _section = "precision"
    compute: str = param("fp32", choices=("fp32", "bf16", "fp16"),
                         doc="network compute dtype; parameters, optimiser state, targets and losses stay float32")
    loss_scale_init: float = param(2.0**15, lo=0.0, lo_open=True, doc="fp16: initial loss scale")
    loss_scale_growth_interval: int = param(2000, lo=1, doc="fp16: finite updates in a row before the scale doubles")
    loss_scale_min: float = param(1.0, lo=0.0, lo_open=True, doc="fp16: the scale never halves below this")
    loss_scale_max: float = param(2.0**24, lo=0.0, lo_open=True, doc="fp16: the scale never doubles above this")
    escalate_after_consecutive: int = param(0, lo=0, doc="bf16/fp16: switch to fp32 after this many non-finite "
                                                         "updates in a row; 0 never (the default: under vmap over "
                                                         "seeds escalation computes both precisions every update)")
    escalate_after_total: int = param(0, lo=0, doc="bf16/fp16: switch to fp32 after this many non-finite updates "
                                                   "in all (counted since low precision was last entered); 0 never")
    escalate_cooldown: int = param(0, lo=0, doc="guarded updates run in fp32 after an escalation before low "
                                                "precision is tried again; 0: fp32 for the rest of the run")
    clip_decay_to: float = param(1.0, lo=0.0, hi=1.0, doc="the gradient-clip threshold decays linearly over "
                                                          "training from agent.max_grad_norm to this share of it")

    def validate(self):
        if not self.loss_scale_min <= self.loss_scale_init <= self.loss_scale_max:
            raise ConfigError(f"precision.loss_scale_init: {self.loss_scale_init} must lie within "
                              f"[precision.loss_scale_min, precision.loss_scale_max] = "
                              f"[{self.loss_scale_min}, {self.loss_scale_max}]")
        defaults = PrecisionConfig.__dataclass_fields__
        # settings that would have no effect are refused rather than ignored
        if self.compute != "fp16":
            for name in ("loss_scale_init", "loss_scale_growth_interval", "loss_scale_min", "loss_scale_max"):
                if getattr(self, name) != defaults[name].default:
                    raise ConfigError(f"precision.{name}: loss scaling applies only with precision.compute: fp16 "
                                      f"(it is {self.compute!r}); remove the setting or set compute to fp16")
        if self.compute == "fp32":
            for name in ("escalate_after_consecutive", "escalate_after_total", "escalate_cooldown"):
                if getattr(self, name) != defaults[name].default:
                    raise ConfigError(f"precision.{name}: escalation to fp32 applies only with precision.compute "
                                      f"bf16 or fp16 (it is 'fp32'); remove the setting or choose a low precision")


@struct.dataclass
class PrecisionState:
    """Per-seed state of the policy; all scalars."""

    low: jax.Array  # bool: low precision in force (False: fp32, by config or after an escalation)
    loss_scale: jax.Array  # float32: the fp16 loss scale (used only while fp16 is in force)
    good_streak: jax.Array  # finite updates since the scale last changed or an overflow
    bad_streak: jax.Array  # non-finite updates in a row while low precision is in force
    bad_total: jax.Array  # non-finite updates since low precision was last entered
    cooldown_left: jax.Array  # guarded updates left in fp32 before low precision returns
    skipped: jax.Array  # updates skipped by the guard, in all
    escalations: jax.Array  # times the run switched to fp32


def tree_where(cond, a, b):
    return jax.tree.map(lambda x, y: jnp.where(cond, x, y), a, b)


def ema(previous, value, valid, rate: float = 0.01):
    """A moving average that starts at the first valid value and ignores invalid ones."""
    started = jnp.where(previous == 0, value, (1.0 - rate) * previous + rate * value)
    return jnp.where(valid & jnp.isfinite(value), started, previous)


def finite_abs(x):
    """|x| with non-finite entries as 0 (for priorities and statistics a NaN must not poison)."""
    return jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0)


def summarize(stats: dict) -> dict:
    """Mean over a scan of guarded updates: each statistic over the accepted updates only (0 if
    none was accepted), plus `skipped_frac`, the share of updates skipped."""
    skipped = stats["update_skipped"].reshape(-1)
    ok = 1.0 - skipped
    n = jnp.maximum(ok.sum(), 1.0)
    out = {}
    for k, v in stats.items():
        if k == "update_skipped":
            continue
        v = v.reshape(-1)
        out[k] = jnp.where(ok > 0, v, 0.0).sum() / n
    out["skipped_frac"] = skipped.mean()
    return out


class Step(NamedTuple):
    """What `Precision.step` returns."""

    params: Any  # after the update (the ones passed in if it was skipped)
    opt_state: Any  # the guard's state (`rmtjax.guard.GuardState`)
    precision: PrecisionState  # after the loss-scale, skip and escalation bookkeeping
    loss: jax.Array  # the loss (when the gradients are fused: the devices' mean, NaN if the step was skipped)
    aux: Any  # what `loss_fn` returned beside the loss (this device's)
    transfer_kl: Any = None  # with a KL penalty (`penalty`): the KL to the source policy, else None

    @property
    def stats(self) -> dict:
        """`grad_norm` (before clipping) and `update_skipped` (1.0 or 0.0); with a KL penalty
        also `transfer_kl`."""
        out = guard_stats(self.opt_state)
        return out if self.transfer_kl is None else {**out, "transfer_kl": self.transfer_kl}


class Precision:
    """The static policy of one run (from `PrecisionConfig`) and its pure functions."""

    def __init__(self, cfg: PrecisionConfig):
        self.cfg = cfg
        self.low_dtype = LOW_DTYPES.get(cfg.compute)
        self.switchable = self.low_dtype is not None and (
            cfg.escalate_after_consecutive > 0 or cfg.escalate_after_total > 0)

    @property
    def dtypes(self) -> tuple:
        """Every compute dtype the compiled program may use; build one network per dtype."""
        if self.low_dtype is None:
            return (jnp.float32,)
        return (self.low_dtype, jnp.float32) if self.switchable else (self.low_dtype,)

    def init(self) -> PrecisionState:
        i0 = jnp.zeros((), jnp.int32)
        scale = self.cfg.loss_scale_init if self.cfg.compute == "fp16" else 1.0
        return PrecisionState(low=jnp.asarray(self.low_dtype is not None), loss_scale=jnp.float32(scale),
                              good_streak=i0, bad_streak=i0, bad_total=i0, cooldown_left=i0, skipped=i0,
                              escalations=i0)

    def select(self, state: PrecisionState, fn: Callable[[Any], Any]):
        """`fn(dtype)` in the dtype in force. Every output must have the same dtype in each branch."""
        if self.low_dtype is None:
            return fn(jnp.float32)
        if not self.switchable:
            return fn(self.low_dtype)
        return jax.lax.cond(state.low, lambda: fn(self.low_dtype), lambda: fn(jnp.float32))

    def clip_threshold(self, max_grad_norm, progress):
        """The clip threshold in force at `progress` (share of training done, 0..1)."""
        return max_grad_norm * (1.0 + (self.cfg.clip_decay_to - 1.0) * jnp.clip(progress, 0.0, 1.0))

    def loss_scale(self, state: PrecisionState):
        """The loss scale in force: the dynamic scale while fp16 is in force, else 1."""
        if self.cfg.compute != "fp16":
            return jnp.float32(1.0)
        return jnp.where(state.low, state.loss_scale, 1.0)

    def bits(self, state: PrecisionState):
        return jnp.where(state.low, BITS[self.cfg.compute], 32).astype(jnp.float32)

    def step(self, state: PrecisionState, loss_fn, params, opt_state, tx, clip=0.0, penalty=None) -> "Step":
        """One guarded gradient step: the call every agent makes for every update.

        `loss_fn(params, dtype) -> (loss, aux)` computes its networks in `dtype` and its loss
        (a float32 scalar) and aux (float32 arrays) in float32; the gradient is taken in the
        dtype in force, of the loss times the loss scale in force. `tx` is the agent's
        optimiser wrapped in `rmtjax.guard.guard` and `opt_state` its state; `clip` the
        global-norm threshold in force (0: no clipping; see `clip_threshold`). Returns a
        `Step`: when the update is skipped its params and inner optimiser state are the ones
        passed in; its `loss` is the mean over the devices when the gradients are fused.

        `penalty(params, dtype) -> (term, kl)` (a transferred run's KL penalty to the source
        policy, `rmtjax.agents.base.Agent.transfer_penalty`; None: none): `term` is added to the
        loss before the gradient, and `kl` is reported as `Step.transfer_kl`.
        """
        scale = self.loss_scale(state)

        def grads_in(dtype):
            def scaled(p):
                loss, aux = loss_fn(p, dtype)
                if penalty is None:
                    return loss * scale, (loss, aux)
                term, kl = penalty(p, dtype)
                loss = loss + term
                return loss * scale, (loss, (aux, kl))

            grads, (loss, aux) = jax.grad(scaled, has_aux=True)(params)
            return grads, loss, aux

        grads, loss, aux = self.select(state, grads_in)
        kl = None
        if penalty is not None:
            aux, kl = aux
        if not isinstance(opt_state, GuardState):
            raise TypeError("Precision.step: the optimiser must be wrapped in rmtjax.guard.guard(...) (its state "
                            f"is a GuardState); got a {type(opt_state).__name__}")
        updates, opt_state = tx.update(grads, opt_state, params, loss=loss, clip=clip, loss_scale=scale,
                                       zero_skipped=False)
        # the guard's updates of a skipped step are not zeroed: the select comes after the add (see rmtjax.guard)
        params = tree_where(opt_state.finite, optax.apply_updates(params, updates), params)
        # the loss over the devices when fused (NaN everywhere when any device's was not finite), else this one
        loss = jnp.where(opt_state.finite, opt_state.loss, jnp.nan if opt_state.fusion is not None else loss)
        return Step(params, opt_state, self.after_update(state, opt_state.finite), loss, aux, kl)

    def after_update(self, state: PrecisionState, finite) -> PrecisionState:
        """Loss-scale, skip and escalation bookkeeping after an update that was `finite` or not."""
        c = self.cfg
        bad = ~finite
        skipped = state.skipped + bad.astype(jnp.int32)
        good = jnp.where(finite, state.good_streak + 1, 0)
        scale = state.loss_scale
        if c.compute == "fp16":
            grow = state.low & (good >= c.loss_scale_growth_interval)
            scale = jnp.where(grow, jnp.minimum(scale * 2.0, c.loss_scale_max), scale)
            scale = jnp.where(state.low & bad, jnp.maximum(scale * 0.5, c.loss_scale_min), scale)
            good = jnp.where(grow, 0, good)
        if not self.switchable:
            return state.replace(loss_scale=scale, good_streak=good, skipped=skipped)

        counting = state.low & bad
        bad_streak = jnp.where(state.low, jnp.where(bad, state.bad_streak + 1, 0), 0)
        bad_total = state.bad_total + counting.astype(jnp.int32)
        escalate = state.low & (
            ((c.escalate_after_consecutive > 0) & (bad_streak >= c.escalate_after_consecutive))
            | ((c.escalate_after_total > 0) & (bad_total >= c.escalate_after_total)))
        low = state.low & ~escalate
        cooldown = jnp.where(escalate, c.escalate_cooldown, state.cooldown_left)
        if c.escalate_cooldown > 0:
            cooling = ~state.low
            cooldown = jnp.where(cooling, cooldown - 1, cooldown)
            back = cooling & (cooldown <= 0)
            low = low | back
            cooldown = jnp.maximum(cooldown, 0)
            good = jnp.where(back, 0, good)
        return state.replace(
            low=low, loss_scale=scale, good_streak=jnp.where(escalate, 0, good),
            bad_streak=jnp.where(escalate, 0, bad_streak), bad_total=jnp.where(escalate, 0, bad_total),
            cooldown_left=cooldown, skipped=skipped, escalations=state.escalations + escalate.astype(jnp.int32))

    def metrics(self, state: PrecisionState, clip) -> dict:
        """The monitors every agent reports: precision in force (bits), loss scale in force,
        updates skipped so far, escalations so far, and the clip threshold in force."""
        return {"precision_bits": self.bits(state), "loss_scale": self.loss_scale(state),
                "skipped_updates": state.skipped.astype(jnp.float32),
                "precision_escalations": state.escalations.astype(jnp.float32),
                "clip_threshold": jnp.asarray(clip, jnp.float32)}
