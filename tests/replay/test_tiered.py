import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmtjax.replay import tiered

EXAMPLE = {"obs": jnp.zeros((2,), jnp.uint8), "tag": jnp.float32(0)}
# 22 slots in blocks of 4: six blocks, the last one half padding
CAPACITY, BLOCK, FRACTIONS = 22, 4, (0.1, 0.3, 0.6)
ADD_B, SAMPLE_B = 5, 4

_add = jax.jit(tiered.add)
_sample = jax.jit(tiered.sample, static_argnums=2)
_update = jax.jit(tiered.update)


def payload(tags):
    tags = np.asarray(tags)
    return {"obs": np.stack([tags % 256, (tags * 3) % 256], 1).astype(np.uint8), "tag": tags.astype(np.float32)}


def new_state(capacity=CAPACITY, fractions=FRACTIONS, block=BLOCK, **kw):
    return tiered.init(EXAMPLE, capacity, fractions, block=block, **kw)


class RefTiered:
    """Plain-Python model: a ring of slots holding [uid, |td|, tier, tag] or None, written one
    item at a time; the thresholds come from the JAX state."""

    def __init__(self, capacity):
        self.slots = [None] * capacity
        self.cursor, self.next_uid = 0, 0

    @staticmethod
    def route(abs_td, thresholds):
        x, (hot, warm) = np.float32(abs_td), np.asarray(thresholds, np.float32)
        return 0 if x > hot else 1 if x > warm else 2

    def add(self, abs_td, tags, thresholds):
        for x, tag in zip(abs_td, tags):
            self.slots[self.cursor] = [self.next_uid, np.float32(x), self.route(x, thresholds), tag]
            self.cursor = (self.cursor + 1) % len(self.slots)
            self.next_uid += 1

    def update(self, slot, uid, valid, abs_td, thresholds):
        for s, u, v, x in zip(slot, uid, valid, abs_td):
            item = self.slots[s]
            if v and item is not None and item[0] == u:
                item[1], item[2] = np.float32(x), self.route(x, thresholds)


def assert_matches(state, ref):
    uid, td = np.asarray(state.uid), np.asarray(state.abs_td_error)
    tier, tag = np.asarray(state.tier), np.asarray(state.data["tag"])
    for s, item in enumerate(ref.slots):
        if item is None:
            assert uid[s] == -1 and tier[s] == tiered.EMPTY
        else:
            assert (uid[s], td[s], tier[s], tag[s]) == tuple(item)
            assert list(np.asarray(state.data["obs"])[s]) == [item[3] % 256, (item[3] * 3) % 256]
    assert (tier[state.capacity:] == tiered.EMPTY).all()  # the padding of the last block
    counts = np.zeros((state.num_blocks, 3), int)
    for s, item in enumerate(ref.slots):
        if item is not None:
            counts[s // state.block, item[2]] += 1
    np.testing.assert_array_equal(np.asarray(state.block_count), counts)
    assert int(state.size) == sum(item is not None for item in ref.slots)


td_values = st.sampled_from([0.0, 0.25, -0.5, 1.0, -1.5, 2.0, 3.0, -4.0, 8.0, 16.0])
add_op = st.tuples(st.just("add"), st.lists(td_values, min_size=ADD_B, max_size=ADD_B))
update_op = st.tuples(
    st.sampled_from(["update", "stale_update"]),
    st.lists(td_values, min_size=SAMPLE_B, max_size=SAMPLE_B),
    st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.one_of(add_op, update_op), min_size=1, max_size=14),
    seed=st.integers(0, 2**31 - 1),
    lively=st.booleans(),
)
def test_tiered_matches_reference_model(ops, seed, lively):
    # "lively" thresholds (lower quantiles, fast steps) send more items to hot and move more of them
    state = new_state(threshold_step=0.5) if lively else new_state(fractions=(0.01, 0.1, 0.89))
    ref = RefTiered(CAPACITY)
    key, next_tag, previous_info = jax.random.key(seed), 1, None
    for op in ops:
        if op[0] == "add":
            tds = np.asarray(op[1], np.float32)
            tags = np.arange(next_tag, next_tag + ADD_B)
            next_tag += ADD_B
            state = _add(state, payload(tags), tds)
            ref.add(np.abs(tds), tags, state.thresholds)
        else:
            _, tds, weights = op
            proportions = np.asarray(weights, np.float32) + 1e-3
            proportions /= proportions.sum()
            key, k = jax.random.split(key)
            batch, info = _sample(state, k, SAMPLE_B, proportions, 0.6)
            # every valid draw is an item of the reference in the drawn tier, with its data and |td|
            for b in np.flatnonzero(np.asarray(info.valid)):
                item = ref.slots[int(info.slot[b])]
                assert item is not None and item[2] == int(info.tier[b])
                assert (int(info.uid[b]), float(info.abs_td_error[b]), float(batch["tag"][b])) == (
                    item[0], item[1], item[3])
            assert bool(info.valid.all()) == any(item is not None for item in ref.slots)
            if op[0] == "stale_update" and previous_info is not None:
                info, previous_info = previous_info, info
            else:
                previous_info = info
            tds = np.asarray(tds, np.float32)
            state = _update(state, info, tds)
            ref.update(np.asarray(info.slot), np.asarray(info.uid), np.asarray(info.valid), np.abs(tds),
                       state.thresholds)
        assert_matches(state, ref)


def test_init_checks_its_arguments_and_sizes_blocks_near_the_root_of_the_capacity():
    assert new_state(1000, (0.01, 0.1, 0.89), block=None).block == 32
    assert tiered.init(EXAMPLE, 50_000).block == 256 and tiered.init(EXAMPLE, 10).block == 16
    np.testing.assert_allclose(np.asarray(new_state(fractions=(0.01, 0.1, 0.89)).quantiles), [0.99, 0.89])
    with pytest.raises(ValueError, match="sum to 1"):
        new_state(1000, (0.1, 0.1, 0.1))
    with pytest.raises(ValueError, match="three positive"):
        new_state(1000, (0.0, 0.1, 0.9))
    with pytest.raises(ValueError, match="leading axis of 4"):
        tiered.add(new_state(), payload(np.arange(5)), np.ones(4, np.float32))
    with pytest.raises(ValueError, match="does not fit"):
        tiered.add(new_state(), payload(np.arange(30)), np.ones(30, np.float32))


def test_first_batch_sets_thresholds_to_its_quantiles_and_routes_by_them():
    state = new_state(1000, (0.01, 0.1, 0.89), block=None)
    td = np.random.default_rng(0).permutation(np.arange(1, 201)).astype(np.float32)
    state = _add(state, payload(td.astype(int)), -td)  # the sign does not matter
    # inverse-CDF 0.99 and 0.89 quantiles of 1..200
    np.testing.assert_array_equal(np.asarray(state.thresholds), [198.0, 178.0])
    np.testing.assert_array_equal(np.asarray(tiered.tier_sizes(state)), [2, 20, 178])
    held, tier = np.asarray(state.abs_td_error)[:200], np.asarray(state.tier)[:200]
    for t, (lo, hi) in enumerate([(198, 200), (178, 198), (0, 178)]):
        assert ((held[tier == t] > lo) & (held[tier == t] <= hi)).all()


def test_thresholds_move_by_the_step_towards_each_batch_quantile():
    state = new_state(1000, (0.01, 0.1, 0.89), threshold_step=0.25)
    state = _add(state, payload(np.arange(200)), np.arange(1, 201, dtype=np.float32))
    state = _add(state, payload(np.arange(200)), np.arange(1, 201, dtype=np.float32) * 2)
    np.testing.assert_allclose(np.asarray(state.thresholds), [198 + 0.25 * 198, 178 + 0.25 * 178])


def test_thresholds_track_quantiles_of_a_stream_and_the_tiers_hold_their_shares():
    state = new_state(2000, (0.01, 0.1, 0.89), block=None)

    def payload_jnp(b):
        return {"obs": jnp.zeros((b, 2), jnp.uint8), "tag": jnp.zeros((b,), jnp.float32)}

    @jax.jit
    def feed(state, xs):
        return jax.lax.scan(lambda s, x: (tiered.add(s, payload_jnp(x.shape[0]), x), None), state, xs)[0]

    k1, k2 = jax.random.split(jax.random.key(0))
    state = feed(state, jax.random.exponential(k1, (300, 256)))
    # exponential(1): the 0.99 and 0.89 quantiles are ln 100 and ln(1 / 0.11)
    np.testing.assert_allclose(np.asarray(state.thresholds), [np.log(100), np.log(1 / 0.11)], rtol=0.08)
    state = feed(state, 10 * jax.random.exponential(k2, (300, 256)))
    np.testing.assert_allclose(np.asarray(state.thresholds), [10 * np.log(100), 10 * np.log(1 / 0.11)], rtol=0.08)
    np.testing.assert_allclose(np.asarray(tiered.tier_sizes(state)) / 2000, [0.01, 0.10, 0.89], atol=0.01)


def test_update_thresholds_weight_by_inverse_probability():
    # a batch that drew a hot item 3 times as often as its share: weights undo the skew
    state = new_state(fractions=(0.05, 0.45, 0.5), threshold_step=1.0).replace(seeded=jnp.array(True))
    state = _add(state, payload(np.arange(4)), np.zeros(4, np.float32)).replace(thresholds=jnp.zeros(2))
    _, info = _sample(state, jax.random.key(0), 4, np.array([0.0, 0.0, 1.0], np.float32), 1.0)
    info = info.replace(probability=jnp.array([0.3, 0.1, 0.1, 0.1]))
    state = _update(state, info, jnp.array([10.0, 1.0, 2.0, 3.0]))
    # weights 1, 3, 3, 3 (of 10): sorted values 1, 2, 3, 10 with cdf 0.3, 0.6, 0.9, 1.0
    np.testing.assert_array_equal(np.asarray(state.thresholds), [10.0, 2.0])
    # stale draws (their uid no longer there) neither write nor move the thresholds
    stale = info.replace(uid=info.uid + 100)
    same = _update(state, stale, jnp.array([50.0, 50.0, 50.0, 50.0]))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(same)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def fixed_thresholds_state():
    """An empty buffer whose thresholds stay at (10, 5): hot above 10, warm above 5."""
    return new_state(threshold_step=1e-6).replace(thresholds=jnp.array([10.0, 5.0]), seeded=jnp.array(True))


def add_in_batches(state, td, first_tag=0):
    for i in range(0, len(td), ADD_B):
        tags = np.arange(first_tag + i, first_tag + i + ADD_B)
        state = _add(state, payload(tags), np.asarray(td[i : i + ADD_B], np.float32))
    return state


def filled_state():
    """15 items spread over four blocks: uids 0, 1 hot, 2..5 warm, 6..14 cold."""
    state = add_in_batches(fixed_thresholds_state(), [20, 30, 6, 7, 8, 9, 1, 2, 3, 1, 2, 3, 4, 1, 2])
    np.testing.assert_array_equal(np.asarray(tiered.tier_sizes(state)), [2, 4, 9])
    return state


def test_sample_splits_the_batch_by_proportion_and_weights_match_the_formula():
    state = filled_state()
    proportions, beta, n = np.array([0.5, 0.3, 0.2], np.float32), 0.4, 1000
    batch, info = _sample(state, jax.random.key(1), n, proportions, beta)
    tier = np.asarray(info.tier)
    counts = np.bincount(tier, minlength=3)
    assert all(abs(counts[t] - n * proportions[t]) <= 1 for t in range(3))  # systematic split
    sizes = np.array([2, 4, 9])
    p = proportions[tier] / sizes[tier]
    np.testing.assert_allclose(np.asarray(info.probability), p, rtol=1e-6)
    raw = (15 * p) ** -beta
    np.testing.assert_allclose(np.asarray(info.weight), raw / raw.max(), rtol=1e-5)
    # every draw is an item of its tier, and uniform within it: chi-square (dof 1, 3, 8 at the 0.999 level)
    labels = np.asarray(state.tier)
    slots = np.asarray(info.slot)
    assert (labels[slots] == tier).all() and (np.asarray(batch["tag"]) == slots).all()
    for t, limit in zip(range(3), [10.8, 16.3, 26.1]):
        members = np.flatnonzero(labels[:CAPACITY] == t)
        observed = np.array([(slots[tier == t] == m).sum() for m in members])
        expected = counts[t] / sizes[t]
        assert observed.sum() == counts[t] and len(members) == sizes[t]
        assert ((observed - expected) ** 2 / expected).sum() < limit


def test_empty_tier_share_falls_back_to_the_other_tiers():
    state = add_in_batches(fixed_thresholds_state(), [6, 7, 1, 2, 3])  # hot empty
    _, info = _sample(state, jax.random.key(0), 1000, np.array([0.6, 0.1, 0.3], np.float32), 1.0)
    assert (np.bincount(np.asarray(info.tier), minlength=3) == [0, 250, 750]).all()
    expected = np.where(np.asarray(info.tier) == 1, 0.25 / 2, 0.75 / 3)
    np.testing.assert_allclose(np.asarray(info.probability), expected)
    # only the empty tier has a share: draw uniformly over all items
    _, info = _sample(state, jax.random.key(0), 1000, np.array([1.0, 0.0, 0.0], np.float32), 1.0)
    assert (np.bincount(np.asarray(info.tier), minlength=3) == [0, 400, 600]).all()
    np.testing.assert_allclose(np.asarray(info.weight), 1.0)
    # nothing stored: all invalid
    _, info = _sample(new_state(), jax.random.key(0), 1000, np.array([0.2, 0.3, 0.5], np.float32), 1.0)
    assert not bool(info.valid.any()) and float(info.weight.max()) == 0.0


def find(state, uid):
    """(tier, |td|, tag, slot) of the item with this uid."""
    slot = int(np.flatnonzero(np.asarray(state.uid) == uid)[0])
    return int(state.tier[slot]), float(state.abs_td_error[slot]), float(state.data["tag"][slot]), slot


def test_update_moves_items_to_the_tier_of_their_new_td_error_and_leaves_them_in_place():
    state = filled_state()
    _, info = _sample(state, jax.random.key(2), SAMPLE_B, np.array([0.25, 0.25, 0.5], np.float32), 1.0)
    assert list(np.asarray(info.tier)) == [0, 1, 2, 2]
    uids = np.asarray(info.uid)
    assert uids[2] != uids[3]
    before = [find(state, u) for u in uids]
    state = _update(state, info, jnp.array([0.5, 50.0, -7.0, 1.5]))
    moved = [find(state, u) for u in uids]
    assert [m[:2] for m in moved] == [(2, 0.5), (0, 50.0), (1, 7.0), (2, 1.5)]
    assert [m[2:] for m in moved] == [b[2:] for b in before]  # same data, same slot
    np.testing.assert_array_equal(np.asarray(tiered.tier_sizes(state)), [2, 4, 9])  # one out and one in per tier


def test_the_oldest_items_are_overwritten_whatever_their_tier():
    state = filled_state()  # 15 of 22 slots: 7 free
    state = add_in_batches(state, [40, 50, 60, 1, 1, 1, 1, 1, 1, 1], first_tag=15)
    # 25 items in 22 slots: the three oldest (uids 0, 1 hot and 2 warm) are gone
    held = set(np.asarray(state.uid)[np.asarray(tiered.live(state))])
    assert held == set(range(3, 25))
    np.testing.assert_array_equal(np.asarray(tiered.tier_sizes(state)), [3, 3, 16])
    assert int(state.size) == CAPACITY and int(state.cursor) == 3


def test_a_write_back_to_an_overwritten_slot_is_ignored():
    state = filled_state()
    _, info = _sample(state, jax.random.key(2), SAMPLE_B, np.array([0.25, 0.25, 0.5], np.float32), 1.0)
    state = add_in_batches(state, np.ones(10), first_tag=15)  # overwrites slots 15..21 and 0..2
    overwritten = np.asarray(info.slot) < 3
    after = _update(state, info, jnp.full((SAMPLE_B,), 50.0))
    tier = np.asarray(after.tier)[np.asarray(info.slot)]
    np.testing.assert_array_equal(tier == 0, ~overwritten)


def test_vmapped_over_seeds_matches_one_seed_at_a_time():
    states = jax.tree.map(lambda x: jnp.stack([x, x]), new_state())
    td = np.array([[1, 2, 3, 8, 16], [0.5, 4, 4, 2, 1]], np.float32)
    batch = jax.tree.map(lambda x: np.stack([x, x + 1]), payload(np.arange(5)))
    keys = jax.random.split(jax.random.key(0))
    sample_v = jax.jit(jax.vmap(lambda s, k: tiered.sample(s, k, SAMPLE_B, jnp.array([0.2, 0.3, 0.5]), 0.5)))
    states = jax.jit(jax.vmap(tiered.add))(states, batch, td)
    drawn, infos = sample_v(states, keys)
    states = jax.jit(jax.vmap(tiered.update))(states, infos, jnp.array([[9.0, 0, 0, 0], [0, 9.0, 0, 0]]))
    for i in range(2):
        one = _add(new_state(), jax.tree.map(lambda x: x[i], batch), td[i])
        d, inf = _sample(one, keys[i], SAMPLE_B, jnp.array([0.2, 0.3, 0.5]), 0.5)
        one = _update(one, inf, jnp.array([[9.0, 0, 0, 0], [0, 9.0, 0, 0]])[i])
        for a, b in zip(jax.tree.leaves((states, drawn, infos)), jax.tree.leaves((one, d, inf))):
            np.testing.assert_array_equal(np.asarray(a[i]), np.asarray(b))


def test_a_training_step_updates_the_buffers_in_place():
    # XLA copies a whole buffer when an old version of it is read after a write; checked on the
    # compiled program of a learner-like loop
    capacity, b = 1009, 8
    example = {"obs": jnp.zeros((3,), jnp.float32)}

    def step(state, key):
        k1, k2, k3 = jax.random.split(key, 3)
        state = tiered.add(state, {"obs": jax.random.normal(k1, (b, 3))}, jax.random.normal(k2, (b,)))
        batch, info = tiered.sample(state, k3, b, jnp.array([0.2, 0.3, 0.5]), 0.5)
        td = batch["obs"].sum(1) * info.weight  # the learner consumes the batch before the write-back
        return tiered.update(state, info, td), td.mean()

    run = jax.jit(lambda s, k: jax.lax.scan(step, s, jax.random.split(k, 2)), donate_argnums=0)
    hlo = run.lower(tiered.init(example, capacity), jax.random.key(0)).compile().as_text()
    copies = [line for line in hlo.splitlines() if " copy(" in line and f"[{capacity}" in line]
    assert copies == []
