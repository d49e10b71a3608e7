"""The hierarchical replay's prefetching sampler (`agent.hier_sampling: prefetch`): the sync against
a plain-Python model (items moved down once, write-backs carried, draws staged from the |TD|-ranked
tiers of the whole capacity with their probabilities), the draw distribution, exact resume and the
config's check of the staging area."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from hypothesis import given, settings
from hypothesis import strategies as st

import rmtjax
from rmtjax.replay import hier_options
from rmtjax.config import ConfigError
from rmtjax.replay.prefetch import NO_TIER, PrefetchLevels, PrefetchReplay, tier_counts
from tests.helpers import assert_same_run, cut_after_first_checkpoint

FRACTIONS, PROPORTIONS = (0.1, 0.2, 0.7), (0.3, 0.3, 0.4)
BATCH, UPDATES, OUTBOX, SEEDS = 8, 2, 16, 2
STAGE = UPDATES * BATCH
REPLAY = PrefetchReplay(STAGE, outbox=OUTBOX)


@struct.dataclass
class State:  # what `after_chunk` needs of an agent's state
    replay: object


@jax.jit
def chunk(replay, first, key):
    """OUTBOX adds (x = the item's insertion number) then UPDATES sample/write-backs; returns the
    replay and, per update, the ids drawn (x, from the items themselves) and the |TD| written."""

    def one(replay, key):
        k_td, key = jax.random.split(key)
        x = first + jnp.arange(OUTBOX, dtype=jnp.int32)
        replay = REPLAY.add(replay, {"x": x, "obs": jnp.stack([x, -x], 1).astype(jnp.float32)},
                            jax.random.exponential(k_td, (OUTBOX,)))
        drawn, written = [], []
        for _ in range(UPDATES):
            k_s, k_new, key = jax.random.split(key, 3)
            items, info = REPLAY.sample(replay, k_s, BATCH, 0.5)
            td = 3.0 * jax.random.exponential(k_new, (BATCH,))
            replay = REPLAY.update(replay, info, td)
            drawn.append(items["x"])
            written.append(td)
        return replay, jnp.stack(drawn), jnp.stack(written)

    return jax.vmap(one)(replay, jax.random.split(key, SEEDS))


def fresh():
    return jax.vmap(lambda _: REPLAY.init({"x": jnp.int32(0), "obs": jnp.zeros(2)}))(jnp.arange(SEEDS))


def held_items(levels, s):
    """{insertion number: |TD|} of seed s's host and disk items, and their order (host rows, disk rows)."""
    host_n, disk_n = levels.sizes()
    x_host = jax.tree.unflatten(levels.treedef, levels.host)["x"][s][:host_n[s]]
    x_disk = (jax.tree.unflatten(levels.treedef, levels.disk)["x"][s][:disk_n[s]] if levels.disk
              else np.zeros(0, np.int32))
    xs = np.concatenate([x_host, x_disk])
    tds = np.concatenate([levels.host_td[s, :host_n[s]], levels.disk_td[s, :disk_n[s]]])
    assert len(set(xs.tolist())) == len(xs), "an item held twice"
    return dict(zip(xs.tolist(), tds.tolist()))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), disk=st.sampled_from([0, 24]), warmup=st.sampled_from([0, 40]))
def test_a_sync_matches_a_reference_model(tmp_path_factory, seed, disk, warmup):
    host = 32
    levels = PrefetchLevels(seeds=SEEDS, host_capacity=host, disk_capacity=disk, stage=STAGE, batch_size=BATCH,
                            fractions=FRACTIONS, proportions=PROPORTIONS, warmup=warmup,
                            disk_dir=tmp_path_factory.mktemp("disk") if disk else None, seed=seed)
    state = State(fresh())
    reference = [dict() for _ in range(SEEDS)]  # insertion number -> last |TD| known
    key = jax.random.key(seed)
    staged_before = np.zeros(SEEDS, bool)
    for sync in range(7):
        key, k = jax.random.split(key)
        replay, drawn, written = chunk(state.replay, jnp.int32(sync * OUTBOX), k)
        outbox = jax.device_get(replay.outbox)
        state, metrics = levels.after_chunk(State(replay))
        after = jax.device_get(state.replay)
        total = (sync + 1) * OUTBOX
        for s in range(SEEDS):
            ref = reference[s]
            for x, td in zip(outbox["item"]["x"][s], outbox["td"][s]):
                ref[int(x)] = float(td)  # (a draw from the outbox already wrote its |TD| there)
            for x, td in zip(np.asarray(drawn[s]).reshape(-1), np.asarray(written[s]).reshape(-1)):
                ref[int(x)] = float(td)  # the write-backs in draw order: the last one wins
            # the hit rate of the chunk: its draws came from the staging area iff something was staged
            assert metrics["replay_hit_rate"][s] == (1.0 if staged_before[s] else 0.0)
            assert metrics["prefetch_fallback"][s] == (0 if staged_before[s] else UPDATES * BATCH)
            held = held_items(levels, s)
            assert sorted(held) == list(range(max(0, total - host - disk), total))
            for x, td in held.items():
                assert td == pytest.approx(ref[x]), x
            # the next chunk's draws
            n = len(held)
            staged = n >= max(warmup, BATCH)
            staged_before[s] = staged
            assert after.staged_count[s] == (STAGE if staged else 0)
            assert metrics["replay_items_up"][s] == (STAGE if staged else 0)
            assert after.cursor[s] == 0 and after.outbox_count[s] == 0 and not after.written[s].any()
            if not staged:
                continue
            caps = tier_counts(n, FRACTIONS)
            ranked = sorted(held, key=lambda x: -held[x])
            tier_of = {x: 0 if i < caps[0] else 1 if i < caps[0] + caps[1] else 2 for i, x in enumerate(ranked)}
            share = np.asarray(PROPORTIONS) * (np.asarray(caps) > 0)
            share /= share.sum()
            assert after.items_total[s] == n
            np.testing.assert_array_equal(after.tier_sizes[s], caps)
            for d in range(STAGE):
                u = int(after.staged_uid[s][d])
                assert u in held
                assert after.staged["x"][s][d] == u and after.staged["obs"][s][d][1] == -u
                assert after.staged_td[s][d] == pytest.approx(held[u])
                t = int(after.staged_tier[s][d])
                assert t == tier_of[u], (u, t, tier_of[u])
                assert after.staged_prob[s][d] == pytest.approx(share[t] / caps[t])
            for m in range(UPDATES):  # each minibatch splits across tiers as tiered.sample does
                tiers = after.staged_tier[s][m * BATCH:(m + 1) * BATCH]
                for t in range(3):
                    assert np.floor(BATCH * share[t]) <= (tiers == t).sum() <= np.ceil(BATCH * share[t])


def test_draws_follow_the_tiered_distribution_over_the_whole_capacity():
    """Held items with fixed |TD|: over many stagings each item is drawn in proportion to
    P(i) = share_t / n_t of its tier, whatever level it is in."""
    stage, batch, n = 64, 16, 200
    replay = PrefetchReplay(stage, outbox=n // 2)
    levels = PrefetchLevels(seeds=1, host_capacity=120, disk_capacity=80, stage=stage, batch_size=batch,
                            fractions=FRACTIONS, proportions=PROPORTIONS, warmup=0, seed=5)
    state = jax.vmap(lambda _: replay.init({"x": jnp.int32(0)}))(jnp.arange(1))
    x = jnp.arange(n, dtype=jnp.int32)
    td = jnp.asarray(np.random.default_rng(0).permutation(n), jnp.float32)  # distinct: item x ranks by td[x]
    for half in (slice(0, n // 2), slice(n // 2, n)):  # 200 items: 120 in host RAM, 80 on disk
        state = jax.vmap(lambda r: replay.add(r, {"x": x[half]}, td[half]))(state)
        state = levels.after_chunk(State(state))[0].replay
    counts = np.zeros(n)
    syncs = 400
    for _ in range(syncs):
        out, _ = levels.after_chunk(State(state))
        state = out.replay
        counts += np.bincount(np.asarray(state.staged["x"][0]), minlength=n)
    caps = tier_counts(n, FRACTIONS)  # 20 hot, 40 warm, 140 cold
    rank = np.argsort(np.argsort(-np.asarray(td)))
    tier = np.where(rank < caps[0], 0, np.where(rank < caps[0] + caps[1], 1, 2))
    expected = syncs * stage * np.asarray(PROPORTIONS)[tier] / np.asarray(caps)[tier]
    for t in range(3):  # exact per tier (systematic split), uniform within
        assert counts[tier == t].sum() == pytest.approx(syncs * stage * PROPORTIONS[t], abs=syncs)
        chi2 = (((counts - expected) ** 2) / expected)[tier == t].sum()
        assert chi2 < caps[t] + 5 * np.sqrt(2 * caps[t]), (t, chi2)  # df = caps[t] - 1, 5 standard deviations
    assert counts[:120].sum() > 0 and counts[120:].sum() > 0  # drawn from both levels


def small(**overrides):
    base = {"train.total_steps": 2400, "train.num_seeds": 2, "train.progress": False, "env.num_envs": 4,
            "agent.rollout_len": 2, "agent.updates_per_step": 0.25, "agent.torso": "mlp", "agent.hidden": [16], "agent.batch_size": 16,
            "agent.learning_starts": 200, "agent.replay": "hierarchical", "agent.hier_sampling": "prefetch",
            "agent.buffer_size": 800, "agent.device_fraction": 0.25, "agent.disk_fraction": 0.5,
            "agent.sync_every": 5, "agent.tier_fractions": [0.05, 0.15, 0.8], "train.num_chunks": 3,
            "train.checkpoint_every": 20}
    return rmtjax.make_config("rmt", "CartPole-v1", {**base, **overrides})


def test_a_killed_prefetching_run_resumes_exactly(tmp_path):
    cfg = small()
    ref = rmtjax.train(cfg, jax.random.key(4), run_dir=tmp_path / "ref")
    m = ref.metrics
    # 300 iterations, a sync every 5: 2 updates × 16 draws × 5 iterations staged each time
    assert np.all(m["replay_items_up"][:, -1] == 160)
    assert np.all(m["replay_host_items"][:, -1] == 400) and np.all(m["replay_disk_items"][:, -1] == 400)
    learning = m["loss"] != 0
    assert learning.any() and np.all(m["replay_hit_rate"][learning] == 1.0)  # every draw was staged
    assert np.all(m["prefetch_overrun"] == 0) and np.all(m["outbox_lost"] == 0)
    assert np.all(m["hot_share"][learning] > 0) and np.all(m["replay_size"][:, -1] == 800)
    steps = sorted(int(p.name) for p in (tmp_path / "ref" / "checkpoints").iterdir() if p.name.isdigit())
    assert len(steps) >= 2
    run = cut_after_first_checkpoint(tmp_path / "ref", tmp_path / "cut", steps)
    assert_same_run(ref, rmtjax.train(None, resume=run))


def test_the_staging_area_must_fit_the_device_level():
    assert hier_options.stage_size(small().agent, 2) == 160  # 5 iterations × 2 updates × 16
    with pytest.raises(ConfigError, match=r"prefetch stages agent.sync_every=10 .* 400 items; the device level .* is 200"):
        small(**{"agent.sync_every": 10})
    small(**{"agent.sync_every": 10, "agent.device_fraction": 0.5})
    # the device holds no tiers of its own, so a level too small to tier is fine
    small(**{"agent.tier_fractions": [0.001, 0.1, 0.899]})
    with pytest.raises(ConfigError, match="cannot be tiered"):
        small(**{"agent.tier_fractions": [0.001, 0.1, 0.899], "agent.hier_sampling": "cache", "agent.sync_every": 25})
    assert NO_TIER < 0
