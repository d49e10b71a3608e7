"""The MuJoCo Playground adapter (`playground:<name>`), checked against playground's own reset
and step on the DM Control suite's CartpoleBalance (MJX, pure JAX)."""

import os

import jax
import numpy as np
import pytest

pytest.importorskip("mujoco_playground", reason="playground: ids need the playground extra: "
                                                "pip install 'rmtjax[playground]'")

import rmtjax  # noqa: E402
from rmtjax.config import ConfigError, EnvConfig  # noqa: E402
from rmtjax.envs import make_env  # noqa: E402

from .suites import assert_steps_match, episode_recount, replay, rollout  # noqa: E402

LIMIT = 10  # DM Control tasks end only at their time limit (1000 steps); a short one here


@pytest.fixture(scope="module")
def cartpole():
    from mujoco_playground import registry

    env = make_env(EnvConfig(id="playground:CartpoleBalance", num_envs=2, params={"max_steps_in_episode": LIMIT}))
    key = jax.random.key(0)
    obs0, traj, state = rollout(env, 25, key)
    own = registry.load("CartpoleBalance", config_overrides={"impl": "jax"})
    reset = jax.jit(lambda k: (lambda s: (s.obs, (s, 0)))(own.reset(jax.random.key_data(k))))
    own_step = jax.jit(own.step)

    def step(k, carry, a):
        s, t = carry
        s = own_step(s, a)  # playground's own step; the time limit is counted here, as its wrapper does
        return s.obs, (s, t + 1), s.reward, s.done > 0.5, t + 1 >= LIMIT

    ref_obs0, ref = replay(key, 2, traj, reset, step)
    return env, obs0, traj, state, ref_obs0, ref


def test_steps_match_playground_run_by_hand(cartpole):
    env, obs0, traj, _, ref_obs0, ref = cartpole
    assert env.spec.obs_shape == (5,) and env.spec.action_shape == (1,) and env.spec.max_episode_steps == LIMIT
    np.testing.assert_allclose(obs0, ref_obs0, rtol=1e-5, atol=1e-6)
    assert_steps_match(traj, ref, rtol=1e-4, atol=1e-5)
    assert np.all((traj["raw_reward"] > 0) & (traj["raw_reward"] <= 1))  # dm_control rewards are in [0, 1]


def test_the_time_limit_truncates_every_episode(cartpole):
    _, _, traj, _, _, ref = cartpole
    np.testing.assert_array_equal(traj["trunc"], ref["trunc"])
    assert not traj["term"].any()
    np.testing.assert_array_equal(traj["trunc"][:, 0], [(t + 1) % LIMIT == 0 for t in range(25)])


def test_episode_statistics_recount_the_raw_rewards(cartpole):
    _, _, traj, state, _, _ = cartpole
    episode_recount(traj, state, 2)


@pytest.mark.skipif(not os.environ.get("MUJOCO_GL"), reason="MuJoCo's renderer needs an OpenGL context: run with "
                                                            "MUJOCO_GL=egl (or osmesa) on a machine without a display")
def test_render_draws_the_scene(cartpole):
    env, _, _, state, _, _ = cartpole
    frame = env.render(state, 0)
    assert frame.shape == (240, 320, 3) and frame.dtype == np.uint8 and frame.std() > 0


def test_ppo_trains_on_playground():
    cfg = rmtjax.make_config("ppo", "playground:CartpoleBalance", {
        "env.params.max_steps_in_episode": LIMIT, "env.num_envs": 2, "train.total_steps": 32, "train.num_chunks": 1,
        "train.progress": False, "agent.rollout_len": 8, "agent.num_minibatches": 2, "agent.hidden": [16]})
    m = rmtjax.train(cfg, jax.random.key(0)).metrics
    assert np.all(np.isfinite(m["value_loss"]))
    assert m["episode_count"].sum() == 2 * (16 // LIMIT)
    assert m["episode_length"][0, -1] == LIMIT and 0 < m["episode_return"][0, -1] <= LIMIT


def test_unknown_name_and_config_key_are_config_errors():
    with pytest.raises(ConfigError, match=r"playground has no environment 'CartpoleBalanse'.*CartpoleBalance"):
        EnvConfig(id="playground:CartpoleBalanse")
    with pytest.raises(ConfigError, match=r"env\.params\.episode_len: playground:CartpoleBalance has no config key"):
        make_env(EnvConfig(id="playground:CartpoleBalance", params={"episode_len": 3}))
