"""The speed-of-light references (benchmarks/lib/reference.py): ring buffer, bootstrapping at
episode ends, GAE, and tiny vmapped runs of both loops."""

import dataclasses

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.lib.reference import (DQNSettings, PPOSettings, env_step, gae, make_dqn, make_ppo, ring_sample,
                                  ring_write, td_targets)


def test_ring_buffer_wraps_and_samples_only_filled_slots():
    size, n = 5, 2
    buf = {"x": jnp.full(size, -1.0)}

    def write(buf, t):
        return ring_write(buf, t, {"x": jnp.array([10.0 * t, 10.0 * t + 1])})

    buf = write(buf, 0)
    np.testing.assert_array_equal(buf["x"], [0, 1, -1, -1, -1])
    # after iteration 0 only slots 0 and 1 are sampled, both of them
    drawn = np.asarray(ring_sample(buf, jax.random.key(0), 0, n, 1000)["x"])
    assert set(drawn.tolist()) == {0.0, 1.0}

    for t in (1, 2, 3):
        buf = write(buf, t)
    # rows go to slots (t*n + i) % size: t=2 wraps onto slot 0, t=3 overwrites slots 1 and 2
    np.testing.assert_array_equal(buf["x"], [21, 30, 31, 11, 20])
    drawn = np.asarray(ring_sample(buf, jax.random.key(1), 3, n, 1000)["x"])
    assert set(drawn.tolist()) == {21.0, 30.0, 31.0, 11.0, 20.0}


def test_dqn_target_bootstraps_through_truncation_and_not_termination():
    env, params = gymnax.make("CartPole-v1")
    _, state = jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(jax.random.key(0), 3), params)
    # env 0: upright at the last step of the time limit (truncated); env 1: the pole falls past
    # the threshold (terminated); env 2: mid-episode
    state = state.replace(x=jnp.zeros(3), x_dot=jnp.zeros(3), theta=jnp.array([0.0, 0.2, 0.0]),
                          theta_dot=jnp.array([0.0, 2.0, 0.0]),
                          time=jnp.array([params.max_steps_in_episode - 1, 10, 10]))
    action = jnp.array([1, 1, 0])
    obs, _, reward, terminated, done, final_obs = env_step(env, params, jax.random.key(1), state, action)

    np.testing.assert_array_equal(terminated, [False, True, False])
    np.testing.assert_array_equal(done, [True, True, False])
    # final_obs is the observation the step ended in, before the reset
    pre_reset = jax.vmap(lambda s, a: env.step_env(jax.random.key(0), s, a, params)[0])(state, action)
    np.testing.assert_allclose(final_obs, pre_reset)
    assert not np.allclose(obs[0], final_obs[0]) and not np.allclose(obs[1], final_obs[1])
    np.testing.assert_allclose(obs[2], final_obs[2])
    np.testing.assert_array_equal(reward, [1.0, 1.0, 1.0])

    # the stored (next_obs, terminated) feed the target: bootstrapped except after termination
    buf = ring_write({"next_obs": jnp.zeros((8, 4)), "terminated": jnp.zeros(8), "reward": jnp.zeros(8)}, 0,
                     {"next_obs": final_obs, "terminated": terminated.astype(jnp.float32), "reward": reward})
    np.testing.assert_allclose(buf["next_obs"][:3], pre_reset)
    q_next = jnp.array([[1.0, 3.0], [2.0, 5.0], [4.0, 0.5]])
    target = td_targets(q_next, buf["reward"][:3], buf["terminated"][:3], 0.99)
    np.testing.assert_allclose(target, [1.0 + 0.99 * 3.0, 1.0, 1.0 + 0.99 * 4.0], rtol=1e-6)


def test_gae_by_hand():
    gamma, lam = 0.9, 0.8
    # env 0: step 0 terminates, step 2 is truncated; env 1: no episode end
    reward = jnp.array([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    value = jnp.array([[0.5, 0.1], [0.6, 0.2], [0.7, 0.3]])
    # V of each step's pre-reset observation: 9.0 after the termination must be ignored,
    # 2.0 after the truncation must be used
    next_value = jnp.array([[9.0, 0.2], [0.7, 0.3], [2.0, 0.4]])
    terminated = jnp.array([[True, False], [False, False], [False, False]])
    done = jnp.array([[True, False], [False, False], [True, False]])
    adv = gae(reward, value, next_value, terminated, done, gamma, lam)

    # env 0: A2 = 1 + .9*2 - .7; A1 = (1 + .9*.7 - .6) + .72*A2; A0 = 1 - .5, nothing from A1
    a2 = 2.1
    a1 = 1.03 + 0.72 * a2
    a0 = 0.5
    # env 1: plain discounted sums of TD errors
    b2 = 1.06
    b1 = 0.07 + 0.72 * b2
    b0 = 0.08 + 0.72 * b1
    np.testing.assert_allclose(adv, [[a0, b0], [a1, b1], [a2, b2]], rtol=1e-5)


@pytest.fixture(scope="module")
def tiny_dqn():
    s = dataclasses.replace(DQNSettings(), num_envs=4, total_steps=2000, buffer_size=500, batch_size=32,
                            learning_starts=400, target_update_every=100)
    train = jax.vmap(make_dqn(s))
    keys = jax.random.split(jax.random.key(0), 2)
    return s, train, keys, jax.jit(train)(keys)


def test_tiny_dqn_run_metrics(tiny_dqn):
    s, _, _, (state, m) = tiny_dqn
    iters = s.total_steps // s.num_envs
    for k in ("env_steps", "episode_return", "loss"):
        assert m[k].shape == (2, iters)
        assert np.isfinite(np.asarray(m[k])).all()
    np.testing.assert_array_equal(m["env_steps"], np.tile((np.arange(iters) + 1) * s.num_envs, (2, 1)))
    start = s.learning_starts // s.num_envs
    loss = np.asarray(m["loss"])
    assert (loss[:, :start] == 0).all() and (loss[:, start:] > 0).all()
    # a random CartPole policy ends episodes within a few dozen steps
    assert (np.asarray(m["episode_return"])[:, -1] > 5).all()
    assert state.buffer["obs"].shape == (2, s.buffer_size, 4)
    # the last iteration's 4 env steps reach 2000, a multiple of 100: the target is a copy of the net
    jax.tree.map(np.testing.assert_array_equal, state.target_params, state.params)


def test_dqn_conds_stay_branches_under_vmap(tiny_dqn):
    _, train, keys, _ = tiny_dqn
    jaxpr = str(jax.make_jaxpr(train)(keys))
    # vmap turns a cond on a batched predicate into a select of both branches
    assert jaxpr.count("cond[") == 2


def test_tiny_ppo_run_metrics():
    s = dataclasses.replace(PPOSettings(), rollout_len=16, total_steps=2048)
    train = jax.vmap(make_ppo(s))
    keys = jax.random.split(jax.random.key(0), 2)
    _, m = jax.jit(train)(keys)
    iters = s.total_steps // (s.num_envs * s.rollout_len)
    for k in ("env_steps", "episode_return", "loss"):
        assert m[k].shape == (2, iters)
        assert np.isfinite(np.asarray(m[k])).all()
    np.testing.assert_array_equal(m["env_steps"], np.tile((np.arange(iters) + 1) * 64, (2, 1)))
    assert (np.asarray(m["episode_return"])[:, -1] > 5).all()
    assert (np.asarray(m["loss"]) != 0).all()
