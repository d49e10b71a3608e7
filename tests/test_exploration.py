import jax
import jax.numpy as jnp
import numpy as np

from rmtjax import exploration
from rmtjax.exploration import Hold, select_action

B, A = 4000, 3
Q = jnp.tile(jnp.array([0.0, 1.0, 0.5]), (B, 1))  # greedy action: 1


def test_epsilon_zero_is_greedy_and_epsilon_one_is_uniform():
    a, info, hold = select_action(jax.random.key(0), Q, 0.0, 1.0, boltzmann=False)
    assert np.all(np.asarray(a) == 1) and float(info["explore_frac"]) == 0.0 and hold is None
    a, info, _ = select_action(jax.random.key(1), Q, 1.0, 1.0, boltzmann=False)
    counts = np.bincount(np.asarray(a), minlength=A) / B
    np.testing.assert_allclose(counts, 1 / 3, atol=0.03)
    assert float(info["explore_frac"]) == 1.0


def test_boltzmann_draws_follow_the_softmax_of_q_over_temperature():
    a, info, _ = select_action(jax.random.key(2), Q, 0.0, 0.5, boltzmann=True)
    p = np.asarray(jax.nn.softmax(Q[0] / 0.5))
    np.testing.assert_allclose(np.bincount(np.asarray(a), minlength=A) / B, p, atol=0.03)
    np.testing.assert_allclose(float(info["policy_entropy"]), -(p * np.log(p)).sum(), rtol=1e-5)


def test_the_temperature_moves_the_entropy_towards_its_target():
    log_t = jnp.log(1.0)
    for _ in range(300):
        h = exploration.boltzmann_entropy(Q[:1], jnp.exp(log_t))
        log_t = exploration.adapt_temperature(log_t, h, 0.5, 0.5)
    np.testing.assert_allclose(float(exploration.boltzmann_entropy(Q[:1], jnp.exp(log_t))), 0.5, atol=1e-3)


def test_a_held_exploratory_action_repeats_for_one_to_max_hold_steps():
    max_hold = 4
    first, _, hold = select_action(jax.random.key(3), Q, 1.0, 1.0, False, Hold.empty((B,)), max_hold)
    first, left0 = np.asarray(first), np.asarray(hold.left)
    # everyone explored: a hold of 1..max_hold steps (this one included), uniformly
    np.testing.assert_allclose(np.bincount(left0, minlength=max_hold) / B, 1 / max_hold, atol=0.03)
    assert left0.max() == max_hold - 1
    np.testing.assert_array_equal(np.asarray(hold.action)[left0 > 0], first[left0 > 0])
    for t in range(1, max_hold + 1):
        a, info, hold = select_action(jax.random.key(10 + t), Q, 0.0, 1.0, False, hold, max_hold)  # ε = 0 now
        a, holding = np.asarray(a), left0 >= t
        np.testing.assert_array_equal(a[holding], first[holding])  # still held
        assert np.all(a[~holding] == 1)  # hold over: greedy
        np.testing.assert_allclose(float(info["explore_frac"]), holding.mean(), rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(hold.left), np.maximum(left0 - t, 0))


def test_max_hold_one_draws_afresh_every_step_with_the_same_actions():
    q = jax.random.normal(jax.random.key(4), (64, 2, 5))  # per-dimension heads
    plain, _, _ = select_action(jax.random.key(5), q, 0.3, 0.7)
    held, _, hold = select_action(jax.random.key(5), q, 0.3, 0.7, True, Hold.empty((64, 2)), 1)
    np.testing.assert_array_equal(plain, held)
    assert not np.asarray(hold.left).any()
