import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmtjax.config import EnvConfig
from rmtjax.envs import episode_metrics, final_return, make_env


def rollout(env, steps, key, action_fn=None):
    """Scan `steps` random steps; returns per-step (obs, reward, terminated, truncated, info) and last state."""
    obs, state = env.reset(key)

    def body(carry, k):
        obs, state = carry
        k_a, k_e = jax.random.split(k)
        if env.spec.discrete:
            action = jax.random.randint(k_a, (env.num_envs,), 0, env.spec.num_actions)
        else:
            action = jax.random.uniform(k_a, (env.num_envs,) + env.spec.action_shape, minval=-2, maxval=2)
        nobs, state, r, term, trunc, info = env.step(k_e, state, action)
        return (nobs, state), dict(obs=obs, next_obs=nobs, reward=r, term=term, trunc=trunc, **info)

    (_, state), traj = jax.lax.scan(body, (obs, state), jax.random.split(jax.random.key(1), steps))
    return jax.device_get(traj), state


def test_episode_statistics_match_a_recount_of_rewards():
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=3))
    traj, state = rollout(env, 300, jax.random.key(0))
    for e in range(3):
        ret, last, n = 0.0, None, 0
        for t in range(300):
            ret += traj["raw_reward"][t, e]
            if traj["done"][t, e]:
                last, ret, n = ret, 0.0, n + 1
        assert n > 3  # random CartPole episodes are short
        assert int(state.episodes_done[e]) == n
        assert float(state.last_return[e]) == pytest.approx(last)
        assert float(state.episode_return[e]) == pytest.approx(ret)
    assert float(final_return(state)) == pytest.approx(np.mean([float(state.last_return[e]) for e in range(3)]))


def test_truncation_is_not_termination_and_keeps_the_final_observation():
    # Pendulum never terminates; a 5-step limit truncates every 5th step.
    env = make_env(EnvConfig(id="Pendulum-v1", num_envs=2, params={"max_steps_in_episode": 5}))
    traj, state = rollout(env, 12, jax.random.key(0))
    assert not traj["term"].any()
    np.testing.assert_array_equal(traj["trunc"][:, 0], [t % 5 == 4 for t in range(12)])
    assert int(state.last_length[0]) == 5 and int(state.episodes_done[0]) == 2
    t = 4
    # the returned observation is the reset one; final_obs is where the episode ended
    assert not np.allclose(traj["final_obs"][t], traj["next_obs"][t])
    # where no episode ended, final_obs is the next observation
    np.testing.assert_allclose(traj["final_obs"][t - 1], traj["next_obs"][t - 1])


def test_termination_is_reported_on_cartpole_failure():
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=2))
    traj, _ = rollout(env, 200, jax.random.key(3))
    assert traj["term"].any() and not traj["trunc"].any()
    assert (traj["done"] == (traj["term"] | traj["trunc"])).all()


def test_running_observation_normalisation_uses_every_observation_seen():
    env = make_env(EnvConfig(id="Pendulum-v1", num_envs=4, normalize_obs=True))
    raw_env = make_env(EnvConfig(id="Pendulum-v1", num_envs=4))
    key = jax.random.key(7)
    traj, state = rollout(env, 50, key)
    raw, _ = rollout(raw_env, 50, key)
    obs0, _ = raw_env.reset(key)
    seen = np.concatenate([np.asarray(obs0)[None], raw["next_obs"]], 0).reshape(-1, 3)
    np.testing.assert_allclose(state.obs_stats.mean, seen.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.obs_stats.var, seen.var(0), rtol=1e-3, atol=1e-5)
    expect_last = (raw["next_obs"][-1] - seen.mean(0)) / np.sqrt(seen.var(0) + 1e-8)
    np.testing.assert_allclose(traj["next_obs"][-1], np.clip(expect_last, -10, 10), rtol=1e-3, atol=1e-4)


def test_sliding_window_normalisation_uses_only_the_last_steps():
    window = 8
    env = make_env(EnvConfig(id="Pendulum-v1", num_envs=4, normalize_obs=True, obs_norm_window=window))
    raw_env = make_env(EnvConfig(id="Pendulum-v1", num_envs=4))
    key = jax.random.key(2)
    _, state = rollout(env, 30, key)
    raw, _ = rollout(raw_env, 30, key)
    recent = raw["next_obs"][-window:].reshape(-1, 3)
    mean, var = state.obs_stats.moments()
    np.testing.assert_allclose(mean, recent.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(var, recent.var(0), rtol=1e-3, atol=1e-4)


def test_frame_stack_shifts_history_and_refills_on_reset():
    k = 3
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=2, frame_stack=k))
    raw_env = make_env(EnvConfig(id="CartPole-v1", num_envs=2))
    assert env.spec.obs_shape == (4 * k,)
    key = jax.random.key(5)
    obs0, _ = env.reset(key)
    raw0, _ = raw_env.reset(key)
    np.testing.assert_allclose(obs0, np.tile(raw0, (1, k)))
    traj, _ = rollout(env, 60, key)
    raw, _ = rollout(raw_env, 60, key)
    for t in range(1, 60):
        for e in range(2):
            stacked = traj["next_obs"][t, e].reshape(k, 4)
            if raw["done"][t, e]:
                np.testing.assert_allclose(stacked, np.tile(raw["next_obs"][t, e], (k, 1)))
                np.testing.assert_allclose(traj["final_obs"][t, e].reshape(k, 4)[-1], raw["final_obs"][t, e])
            elif not raw["done"][t - 1, e]:
                np.testing.assert_allclose(stacked[-1], raw["next_obs"][t, e])
                np.testing.assert_allclose(stacked[:-1], traj["next_obs"][t - 1, e].reshape(k, 4)[1:])


def test_image_observations_stack_on_channels_and_keep_their_dtype():
    env = make_env(EnvConfig(id="Breakout-MinAtar", num_envs=2, frame_stack=2))
    raw_env = make_env(EnvConfig(id="Breakout-MinAtar", num_envs=2))
    obs, _ = env.reset(jax.random.key(0))
    raw, _ = raw_env.reset(jax.random.key(0))
    assert obs.dtype == raw.dtype == env.spec.obs_dtype
    assert raw.shape == (2, 10, 10, 4) and obs.shape == (2, 10, 10, 8)
    assert env.spec.obs_shape == (10, 10, 8)


def test_reward_scale_and_clip_apply_after_raw_statistics():
    env = make_env(EnvConfig(id="Pendulum-v1", num_envs=2, reward_scale=0.1, reward_clip=0.5))
    traj, state = rollout(env, 20, jax.random.key(0))
    np.testing.assert_allclose(traj["reward"], np.clip(traj["raw_reward"] * 0.1, -0.5, 0.5), rtol=1e-6)
    assert float(state.episode_return[0]) == pytest.approx(traj["raw_reward"][:, 0].sum(), rel=1e-5)


def test_reward_normalisation_divides_by_return_std():
    env = make_env(EnvConfig(id="Pendulum-v1", num_envs=2, normalize_reward=True, reward_gamma=0.9))
    traj, state = rollout(env, 40, jax.random.key(0))
    disc = np.zeros(2)
    returns = []
    for t in range(40):
        disc = disc * 0.9 + traj["raw_reward"][t]
        returns.append(disc.copy())
    np.testing.assert_allclose(state.return_stats.var, np.var(np.stack(returns)), rtol=1e-3)
    np.testing.assert_allclose(traj["reward"][-1], traj["raw_reward"][-1] / np.sqrt(np.var(np.stack(returns)) + 1e-8), rtol=1e-3)


def test_continuous_actions_are_clipped_to_the_box():
    env = make_env(EnvConfig(id="Pendulum-v1", num_envs=1))
    _, s = env.reset(jax.random.key(0))
    _, _, r_big, *_ = env.step(jax.random.key(1), s, jnp.array([[50.0]]))
    _, _, r_max, *_ = env.step(jax.random.key(1), s, jnp.array([[2.0]]))
    assert float(r_big[0]) == pytest.approx(float(r_max[0]))


def test_episode_metrics_count_and_mean():
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=4))
    _, s0 = env.reset(jax.random.key(0))
    _, s1 = rollout(env, 100, jax.random.key(0))
    m = episode_metrics(s0, s1)
    assert int(m["episode_count"]) == int(s1.episodes_done.sum())
    assert float(m["episode_return"]) == pytest.approx(float(s1.last_return.mean()))


def test_evaluation_normalises_with_given_statistics_and_keeps_them_frozen():
    from rmtjax.envs.vec import OBS_CLIP, RunningStats

    cfg = EnvConfig(id="CartPole-v1", num_envs=3, normalize_obs=True)
    env, raw_env = make_env(cfg), make_env(EnvConfig(id="CartPole-v1", num_envs=3))
    trained = RunningStats(jnp.float32(1000.0), jnp.array([0.5, 0.0, 0.0, 1.0]), jnp.array([4.0, 1.0, 0.25, 1.0]))
    expect = lambda raw: np.clip((raw - trained.mean) / np.sqrt(trained.var + 1e-8), -OBS_CLIP, OBS_CLIP)

    obs, state = env.reset(jax.random.key(0), obs_stats=trained)
    raw, raw_state = raw_env.reset(jax.random.key(0))
    np.testing.assert_allclose(obs, expect(raw), rtol=1e-6)
    action = jnp.array([0, 1, 1])
    obs, frozen, *_ = env.step(jax.random.key(1), state, action, frozen=True)
    raw, *_ = raw_env.step(jax.random.key(1), raw_state, action)
    np.testing.assert_allclose(obs, expect(raw), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(frozen.obs_stats), jax.tree.leaves(trained)):
        np.testing.assert_array_equal(a, b)
    _, learning, *_ = env.step(jax.random.key(1), state, action)
    assert float(learning.obs_stats.count) == 1003.0  # without frozen the statistics move on
