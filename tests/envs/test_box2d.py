"""gymnasium's Box2D envs through the gymnasium adapter, and their PPO presets."""

import jax
import numpy as np
import pytest

pytest.importorskip("Box2D", reason="Box2D envs need the box2d extra: pip install 'rmtjax[box2d]'")

import rmtjax  # noqa: E402
from rmtjax.config import EnvConfig  # noqa: E402
from rmtjax.envs import make_env  # noqa: E402

from .test_gymnasium import replay_by_hand, rollout  # noqa: E402


def test_continuous_lunar_lander_matches_the_env_run_by_hand():
    # an 80-step limit: random landers crash (terminate) in about 60-120 steps, so both endings occur
    kwargs = {"continuous": True, "max_episode_steps": 80}
    env = make_env(EnvConfig(id="gymnasium:LunarLander-v3", num_envs=2, params=kwargs))
    assert not env.spec.discrete and env.spec.action_shape == (2,)
    key = jax.random.key(0)
    obs0, traj, state = rollout(env, 300, key)
    ref_obs0, ref = replay_by_hand("LunarLander-v3", kwargs, key, 2, traj)
    np.testing.assert_allclose(obs0, ref_obs0, rtol=1e-6)
    for k in ("next_obs", "final_obs", "raw_reward"):
        np.testing.assert_allclose(traj[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_array_equal(traj["term"], ref["term"])
    np.testing.assert_array_equal(traj["trunc"], ref["trunc"] & ~ref["term"])
    assert traj["term"].any() and traj["trunc"].any()
    ends = np.flatnonzero(traj["done"][:, 0])
    assert float(state.last_return[0]) == pytest.approx(traj["raw_reward"][ends[-2] + 1: ends[-1] + 1, 0].sum(), rel=1e-5)


@pytest.mark.parametrize("env_id", ["gymnasium:LunarLander-v3", "gymnasium:LunarLanderContinuous-v3"])
def test_ppo_preset_runs_one_iteration(env_id):
    # the preset is rl-baselines3-zoo's (16 envs × 1024 steps, minibatches of 64, constant lr); here 4 envs
    preset = rmtjax.make_config("ppo", env_id, {})
    assert preset.env.num_envs * preset.agent.rollout_len // preset.agent.num_minibatches == 64
    assert not preset.agent.anneal_lr and preset.agent.gae_lambda == pytest.approx(0.98)
    cfg = rmtjax.make_config("ppo", env_id, {"train.total_steps": 4096, "env.num_envs": 4,
                                             "agent.num_minibatches": 4, "train.progress": False})
    assert cfg.agent.gamma == pytest.approx(0.999) and cfg.agent.rollout_len == 1024
    result = rmtjax.train(cfg, jax.random.key(0))
    m = result.metrics
    assert m["env_steps"][0, -1] == 4096
    assert np.all(np.isfinite(m["policy_loss"])) and np.all(np.isfinite(m["value_loss"]))
    assert result.state.env_state.inner.step[0, 0] == 1024
