import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmtjax.replay import tiered, top_share

EXAMPLE = {"obs": jnp.zeros((2,), jnp.uint8), "tag": jnp.float32(0)}
CAPACITY, FRACTIONS = 20, (0.1, 0.3, 0.6)  # tiers of 2, 6 and 12 rows: they overflow quickly
ADD_B, SAMPLE_B = 5, 4

_add = jax.jit(tiered.add)
_sample = jax.jit(tiered.sample, static_argnums=2)
_update = jax.jit(tiered.update)


def payload(tags):
    tags = np.asarray(tags)
    return {"obs": np.stack([tags % 256, (tags * 3) % 256], 1).astype(np.uint8), "tag": tags.astype(np.float32)}


def new_state(capacity=CAPACITY, fractions=FRACTIONS, **kw):
    return tiered.init(EXAMPLE, capacity, fractions, **kw)


class RefTiered:
    """Plain-Python model: each tier a list of slots holding (uid, |td|, tag) or None, a start and a count.

    Items are added one at a time (append, or overwrite the oldest and pass it on), which is the
    behaviour the batched implementation has to reproduce; thresholds come from the JAX state.
    """

    def __init__(self, caps):
        self.caps = caps
        self.slots = [[None] * c for c in caps]
        self.start, self.count = [0, 0, 0], [0, 0, 0]
        self.next_uid = 0

    @staticmethod
    def route(abs_td, thresholds):
        x, (hot, warm) = np.float32(abs_td), np.asarray(thresholds, np.float32)
        return 0 if x > hot else 1 if x > warm else 2

    def insert(self, t, items):
        evicted, c = [], self.caps[t]
        for item in items:
            if self.count[t] < c:
                self.slots[t][(self.start[t] + self.count[t]) % c] = item
                self.count[t] += 1
            else:
                evicted.append(self.slots[t][self.start[t]])
                self.slots[t][self.start[t]] = item
                self.start[t] = (self.start[t] + 1) % c
        return evicted

    def cascade(self, items, tiers):
        carried = []
        for t in range(3):
            carried = self.insert(t, carried + [it for it, tt in zip(items, tiers) if tt == t])

    def add(self, abs_td, tags, thresholds):
        items = [(self.next_uid + i, np.float32(x), tag) for i, (x, tag) in enumerate(zip(abs_td, tags))]
        self.next_uid += len(items)
        self.cascade(items, [self.route(x, thresholds) for x in abs_td])

    def remove(self, t, slots):
        c, s, k = self.caps[t], self.start[t], len(slots)
        head = [(s + j) % c for j in range(k)]
        fillers = [p for p in head if p not in slots]
        holes = [p for p in slots if (p - s) % c >= k]
        for f, h in zip(fillers, holes):
            self.slots[t][h] = self.slots[t][f]
        for p in head:
            self.slots[t][p] = None
        self.start[t], self.count[t] = (s + k) % c, self.count[t] - k

    def update(self, tier, slot, uid, valid, abs_td, thresholds):
        current = [
            bool(v) and self.slots[t][s] is not None and self.slots[t][s][0] == u
            for t, s, u, v in zip(tier, slot, uid, valid)
        ]
        where = list(zip(tier, slot))
        winners = [
            b for b in range(len(tier))
            if current[b] and not any(current[a] and where[a] == where[b] for a in range(b + 1, len(tier)))
        ]
        movers, new_tiers = [], []
        for b in winners:
            t, s = int(tier[b]), int(slot[b])
            uid_, _, tag = self.slots[t][s]
            new_t = self.route(abs_td[b], thresholds)
            if new_t == t:
                self.slots[t][s] = (uid_, np.float32(abs_td[b]), tag)
            else:
                movers.append((b, (uid_, np.float32(abs_td[b]), tag)))
                new_tiers.append(new_t)
        for t in range(3):
            self.remove(t, [int(slot[b]) for b, _ in movers if tier[b] == t])
        self.cascade([item for _, item in movers], new_tiers)

    def live(self, t):
        """Tier t's items, oldest first."""
        c = self.caps[t]
        return [self.slots[t][(self.start[t] + j) % c] for j in range(self.count[t])]


def assert_matches(state, ref):
    np.testing.assert_array_equal(np.asarray(state.start), ref.start)
    np.testing.assert_array_equal(np.asarray(state.count), ref.count)
    uid, td = np.asarray(state.uid), np.asarray(state.abs_td_error)
    tag, obs = np.asarray(state.data["tag"]), np.asarray(state.data["obs"])
    live_rows = set()
    for t, (c, off) in enumerate(zip(state.tier_capacity, state.tier_offset)):
        assert ref.count[t] <= c
        for j, (item_uid, item_td, item_tag) in enumerate(ref.live(t)):
            row = off + (ref.start[t] + j) % c
            live_rows.add(row)
            assert (uid[row], td[row], tag[row]) == (item_uid, item_td, item_tag)
            assert list(obs[row]) == [item_tag % 256, (item_tag * 3) % 256]
    dead = [r for r in range(state.capacity) if r not in live_rows]
    assert (uid[dead] == -1).all()


td_values = st.sampled_from([0.0, 0.25, -0.5, 1.0, -1.5, 2.0, 3.0, -4.0, 8.0, 16.0])
add_op = st.tuples(st.just("add"), st.lists(td_values, min_size=ADD_B, max_size=ADD_B))
update_op = st.tuples(
    st.sampled_from(["update", "stale_update"]),
    st.lists(td_values, min_size=SAMPLE_B, max_size=SAMPLE_B),
    st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.one_of(add_op, update_op), min_size=1, max_size=12),
    seed=st.integers(0, 2**31 - 1),
    lively=st.booleans(),
)
def test_tiered_matches_reference_model(ops, seed, lively):
    # "lively" thresholds (lower quantiles, fast steps) send more items to hot and move more of them
    state = new_state(quantiles=(0.7, 0.4), threshold_step=0.5) if lively else new_state()
    ref = RefTiered(tiered.tier_capacities(CAPACITY, FRACTIONS))
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
            # every valid draw is a live item of the reference, with its data and |td|
            for b in np.flatnonzero(np.asarray(info.valid)):
                t, s = int(info.tier[b]), int(info.slot[b])
                item = ref.slots[t][s]
                assert item is not None and (s - ref.start[t]) % ref.caps[t] < ref.count[t]
                assert (int(info.uid[b]), float(info.abs_td_error[b]), float(batch["tag"][b])) == item
            assert bool(info.valid.all()) == (sum(ref.count) > 0)
            if op[0] == "stale_update" and previous_info is not None:
                info, previous_info = previous_info, info
            else:
                previous_info = info
            tds = np.asarray(tds, np.float32)
            state = _update(state, info, tds)
            ref.update(
                np.asarray(info.tier), np.asarray(info.slot), np.asarray(info.uid), np.asarray(info.valid),
                np.abs(tds), state.thresholds,
            )
        assert_matches(state, ref)


def test_tier_capacities_follow_the_fractions_and_reject_empty_tiers():
    assert tiered.tier_capacities(1000) == (10, 100, 890)
    assert new_state(100, (0.01, 0.1, 0.89)).tier_capacity == (1, 10, 89)
    with pytest.raises(ValueError, match="at least 100"):
        tiered.tier_capacities(50)
    with pytest.raises(ValueError, match="sum to 1"):
        tiered.tier_capacities(1000, (0.1, 0.1, 0.1))
    with pytest.raises(ValueError, match="leading axis of 4"):
        tiered.add(new_state(), payload(np.arange(5)), np.ones(4, np.float32))


def test_first_batch_sets_thresholds_to_its_quantiles_and_routes_by_them():
    state = new_state(1000, (0.01, 0.1, 0.89))
    td = np.random.default_rng(0).permutation(np.arange(1, 201)).astype(np.float32)
    state = _add(state, payload(td.astype(int)), -td)  # the sign does not matter
    # inverse-CDF 0.99 and 0.89 quantiles of 1..200
    np.testing.assert_array_equal(np.asarray(state.thresholds), [198.0, 178.0])
    np.testing.assert_array_equal(np.asarray(state.count), [2, 20, 178])
    for t, (lo, hi) in enumerate([(198, 200), (178, 198), (0, 178)]):
        off = state.tier_offset[t]
        held = np.asarray(state.abs_td_error[off : off + int(state.count[t])])
        assert ((held > lo) & (held <= hi)).all()


def test_thresholds_move_by_the_step_towards_each_batch_quantile():
    state = new_state(1000, (0.01, 0.1, 0.89), threshold_step=0.25)
    state = _add(state, payload(np.arange(200)), np.arange(1, 201, dtype=np.float32))
    state = _add(state, payload(np.arange(200)), np.arange(1, 201, dtype=np.float32) * 2)
    np.testing.assert_allclose(np.asarray(state.thresholds), [198 + 0.25 * 198, 178 + 0.25 * 178])


def test_thresholds_track_quantiles_of_a_stream_and_follow_a_change_of_scale():
    state = new_state(2000, (0.01, 0.1, 0.89))

    def feed(state, xs):
        def body(s, x):
            return tiered.add(s, payload_jnp(x.shape[0]), x), s.thresholds

        return jax.lax.scan(body, state, xs)

    def payload_jnp(b):
        return {"obs": jnp.zeros((b, 2), jnp.uint8), "tag": jnp.zeros((b,), jnp.float32)}

    feed = jax.jit(feed)
    k1, k2 = jax.random.split(jax.random.key(0))
    state, _ = feed(state, jax.random.exponential(k1, (300, 256)))
    # exponential(1): the 0.99 and 0.89 quantiles are ln 100 and ln(1 / 0.11)
    np.testing.assert_allclose(np.asarray(state.thresholds), [np.log(100), np.log(1 / 0.11)], rtol=0.08)
    state, _ = feed(state, 10 * jax.random.exponential(k2, (300, 256)))
    np.testing.assert_allclose(np.asarray(state.thresholds), [10 * np.log(100), 10 * np.log(1 / 0.11)], rtol=0.08)
    # each tier receives about its share of the stream, so the tiers fill in step
    np.testing.assert_array_equal(np.asarray(state.count), state.tier_capacity)


def test_update_thresholds_weight_by_inverse_probability():
    # a batch that drew a hot item 3 times as often as its share: weights undo the skew
    state = new_state(quantiles=(0.95, 0.5), threshold_step=1.0).replace(seeded=jnp.array(True))
    info = tiered.SampleInfo(
        tier=jnp.zeros(4, jnp.int32), slot=jnp.zeros(4, jnp.int32), weight=jnp.ones(4), valid=jnp.ones(4, bool),
        uid=jnp.full(4, -1, jnp.int32), probability=jnp.array([0.3, 0.1, 0.1, 0.1]), abs_td_error=jnp.zeros(4),
    )
    state = _update(state, info, jnp.array([10.0, 1.0, 2.0, 3.0]))
    # weights 1, 3, 3, 3 (of 10): sorted values 1, 2, 3, 10 with cdf 0.3, 0.6, 0.9, 1.0
    np.testing.assert_array_equal(np.asarray(state.thresholds), [10.0, 2.0])
    assert int(state.count.sum()) == 0  # the uids did not match: nothing was written


def fixed_thresholds_state():
    """An empty buffer whose thresholds stay at (10, 5): hot above 10, warm above 5."""
    return new_state(threshold_step=1e-6).replace(thresholds=jnp.array([10.0, 5.0]), seeded=jnp.array(True))


def add_in_batches(state, td, first_tag=0):
    for i in range(0, len(td), ADD_B):
        tags = np.arange(first_tag + i, first_tag + i + ADD_B)
        state = _add(state, payload(tags), np.asarray(td[i : i + ADD_B], np.float32))
    return state


def filled_state():
    """Tiers of 2, 6, 12 rows holding 2, 4 and 9 items: uids 0, 1 hot, 2..5 warm, 6..14 cold."""
    state = add_in_batches(fixed_thresholds_state(), [20, 30, 6, 7, 8, 9, 1, 2, 3, 1, 2, 3, 4, 1, 2])
    np.testing.assert_array_equal(np.asarray(state.count), [2, 4, 9])
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
    # uniform within a tier: chi-square per tier (dof 1, 3, 8 at the 0.999 level)
    for t, limit in zip(range(3), [10.8, 16.3, 26.1]):
        slots = np.asarray(info.slot)[tier == t]
        observed = np.bincount(slots, minlength=state.tier_capacity[t])[: sizes[t]]
        expected = counts[t] / sizes[t]
        assert observed.sum() == counts[t]
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
    row = int(np.flatnonzero(np.asarray(state.uid) == uid)[0])
    tier = int(np.searchsorted(np.asarray(state.tier_offset), row, side="right") - 1)
    return tier, float(state.abs_td_error[row]), float(state.data["tag"][row])


def test_update_moves_items_to_the_tier_of_their_new_td_error():
    state = filled_state()
    _, info = _sample(state, jax.random.key(2), SAMPLE_B, np.array([0.25, 0.25, 0.5], np.float32), 1.0)
    assert list(np.asarray(info.tier)) == [0, 1, 2, 2]
    uids = np.asarray(info.uid)
    assert uids[2] != uids[3]
    tags = [find(state, u)[2] for u in uids]
    state = _update(state, info, jnp.array([0.5, 50.0, -7.0, 1.5]))
    moved = [find(state, u) for u in uids]
    assert moved == [(2, 0.5, tags[0]), (0, 50.0, tags[1]), (1, 7.0, tags[2]), (2, 1.5, tags[3])]
    np.testing.assert_array_equal(np.asarray(state.count), [2, 4, 9])  # one out and one in per tier
    assert sorted(np.asarray(state.uid)[np.asarray(tiered.live(state))]) == list(range(15))


def test_a_full_tier_demotes_its_oldest_items_down_the_tiers():
    state = filled_state()
    state = add_in_batches(state, [40, 50, 60, 1, 1], first_tag=15)
    # hot keeps the newest two (uids 16, 17); 0, 1 and 15 go down to warm, in age order
    assert [find(state, u)[0] for u in (16, 17)] == [0, 0]
    assert [find(state, u)[:2] for u in (0, 1, 15)] == [(1, 20.0), (1, 30.0), (1, 40.0)]
    # warm (6 rows) had 4 items and takes 3: its oldest (uid 2) goes to cold, which has room
    assert find(state, 2)[:2] == (2, 6.0)
    np.testing.assert_array_equal(np.asarray(state.count), [2, 6, 12])
    # cold is full now: uid 21 goes hot, pushing 16 to warm, which pushes its oldest (uid 3) to
    # cold; with the four new cold items that is five more, so cold drops its five oldest (6..10)
    state = add_in_batches(state, [1, 60, 2, 1, 1], first_tag=20)
    np.testing.assert_array_equal(np.asarray(state.count), [2, 6, 12])
    assert [find(state, u)[0] for u in (21, 16, 3)] == [0, 1, 2]
    held = set(np.asarray(state.uid)[np.asarray(tiered.live(state))])
    assert not set(range(6, 11)) & held and {3, 11, 20, 22, 23, 24} <= held


def test_duplicates_in_a_write_back_resolve_to_the_last_and_stale_entries_are_ignored():
    state = filled_state()
    _, info = _sample(state, jax.random.key(2), SAMPLE_B, np.array([0.25, 0.25, 0.5], np.float32), 1.0)
    cold_uid = int(info.uid[2])
    dup = jax.tree.map(lambda x: np.repeat(np.asarray(x)[2:3], SAMPLE_B, axis=0), info)
    state = _update(state, dup, jnp.array([50.0, 7.0, 0.5, 2.5]))
    assert find(state, cold_uid)[:2] == (2, 2.5)
    state2 = _update(state, dup, jnp.array([0.5, 0.5, 0.5, 50.0]))
    assert find(state2, cold_uid)[:2] == (0, 50.0)
    # the item has moved: the old location no longer holds it, so this write-back does nothing
    state3 = _update(state2, dup, jnp.array([0.1, 0.1, 0.1, 0.1]))
    assert find(state3, cold_uid)[:2] == (0, 50.0)
    np.testing.assert_array_equal(np.asarray(state3.abs_td_error), np.asarray(state2.abs_td_error))


def test_top_share_counts_draws_from_the_buffer_top_decile():
    state = add_in_batches(fixed_thresholds_state(), np.arange(1, 21))
    # all 20 items fit (hot keeps |td| 19 and 20, the rest cascade down): the top 10% is 19 and 20
    assert int(state.count.sum()) == 20
    _, info = _sample(state, jax.random.key(3), 1000, np.array([0.5, 0.3, 0.2], np.float32), 1.0)
    assert set(np.asarray(info.abs_td_error)[np.asarray(info.tier) == 0]) == {19.0, 20.0}
    # the agents' diagnostic (`rmtjax.replay.top_share`) with every live item as its pool
    pool = np.asarray(state.abs_td_error)[np.asarray(tiered.live(state))]
    assert float(top_share(pool, info.abs_td_error)) == 0.5  # the 500 draws from hot


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
    # XLA copies a whole buffer when an old version of it is read after a write; the moves are
    # written so that never happens. Checked on the compiled program of a learner-like loop.
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
