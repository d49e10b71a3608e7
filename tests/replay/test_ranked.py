import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmtjax.replay import make_replay, ranked

EXAMPLE = {"obs": jnp.zeros((2,), jnp.uint8), "tag": jnp.float32(0)}
CAPACITY, FRACTIONS = 13, (0.1, 0.2, 0.7)  # not a multiple of any batch; K = 1 + 3 + 2 = 6
SAMPLE_B = 8

# one compile per shape, shared by every example
_add = jax.jit(ranked.add)
_refresh = jax.jit(ranked.refresh)
_sample = jax.jit(ranked.sample, static_argnums=2)
_update = jax.jit(ranked.update)


def payload(tags):
    tags = np.asarray(tags)
    return {"obs": np.stack([tags % 256, (tags * 3) % 256], 1).astype(np.uint8), "tag": tags.astype(np.float32)}


def new_state(capacity=CAPACITY, fractions=FRACTIONS):
    return ranked.init(EXAMPLE, capacity, fractions)


def ref_tier_sizes(size, hot, warm):
    if size == 0:
        return 0, 0
    n_hot = min(max(1, math.floor(hot * size + 0.5)), size - 1)
    return n_hot, min(max(1, math.floor(warm * size + 0.5)), size - 1 - n_hot)


class RefRanked:
    """Plain-Python model: a FIFO of (tag, |td|) slots and the tiers of the last refresh."""

    def __init__(self, capacity, fractions):
        self.tags, self.td = [None] * capacity, [-math.inf] * capacity
        self.cursor = self.size = 0
        self.fractions = fractions
        self.top, self.n_hot, self.n_warm = [], 0, 0

    def add(self, tags):
        for tag in tags:
            self.tags[self.cursor], self.td[self.cursor] = tag, math.inf
            self.cursor = (self.cursor + 1) % len(self.tags)
            self.size = min(self.size + 1, len(self.tags))

    def refresh(self):
        self.n_hot, self.n_warm = ref_tier_sizes(self.size, *self.fractions[:2])
        # descending |td|, ties to the lower slot
        order = sorted(range(self.size), key=lambda s: (-self.td[s], s))
        self.top = order[: self.n_hot + self.n_warm]

    def update(self, slots, tds, mask):
        for s, x, m in zip(slots, tds, mask):
            if m:
                self.td[s] = float(np.float32(abs(x))) if math.isfinite(x) else 0.0

    def tiers(self):
        """Slots of hot, warm, cold."""
        hot, warm = self.top[: self.n_hot], self.top[self.n_hot :]
        return hot, warm, [s for s in range(self.size) if s not in self.top]


def effective_shares(proportions, counts):
    share = np.asarray(proportions, np.float64) * (np.asarray(counts) > 0)
    return share / share.sum() if share.sum() > 0 else np.asarray(counts) / max(sum(counts), 1)


def assert_matches(state, ref):
    assert int(state.cursor) == ref.cursor and int(state.size) == ref.size
    np.testing.assert_array_equal(np.asarray(state.td), np.asarray(ref.td, np.float32))
    tag, obs = np.asarray(state.data["tag"]), np.asarray(state.data["obs"])
    for s, t in enumerate(ref.tags):
        if t is not None:
            assert tag[s] == t and list(obs[s]) == [t % 256, (t * 3) % 256]
    assert (int(state.n_hot), int(state.n_warm)) == (ref.n_hot, ref.n_warm)
    n_top = ref.n_hot + ref.n_warm
    np.testing.assert_array_equal(np.asarray(state.top[:n_top]), ref.top)
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(state.in_top)), sorted(ref.top))


def check_draw(batch, info, ref, proportions, beta):
    hot, warm, cold = ref.tiers()
    counts = [len(hot), len(warm), len(cold)]
    valid = np.asarray(info.valid)
    assert valid.all() == (ref.size > 0) and valid.any() == (ref.size > 0)
    if ref.size == 0:
        assert (np.asarray(info.weight) == 0).all()
        return
    share = effective_shares(proportions, counts)
    tier, slot = np.asarray(info.tier), np.asarray(info.slot)
    drawn = np.bincount(tier, minlength=3)
    # systematic split: floor or ceil of B * share per tier
    assert (np.abs(drawn - SAMPLE_B * share) < 1).all() and drawn.sum() == SAMPLE_B
    for b in range(SAMPLE_B):
        assert slot[b] in (hot, warm, cold)[tier[b]]
        assert float(batch["tag"][b]) == ref.tags[slot[b]] and float(info.td[b]) == np.float32(ref.td[slot[b]])
    raw = (ref.size * share[tier] / np.asarray(counts)[tier]) ** -beta
    np.testing.assert_allclose(np.asarray(info.weight), raw / raw.max(), rtol=1e-5)


td_values = st.sampled_from([0.0, 0.25, -0.5, 1.0, 1.0, 2.0, -3.0, 8.0, math.inf, math.nan])
add_op = st.tuples(st.just("add"), st.sampled_from([1, 3, 5]))
update_op = st.tuples(
    st.just("update"),
    st.lists(td_values, min_size=CAPACITY, max_size=CAPACITY),  # per slot: duplicates write one value
    st.lists(st.booleans(), min_size=SAMPLE_B, max_size=SAMPLE_B),
    st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
)
refresh_op = st.tuples(st.just("refresh"))


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.one_of(add_op, update_op, refresh_op), min_size=1, max_size=14),
       seed=st.integers(0, 2**31 - 1), beta=st.sampled_from([0.0, 0.4, 1.0]))
def test_ranked_matches_reference_model(ops, seed, beta):
    state, ref = new_state(), RefRanked(CAPACITY, FRACTIONS)
    key, next_tag = jax.random.key(seed), 1
    for op in ops:
        if op[0] == "add":
            tags = list(range(next_tag, next_tag + op[1]))
            next_tag += op[1]
            state = _add(state, payload(tags))
            ref.add(tags)
        elif op[0] == "refresh":
            state = _refresh(state)
            ref.refresh()
        else:
            _, tds, keep, weights = op
            proportions = np.asarray(weights, np.float32)
            if proportions.sum() == 0:
                proportions[2] = 1.0
            key, k = jax.random.split(key)
            batch, info = _sample(state, k, SAMPLE_B, proportions, beta)
            check_draw(batch, info, ref, proportions / proportions.sum(), beta)
            row_td = np.asarray(tds, np.float32)[np.asarray(info.slot)]
            state = _update(state, info, row_td, np.asarray(keep))
            ref.update(np.asarray(info.slot), row_td, np.asarray(keep) & np.asarray(info.valid))
        assert_matches(state, ref)


def test_tier_sizes_leave_one_item_cold_and_k_covers_them():
    for size, expected in [(0, (0, 0)), (1, (0, 0)), (2, (1, 0)), (3, (1, 1)), (100, (1, 10)), (1000, (10, 100)),
                           (10_000, (100, 1000))]:
        got = tuple(int(x) for x in ranked.tier_sizes(jnp.int32(size), (0.01, 0.1)))
        assert got == expected == ref_tier_sizes(size, 0.01, 0.1)
    assert ranked.top_width(10_000, (0.01, 0.1, 0.89)) == 1102
    assert ranked.top_width(2, (0.01, 0.1, 0.89)) == 2
    with pytest.raises(ValueError, match="sum to 1"):
        ranked.top_width(100, (0.1, 0.1, 0.1))
    with pytest.raises(ValueError, match="positive"):
        ranked.init(EXAMPLE, 100, (0.0, 0.1, 0.9))
    with pytest.raises(ValueError, match="capacity 13"):
        ranked.add(new_state(), payload(np.arange(14)))
    with pytest.raises(ValueError, match="refresh_every"):
        make_replay("ranked", 100, refresh_every=0)


def test_cold_draws_are_exactly_uniform_over_the_live_items_outside_the_top():
    # capacity 40, 30 live: hot 3, warm 6, scattered over the ring by their |TD|
    state = _add(ranked.init(EXAMPLE, 40, (0.1, 0.2, 0.7)), payload(np.arange(30)))
    td = np.random.default_rng(1).permutation(30).astype(np.float32)
    info = ranked.RankedInfo(slot=jnp.arange(30), weight=jnp.ones(30), tier=jnp.zeros(30, jnp.int32),
                             td=jnp.zeros(30), valid=jnp.ones(30, bool))
    state = _refresh(ranked.update(state, info, td))
    top = set(np.argsort(-td)[:9].tolist())
    assert set(np.flatnonzero(np.asarray(state.in_top)).tolist()) == top
    cold = sorted(set(range(30)) - top)
    # a later add grows the live range: the new slots are cold until the next refresh
    state = _add(state, payload(np.arange(30, 33)))
    cold += [30, 31, 32]
    _, draw = jax.jit(ranked.sample, static_argnums=2)(state, jax.random.key(0), 4800, jnp.array([0.0, 0.0, 1.0]), 0.0)
    counts = np.bincount(np.asarray(draw.slot), minlength=40)
    assert set(np.flatnonzero(counts).tolist()) == set(cold)
    expected = 4800 / len(cold)
    # chi-square, 23 dof: 49.7 is the 0.999 quantile
    assert ((counts[cold] - expected) ** 2 / expected).sum() < 49.7
    # hot and warm: their own slots only, the three highest |TD| and the next six
    _, draw = ranked.sample(state, jax.random.key(1), 600, jnp.array([0.5, 0.5, 0.0]), 0.0)
    tier, slot = np.asarray(draw.tier), np.asarray(draw.slot)
    assert set(slot[tier == 0].tolist()) == set(np.argsort(-td)[:3].tolist())
    assert set(slot[tier == 1].tolist()) == set(np.argsort(-td)[3:9].tolist())


def test_fresh_items_rank_hot_and_tiny_buffers_draw_uniformly():
    state = new_state()
    batch, info = _sample(state, jax.random.key(0), SAMPLE_B, jnp.array([0.25, 0.35, 0.4]), 0.5)
    assert not bool(info.valid.any()) and float(info.weight.sum()) == 0.0
    state = _refresh(_add(state, payload([7])))  # size 1: everything cold
    assert (int(state.n_hot), int(state.n_warm)) == (0, 0)
    _, info = _sample(state, jax.random.key(0), SAMPLE_B, jnp.array([0.25, 0.35, 0.4]), 0.5)
    assert (np.asarray(info.tier) == 2).all() and (np.asarray(info.slot) == 0).all()
    np.testing.assert_array_equal(np.asarray(info.weight), 1.0)
    # size 2: the scored item is cold, the fresh one hot
    state = _update(state, info, jnp.full((SAMPLE_B,), 5.0))
    state = _refresh(_add(state, payload([8])))
    assert (int(state.n_hot), int(state.n_warm)) == (1, 0) and int(state.top[0]) == 1
    _, info = _sample(state, jax.random.key(0), SAMPLE_B, jnp.array([0.25, 0.35, 0.4]), 1.0)
    # warm is empty: its share goes to hot and cold in proportion, 0.25 : 0.4 of 8 rows -> 3 : 5
    np.testing.assert_array_equal(np.bincount(np.asarray(info.tier), minlength=3), [3, 0, 5])
    assert set(np.asarray(info.slot)[np.asarray(info.tier) == 0].tolist()) == {1}
    stats = make_replay("ranked", CAPACITY, FRACTIONS).buffer_stats(state)
    assert {k: float(v) for k, v in stats.items()} == {
        "replay_size": 2, "hot_size": 1, "warm_size": 0, "cold_size": 1, "fresh": 1,
        "hot_threshold": 5.0, "warm_threshold": 0.0}  # hot holds only the fresh item: the largest finite |TD|


def test_interface_and_vmap_over_seeds_with_different_contents():
    replay = make_replay("ranked", capacity=50, fractions=(0.1, 0.2, 0.7), proportions=(1, 1, 2), refresh_every=4)
    assert isinstance(replay, ranked.RankedReplay) and not replay.needs_td and replay.refresh_every == 4
    assert [bool(replay.refresh_due(u)) for u in range(1, 9)] == [False, False, False, True] * 2

    def fill(state, first):
        return replay.add(state, payload(np.arange(first, first + 20)), td_abs=None)

    def step(state, key, due):
        batch, info = replay.sample(state, key, 16, 0.5)
        state = replay.update(state, info, batch["tag"] * 0.5, keep=jnp.arange(16) % 4 != 0)
        return replay.maybe_refresh(state, due), info

    seeds = 3
    states = [fill(fill(replay.init(EXAMPLE), 100 * s), 100 * s + 20) for s in range(seeds)]
    keys = jax.random.split(jax.random.key(0), seeds)
    batched = jax.tree.map(lambda *x: jnp.stack(x), *states)
    vstep = jax.jit(jax.vmap(step, in_axes=(0, 0, None)))
    for i, due in enumerate([True, False, True]):
        keys = jax.vmap(lambda k: jax.random.split(k)[0])(keys)
        batched, vinfo = vstep(batched, keys, due)
        for s in range(seeds):
            states[s], info = step(states[s], keys[s], due)
            np.testing.assert_array_equal(np.asarray(vinfo.slot[s]), np.asarray(info.slot))
            np.testing.assert_allclose(np.asarray(vinfo.weight[s]), np.asarray(info.weight), rtol=1e-6)
    for s in range(seeds):
        for a, b in zip(jax.tree.leaves(states[s]), jax.tree.leaves(jax.tree.map(lambda x: x[s], batched))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the contents differ per seed, and the last refresh ranked each seed's own |TD|
    assert len({float(batched.data["tag"][s, 0]) for s in range(seeds)}) == seeds
    assert int(batched.since_refresh[0]) == 0 and int(batched.n_hot[0]) == 4
    # batch_stats and key_share
    _, info = replay.sample(states[0], jax.random.key(3), 16, 0.5)
    shares = replay.batch_stats(states[0], info)
    np.testing.assert_allclose([float(shares[k]) for k in ("hot_share", "warm_share", "cold_share")], [0.25, 0.25, 0.5])
    share = float(replay.key_share(states[0], info, jax.random.key(4)))
    scored = np.isfinite(np.asarray(info.td))
    pool = np.asarray(states[0].td)[np.asarray(jax.random.randint(jax.random.key(4), (1024,), 0, 40))]
    threshold = np.quantile(pool[np.isfinite(pool)], 0.9)
    assert share == pytest.approx((np.asarray(info.td)[scored] >= threshold).sum() / max(scored.sum(), 1))
