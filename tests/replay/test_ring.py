import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmtjax.replay import ring

CAPACITY = 7
EXAMPLE = {"obs": jnp.zeros((2,), jnp.uint8), "td_error": jnp.float32(0)}

# one compile per batch shape, shared by every example
_add = jax.jit(ring.add)
_sample = jax.jit(ring.sample, static_argnums=2)


class RefRing:
    """Plain-Python ring: slot contents, next slot, fill count."""

    def __init__(self, capacity):
        self.slots = [None] * capacity
        self.cursor = 0
        self.size = 0

    def add(self, items):
        for item in items:
            self.slots[self.cursor] = item
            self.cursor = (self.cursor + 1) % len(self.slots)
            self.size = min(self.size + 1, len(self.slots))


def make_batch(first_id, b):
    ids = np.arange(first_id, first_id + b)
    return {"obs": np.stack([ids % 256, (ids * 7) % 256], 1).astype(np.uint8), "td_error": ids.astype(np.float32)}


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.sampled_from([1, 3, 7]), min_size=1, max_size=8), seed=st.integers(0, 2**31 - 1))
def test_ring_matches_reference_and_samples_only_filled_slots(sizes, seed):
    state, ref, next_id = ring.init(EXAMPLE, CAPACITY), RefRing(CAPACITY), 0
    for i, b in enumerate(sizes):
        batch = make_batch(next_id, b)
        state = _add(state, batch)
        ref.add(range(next_id, next_id + b))
        next_id += b
        assert int(state.cursor) == ref.cursor and int(state.size) == ref.size <= CAPACITY
        stored = np.asarray(state.data["td_error"])
        for slot, item in enumerate(ref.slots):
            if item is not None:
                assert stored[slot] == item
                assert list(np.asarray(state.data["obs"][slot])) == [item % 256, (item * 7) % 256]
        assert state.data["obs"].dtype == jnp.uint8
        batch, slots = _sample(state, jax.random.key(seed + i), 16)
        slots = np.asarray(slots)
        assert (slots < ref.size).all()
        np.testing.assert_array_equal(np.asarray(batch["td_error"]), [ref.slots[s] for s in slots])


def test_add_rejects_a_batch_larger_than_the_capacity():
    with pytest.raises(ValueError, match="capacity 7"):
        ring.add(ring.init(EXAMPLE, CAPACITY), make_batch(0, 8))


def test_sampling_covers_the_filled_slots_uniformly():
    state = _add(ring.init(EXAMPLE, CAPACITY), make_batch(0, 3))
    _, slots = _sample(state, jax.random.key(0), 3000)
    counts = np.bincount(np.asarray(slots), minlength=CAPACITY)
    assert counts[3:].sum() == 0
    # chi-square against uniform over 3 slots, 2 dof: 13.8 is the 0.999 quantile
    assert ((counts[:3] - 1000) ** 2 / 1000).sum() < 13.8


def test_top_share_counts_a_batch_against_the_pools_top_decile():
    from rmtjax.replay import top_share

    pool = jnp.arange(1.0, 101.0)  # the 90th percentile (interpolated) is 90.1
    assert float(top_share(pool, jnp.array([95.0, 91.0, 90.0, 3.0]))) == pytest.approx(0.5)
    assert float(top_share(pool, jnp.array([100.0]))) == 1.0 and float(top_share(pool, jnp.array([1.0]))) == 0.0
