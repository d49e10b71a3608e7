"""The navix adapter (`navix:<id>`): MiniGrid in JAX, checked against navix's own reset/step."""

import jax
import numpy as np
import pytest

navix = pytest.importorskip("navix", reason="navix: ids need the navix extra: pip install 'rmtjax[navix]'")

import rmtjax  # noqa: E402
from rmtjax.config import ConfigError, EnvConfig  # noqa: E402
from rmtjax.envs import make_env  # noqa: E402

from .suites import assert_steps_match, assert_ends_match, episode_recount, replay, rollout  # noqa: E402

LIMIT = 20  # random walks in the 5×5 room reach the goal in some of 120 steps and not in others


@pytest.fixture(scope="module")
def empty():
    env = make_env(EnvConfig(id="navix:Navix-Empty-5x5-v0", num_envs=3, params={"max_steps_in_episode": LIMIT}))
    key = jax.random.key(0)
    obs0, traj, state = rollout(env, 120, key)
    own = navix.make("Navix-Empty-5x5-v0", max_steps=LIMIT)  # navix's own env, its own public calls
    reset = jax.jit(lambda k: (lambda ts: (ts.observation, ts))(own.reset(jax.random.key_data(k))))

    @jax.jit
    def step(k, ts, a):
        nxt = own.step(ts, a)  # ts is never finished here, so navix steps rather than resets
        return nxt.observation, nxt, nxt.reward, nxt.step_type == 2, nxt.step_type == 1

    ref_obs0, ref = replay(key, 3, traj, reset, step)
    return env, obs0, traj, state, ref_obs0, ref


def test_steps_match_navix_run_by_hand(empty):
    env, obs0, traj, _, ref_obs0, ref = empty
    assert env.spec.obs_shape == (5, 5, 3) and env.spec.num_actions == 7 and env.spec.max_episode_steps == LIMIT
    np.testing.assert_array_equal(obs0, ref_obs0)
    assert_steps_match(traj, ref, rtol=1e-6)
    assert traj["raw_reward"].max() > 0  # the goal was reached


def test_goal_terminates_and_the_step_limit_truncates(empty):
    _, _, traj, _, _, ref = empty
    assert_ends_match(traj, ref)
    assert traj["term"].any() and traj["trunc"].any() and not (traj["term"] & traj["trunc"]).any()


def test_episode_statistics_recount_the_raw_rewards(empty):
    _, _, traj, state, _, _ = empty
    episode_recount(traj, state, 3)


def test_render_draws_the_grid_in_rgb(empty):
    env, _, _, state, _, _ = empty
    frame = env.render(state, 2)
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3 and frame.shape[0] >= 5
    assert len(np.unique(frame.reshape(-1, 3), axis=0)) > 2  # walls, floor, agent, goal


def test_ppo_trains_on_navix_with_two_seeds():
    cfg = rmtjax.make_config("ppo", "navix:Navix-Empty-5x5-v0", {
        "env.params.max_steps_in_episode": LIMIT, "train.total_steps": 256, "train.num_seeds": 2,
        "train.num_chunks": 1, "train.progress": False, "agent.rollout_len": 16, "agent.num_minibatches": 2,
        "agent.hidden": [32]})
    m = rmtjax.train(cfg, jax.random.key(0)).metrics
    assert m["env_steps"].shape == (2, 4)
    assert np.all(m["episode_count"].sum(1) >= 4 * 64 // LIMIT)  # every episode ends within the limit
    assert np.all((m["episode_length"][:, 1:] >= 1) & (m["episode_length"][:, 1:] <= LIMIT))
    assert np.all((m["episode_return"] >= 0) & (m["episode_return"] <= 1))  # navix: 1 at the goal, else 0


def test_unknown_id_and_observation_are_config_errors():
    with pytest.raises(ConfigError, match=r"navix has no environment 'Navix-Empty-5x5-v1'.*Navix-Empty-5x5-v0"):
        EnvConfig(id="navix:Navix-Empty-5x5-v1")
    with pytest.raises(ConfigError, match=r"env\.params\.observation: navix has no observation 'pixels'"):
        make_env(EnvConfig(id="navix:Navix-Empty-5x5-v0", params={"observation": "pixels"}))
