"""The brax adapter: brax envs as pure JAX, with our own auto-reset and time limit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("brax", reason="the brax adapter needs the brax extra: pip install 'rmtjax[brax]'")

from brax.envs import register_environment  # noqa: E402
from brax.envs.base import Env, State  # noqa: E402

import rmtjax  # noqa: E402
from rmtjax.config import ConfigError, EnvConfig  # noqa: E402
from rmtjax.envs import make_env  # noqa: E402


class Walk(Env):
    """A one-dimensional brax env: the position moves by the action, the episode terminates
    when |position| > 1, the reward is the position; reset draws the start from the key."""

    def reset(self, rng):
        pos = jax.random.uniform(rng, (1,), minval=-0.5, maxval=0.5)
        return State(pipeline_state=None, obs=pos, reward=jnp.zeros(()), done=jnp.zeros(()))

    def step(self, state, action):
        pos = state.obs + 0.3 * action
        return state.replace(obs=pos, reward=pos[0], done=(jnp.abs(pos[0]) > 1.0).astype(jnp.float32))

    @property
    def observation_size(self):
        return 1

    @property
    def action_size(self):
        return 1

    @property
    def backend(self):
        return "none"


register_environment("rmtjax_test_walk", Walk)


def rollout(env, steps, key):
    """`steps` random actions in [-1, 1] in one jitted scan; records each step's key too."""

    def body(carry, k):
        obs, state = carry
        action = jax.random.uniform(k, (env.num_envs, 1), minval=-1.0, maxval=1.0)
        nobs, state, r, term, trunc, info = env.step(k, state, action)
        return (nobs, state), dict(key=jax.random.key_data(k), action=action, next_obs=nobs, reward=r,
                                   term=term, trunc=trunc, **info)

    @jax.jit
    def run(key):
        obs, state = env.reset(key)
        (_, state), traj = jax.lax.scan(body, (obs, state), jax.random.split(jax.random.key(1), steps))
        return obs, traj, state

    obs0, traj, state = run(key)
    return np.asarray(obs0), jax.device_get(traj), state


def replay_by_hand(raw_env, key, num_envs, traj, max_steps):
    """The same episodes through the brax env's own reset/step, with the keys VecEnv hands out."""
    out = {k: np.zeros_like(traj[k]) for k in ("next_obs", "final_obs", "raw_reward", "term", "trunc")}
    for e in range(num_envs):
        s = raw_env.reset(jax.random.key_data(jax.random.split(key, num_envs)[e]))
        t_in_episode = 0
        for t in range(traj["action"].shape[0]):
            s = raw_env.step(s, jnp.asarray(traj["action"][t, e]))
            t_in_episode += 1
            term = bool(s.done > 0.5)
            trunc = t_in_episode >= max_steps and not term
            out["final_obs"][t, e], out["raw_reward"][t, e] = s.obs, s.reward
            out["term"][t, e], out["trunc"][t, e] = term, trunc
            if term or trunc:
                step_key = jax.random.wrap_key_data(traj["key"][t])
                s = raw_env.reset(jax.random.key_data(jax.random.split(step_key, num_envs)[e]))
                t_in_episode = 0
            out["next_obs"][t, e] = s.obs
    return out


@pytest.fixture(scope="module")
def walk():
    env = make_env(EnvConfig(id="brax:rmtjax_test_walk", num_envs=3, params={"max_steps_in_episode": 6}))
    key = jax.random.key(0)
    obs0, traj, state = rollout(env, 40, key)
    ref = replay_by_hand(Walk(), key, 3, traj, 6)
    return env, traj, state, ref


def test_steps_match_the_brax_env_run_by_hand(walk):
    _, traj, _, ref = walk
    np.testing.assert_allclose(traj["next_obs"], ref["next_obs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(traj["raw_reward"], ref["raw_reward"], rtol=1e-5, atol=1e-6)


def test_final_obs_is_the_observation_before_the_reset(walk):
    _, traj, _, ref = walk
    np.testing.assert_allclose(traj["final_obs"], ref["final_obs"], rtol=1e-5, atol=1e-6)
    done = traj["done"]
    assert np.all(np.abs(traj["next_obs"][done]) <= 0.5)  # fresh starts
    assert not np.allclose(traj["final_obs"][done], traj["next_obs"][done])


def test_termination_and_time_limit_truncation_are_kept_apart(walk):
    _, traj, _, ref = walk
    assert traj["term"].any() and traj["trunc"].any()
    np.testing.assert_array_equal(traj["term"], ref["term"])
    np.testing.assert_array_equal(traj["trunc"], ref["trunc"])
    assert not (traj["term"] & traj["trunc"]).any()


def test_episode_statistics_recount(walk):
    _, traj, state, _ = walk
    for e in range(3):
        ret, last, n = 0.0, None, 0
        for t in range(40):
            ret += traj["raw_reward"][t, e]
            if traj["done"][t, e]:
                last, ret, n = ret, 0.0, n + 1
        assert int(state.episodes_done[e]) == n
        assert float(state.last_return[e]) == pytest.approx(last, rel=1e-5)
        assert int(state.last_length[e]) <= 6


def test_fast_env_truncates_every_episode_at_the_limit():
    env = make_env(EnvConfig(id="brax:fast", num_envs=2, params={"max_steps_in_episode": 5}))
    assert env.spec.max_episode_steps == 5 and env.spec.action_shape == (1,)
    _, traj, state = rollout(env, 12, jax.random.key(0))
    assert not traj["term"].any()
    np.testing.assert_array_equal(traj["trunc"][:, 0], [t % 5 == 4 for t in range(12)])
    np.testing.assert_array_equal(traj["next_obs"][4], np.zeros((2, 2)))  # fast resets to the origin
    for e in range(2):  # fast's own dynamics: velocity grows by dt on a positive action
        vel = pos = 0.0
        for t in range(5):
            vel += 0.02 * float(traj["action"][t, e, 0] > 0)
            pos += vel * 0.02
        np.testing.assert_allclose(traj["final_obs"][4, e], [pos, vel], rtol=1e-5, atol=1e-7)
    assert int(state.episodes_done[0]) == 2 and int(state.last_length[0]) == 5


def test_ppo_trains_on_brax_with_two_seeds():
    cfg = rmtjax.make_config("ppo", "brax:fast", {
        "train.total_steps": 1024, "train.num_seeds": 2, "train.progress": False, "agent.rollout_len": 32,
        "env.params.max_steps_in_episode": 16})
    result = rmtjax.train(cfg, jax.random.key(0))
    m = result.metrics
    assert m["env_steps"].shape == (2, 8)
    np.testing.assert_array_equal(m["episode_length"][:, 1:], 16.0)  # fast never terminates
    assert np.all(m["episode_count"].sum(1) == 4 * 1024 // (4 * 16))
    assert np.all(np.isfinite(result.final_return))


def test_unknown_brax_name_and_bad_argument_are_config_errors():
    with pytest.raises(ConfigError, match=r"brax has no environment 'halfcheeta'.*Did you mean: halfcheetah"):
        EnvConfig(id="brax:halfcheeta")
    with pytest.raises(ConfigError, match=r"env\.params: brax env 'rmtjax_test_walk' does not take"):
        make_env(EnvConfig(id="brax:rmtjax_test_walk", params={"no_such_arg": 1}))
