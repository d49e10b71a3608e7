"""The hierarchical replay: migration across device, host and disk against a plain-Python model,
the priority formula, exact resume with the host and disk levels, and the config's checks."""

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
from rmtjax.replay import tiered
from rmtjax.replay.hierarchical import HierarchicalReplay, Levels, priority_function
from tests.helpers import assert_same_run, cut_after_first_checkpoint

FRACTIONS, PROPORTIONS = (0.1, 0.2, 0.7), (0.3, 0.3, 0.4)
DEVICE, OUTBOX, BATCH, SEEDS = 40, 16, 8, 2  # device rows: hot 4, warm 8, cold 28
REPLAY = HierarchicalReplay(DEVICE, FRACTIONS, PROPORTIONS, outbox=OUTBOX)


@struct.dataclass
class State:  # what `after_chunk` needs of an agent's state
    replay: object


@jax.jit
def chunk(replay, first, key):
    """Two adds of BATCH items (x = the item's insertion number) and two sample/write-backs."""

    def one(replay, key):
        for i in range(OUTBOX // BATCH):
            k_td, k_s, k_new, key = jax.random.split(key, 4)
            x = first + i * BATCH + jnp.arange(BATCH, dtype=jnp.int32)
            replay = REPLAY.add(replay, {"x": x, "obs": jnp.stack([x, -x], 1).astype(jnp.float32)},
                                jax.random.exponential(k_td, (BATCH,)))
            _, info = REPLAY.sample(replay, k_s, BATCH, 0.5)
            replay = REPLAY.update(replay, info, 3.0 * jax.random.exponential(k_new, (BATCH,)))
        return replay

    return jax.vmap(one)(replay, jax.random.split(key, SEEDS))


def fresh():
    return jax.vmap(lambda _: REPLAY.init({"x": jnp.int32(0), "obs": jnp.zeros(2)}))(jnp.arange(SEEDS))


def lower_items(levels: Levels, s: int):
    """{insertion number: |TD|} of the items in seed s's host and disk levels."""
    host_n, disk_n = levels.sizes()
    out = {}
    x_host = jax.tree.unflatten(levels.treedef, levels.host)["x"][s]
    x_disk = jax.tree.unflatten(levels.treedef, levels.disk)["x"][s] if levels.disk else np.zeros(0, np.int32)
    for rows, xs, td in ((np.arange(host_n[s]), x_host, levels.host_td[s]), (np.arange(disk_n[s]), x_disk, levels.disk_td[s])):
        for r in rows:
            assert int(xs[r]) not in out, f"item {int(xs[r])} held twice"
            out[int(xs[r])] = float(td[r])
    return out


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), disk=st.sampled_from([0, 24]), refresh=st.sampled_from([0.0, 0.3, 1.0]),
       warmup=st.sampled_from([0, 40]))
def test_migration_matches_a_reference_model(tmp_path_factory, seed, disk, refresh, warmup):
    host = 32
    levels = Levels(seeds=SEEDS, host_capacity=host, disk_capacity=disk, cold_rows=(12, 28), refresh_share=refresh,
                    warmup=warmup, priority="|td| + 0.01", disk_dir=tmp_path_factory.mktemp("disk") if disk else None,
                    seed=seed)
    prio = priority_function("|td| + 0.01")
    state = State(fresh())
    reference = [dict() for _ in range(SEEDS)]  # insertion number -> last |TD| known, every item ever added
    key = jax.random.key(seed)
    for sync in range(9):
        key, k = jax.random.split(key)
        replay = chunk(state.replay, jnp.int32(sync * OUTBOX), k)
        dev = jax.device_get(replay.device)
        outbox = jax.device_get(replay.outbox)
        state, metrics = levels.after_chunk(State(replay))
        after = jax.device_get(state.replay.device)
        total = (sync + 1) * OUTBOX
        for s in range(SEEDS):
            ref = reference[s]
            for x, td in zip(outbox["item"]["x"][s], outbox["td"][s]):
                ref[int(x)] = float(td)
            live = dev.uid[s] >= 0
            for u, td in zip(dev.uid[s][live], dev.abs_td_error[s][live]):  # the device's write-backs carried down
                ref[int(u)] = float(td)
            # host and disk hold the newest host + disk items, each once, with their last priority
            held = lower_items(levels, s)
            assert sorted(held) == list(range(max(0, total - host - disk), total))
            for x, td in held.items():
                assert td == pytest.approx(ref[x]), x
            # the hit rate: the priority mass on the items the device held during the chunk
            resident = {int(u) for u in dev.uid[s][live]}
            mass = {x: float(prio(np.float32(td))) for x, td in held.items()}
            for u in resident - set(held):
                mass[u] = float(prio(np.float32(ref[u])))
            assert metrics["replay_hit_rate"][s] == pytest.approx(sum(mass[u] for u in resident) / sum(mass.values()),
                                                                  rel=1e-5)
            assert metrics["replay_items_down"][s] == OUTBOX
            # the refresh: only cold rows change, each to a lower-level item that was not on the device
            np.testing.assert_array_equal(after.count[s], dev.count[s])
            changed = np.flatnonzero(after.uid[s] != dev.uid[s])
            assert np.all((changed >= 12) & (changed < 40))
            k = int(metrics["replay_items_up"][s])
            assert len(changed) == k
            expect = 0 if len(held) < max(warmup, 1) else min(int(refresh * 28), int((dev.uid[s][12:] >= 0).sum()),
                                                          len(set(held) - resident))
            assert k == expect
            for r in changed:
                u = int(after.uid[s][r])
                assert u in held and u not in resident
                assert after.data["x"][s][r] == u and after.data["obs"][s][r][1] == -u
                assert after.abs_td_error[s][r] == pytest.approx(held[u])
            live_after = after.uid[s][after.uid[s] >= 0]
            assert len(set(live_after.tolist())) == len(live_after), "an item twice on the device"
            np.testing.assert_array_equal(after.data["x"][s][after.uid[s] >= 0], live_after)
        assert int(jax.device_get(state.replay.outbox_count).sum()) == 0


@pytest.mark.parametrize("text, td, expected", [
    ("|td|^0.6 + 0.01", [0.0, 1.0, 4.0], [0.01, 1.01, 4 ** 0.6 + 0.01]),
    ("sqrt(|td|) + 0.1", [0.0, 4.0], [0.1, 2.1]),
    ("max(td, 0.5) * 2", [0.1, 3.0], [1.0, 6.0]),
    ("log1p(td) + 1e-3", [0.0, np.e - 1], [1e-3, 1.001]),
])
def test_priority_formulas(text, td, expected):
    np.testing.assert_allclose(priority_function(text)(np.array(td)), expected, rtol=1e-6)


@pytest.mark.parametrize("text, says", [
    ("td", "above 0"),  # 0 at td = 0: such an item could never be drawn
    ("|td| - 1", "above 0"),
    ("1 / td", "finite"),
    ("__import__('os')", "not allowed"),
    ("td.real", "not allowed"),
    ("td +", "not a formula"),
])
def test_a_bad_priority_formula_is_a_config_error(text, says):
    with pytest.raises(ConfigError, match=says):
        priority_function(text)


def small(**overrides):
    base = {"train.total_steps": 2400, "train.num_seeds": 2, "train.progress": False, "env.num_envs": 4,
            "agent.rollout_len": 2, "agent.torso": "mlp", "agent.hidden": [16], "agent.batch_size": 16,
            "agent.learning_starts": 200, "agent.replay": "hierarchical", "agent.hier_sampling": "cache",
            "agent.buffer_size": 800,
            "agent.device_fraction": 0.25, "agent.disk_fraction": 0.5, "agent.sync_every": 25,
            "agent.tier_fractions": [0.05, 0.15, 0.8], "train.num_chunks": 3}
    return rmtjax.make_config("rmt", "CartPole-v1", {**base, **overrides})


def test_a_killed_hierarchical_run_resumes_exactly_with_host_and_disk_levels(tmp_path):
    cfg = small()
    ref = rmtjax.train(cfg, jax.random.key(3), run_dir=tmp_path / "ref")
    m = ref.metrics
    # 300 iterations in chunks of at most sync_every: 12 moves; 800 items: 400 on the host, 400 on disk
    assert np.all(m["replay_host_items"][:, -1] == 400) and np.all(m["replay_disk_items"][:, -1] == 400)
    assert np.all(m["replay_dropped"][:, -1] == 200)  # 2400 items a seed, capacity 800, 200 per move
    assert np.all((m["replay_hit_rate"] > 0) & (m["replay_hit_rate"] <= 1))
    assert np.all(m["replay_items_up"][:, -1] == 40)  # refresh_share 0.25 of the 160-row cold tier
    assert np.all(m["outbox_lost"] == 0)
    levels = sorted(p.name for p in (tmp_path / "ref" / "replay_levels").glob("*.npz"))
    steps = sorted(int(p.name) for p in (tmp_path / "ref" / "checkpoints").iterdir() if p.name.isdigit())
    assert set(levels) == {f"{s}.npz" for s in steps}  # the levels of every kept checkpoint, no others

    run = cut_after_first_checkpoint(tmp_path / "ref", tmp_path / "cut", steps)
    assert_same_run(ref, rmtjax.train(None, resume=run))

    # a damaged disk segment is found by its checksum
    broken = cut_after_first_checkpoint(tmp_path / "ref", tmp_path / "broken", steps)
    with np.load(broken / "replay_levels" / f"{steps[0]}.npz") as z:
        import json

        segment = json.loads(str(z["meta"]))["segments"][0]
    path = broken / "replay_levels" / "segments" / f"{segment}.npz"
    with np.load(path) as z:
        arrays = {k: z[k].copy() for k in z}
    arrays["leaf0"].flat[0] += 1
    np.savez(path, **arrays)
    from rmtjax.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=rf"{path.name}: its content does not match its checksum"):
        rmtjax.train(None, resume=broken)  # the only checkpoint: no earlier one to fall back to


def test_the_device_level_is_the_configured_share_and_the_rest_is_checked():
    cfg = small()
    agent_cfg = cfg.agent
    assert hier_options.capacities(agent_cfg) == (200, 400, 400)
    with pytest.raises(ConfigError, match="one function"):
        rmtjax.make_train(cfg)
    with pytest.raises(ConfigError, match="less than one iteration"):
        small(**{"agent.device_fraction": 0.005})
    with pytest.raises(ConfigError, match="sync_every"):
        small(**{"agent.disk_fraction": 0.9, "agent.sync_every": 100})
    with pytest.raises(ConfigError, match="agent.priority"):
        small(**{"agent.priority": "td"})
    with pytest.raises(ConfigError, match="never begin"):
        small(**{"agent.replay_warmup": 801})
    with pytest.raises(ConfigError, match="several devices"):
        small(**{"distributed.devices": 2})
    assert tiered.tier_capacities(200, (0.05, 0.15, 0.8)) == (10, 30, 160)


def test_a_host_level_that_cannot_fit_is_refused_before_compiling(monkeypatch):
    from rmtjax.limits import MemoryLimitError

    monkeypatch.setenv("RMTJAX_MEMORY_LIMIT", "2e8")
    cfg = small(**{"agent.buffer_size": 10_000_000, "agent.device_fraction": 0.01, "agent.disk_fraction": 0.0})
    with pytest.raises(MemoryLimitError, match=r"largest parts: replay host level [0-9.]+ GB.*agent.disk_fraction"):
        rmtjax.train(cfg, jax.random.key(0))
    from rmtjax.driver import Program

    Program(small()).preflight()  # the test's usual run fits
