"""The XLand-MiniGrid adapter (`xminigrid:<id>`), checked against xminigrid's own reset/step."""

import jax
import numpy as np
import pytest

xminigrid = pytest.importorskip("xminigrid", reason="xminigrid: ids need the xminigrid extra: "
                                                    "pip install 'rmtjax[xminigrid]'")

import rmtjax  # noqa: E402
from rmtjax.config import ConfigError, EnvConfig  # noqa: E402
from rmtjax.envs import make_env  # noqa: E402

from .suites import assert_steps_match, assert_ends_match, episode_recount, replay, rollout  # noqa: E402

LIMIT = 20


@pytest.fixture(scope="module")
def empty():
    env = make_env(EnvConfig(id="xminigrid:MiniGrid-Empty-5x5", num_envs=3, params={"max_steps": LIMIT}))
    key = jax.random.key(0)
    obs0, traj, state = rollout(env, 120, key)
    own, params = xminigrid.make("MiniGrid-Empty-5x5")
    params = params.replace(max_steps=LIMIT)
    reset = jax.jit(lambda k: (lambda ts: (ts.observation, ts))(own.reset(params, jax.random.key_data(k))))

    @jax.jit
    def step(k, ts, a):
        nxt = own.step(params, ts, a)
        # Empty-5x5 pays only at the goal, which ends the episode; the clock ends it at max_steps
        return nxt.observation, nxt, nxt.reward, nxt.reward > 0, nxt.state.step_num >= LIMIT

    ref_obs0, ref = replay(key, 3, traj, reset, step)
    return env, obs0, traj, state, ref_obs0, ref


def test_steps_match_xminigrid_run_by_hand(empty):
    env, obs0, traj, _, ref_obs0, ref = empty
    assert env.spec.obs_shape == (7, 7, 2) and env.spec.num_actions == 6 and env.spec.max_episode_steps == LIMIT
    np.testing.assert_array_equal(obs0, ref_obs0)
    assert_steps_match(traj, ref, rtol=1e-6)
    assert traj["raw_reward"].max() > 0


def test_goal_terminates_and_max_steps_truncates(empty):
    _, _, traj, _, _, ref = empty
    assert_ends_match(traj, ref)
    assert traj["term"].any() and traj["trunc"].any() and not (traj["term"] & traj["trunc"]).any()


def test_episode_statistics_recount_the_raw_rewards(empty):
    _, _, traj, state, _, _ = empty
    episode_recount(traj, state, 3)


def test_render_draws_the_grid_in_rgb(empty):
    env, _, _, state, _, _ = empty
    frame = env.render(state, 0)
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3 and frame.shape[0] >= 5


def test_ppo_trains_on_xminigrid():
    cfg = rmtjax.make_config("ppo", "xminigrid:MiniGrid-Empty-5x5", {
        "env.params.max_steps": LIMIT, "train.total_steps": 256, "train.num_chunks": 1, "train.progress": False,
        "agent.rollout_len": 16, "agent.num_minibatches": 2, "agent.hidden": [32]})
    m = rmtjax.train(cfg, jax.random.key(0)).metrics
    assert np.all(m["episode_count"].sum(1) >= 4 * 64 // LIMIT)
    assert np.all((m["episode_length"][:, 1:] >= 1) & (m["episode_length"][:, 1:] <= LIMIT))
    assert np.all((m["episode_return"] >= 0) & (m["episode_return"] <= 1))


def test_unknown_id_and_parameter_are_config_errors():
    with pytest.raises(ConfigError, match=r"xminigrid has no environment 'MiniGrid-Empty-5x6'"):
        EnvConfig(id="xminigrid:MiniGrid-Empty-5x6")
    with pytest.raises(ConfigError, match=r"env\.params\.max_step: .* has no parameter 'max_step'.*max_steps"):
        make_env(EnvConfig(id="xminigrid:MiniGrid-Empty-5x5", params={"max_step": 3}))
