import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmtjax.replay import prioritized as per

CAPACITY = 6  # 8 leaves: two of them padding
ADD_B, UPDATE_B = 3, 4
EXAMPLE = {"obs": jnp.zeros((2,), jnp.uint8), "tag": jnp.float32(0)}

_add = jax.jit(per.add)
_sample = jax.jit(per.sample, static_argnums=2)
_update = jax.jit(per.update)


def payload(tags):
    tags = np.asarray(tags)
    return {"obs": np.stack([tags % 256, (tags * 5) % 256], 1).astype(np.uint8), "tag": tags.astype(np.float32)}


class RefPrioritized:
    """Plain-Python model: slot contents and priorities of a ring, written one item at a time."""

    def __init__(self, capacity):
        self.tags, self.priority = [None] * capacity, [0.0] * capacity
        self.cursor = self.size = 0

    def add(self, tags, priority):
        for tag, p in zip(tags, priority):
            self.tags[self.cursor], self.priority[self.cursor] = tag, p
            self.cursor = (self.cursor + 1) % len(self.tags)
            self.size = min(self.size + 1, len(self.tags))

    def update(self, slots, priority):
        for s, p in zip(slots, priority):
            self.priority[s] = p


def check_tree(state, ref, alpha):
    tree = np.asarray(state.tree)
    leaves = state.num_leaves
    assert leaves == 8 and tree.dtype == np.float32
    expected = np.float32(np.asarray(ref.priority, np.float64) ** alpha) * (np.arange(CAPACITY) < ref.size)
    np.testing.assert_allclose(tree[leaves : leaves + CAPACITY], expected, rtol=1e-6)
    assert (tree[leaves + CAPACITY :] == 0).all()
    # every inner node is exactly the float32 sum of its children
    for node in range(1, leaves):
        assert tree[node] == np.float32(tree[2 * node] + tree[2 * node + 1])
    np.testing.assert_allclose(tree[1], expected.sum(dtype=np.float64), rtol=1e-5)


priorities = st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 7.0])
add_op = st.tuples(st.just("add"), st.lists(priorities, min_size=ADD_B, max_size=ADD_B))
update_op = st.tuples(
    st.just("update"),
    st.lists(priorities, min_size=UPDATE_B, max_size=UPDATE_B),
    st.lists(st.integers(0, CAPACITY - 1), min_size=UPDATE_B, max_size=UPDATE_B),  # duplicates likely
)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.one_of(add_op, update_op), min_size=1, max_size=10),
    alpha=st.sampled_from([0.0, 0.6, 1.0]),
    beta=st.sampled_from([0.0, 0.4, 1.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_prioritized_matches_reference_model(ops, alpha, beta, seed):
    state, ref, next_tag = per.init(EXAMPLE, CAPACITY, alpha=alpha), RefPrioritized(CAPACITY), 0
    for i, op in enumerate(ops):
        if op[0] == "add":
            tags = list(range(next_tag, next_tag + ADD_B))
            next_tag += ADD_B
            state = _add(state, payload(tags), np.asarray(op[1], np.float32))
            ref.add(tags, op[1])
        else:
            state = _update(state, np.asarray(op[2], np.int32), np.asarray(op[1], np.float32))
            # writes to slots that hold no item yet are ignored
            ref.update([s for s in op[2] if s < ref.size], [p for s, p in zip(op[2], op[1]) if s < ref.size])
        assert int(state.cursor) == ref.cursor and int(state.size) == ref.size
        np.testing.assert_array_equal(np.asarray(state.data["tag"])[: ref.size], ref.tags[: ref.size])
        check_tree(state, ref, alpha)

        batch, info = _sample(state, jax.random.key(seed + i), 5, beta)
        stored = np.asarray(state.tree)[state.num_leaves :][: CAPACITY]
        total = stored.sum(dtype=np.float64)
        assert bool(info.valid.all()) == (total > 0)
        if total > 0:
            slots = np.asarray(info.slot)
            assert (slots < ref.size).all() and (stored[slots] > 0).all()
            np.testing.assert_array_equal(np.asarray(batch["tag"]), [ref.tags[s] for s in slots])
            p = stored[slots] / total
            np.testing.assert_allclose(np.asarray(info.probability), p, rtol=1e-5)
            raw = (ref.size * p) ** -beta
            np.testing.assert_allclose(np.asarray(info.weight), raw / raw.max(), rtol=1e-5)
        else:
            assert float(info.weight.max()) == 0.0


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_sampling_frequencies_match_priorities(alpha):
    state = per.init(EXAMPLE, 10, alpha=alpha)
    state = _add(state, payload(np.arange(10)), np.arange(10, dtype=np.float32))  # slot 0 has priority 0
    n = 20000
    _, info = _sample(state, jax.random.key(7), n, 1.0)
    observed = np.bincount(np.asarray(info.slot), minlength=16)
    expected = n * np.arange(10) ** alpha / (np.arange(10) ** alpha).sum()
    assert observed[0] == 0 and observed[10:].sum() == 0
    # chi-square over the 9 drawable slots, 8 dof: 26.1 is the 0.999 quantile
    assert ((observed[1:10] - expected[1:]) ** 2 / expected[1:]).sum() < 26.1


def test_update_resolves_duplicates_to_the_last_and_keeps_the_tree_consistent():
    state = per.init(EXAMPLE, CAPACITY, alpha=1.0)
    state = _add(state, payload([0, 1, 2]), np.array([1.0, 1.0, 1.0], np.float32))
    state = _update(state, np.array([2, 0, 2, 2], np.int32), np.array([5.0, 3.0, 9.0, 4.0], np.float32))
    np.testing.assert_array_equal(np.asarray(per.priorities(state)), [3, 1, 4, 0, 0, 0])
    assert float(state.tree[1]) == 8.0
    # masked-out entries write nothing
    state = per.update(state, jnp.array([1, 1]), jnp.array([6.0, 7.0]), valid=jnp.array([True, False]))
    np.testing.assert_array_equal(np.asarray(per.priorities(state)), [3, 6, 4, 0, 0, 0])


def test_add_wraps_around_and_rejects_oversized_batches():
    state = per.init(EXAMPLE, CAPACITY, alpha=1.0)
    for start in (0, 3, 6):
        state = _add(state, payload([start, start + 1, start + 2]), np.array([1.0, 2.0, 3.0], np.float32))
    np.testing.assert_array_equal(np.asarray(state.data["tag"]), [6, 7, 8, 3, 4, 5])
    assert int(state.cursor) == 3 and int(state.size) == CAPACITY
    with pytest.raises(ValueError, match="capacity 6"):
        per.add(state, payload(np.arange(7)), np.ones(7, np.float32))


def test_a_capacity_of_one_is_a_single_leaf_tree():
    state = per.add(per.init(EXAMPLE, 1), payload([4]), np.array([2.0], np.float32))
    batch, info = per.sample(state, jax.random.key(0), 3, 1.0)
    assert state.tree.shape == (2,)
    np.testing.assert_array_equal(np.asarray(info.slot), [0, 0, 0])
    np.testing.assert_array_equal(np.asarray(batch["tag"]), [4, 4, 4])
    np.testing.assert_allclose(np.asarray(info.weight), 1.0)
