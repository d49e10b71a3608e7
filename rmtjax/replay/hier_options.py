"""`agent.replay: hierarchical` as a replay kind: its options (`HierOptions`, fields of the agent's
section), their checks, and `build`, which makes the device side (a replay of the agents' one
interface) and the host side the driver syncs between chunks (`rmtjax.protocol.BetweenChunks`).

The levels themselves are `rmtjax.replay.hierarchical` (cache) and `rmtjax.replay.prefetch`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rmtjax.schema import ConfigError, param


@dataclasses.dataclass(frozen=True)
class HierOptions:
    """The `agent.*` fields of the hierarchical replay (a capacity beyond device memory)."""

    device_fraction: float = param(0.1, lo=0.0, hi=1.0, lo_open=True, doc="hierarchical: share of buffer_size the "
                                                                           "device may hold (prefetch: the staged draws "
                                                                           "and outbox must fit in it; cache: the "
                                                                           "tiered buffer)")
    disk_fraction: float = param(0.0, lo=0.0, hi=1.0, doc="hierarchical: share of buffer_size held on disk "
                                                          "(memory-mapped files); host RAM holds the rest")
    disk_dir: str = param("", doc="hierarchical: directory of the disk level's files; '' for the run directory's "
                                  "replay_disk/ (a temporary directory without a run directory)")
    sync_every: int = param(4, lo=1, doc="hierarchical: iterations between moves across levels (the driver's "
                                           "chunks are at most this long)")
    refresh_share: float = param(0.25, lo=0.0, hi=1.0, doc="hierarchical, cache: share of the device's cold tier "
                                                           "replaced at each move by lower-level items drawn by priority")
    priority: str = param("|td|^0.6 + 0.01", doc="hierarchical, cache: priority of an item from its last |TD error| "
                                                 "`td` (numbers, + - * / ^, |...|, sqrt, log, log1p, exp, min, max)")
    replay_warmup: int = param(0, lo=0, doc="hierarchical: items the lower levels hold before refreshes (cache) or "
                                            "stagings (prefetch) begin")
    hier_sampling: str = param("prefetch", choices=("prefetch", "cache"),
                               doc="hierarchical: what minibatches are drawn from. prefetch: the whole capacity, "
                                   "ranked into tiers by |TD| on the host, each chunk's draws staged on the device "
                                   "(rmtjax.replay.prefetch); cache: the device level's tiered buffer, its cold tier "
                                   "refreshed from the lower levels by `priority`")


def capacities(c) -> tuple[int, int, int]:
    """(device, host, disk) capacities in items of the agent section `c`."""
    disk = int(round(c.disk_fraction * c.buffer_size))
    return int(round(c.device_fraction * c.buffer_size)), c.buffer_size - disk, disk


def stage_size(c, updates_per_iteration: int) -> int:
    """prefetch: draws staged on the device per chunk (sync_every iterations)."""
    return c.sync_every * updates_per_iteration * c.batch_size


def check(c, per_iter: int, updates_per_iteration: int) -> None:
    """The `ConfigError` for hierarchical options that cannot work with the agent section `c`
    (`per_iter` transitions and `updates_per_iteration` updates an iteration)."""
    from rmtjax.replay import tiered
    from rmtjax.replay.hierarchical import priority_function

    device, host, disk = capacities(c)
    if c.hier_sampling == "prefetch":
        need = stage_size(c, updates_per_iteration) + c.sync_every * per_iter
        if need > device:
            raise ConfigError(f"agent.hier_sampling: prefetch stages agent.sync_every={c.sync_every} iterations' "
                              f"draws ({c.sync_every} × {updates_per_iteration} updates × {c.batch_size}) and their "
                              f"{c.sync_every * per_iter} new transitions on the device, {need} items; the device "
                              f"level (agent.device_fraction × agent.buffer_size) is {device}: lower agent.sync_every "
                              f"or raise agent.device_fraction")
    elif device < per_iter:
        raise ConfigError(f"agent.device_fraction: {c.device_fraction} of agent.buffer_size {c.buffer_size} is "
                          f"{device} items on the device, less than one iteration's {per_iter} transitions")
    if c.hier_sampling == "cache":
        try:
            tiered.tier_capacities(device, c.tier_fractions)
        except ValueError as e:
            raise ConfigError(f"agent.device_fraction: the device level of {device} items cannot be tiered: "
                              f"{e}") from None
    if c.batch_size > device:
        raise ConfigError(f"agent.batch_size: {c.batch_size} exceeds the device level's {device} items "
                          f"(agent.device_fraction × agent.buffer_size)")
    if host < c.sync_every * per_iter:
        raise ConfigError(f"agent.disk_fraction: the host level's {host} items cannot take the "
                          f"{c.sync_every * per_iter} transitions of agent.sync_every={c.sync_every} "
                          f"iterations; lower disk_fraction or sync_every")
    if c.replay_warmup > c.buffer_size:
        raise ConfigError(f"agent.replay_warmup: {c.replay_warmup} items exceed the lower levels' capacity "
                          f"(agent.buffer_size {c.buffer_size}), so refreshes would never begin")
    priority_function(c.priority)


def device_replay(c, per_iter: int, updates_per_iteration: int):
    """The device side, a replay of the agents' interface: the prefetch staging area, or the
    tiered cache; both with an outbox of `sync_every` iterations' transitions."""
    from rmtjax.replay.hierarchical import HierarchicalReplay
    from rmtjax.replay.prefetch import PrefetchReplay

    outbox = c.sync_every * per_iter
    if c.hier_sampling == "prefetch":
        return PrefetchReplay(stage_size(c, updates_per_iteration), outbox=outbox)
    return HierarchicalReplay(capacities(c)[0], c.tier_fractions, c.tier_proportions, outbox=outbox)


def host_levels(c, updates_per_iteration: int, seeds: int, run_dir=None, seed: int = 0):
    """The host side the driver syncs between chunks (`Levels` or `PrefetchLevels`)."""
    from rmtjax.replay import tiered
    from rmtjax.replay.hierarchical import Levels
    from rmtjax.replay.prefetch import PrefetchLevels

    device, host, disk = capacities(c)
    disk_dir = c.disk_dir or (None if run_dir is None else Path(run_dir) / "replay_disk")
    if c.hier_sampling == "prefetch":
        return PrefetchLevels(seeds=seeds, host_capacity=host, disk_capacity=disk,
                              stage=stage_size(c, updates_per_iteration), batch_size=c.batch_size,
                              fractions=c.tier_fractions, proportions=c.tier_proportions, warmup=c.replay_warmup,
                              disk_dir=disk_dir if disk else None, seed=seed, max_iterations=c.sync_every)
    caps = tiered.tier_capacities(device, c.tier_fractions)
    return Levels(seeds=seeds, host_capacity=host, disk_capacity=disk, cold_rows=(caps[0] + caps[1], caps[2]),
                  refresh_share=c.refresh_share, warmup=c.replay_warmup, priority=c.priority,
                  disk_dir=disk_dir if disk else None, seed=seed, max_iterations=c.sync_every)
