"""The gymnasium adapter: host envs stepped from inside the compiled program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

gym = pytest.importorskip("gymnasium", reason="the gymnasium adapter needs gymnasium (pip install gymnasium)")

import rmtjax  # noqa: E402
from rmtjax.config import ConfigError, EnvConfig  # noqa: E402
from rmtjax.envs import make_env  # noqa: E402


def rollout(env, steps, key, action_key=jax.random.key(1)):
    """Reset from `key`, then `steps` random actions in one jitted scan; returns the numpy
    trajectory (with the actions as sent to the host, clipped to the box) and the last state."""

    def body(carry, k):
        obs, state = carry
        if env.spec.discrete:
            action = jax.random.randint(k, (env.num_envs,), 0, env.spec.num_actions)
        else:
            action = jax.random.uniform(k, (env.num_envs,) + env.spec.action_shape, minval=-2, maxval=2)
            action = jnp.clip(action, env.spec.action_low, env.spec.action_high)
        nobs, state, r, term, trunc, info = env.step(k, state, action)
        return (nobs, state), dict(action=action, next_obs=nobs, reward=r, term=term, trunc=trunc, **info)

    @jax.jit
    def run(key):
        obs, state = env.reset(key)
        (_, state), traj = jax.lax.scan(body, (obs, state), jax.random.split(action_key, steps))
        return obs, traj, state

    obs0, traj, state = run(key)
    return np.asarray(obs0), jax.device_get(traj), state


def replay_by_hand(env_id, kwargs, key, num_envs, traj):
    """The same episodes run on plain gymnasium envs: seeded as the adapter seeds them, fed
    the same actions, reset by hand when an episode ends."""
    seeds = np.asarray(jax.random.bits(key, (num_envs,), jnp.uint32))
    out = {k: np.zeros_like(traj[k]) for k in ("next_obs", "final_obs", "raw_reward", "term", "trunc")}
    first = []
    for e in range(num_envs):
        ref = gym.make(env_id, **kwargs)
        obs, _ = ref.reset(seed=int(seeds[e]))
        first.append(obs)
        for t in range(traj["action"].shape[0]):
            a = traj["action"][t, e]
            obs, r, term, trunc, _ = ref.step(int(a) if np.ndim(a) == 0 else a)
            out["final_obs"][t, e], out["raw_reward"][t, e] = obs, r
            out["term"][t, e], out["trunc"][t, e] = term, trunc
            if term or trunc:
                obs, _ = ref.reset()
            out["next_obs"][t, e] = obs
    return np.stack(first), out


@pytest.fixture(scope="module")
def cartpole():
    # a 15-step limit: random CartPole episodes (about 22 steps) end both ways
    env = make_env(EnvConfig(id="gymnasium:CartPole-v1", num_envs=3, params={"max_episode_steps": 15}))
    key = jax.random.key(0)
    obs0, traj, state = rollout(env, 80, key)
    return env, key, obs0, traj, state


def test_steps_match_the_gymnasium_env_run_by_hand(cartpole):
    env, key, obs0, traj, _ = cartpole
    ref_obs0, ref = replay_by_hand("CartPole-v1", {"max_episode_steps": 15}, key, 3, traj)
    np.testing.assert_allclose(obs0, ref_obs0, rtol=1e-6)
    np.testing.assert_allclose(traj["next_obs"], ref["next_obs"], rtol=1e-6)
    np.testing.assert_array_equal(traj["raw_reward"], ref["raw_reward"])


def test_final_obs_is_the_observation_before_the_reset(cartpole):
    env, key, _, traj, _ = cartpole
    _, ref = replay_by_hand("CartPole-v1", {"max_episode_steps": 15}, key, 3, traj)
    np.testing.assert_allclose(traj["final_obs"], ref["final_obs"], rtol=1e-6)
    done = traj["done"]
    assert done.sum() >= 6
    assert not np.allclose(traj["final_obs"][done], traj["next_obs"][done])
    np.testing.assert_array_equal(traj["final_obs"][~done], traj["next_obs"][~done])


def test_termination_and_truncation_are_kept_apart(cartpole):
    env, key, _, traj, _ = cartpole
    _, ref = replay_by_hand("CartPole-v1", {"max_episode_steps": 15}, key, 3, traj)
    assert traj["term"].any() and traj["trunc"].any()
    np.testing.assert_array_equal(traj["term"], ref["term"])
    np.testing.assert_array_equal(traj["trunc"], ref["trunc"] & ~ref["term"])
    assert env.spec.max_episode_steps == 15


def test_episode_statistics_of_cartpole_returns_equal_lengths(cartpole):
    _, _, _, traj, state = cartpole
    for e in range(3):
        ends = np.flatnonzero(traj["done"][:, e])
        lengths = np.diff(np.concatenate([[-1], ends]))
        assert int(state.episodes_done[e]) == len(ends)
        assert int(state.last_length[e]) == lengths[-1]
        assert float(state.last_return[e]) == lengths[-1]  # CartPole pays 1 per step
        assert lengths.max() <= 15
        assert int(state.episode_length[e]) == 80 - 1 - ends[-1]


def test_stepping_a_stale_state_raises():
    env = make_env(EnvConfig(id="gymnasium:CartPole-v1", num_envs=2))
    _, s0 = jax.jit(env.reset)(jax.random.key(0))
    step = jax.jit(env.step)
    action = jnp.zeros(2, jnp.int32)
    _, s1, *_ = step(jax.random.key(1), s0, action)
    jax.block_until_ready(s1)
    assert int(s1.inner.step[0]) == 1
    with pytest.raises(Exception, match="stale state"):
        jax.block_until_ready(step(jax.random.key(1), s0, action))


def test_nested_vmaps_fold_into_one_host_env_stepped_once_per_step():
    env = make_env(EnvConfig(id="gymnasium:CartPole-v1", num_envs=2))
    keys = jax.random.split(jax.random.key(4), 6).reshape(3, 2)  # e.g. 3 hyperparameters × 2 seeds

    @jax.jit
    def run(keys):
        def one_seed(key):
            obs, state = env.reset(key)

            def body(carry, k):
                state = carry
                a = jax.random.randint(k, (2,), 0, 2)
                obs, state, r, term, trunc, info = env.step(k, state, a)
                return state, obs

            return jax.lax.scan(body, state, jax.random.split(jax.random.key(9), 30))

        return jax.vmap(jax.vmap(one_seed))(keys)

    state, obs = run(keys)
    host = env.env
    assert host._size == 3 * 2 * 2 and host._steps == 30  # one host env for all, one call per step
    assert obs.shape == (3, 2, 30, 2, 4)
    # one batch alone sees exactly what it saw beside the others
    _, traj, _ = rollout(env, 30, keys[1, 0], action_key=jax.random.key(9))
    np.testing.assert_allclose(obs[1, 0], traj["next_obs"], rtol=1e-6)
    assert not np.allclose(obs[1, 0], obs[1, 1])


def test_ppo_trains_through_the_adapter_with_two_seeds():
    cfg = rmtjax.make_config("ppo", "gymnasium:CartPole-v1", {
        "train.total_steps": 2048, "train.num_seeds": 2, "train.progress": False, "agent.rollout_len": 64})
    result = rmtjax.train(cfg, jax.random.key(0))
    m = result.metrics
    assert m["env_steps"].shape == (2, 8) and m["env_steps"][0, -1] == 2048
    np.testing.assert_array_equal(m["episode_return"], m["episode_length"])  # CartPole: return = length
    assert m["episode_count"].sum(1).min() > 20  # random-ish CartPole episodes are short
    last = result.state.env_state
    np.testing.assert_allclose(result.final_return, np.asarray(last.last_length).mean(1))
    assert np.all(np.asarray(last.inner.step) == 2048 // 4)
    assert result.state.env_state.inner.step.shape == (2, 4)
    # greedy evaluation on fresh host envs: one host call per step for both seeds (a loop condition
    # batched over seeds could not hold the callbacks: it raised before evaluate looped over seeds)
    ev = rmtjax.evaluate(result, episodes=3, key=jax.random.key(1))
    assert ev.returns.shape == (2, 3) and ev.finished.all()
    np.testing.assert_array_equal(ev.returns, ev.lengths)  # CartPole: return = length
    assert np.all((ev.lengths >= 8) & (ev.lengths <= 500))
    again = rmtjax.evaluate(result, episodes=3, key=jax.random.key(1))
    np.testing.assert_array_equal(again.returns, ev.returns)  # reproducible from its key


def test_async_vectorisation_gives_the_same_steps_as_sync():
    kwargs = {"max_episode_steps": 15}
    sync = make_env(EnvConfig(id="gymnasium:CartPole-v1", num_envs=2, params=kwargs))
    asy = make_env(EnvConfig(id="gymnasium:CartPole-v1", num_envs=2, params=kwargs, host_vectorization="async"))
    try:
        _, a, _ = rollout(asy, 25, jax.random.key(2))
    finally:
        asy.env.close()
    _, s, _ = rollout(sync, 25, jax.random.key(2))
    for k in ("next_obs", "final_obs", "reward", "term", "trunc"):
        np.testing.assert_array_equal(a[k], s[k], err_msg=k)
    assert s["trunc"].any()


def test_prefixed_ids_pass_config_validation():
    assert EnvConfig(id="gymnasium:CartPole-v1").id == "gymnasium:CartPole-v1"
    cfg = rmtjax.make_config("ppo", "gymnasium:Acrobot-v1", {"env.params.max_episode_steps": 50})
    assert cfg.env.params == {"max_episode_steps": 50}


def test_unknown_gymnasium_id_suggests_close_matches():
    with pytest.raises(ConfigError, match=r"gymnasium has no environment 'CartPol-v1'.*Did you mean: CartPole-v1"):
        EnvConfig(id="gymnasium:CartPol-v1")


def test_a_gymnasium_id_without_prefix_is_pointed_to_it():
    with pytest.raises(ConfigError, match=r"unknown environment 'LunarLander-v3'.*use 'gymnasium:LunarLander-v3'"):
        EnvConfig(id="LunarLander-v3")


def test_unknown_prefix_lists_the_prefixes():
    with pytest.raises(ConfigError, match=r"unknown prefix 'gym'.*Did you mean: gymnasium"):
        EnvConfig(id="gym:CartPole-v1")


def test_host_vectorization_is_refused_for_jax_envs():
    with pytest.raises(ConfigError, match=r"env\.host_vectorization: 'async' applies only"):
        EnvConfig(id="CartPole-v1", host_vectorization="async")


def test_bad_gymnasium_make_argument_is_a_config_error():
    with pytest.raises(ConfigError, match=r"env\.params: gymnasium\.make\('CartPole-v1'.*gravty"):
        make_env(EnvConfig(id="gymnasium:CartPole-v1", params={"gravty": 3.0}))
