import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rmtjax
from rmtjax.agents.ppo import gae
from tests.helpers import assert_no_doctor_findings


def reference_gae(reward, value, next_value, terminated, done, gamma, lam):
    T, N = reward.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            delta = reward[t, n] + gamma * next_value[t, n] * (1 - terminated[t, n]) - value[t, n]
            running = delta + gamma * lam * (1 - done[t, n]) * running
            adv[t, n] = running
    return adv


def test_gae_matches_reference_and_separates_truncation_from_termination():
    rng = np.random.default_rng(0)
    T, N = 12, 3
    reward, value, next_value = (rng.normal(size=(T, N)).astype(np.float32) for _ in range(3))
    terminated = np.zeros((T, N), bool)
    truncated = np.zeros((T, N), bool)
    terminated[4, 0] = True
    truncated[7, 1] = True
    done = terminated | truncated
    got = gae(jnp.asarray(reward), jnp.asarray(value), jnp.asarray(next_value), jnp.asarray(terminated),
              jnp.asarray(done), 0.9, 0.8)
    np.testing.assert_allclose(got, reference_gae(reward, value, next_value, terminated, done, 0.9, 0.8), rtol=1e-5)
    # a truncated step still bootstraps; a terminal one does not
    assert float(got[7, 1]) == pytest.approx(reward[7, 1] + 0.9 * next_value[7, 1] - value[7, 1], rel=1e-5)
    assert float(got[4, 0]) == pytest.approx(reward[4, 0] - value[4, 0], rel=1e-5)


def test_continuous_log_prob_matches_gaussian_formula():
    cfg = rmtjax.make_config("ppo", "Pendulum-v1", {"train.total_steps": 512, "agent.rollout_len": 128,
                                                    "env.num_envs": 4, "agent.num_minibatches": 4})
    agent = rmtjax.agents.build_agent(cfg)
    mean = jnp.array([[0.5], [-1.0]])
    log_std = jnp.array([[0.2], [-0.3]])
    action = jnp.array([[1.0], [0.0]])
    lp, ent = agent._log_prob_entropy((mean, log_std), action)
    std = np.exp(np.asarray(log_std))[:, 0]
    expect = -0.5 * ((np.array([1.0, 0.0]) - np.array([0.5, -1.0])) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(lp, expect, rtol=1e-5)
    np.testing.assert_allclose(ent, 0.5 * np.log(2 * np.pi * np.e * std**2), rtol=1e-5)


@pytest.mark.slow
def test_ppo_learns_cartpole_and_the_doctor_finds_nothing(tmp_path, capsys):
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {"train.total_steps": 149_504, "train.num_seeds": 2,
                                                    "train.progress": False})
    result = rmtjax.train(cfg, jax.random.key(0), run_dir=tmp_path / "run")
    # 292 whole iterations of 512 env steps (no rounding warning); a random policy scores about
    # 22; PPO passes 150 well within 150k steps
    assert np.all(result.final_return > 150), result.final_return
    assert np.all(result.metrics["episode_return"][:, -10:].mean(1) > result.metrics["episode_return"][:, :10].mean(1) + 100)
    assert_no_doctor_findings(result, capsys)  # a healthy run of every agent: no training doctor finding
