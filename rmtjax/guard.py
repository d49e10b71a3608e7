"""The update guard: one optax `GradientTransformation` that every agent's optimiser is wrapped in.

`guard(inner, fusion)` turns the raw gradient of a loss into the update the inner optimiser
(Adam, RMSProp, ...) makes, in this order:

1. loss scaling: the gradient is divided by the loss scale the loss was multiplied by before the
   backward pass (fp16; the scale is 1 otherwise, see `rmtjax.precision`);
2. fusion across devices (only with a `rmtjax.distributed.Fusion`, i.e. `distributed.devices`
   > 1, inside `shard_map` over the `data` axis): the devices' gradients are combined, and the
   loss is averaged over them and is NaN on every device if any device's loss or gradient is
   not finite, so that all devices skip the same steps; the fusion's own state (error-feedback
   residuals, top-k momentum) is part of this transform's state;
3. the finiteness skip (in the spirit of `optax.apply_if_finite`): a step whose loss or fused
   gradient is not finite gives zero updates (the parameters stay as they are) and leaves the
   inner optimiser state and the fusion state as they were;
4. the global-norm clip with the threshold in force: the threshold is an argument of each
   update (`clip`, 0: none), computed by the agent from its `max_grad_norm` and the share of
   training done (`Precision.clip_threshold`, the clip schedule), so one compiled step serves
   a threshold that changes over the run or is moved by the meta-controller. The norm is
   taken once, of the fused gradient, and kept in the state (`grad_norm`, before clipping);
5. the inner optimiser.

The update takes the extra arguments by keyword: `tx.update(grads, state, params, loss=...,
clip=..., loss_scale=...)`. A skipped step's updates are zeros; with `zero_skipped=False` they
are the inner optimiser's, and the caller keeps the old parameters where `state.finite` is
False (`Precision.step` does, with `jnp.where` after `optax.apply_updates`): a select between
the optimiser's arithmetic and the add to the parameters changes how XLA:CPU rounds that add
(it no longer fuses into one multiply-add), which would change every preset's results in the
last bits and so their trajectories. Agents do not call it themselves: `Precision.step` computes the
gradient in the compute dtype in force, calls it and keeps the loss-scale, skip count and
escalation bookkeeping in `PrecisionState` (which stays beside the optimiser state because one
`PrecisionState` serves every optimiser of an agent, e.g. SAC's three).

The learning rate of an inner `optax.inject_hyperparams` optimiser is set with `with_lr`;
`lr_in_force` is the linear schedule every agent uses.

Transfer (`rmtjax.transfer`) adds one thing to this path, and only when a run freezes parameters
or measures a KL penalty: `guard(inner, fusion, stages=Stages(...))`. Every parameter leaf then
has a stage (`Stages.labels`): -1 frozen for the whole run, 0 trained from the start, k ≥ 1
released when `Staged.released[k]` turns True (the transfer layer sets it from the share of
training done before each iteration, `release`). The gradient of a leaf that is not released
is zeroed right after the fusion, before the norm (so it neither moves the parameter nor counts
in the clip), and its update is exactly zero. Each stage has its own copy of the inner optimiser
(`optax.masked` over that stage's leaves), which advances only once the stage is released: a
layer released halfway starts with fresh moments and step count, as a newly trained layer would.
`Staged.anchor` holds the source parameters the KL penalty is measured from (`Precision.step`
reads it with `anchor`); the optimiser state is where it lives because it is per seed, copied by
PBT with the parameters and saved in every checkpoint.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct


@struct.dataclass
class GuardState:
    """The guard's state: the inner optimiser's, the fusion's and what the last update saw."""

    inner: Any  # the inner optimiser's state
    fusion: Any  # `rmtjax.distributed.FusionState` on several devices, else None
    finite: jax.Array  # bool: the last update was applied (its loss and gradient were finite)
    # float32, of the last update; 0 when it was skipped (no NaN enters the state, which PBT
    # copies and checkpoints save): the global norm of the (unscaled, fused) gradient before
    # clipping, and the loss (on several devices, their mean)
    grad_norm: jax.Array
    loss: jax.Array


class Stages(NamedTuple):
    """Static description of staged training (`rmtjax.transfer`): `labels(params)` gives each
    leaf's stage (-1: frozen for the run; 0: trained from the start; k in 1..count-1: trained once
    stage k is released); `anchor`: keep the KL penalty's source parameters in the state."""

    labels: Callable[[Any], Any]
    count: int
    anchor: bool = False


@struct.dataclass
class Staged:
    """The inner optimiser's state under `Stages`: one state per stage (over that stage's
    leaves), which stages are released (bool [count]; stage 0 always), and the anchor
    parameters of the KL penalty (None without one)."""

    inner: tuple
    released: jax.Array
    anchor: Any = None


def _staged(inner: optax.GradientTransformation, stages: Stages) -> optax.GradientTransformationExtraArgs:
    """`inner` run once per stage over that stage's leaves; a stage that is not released gives
    zero updates and keeps its state."""
    masked = [optax.masked(inner, lambda p, k=k: jax.tree.map(lambda lab: lab == k, stages.labels(p)))
              for k in range(stages.count)]

    def init(params):
        released = jnp.arange(stages.count) == 0
        return Staged(inner=tuple(m.init(params) for m in masked), released=released,
                      anchor=jax.tree.map(jnp.array, params) if stages.anchor else None)

    def update(grads, state: Staged, params=None, **extra_args):
        labels = stages.labels(grads)
        out = jax.tree.map(jnp.zeros_like, grads)
        new_inner = []
        for k, m in enumerate(masked):
            on = state.released[k]
            updates, s_k = m.update(grads, state.inner[k], params, **extra_args)
            out = jax.tree.map(lambda lab, u, o: jnp.where(on, u, o) if lab == k else o, labels, updates, out)
            new_inner.append(jax.tree.map(lambda a, b: jnp.where(on, a, b), s_k, state.inner[k]))
        return out, state.replace(inner=tuple(new_inner))

    return optax.GradientTransformationExtraArgs(init, update)


def _trainable(state, stages: Stages, grads):
    """bool per leaf of `grads`: its stage is released (never for a leaf frozen for the run)."""
    labels = stages.labels(grads)
    return jax.tree.map(lambda lab: jnp.asarray(False) if lab < 0 else state.inner.released[lab], labels)


def guard(inner: optax.GradientTransformation, fusion=None, stages: Stages | None = None
          ) -> optax.GradientTransformationExtraArgs:
    """Wrap `inner` in the guard (see the module docstring); `fusion`: a `rmtjax.distributed.
    Fusion` to combine the devices' gradients, or None on one device; `stages`: frozen and
    staged parameters and the KL anchor of a transferred run (`rmtjax.transfer`), or None."""
    if stages is not None:
        inner = _staged(inner, stages)

    def init(params):
        return GuardState(inner=inner.init(params), fusion=None if fusion is None else fusion.init(params),
                          finite=jnp.asarray(True), grad_norm=jnp.zeros((), jnp.float32),
                          loss=jnp.zeros((), jnp.float32))

    def update(grads, state: GuardState, params=None, *, loss, clip=0.0, loss_scale=1.0, zero_skipped=True,
               **extra_args):
        grads = jax.tree.map(lambda g: g / loss_scale, grads)
        new_fusion = state.fusion
        if fusion is not None:
            grads, loss, new_fusion = fusion.fuse(grads, loss, state.fusion)
        if stages is not None:  # a parameter that is not trained has no gradient (nor a share of the norm)
            grads = jax.tree.map(lambda on, g: jnp.where(on, g, jnp.zeros_like(g)),
                                 _trainable(state, stages, grads), grads)
        norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(norm)
        clip = jnp.asarray(clip, jnp.float32)
        factor = jnp.where((clip > 0) & (norm > clip), clip / jnp.where(finite, norm, 1.0), 1.0)
        # zeros in place of a non-finite gradient keep the optimiser's arithmetic finite; its result is dropped
        grads = jax.tree.map(lambda g: jnp.where(finite, g * factor, 0.0), grads)
        updates, new_inner = inner.update(grads, state.inner, params)
        if zero_skipped:
            updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), updates)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
        return updates, GuardState(inner=keep(new_inner, state.inner), fusion=keep(new_fusion, state.fusion),
                                   finite=finite, grad_norm=jnp.where(finite, norm, 0.0),
                                   loss=jnp.where(finite, jnp.asarray(loss, jnp.float32), 0.0))

    return optax.GradientTransformationExtraArgs(init, update)


def stats(state: GuardState) -> dict:
    """The last update's `grad_norm` (before clipping; NaN if it was skipped) and
    `update_skipped` (1.0 or 0.0)."""
    return {"grad_norm": jnp.where(state.finite, state.grad_norm, jnp.nan),
            "update_skipped": (~state.finite).astype(jnp.float32)}



def with_lr(state: GuardState, lr) -> GuardState:
    """`state` with the learning rate of its inner `optax.inject_hyperparams` optimiser set to `lr`
    (under `Stages`, of every stage's copy)."""

    def set_lr(inner):
        return inner._replace(hyperparams={**inner.hyperparams, "learning_rate": lr})

    inner = state.inner
    if isinstance(inner, Staged):
        return state.replace(inner=inner.replace(inner=tuple(
            s._replace(inner_state=set_lr(s.inner_state)) for s in inner.inner)))
    return state.replace(inner=set_lr(inner))


def _staged_nodes(tree, fn):
    """`tree` (any state) with `fn` applied to every `Staged` node in it."""
    return jax.tree.map(lambda x: fn(x) if isinstance(x, Staged) else x, tree,
                        is_leaf=lambda x: isinstance(x, Staged))


def release(tree, released):
    """`tree` (an agent state, batched or not) with every `Staged.released` set to `released`
    (bool [stages], broadcast over the seeds)."""
    return _staged_nodes(tree, lambda s: s.replace(released=jnp.broadcast_to(released, s.released.shape)))


def with_anchor(tree, anchor):
    """`tree` with the KL anchor of every `Staged` that keeps one set to `anchor` (the
    parameters, structured like that optimiser's)."""
    return _staged_nodes(tree, lambda s: s if s.anchor is None else s.replace(anchor=anchor))


def anchor(state: GuardState):
    """The KL penalty's anchor parameters kept in the guard's state, or None."""
    return state.inner.anchor if isinstance(state.inner, Staged) else None


def lr_in_force(lr, progress, end_frac):
    """The learning rate at `progress` (share of training done, 0..1) of a linear decay from `lr`
    to `lr × end_frac` (1: constant, 0: to zero)."""
    return lr * (1.0 - (1.0 - end_frac) * progress)
