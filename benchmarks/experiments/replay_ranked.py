"""Replay cost per learner update: the ranked buffer (exact |TD| ranks over a FIFO ring, re-ranked
every `refresh_every` updates) against the tiered buffer and the uniform ring.

    python -m benchmarks replay_ranked [--capacities 10000 50000] [--seeds 1 8] [--refresh 1 8 32] \
        [--batch 128] [--add 8] [--updates 64] [--repeats 3]

One update = add `--add` new transitions (a CartPole-sized item: obs and next obs of 8 float32,
action, reward, done), sample `--batch`, write back |TD| for the batch, and for `ranked` a
`maybe_refresh` due every `refresh_every` updates (its clock unbatched, so under vmap the cond
stays a branch). The tiered buffer gets a random |TD| at `add` (the forward pass that would
compute it is not counted: the tiered buffer's real cost is higher). Buffers start full,
`--seeds` of them vmapped, `--updates` updates in one jitted scan; compile excluded, best of
`--repeats`. The ranked rows also give one refresh alone (top_k over the capacity), per refresh
in a scan of `--updates` of them.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from benchmarks.lib.tables import write_table
from rmtjax.replay import make_replay

EXAMPLE = {"obs": jnp.zeros((8,), jnp.float32), "next_obs": jnp.zeros((8,), jnp.float32),
           "action": jnp.int32(0), "reward": jnp.float32(0), "done": jnp.bool_(False)}


def items(key, n):
    k1, k2, k3 = jax.random.split(key, 3)
    obs = jax.random.normal(k1, (n, 8))
    return {"obs": obs, "next_obs": obs + 0.1, "action": jax.random.randint(k2, (n,), 0, 2),
            "reward": jax.random.normal(k3, (n,)), "done": jnp.zeros((n,), bool)}


def full_buffers(replay, capacity, seeds, chunk=1000):
    def fill(state, key):
        def body(state, k):
            new = items(k, chunk)
            return replay.add(state, new, jnp.abs(new["reward"])), None
        state, _ = jax.lax.scan(body, state, jax.random.split(key, capacity // chunk))
        if hasattr(replay, "refresh"):
            _, info = replay.sample(state, key, capacity, 0.0)  # score every item, then rank
            state = replay.refresh(replay.update(state, info, jax.random.uniform(key, (capacity,))))
        return state

    keys = jax.random.split(jax.random.key(1), seeds)
    return jax.jit(jax.vmap(lambda k: fill(replay.init(EXAMPLE), k)))(keys)


def run_updates(replay, refresh_every, batch, add, updates):
    def one(state, key, t):
        k_add, k_sample, k_td = jax.random.split(key, 3)
        new = items(k_add, add)
        state = replay.add(state, new, jnp.abs(new["reward"]))
        drawn, info = replay.sample(state, k_sample, batch, 0.4)
        td = jnp.abs(drawn["reward"] + jax.random.normal(k_td, (batch,)))
        state = replay.update(state, info, td)
        if refresh_every:
            state = replay.maybe_refresh(state, (t + 1) % refresh_every == 0)
        return state

    def loop(states, key):
        def body(states, t):
            keys = jax.random.split(jax.random.fold_in(key, t), jax.tree.leaves(states)[0].shape[0])
            return jax.vmap(one, in_axes=(0, 0, None))(states, keys, t), None
        return jax.lax.scan(body, states, jnp.arange(updates))[0]

    return jax.jit(loop)


def refresh_loop(replay, updates):
    """`updates` refreshes in a scan; each first writes one |TD|, so the top_k is not loop-invariant."""
    def body(states, t):
        states = states.replace(td=states.td.at[:, t].set(t.astype(jnp.float32)))
        return jax.vmap(replay.refresh)(states), None
    return jax.jit(lambda states: jax.lax.scan(body, states, jnp.arange(updates))[0])


def best_time(fn, *args, repeats):
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def add_arguments(p) -> None:
    p.add_argument("--capacities", type=int, nargs="+", default=[10_000, 50_000])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 8])
    p.add_argument("--refresh", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--add", type=int, default=8)
    p.add_argument("--updates", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="replay_ranked")


def run(args):
    rows = []
    for capacity in args.capacities:
        for seeds in args.seeds:
            variants = [("uniform", 0), ("tiered", 0)] + [("ranked", r) for r in args.refresh]
            for kind, refresh_every in variants:
                replay = make_replay(kind, capacity, refresh_every=max(refresh_every, 1))
                states = full_buffers(replay, capacity, seeds)
                loop = run_updates(replay, refresh_every, args.batch, args.add, args.updates)
                per_update = best_time(loop, states, jax.random.key(0), repeats=args.repeats) / args.updates
                alone = ""
                if kind == "ranked":
                    seconds = best_time(refresh_loop(replay, args.updates), states, repeats=args.repeats)
                    alone = f"{seconds / args.updates * 1e3:.3f}"
                label = kind if kind != "ranked" else f"ranked, refresh every {refresh_every}"
                rows.append([f"{capacity:,}", seeds, label, f"{per_update * 1e3:.3f}", alone])
                print(rows[-1], flush=True)
    notes = (f"One update: add {args.add}, sample {args.batch}, write back {args.batch} |TD| (and a due refresh), "
             f"buffers full, {args.updates} updates in one jitted scan, vmapped over the seeds; compile excluded, "
             f"best of {args.repeats}. The tiered buffer's |TD| at insertion is given (its forward pass is not "
             "counted). 'refresh alone': one re-rank of every seed's buffer (top_k over the capacity), timed in "
             "a scan of refreshes.")
    write_table("replay_ranked", args.name, "Replay cost per update: ranked vs tiered vs uniform",
                ["capacity", "seeds", "buffer", "ms per update (all seeds)", "refresh alone (ms)"], rows, notes)
