"""Replay beyond device memory: the tiered buffer on the device is a cache over host-RAM and disk levels.

This is `agent.hier_sampling: cache`. The default sampler, `prefetch` (`rmtjax.replay.prefetch`),
keeps these host and disk levels (`Levels`) but draws over the whole capacity and stages the
draws on the device; it learnt far better at the same device budget (docs/guides/replay.md,
"Replay beyond device memory").

The compiled loop reads device memory only. Inside it, `HierarchicalReplay` is the tiered buffer
(`rmtjax.replay.tiered`, hot/warm/cold keyed on |TD error|) of `device_fraction` of the capacity,
plus an *outbox*: every transition the loop adds is also copied there, in order, with its |TD|
and id. Between two compiled chunks the driver calls `Levels.after_chunk`, which

1. moves the outbox down: each new item enters the host level (a ring in host RAM); the host
   ring's oldest items move on to the disk level (a ring in memory-mapped files); the disk
   ring's oldest items are dropped. Host and disk together hold the newest `capacity` items,
   each exactly once, device-resident or not (an inclusive hierarchy, as a CPU cache over RAM);
2. carries priorities: the |TD| the device's write-backs gave its resident items is copied to
   their copies in the lower levels, so an item keeps the priority it last had;
3. measures the hit rate: the share of the priority mass `sum priority(|TD|)` over every item
   held that lies on items resident on the device — the chance that a draw of a prioritised
   sampler over the whole capacity would have found its item in device memory;
4. refreshes the device's cold tier: once the lower levels hold `warmup` items, the
   `refresh_share` of the cold tier's items with the lowest priority are overwritten by items
   of the lower levels not on the device, drawn without replacement in proportion to their
   priority (Gumbel top-k). The refreshed items keep their id and |TD|; the tiered buffer
   re-routes them by TD error at their next write-back, as it does with demoted items.

The priority is a formula of `td` (the item's last |TD error|), e.g. `|td|^0.6 + 0.01` or
`sqrt(|td|) + 0.1`: numbers, `td`, `+ - * / ^ **`, `|...|` and the functions of `FUNCTIONS`.

Checkpoints: `save` writes the host level, the lower levels' priorities and ids, the counters
and the disk level, and returns the level file's checksum, which the run directory stores in the
checkpoint written next (the levels are written first: a crash between the two leaves a level
file no checkpoint names, never a checkpoint without its levels). The disk level goes into
content-addressed segment files (`segments/<sha256>.npz`, a segment per `SEGMENT_ROWS` rows); a
checkpoint names its segments by checksum, a segment that did not change since the last
checkpoint is not written again, and a resume checks the level file's and every segment's
checksum before it loads them (`LevelsError` names the file; the run directory then falls back
to the checkpoint before).

Files (issue 34): every file is written through `rmtjax.safefs` (fresh temporary files renamed
into place, no link followed, directories that are links refused); `prune` deletes only the
regular files of the names it writes. The disk level's directory (`agent.disk_dir`) is locked
while a run uses it: a second run naming it is refused. The wall-clock time of the moves is kept
apart from the metrics (`timing()`), so a resumed run's metrics are those of the uninterrupted one.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rmtjax import safefs
from rmtjax.replay import tiered
from rmtjax.replay.adapters import TieredReplay
from rmtjax.schema import ConfigError

# |TD| a new item enters with when the agent computes none: above any real |TD| (so it ranks hot),
# finite (so a priority formula of it stays finite)
FRESH_TD = 1e6
UID_MASK = 0x7FFFFFFF  # the tiered buffer's ids: its insertion count, wrapped in int32's positive range
SEGMENT_ROWS = 4096  # disk-level rows per checkpoint segment
MAX_PRIORITY_CHARS = 256  # a priority formula is a short expression of td
_LEVEL_FILE = re.compile(r"[0-9]{1,12}\.npz")  # <iteration>.npz
_SEGMENT_FILE = re.compile(r"[0-9a-f]{32}\.npz")  # <checksum>.npz
_LEFTOVER = re.compile(r"\..+\.[0-9a-f]{16}\.tmp")  # a temporary file a killed write left (safefs)


class LevelsError(ValueError):
    """A saved level or segment file is missing, damaged or not what its checkpoint names; the
    message names the file."""


FUNCTIONS = {"sqrt": np.sqrt, "log": np.log, "log1p": np.log1p, "exp": np.exp, "abs": np.abs,
             "min": np.minimum, "max": np.maximum}


# --- the priority formula ----------------------------------------------------------------------


def priority_function(text: str) -> Callable[[np.ndarray], np.ndarray]:
    """The priority formula `text` (of `td`, the |TD error|) as a numpy function; a ConfigError
    names what is wrong with it. Bounded: at most `MAX_PRIORITY_CHARS` characters."""
    if not isinstance(text, str) or len(text) > MAX_PRIORITY_CHARS:
        raise ConfigError(f"agent.priority: a formula of {len(str(text)):,} characters; at most {MAX_PRIORITY_CHARS} "
                          f"(e.g. |td|^0.6 + 0.01)")
    source = re.sub(r"\|([^|]+)\|", r"abs(\1)", text).replace("^", "**")
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as e:
        raise ConfigError(f"agent.priority: {text!r} is not a formula ({getattr(e, 'msg', type(e).__name__)})") from None
    ops = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.divide, ast.Pow: np.power}

    def build(node):
        if isinstance(node, ast.Expression):
            return build(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            value = float(node.value)
            return lambda td: value
        if isinstance(node, ast.Name) and node.id == "td":
            return lambda td: td
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            op, a, b = ops[type(node.op)], build(node.left), build(node.right)
            return lambda td: op(a(td), b(td))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            a, sign = build(node.operand), -1.0 if isinstance(node.op, ast.USub) else 1.0
            return lambda td: sign * a(td)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS
                and not node.keywords and len(node.args) in ((1,) if node.func.id not in ("min", "max") else (2,))):
            f, args = FUNCTIONS[node.func.id], [build(a) for a in node.args]
            return lambda td: f(*(a(td) for a in args))
        what = ast.get_source_segment(source, node) or type(node).__name__
        raise ConfigError(f"agent.priority: {text!r}: {what!r} is not allowed; use td, numbers, + - * / ^, |...| "
                          f"and {', '.join(FUNCTIONS)}")

    expr = build(tree)

    def priority(td):
        td = np.asarray(td, np.float64)
        with np.errstate(all="ignore"):
            out = np.broadcast_to(np.asarray(expr(td), np.float64), td.shape)
        return np.where(np.isfinite(out) & (out > 0), out, 0.0)

    probe = np.array([0.0, 1e-3, 0.5, 1.0, 10.0, 1e3])
    with np.errstate(all="ignore"):
        raw = np.broadcast_to(np.asarray(expr(probe), np.float64), probe.shape)
    if not np.all(np.isfinite(raw)) or np.any(raw < 0) or not np.all(raw > 0):
        raise ConfigError(f"agent.priority: {text!r} must be finite and above 0 for every |TD| >= 0 (so every item "
                          f"can be drawn); at |TD| = {probe.tolist()} it gives {raw.tolist()}")
    return priority


# --- the device side: the tiered buffer and its outbox -------------------------------------------


@struct.dataclass
class HierState:
    device: tiered.TieredState  # the device level
    outbox: Any  # {"item": pytree [O, ...], "td": [O] float32, "uid": [O] int32}: items added since the last sync
    outbox_count: jax.Array  # int32, items in the outbox
    outbox_lost: jax.Array  # int32, items that found the outbox full (0 whenever the driver syncs in time)


class HierarchicalReplay(TieredReplay):
    """The device level (a tiered buffer of `device_capacity`) and the outbox of `outbox` items
    the driver empties between chunks (see the module's docstring)."""

    def __init__(self, device_capacity: int, fractions, proportions, outbox: int):
        super().__init__(device_capacity, fractions, proportions)
        self.outbox_size = outbox

    def init(self, example):
        item = jax.tree.map(lambda x: jnp.zeros((self.outbox_size,) + jnp.shape(x), jnp.asarray(x).dtype), example)
        return HierState(device=super().init(example),
                         outbox={"item": item, "td": jnp.zeros((self.outbox_size,), jnp.float32),
                                 "uid": jnp.full((self.outbox_size,), -1, jnp.int32)},
                         outbox_count=jnp.zeros((), jnp.int32), outbox_lost=jnp.zeros((), jnp.int32))

    def add(self, state, batch, td_abs=None):
        b = jax.tree.leaves(batch)[0].shape[0]
        if td_abs is None:  # a new item ranks hottest until it is first learned from (no forward pass)
            td_abs = jnp.full((b,), FRESH_TD, jnp.float32)
        uid = (state.device.next_uid + jnp.arange(b, dtype=jnp.int32)) & UID_MASK
        device = tiered.add(state.device, batch, td_abs)
        rows = state.outbox_count + jnp.arange(b, dtype=jnp.int32)
        lost = (rows >= self.outbox_size).sum(dtype=jnp.int32)
        values = {"item": batch, "td": jnp.abs(td_abs).astype(jnp.float32), "uid": uid}
        outbox = jax.tree.map(lambda buf, v: buf.at[rows].set(jnp.asarray(v).astype(buf.dtype), mode="drop"),
                              state.outbox, values)
        return HierState(device=device, outbox=outbox, outbox_count=jnp.minimum(state.outbox_count + b, self.outbox_size),
                         outbox_lost=state.outbox_lost + lost)

    def sample(self, state, key, batch_size, beta):
        return super().sample(state.device, key, batch_size, beta)

    def update(self, state, info, td_abs, keep=None):
        return state.replace(device=super().update(state.device, info, td_abs, keep))

    def batch_stats(self, state, info):
        return super().batch_stats(state.device, info)

    def key_share(self, state, info, key):
        return super().key_share(state.device, info, key)

    def buffer_stats(self, state):
        return {**super().buffer_stats(state.device), "outbox_lost": state.outbox_lost}


def _apply_refresh(replay: HierState, rows, items, td, uid) -> HierState:
    """Seeds' device levels [S, ...] with rows[S, K] overwritten (a row past the end: not written)
    and the outbox emptied."""

    def one(dev, rows, items, td, uid):
        data = jax.tree.map(lambda buf, v: buf.at[rows].set(v.astype(buf.dtype), mode="drop"), dev.data, items)
        return dev.replace(data=data, abs_td_error=dev.abs_td_error.at[rows].set(td, mode="drop"),
                           uid=dev.uid.at[rows].set(uid, mode="drop"))

    device = jax.vmap(one)(replay.device, rows, items, td, uid)
    return replay.replace(device=device, outbox_count=jnp.zeros_like(replay.outbox_count))


# --- the host side: host RAM and disk levels -----------------------------------------------------


class Levels:
    """The host and disk levels of every seed (leading axis S of every array) and the sync
    between chunks. `host_capacity` + `disk_capacity` is the replay's capacity per seed."""

    def __init__(self, *, seeds: int, host_capacity: int, disk_capacity: int, cold_rows: tuple[int, int],
                 refresh_share: float, warmup: int, priority: str, disk_dir=None, seed: int = 0,
                 max_iterations: int | None = None):
        self.max_iterations = max_iterations  # the driver syncs at least this often (the outbox's size)
        self.seeds, self.host_capacity, self.disk_capacity = seeds, host_capacity, disk_capacity
        self.cold_offset, self.cold_capacity = cold_rows
        self.refresh_rows = int(math.floor(refresh_share * self.cold_capacity))
        self.warmup, self.priority_text, self.priority = warmup, priority, priority_function(priority)
        self.seed = seed
        self._tmp = None  # a temporary directory for the disk level without a run directory, made when first used
        self.disk_dir = None if disk_dir is None else Path(disk_dir)
        self._disk_lock = None
        if self.disk_dir is not None and disk_capacity:
            self._disk_lock = _claim(self.disk_dir)
        self.last_seconds = 0.0  # the last sync's wall-clock seconds
        self.host: list[np.ndarray] = []  # allocated at the first sync (or restore)
        self.disk: list[np.ndarray] = []
        self.fields = None  # [(path, shape, dtype)] of the item's leaves, set at the first sync
        self.syncs = 0
        self.seconds = 0.0  # spent in syncs by this process
        self.seq = np.zeros((seeds,), np.int64)  # items received per seed (the next one's sequence number)
        self.host_td = np.zeros((seeds, host_capacity), np.float32)
        self.disk_td = np.zeros((seeds, disk_capacity), np.float32)
        self._last_saved: dict[str, str] = {}

    # the item layout is known once the device state is
    def _allocate(self, example_items) -> None:
        leaves, self.treedef = jax.tree.flatten(example_items)
        self.fields = [(tuple(x.shape[2:]), np.dtype(x.dtype)) for x in leaves]  # x: [S, O, ...]
        self.item_bytes = int(sum(np.prod(s, dtype=np.int64) * d.itemsize for s, d in self.fields))
        self.host = [np.zeros((self.seeds, self.host_capacity) + s, d) for s, d in self.fields]
        self.disk = []
        if self.disk_capacity:
            if self.disk_dir is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="rmtjax-replay-")
                self.disk_dir = Path(self._tmp.name)
            safefs.make_dir(self.disk_dir, parents=True)
            for i, (s, d) in enumerate(self.fields):
                # created (or emptied) here, never through a link; a raw memory map of the ring
                with safefs.open_regular(self.disk_dir / f"leaf{i}.dat", "w+b") as f:
                    self.disk.append(np.memmap(f, dtype=d, mode="w+", shape=(self.seeds, self.disk_capacity) + s))

    def host_bytes(self, shapes) -> float:
        """Host RAM of the host level for a batched state of these `shapes` (items, priorities)."""
        from rmtjax.limits import tree_bytes

        items = shapes.replay.outbox["item"]
        per_item = tree_bytes(items) / max(self.seeds * shapes.replay.outbox["td"].shape[-1], 1)
        return float(self.seeds * self.host_capacity * (per_item + 4) + self.seeds * self.disk_capacity * 4)

    # -- where an item is, from its sequence number ------------------------------------------
    def _seq_of_uid(self, uid: np.ndarray) -> np.ndarray:
        """Sequence numbers of ids uid[S, n] (-1 where uid < 0): the newest q with q & mask == uid."""
        newest = (self.seq - 1)[:, None]
        back = ((newest & UID_MASK) - uid.astype(np.int64)) & UID_MASK
        return np.where(uid >= 0, newest - back, -1)

    def _level_of(self, q: np.ndarray):
        """(in host, in disk) masks of sequence numbers q[S, n]."""
        seq = self.seq[:, None]
        host = (q >= 0) & (q >= seq - self.host_capacity) & (q < seq)
        disk = (q >= 0) & ~host & (q >= seq - self.host_capacity - self.disk_capacity)
        return host, disk

    def sizes(self) -> tuple[np.ndarray, np.ndarray]:
        """Items held in host and disk, per seed."""
        host = np.minimum(self.seq, self.host_capacity)
        disk = np.clip(self.seq - self.host_capacity, 0, self.disk_capacity)
        return host, disk

    # -- 1. the outbox moves down -----------------------------------------------------------------
    def _append(self, s: int, items: list[np.ndarray], td: np.ndarray) -> int:
        """Seed s receives k items (oldest first); returns how many items the disk level dropped."""
        k = td.shape[0]
        if k > self.host_capacity:
            raise ValueError(f"{k} items in one sync exceed the host level's {self.host_capacity} rows")
        q = self.seq[s] + np.arange(k)
        rows = q % self.host_capacity
        dropped = 0
        leaving = q - self.host_capacity  # the items these rows held move down
        down = leaving >= 0
        if self.disk_capacity:
            dropped = int(np.sum(leaving[down] - self.disk_capacity >= 0))
            drows = leaving[down] % self.disk_capacity
            for buf, host in zip(self.disk, self.host):
                buf[s, drows] = host[s, rows[down]]
            self.disk_td[s, drows] = self.host_td[s, rows[down]]
        else:
            dropped = int(down.sum())
        for host, x in zip(self.host, items):
            host[s, rows] = x
        self.host_td[s, rows] = td
        self.seq[s] += k
        return dropped

    def _gather(self, s: int, index: np.ndarray, host_n: int) -> list[np.ndarray]:
        """Seed s's items at `index` (host rows below `host_n`, disk row `index - host_n` above)."""
        from_host = index < host_n
        hrows, drows = index[from_host], index[~from_host] - host_n
        out = []
        for i, h in enumerate(self.host):
            part = np.empty((index.size,) + h.shape[2:], h.dtype)
            part[from_host] = h[s, hrows]
            if drows.size:
                order = np.argsort(drows, kind="stable")  # a memory-mapped level reads best in row order
                part[np.flatnonzero(~from_host)[order]] = self.disk[i][s, drows[order]]
            out.append(part)
        return out

    # -- the sync -------------------------------------------------------------------------------
    def after_chunk(self, state):
        """One sync of `state` (an agent state whose `replay` is a batched HierState): returns
        the state with its device levels refreshed and its outboxes emptied, and the sync's
        metrics (name -> [S])."""
        t0 = time.perf_counter()
        replay: HierState = state.replay
        got = jax.device_get({"items": replay.outbox["item"], "td": replay.outbox["td"],
                              "count": replay.outbox_count, "lost": replay.outbox_lost,
                              "dev_uid": replay.device.uid, "dev_td": replay.device.abs_td_error})
        if self.fields is None:
            self._allocate(got["items"])
        if np.any(got["lost"] > 0):
            raise RuntimeError(f"replay outbox overflowed ({got['lost'].tolist()} items lost per seed): the driver "
                               f"must sync at least every agent.sync_every iterations")
        leaves = jax.tree.leaves(got["items"])
        S = self.seeds
        down, dropped = np.zeros(S, np.int64), np.zeros(S, np.int64)
        for s in range(S):
            k = int(got["count"][s])
            dropped[s] = self._append(s, [x[s, :k] for x in leaves], got["td"][s, :k])
            down[s] = k

        # 2. priorities of the device's items carried down
        dev_uid, dev_td = got["dev_uid"], got["dev_td"]
        q = self._seq_of_uid(dev_uid)
        in_host, in_disk = self._level_of(q)
        host_resident = np.zeros((S, self.host_capacity), bool)
        disk_resident = np.zeros((S, self.disk_capacity), bool)
        for s in range(S):
            hr, dr = q[s, in_host[s]] % self.host_capacity, q[s, in_disk[s]] % max(self.disk_capacity, 1)
            self.host_td[s, hr] = dev_td[s, in_host[s]]
            host_resident[s, hr] = True
            if self.disk_capacity:
                self.disk_td[s, dr] = dev_td[s, in_disk[s]]
                disk_resident[s, dr] = True
        device_only = (dev_uid >= 0) & ~in_host & ~in_disk

        # 3. hit rate
        host_n, disk_n = self.sizes()
        host_live = np.arange(self.host_capacity)[None, :] < host_n[:, None]
        disk_live = np.arange(self.disk_capacity)[None, :] < disk_n[:, None]
        p_host = np.where(host_live, self.priority(self.host_td), 0.0)
        p_disk = np.where(disk_live, self.priority(self.disk_td), 0.0)
        p_only = np.where(device_only, self.priority(dev_td), 0.0).sum(1)
        total = p_host.sum(1) + p_disk.sum(1) + p_only
        resident = (p_host * host_resident).sum(1) + (p_disk * disk_resident).sum(1) + p_only
        hit = np.where(total > 0, resident / np.maximum(total, 1e-300), 1.0)

        # 4. refresh of the cold tier
        K = self.refresh_rows
        rows = np.full((S, K), dev_uid.shape[1], np.int32)  # past the end: not written
        td_up = np.zeros((S, K), np.float32)
        uid_up = np.full((S, K), -1, np.int32)
        items_up = [np.zeros((S, K) + s_, d) for s_, d in self.fields]
        up = np.zeros(S, np.int64)
        cold = slice(self.cold_offset, self.cold_offset + self.cold_capacity)
        for s in range(S):
            if K == 0 or host_n[s] + disk_n[s] < max(self.warmup, 1):
                continue
            cand_p = np.concatenate([np.where(host_resident[s], 0.0, p_host[s]), np.where(disk_resident[s], 0.0, p_disk[s])])
            cold_live = dev_uid[s, cold] >= 0
            k = int(min(K, cold_live.sum(), np.count_nonzero(cand_p)))
            if k == 0:
                continue
            rng = np.random.default_rng([self.seed, s, self.syncs])
            with np.errstate(divide="ignore"):
                score = np.log(cand_p) + rng.gumbel(size=cand_p.shape)
            pick = np.argpartition(-score, k - 1)[:k]
            pick = pick[np.argsort(-score[pick], kind="stable")]
            cold_p = np.where(cold_live, self.priority(dev_td[s, cold]), np.inf)
            out = np.argpartition(cold_p, k - 1)[:k]
            out = np.sort(out) + self.cold_offset
            from_host = pick < self.host_capacity
            hrows, drows = pick[from_host], pick[~from_host] - self.host_capacity
            for buf, part in zip(items_up, self._gather(s, pick, self.host_capacity)):
                buf[s, :k] = part
            td_k = np.empty(k, np.float32)
            td_k[from_host], td_k[~from_host] = self.host_td[s, hrows], self.disk_td[s, drows]
            td_up[s, :k] = td_k
            host_q = self._host_seq(s, hrows)
            disk_q = self._disk_seq(s, drows)
            qs = np.empty(k, np.int64)
            qs[from_host], qs[~from_host] = host_q, disk_q
            uid_up[s, :k] = (qs & UID_MASK).astype(np.int32)
            rows[s, :k] = out
            up[s] = k
        items_tree = jax.tree.unflatten(self.treedef, items_up)
        new_replay = _apply_refresh_jit(replay, rows, items_tree, td_up, uid_up)
        self.syncs += 1
        self._clock(t0)
        metrics = {
            "replay_hit_rate": hit.astype(np.float32),
            "replay_items_down": down, "replay_items_up": up,
            "replay_bytes_moved": (down + up) * self.item_bytes,
            "replay_device_items": (dev_uid >= 0).sum(1),
            "replay_host_items": host_n, "replay_disk_items": disk_n, "replay_dropped": dropped,
        }
        return state.replace(replay=new_replay), metrics

    def _clock(self, t0: float) -> None:
        self.last_seconds = time.perf_counter() - t0
        self.seconds += self.last_seconds

    def timing(self) -> dict[str, float]:
        """Wall-clock seconds of the last sync and of all syncs of this process: not metrics
        (they differ from run to run), kept by the run directory in timing.jsonl."""
        return {"replay_move_seconds": self.last_seconds, "replay_move_seconds_total": self.seconds}

    def _host_seq(self, s: int, rows: np.ndarray) -> np.ndarray:
        """Sequence numbers of the items at host rows of seed s."""
        newest = self.seq[s] - 1
        return newest - ((newest - rows) % self.host_capacity)

    def _disk_seq(self, s: int, rows: np.ndarray) -> np.ndarray:
        newest = self.seq[s] - 1 - self.host_capacity  # the newest item on disk
        return newest - ((newest - rows) % max(self.disk_capacity, 1))

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, directory, iteration: int) -> str:
        """The levels as they are now, as `directory/<iteration>.npz` (+ disk segments); returns
        the level file's checksum (for the checkpoint to name)."""
        directory = safefs.make_dir(Path(directory))
        segments = safefs.make_dir(directory / "segments")
        manifest = []
        for start in range(0, self.disk_capacity, SEGMENT_ROWS):
            part = [np.ascontiguousarray(d[:, start:start + SEGMENT_ROWS]) for d in self.disk]
            digest = _digest(part)
            path = segments / f"{digest}.npz"
            if not os.path.lexists(path):
                _save_npz(path, {f"leaf{i}": x for i, x in enumerate(part)})
            manifest.append(digest)
        arrays = {f"host{i}": h for i, h in enumerate(self.host or [])}
        meta = {"syncs": self.syncs, "segments": manifest, "priority": self.priority_text,
                "host_capacity": self.host_capacity, "disk_capacity": self.disk_capacity, "allocated": self.fields is not None}
        arrays = {**arrays, "seq": self.seq, "host_td": self.host_td, "disk_td": self.disk_td,
                  "meta": np.array(json.dumps(meta))}
        _save_npz(directory / f"{iteration}.npz", arrays)
        return _level_digest(arrays)

    def prune(self, directory, keep: list[int]) -> None:
        """Remove saved levels (and segments) that no kept checkpoint iteration refers to, and
        temporary files a killed write left; only regular files of those names are removed."""
        directory = safefs.make_dir(Path(directory))
        used = set()
        for f in sorted(directory.iterdir()):
            if _LEFTOVER.fullmatch(f.name):
                safefs.remove_file(f)
            if not _LEVEL_FILE.fullmatch(f.name) or f.is_symlink():
                continue
            if int(f.stem) not in keep:
                safefs.remove_file(f)
                continue
            try:
                used.update(_load_npz(f, ("meta",))[1]["segments"])
            except (LevelsError, KeyError, TypeError):
                pass  # damaged: a resume reports it (and falls back); its segments may go
        segments = directory / "segments"
        if not segments.is_dir() or segments.is_symlink():
            return
        for f in sorted(segments.iterdir()):
            if _LEFTOVER.fullmatch(f.name) or (_SEGMENT_FILE.fullmatch(f.name) and f.name[:-4] not in used):
                safefs.remove_file(f)

    def restore(self, directory, iteration: int, like_state, digest: str | None = None) -> None:
        """The levels as saved at `iteration`; the level file's checksum (`digest`, as the
        checkpoint names it; None: a checkpoint from before level checksums) and every disk
        segment's are checked. `LevelsError` names a missing or damaged file."""
        path = Path(directory) / f"{iteration}.npz"
        if not os.path.lexists(path):
            raise LevelsError(f"{path}: the replay's host and disk levels saved with the checkpoint at iteration "
                              f"{iteration} are missing")
        arrays, meta = _load_npz(path, None)
        if digest is not None and _level_digest(arrays) != digest:
            raise LevelsError(f"{path}: its content does not match the checksum its checkpoint holds (the file was "
                              f"changed or damaged)")
        try:
            if (meta["host_capacity"], meta["disk_capacity"]) != (self.host_capacity, self.disk_capacity):
                raise LevelsError(f"{path}: saved with host/disk capacities {meta['host_capacity']}/"
                                  f"{meta['disk_capacity']}, the config asks for {self.host_capacity}/{self.disk_capacity}")
            shapes = {"seq": (self.seeds,), "host_td": (self.seeds, self.host_capacity),
                      "disk_td": (self.seeds, self.disk_capacity)}
            for k, shape in shapes.items():
                if arrays[k].shape != shape:
                    raise LevelsError(f"{path}: '{k}' is {list(arrays[k].shape)}, this run's is {list(shape)}")
            syncs, segments, allocated = int(meta["syncs"]), [str(x) for x in meta["segments"]], bool(meta["allocated"])
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, LevelsError):
                raise
            raise LevelsError(f"{path}: not a level file of this run ({type(e).__name__}: {e})") from None
        self.syncs = syncs
        self.seq, self.host_td, self.disk_td = (arrays["seq"].astype(np.int64), arrays["host_td"].astype(np.float32),
                                                arrays["disk_td"].astype(np.float32))
        if not allocated:
            return
        self._allocate(jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), like_state.replay.outbox["item"]))
        for i, h in enumerate(self.host):
            saved = arrays.get(f"host{i}")
            if saved is None or saved.shape != h.shape or saved.dtype != h.dtype:
                raise LevelsError(f"{path}: host level {i} is missing or shaped unlike this run's")
            h[...] = saved
        if len(segments) != len(range(0, self.disk_capacity, SEGMENT_ROWS)):
            raise LevelsError(f"{path}: names {len(segments)} disk segments, this run's disk level has "
                              f"{len(range(0, self.disk_capacity, SEGMENT_ROWS))}")
        for n, digest_n in enumerate(segments):
            seg = Path(directory) / "segments" / f"{digest_n}.npz"
            if not _SEGMENT_FILE.fullmatch(seg.name):
                raise LevelsError(f"{path}: names a segment {digest_n[:40]!r}, which is not a checksum")
            if not os.path.lexists(seg):
                raise LevelsError(f"{seg}: a disk segment of the replay saved at iteration {iteration} is missing")
            part_arrays, _ = _load_npz(seg, None, meta_key=None)
            part = [part_arrays.get(f"leaf{i}") for i in range(len(self.disk))]
            if any(x is None for x in part) or _digest(part) != digest_n:
                raise LevelsError(f"{seg}: its content does not match its checksum (the file was changed or damaged)")
            for d, x in zip(self.disk, part):
                d[:, n * SEGMENT_ROWS:n * SEGMENT_ROWS + x.shape[1]] = x


def _claim(disk_dir: Path):
    """Lock `disk_dir` for this run (made if missing, refused if it is or holds a link): a second
    run naming the same directory would overwrite the first one's disk level."""
    try:
        safefs.make_dir(disk_dir, parents=True)
    except safefs.UnsafePathError as e:
        raise ConfigError(f"agent.disk_dir: {disk_dir} {e.strerror}") from None
    links = safefs.find_links(disk_dir)
    if links:
        raise ConfigError(f"agent.disk_dir: {disk_dir} holds symbolic link(s) ({', '.join(map(str, links))}); the disk "
                          f"level is written only into files of its own: remove them")
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return None
    try:
        f = safefs.open_lock_file(disk_dir / ".lock")
    except safefs.UnsafePathError as e:
        raise ConfigError(f"agent.disk_dir: {disk_dir / '.lock'} {e.strerror}") from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip()[:20] or "unknown"
        f.close()
        raise ConfigError(f"agent.disk_dir: {disk_dir} holds the disk level of another running run (pid {holder}); "
                          f"give each run its own agent.disk_dir (or '' for its run directory's replay_disk/)") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _digest(parts: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for x in parts:
        h.update(str((x.shape, x.dtype.str)).encode())
        h.update(np.ascontiguousarray(x).reshape(-1).view(np.uint8))
    return h.hexdigest()[:32]


def _level_digest(arrays: dict) -> str:
    """The checksum of a level file's arrays (names, shapes, dtypes, bytes), in name order."""
    names = sorted(arrays)
    return _digest([np.asarray(names)] + [np.asarray(arrays[k]) for k in names])


def _save_npz(path: Path, arrays: dict) -> None:
    with safefs.atomic_file(path) as f:  # a fresh temporary file renamed into place, no link followed
        np.savez(f, **arrays)


MAX_LEVEL_MEMBERS = 4096


def _load_npz(path: Path, names, meta_key: str | None = "meta") -> tuple[dict, dict]:
    """The arrays of the level or segment file `path` (only `names` if given), read without
    following a link and without pickles, and its `meta` JSON; `LevelsError` if it is missing,
    a link, or not a readable .npz."""
    import zipfile

    try:
        with safefs.open_regular(path, "rb") as f, np.load(f, allow_pickle=False) as z:
            if len(z.files) > MAX_LEVEL_MEMBERS:
                raise LevelsError(f"{path}: holds {len(z.files)} arrays; not a level file")
            arrays = {k: z[k] for k in (z.files if names is None else names)}
            for k, v in arrays.items():
                if v.dtype.kind not in "biufU":
                    raise LevelsError(f"{path}: '{k}' holds {v.dtype} values; not a level file")
        meta = {} if meta_key is None else json.loads(str(arrays[meta_key]))
        if meta_key is not None and not isinstance(meta, dict):
            raise LevelsError(f"{path}: its meta is not a JSON object")
        return arrays, meta
    except LevelsError:
        raise
    except FileNotFoundError:
        raise LevelsError(f"{path}: missing") from None
    except (OSError, ValueError, KeyError, EOFError, RecursionError, zipfile.BadZipFile) as e:
        text = str(e).strip().splitlines()
        raise LevelsError(f"{path}: damaged or not a level file ({type(e).__name__}: "
                          f"{text[0][:160] if text else ''})") from None


_apply_refresh_jit = jax.jit(_apply_refresh, donate_argnums=0)
