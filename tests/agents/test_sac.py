import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rmtjax
from rmtjax.agents import build_agent
import optax

from rmtjax.agents.sac import soft_td_target
from rmtjax.networks.distributions import tanh_gaussian_log_prob
from tests.helpers import assert_no_doctor_findings


def normal_cdf(x):
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def squashed_density(a, mean, std, center, half):
    """Density of center + half * tanh(N(mean, std^2)) at a, by differentiating its CDF numerically."""

    def cdf(x):
        return normal_cdf((math.atanh((x - center) / half) - mean) / std)

    eps = 1e-6 * half
    return (cdf(a + eps) - cdf(a - eps)) / (2 * eps)


def test_tanh_gaussian_log_prob_is_the_density_of_the_rescaled_action():
    mean = np.array([[0.3, -1.2], [0.0, 0.8], [-0.5, 0.1]], np.float32)
    log_std = np.array([[-0.4, 0.2], [0.5, -1.0], [0.0, -0.3]], np.float32)
    u = np.array([[0.1, -0.7], [1.3, 0.9], [-0.6, 0.4]], np.float32)
    low, high = np.array([-2.0, 0.0]), np.array([2.0, 3.0])  # half-widths 2 and 1.5, centres 0 and 1.5
    center, half = (high + low) / 2, (high - low) / 2
    got = np.asarray(tanh_gaussian_log_prob(jnp.asarray(mean), jnp.asarray(log_std), jnp.asarray(u),
                                            jnp.asarray(half, jnp.float32)))
    expect = np.zeros(3)
    for b in range(3):
        for d in range(2):  # independent dimensions: log densities add
            a = center[d] + half[d] * math.tanh(float(u[b, d]))
            expect[b] += math.log(squashed_density(a, float(mean[b, d]), math.exp(float(log_std[b, d])),
                                                   center[d], half[d]))
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)


def test_tanh_gaussian_log_prob_stays_finite_where_tanh_saturates():
    # tanh(12) rounds to 1 in float32, so log(1 - tanh(u)^2) taken naively is -inf
    u = jnp.array([[12.0], [-12.0]])
    lp = tanh_gaussian_log_prob(jnp.array([[11.0], [-11.0]]), jnp.zeros((2, 1)), u, jnp.ones(1))
    # log(1 - tanh(u)^2) = log(4) - 2|u| - 2 log(1 + exp(-2|u|)) ≈ log 4 - 24
    expect = -0.5 - 0.5 * math.log(2 * math.pi) - (math.log(4.0) - 24.0)
    np.testing.assert_allclose(np.asarray(lp), [expect, expect], rtol=1e-5)


def test_polyak_moves_target_by_tau_toward_online():
    # the agent's Polyak update: optax.incremental_update(online, target, tau)
    target = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(-4.0)}
    online = {"w": jnp.array([3.0, 0.0]), "b": jnp.array(6.0)}
    out = optax.incremental_update(online, target, 0.25)
    np.testing.assert_allclose(out["w"], [1.5, 1.5])
    np.testing.assert_allclose(out["b"], -1.5)
    np.testing.assert_allclose(optax.incremental_update(online, target, 1.0)["w"], online["w"])


def test_soft_td_target_bootstraps_unless_terminated():
    reward = jnp.array([1.0, 1.0])
    terminated = jnp.array([False, True])
    got = soft_td_target(reward, terminated, jnp.array([5.0, 5.0]), jnp.array([-2.0, -2.0]), 0.5, 0.9)
    np.testing.assert_allclose(got, [1.0 + 0.9 * (5.0 + 1.0), 1.0])


# -- one small agent, one compiled step, several checks ------------------------------------
TAU = 0.1


@pytest.fixture(scope="module")
def small():
    """A SAC agent on 2 Pendulums cut to 3-step episodes; learning starts at the third step."""
    cfg = rmtjax.make_config("sac", "Pendulum-v1", {
        "env.num_envs": 2, "env.params": {"max_steps_in_episode": 3}, "train.total_steps": 1000,
        "agent.learning_starts": 6, "agent.batch_size": 8, "agent.buffer_size": 64, "agent.hidden": [16, 16],
        "agent.tau": TAU, "agent.updates_per_step": 0.5})  # one update per iteration of 2 envs
    agent = build_agent(cfg)
    step = jax.jit(agent.step)
    states = [agent.init(jax.random.key(0))]
    metrics = []
    for t in range(3):
        s, m = step(states[-1], t)
        states.append(s)
        metrics.append(m)
    return agent, jax.device_get(states), jax.device_get(metrics)


def pendulum_next_obs(obs, torque):
    """Gymnax Pendulum dynamics with default parameters, from an observation (cos θ, sin θ, θ')."""
    theta = np.arctan2(obs[1], obs[0])
    thdot = np.clip(obs[2] + (15.0 * np.sin(theta) + 3.0 * torque) * 0.05, -8.0, 8.0)
    theta = theta + thdot * 0.05
    return np.array([np.cos(theta), np.sin(theta), thdot])


def test_replay_keeps_the_pre_reset_observation_on_truncation(small):
    agent, states, _ = small
    data = states[3].replay.data["item"]
    assert int(states[3].replay.size) == 6  # 3 steps × 2 envs
    assert not data["terminated"][:6].any()  # a time limit is not a terminal state
    for slot in range(6):
        env = slot % 2
        torque = 2.0 * float(data["action"][slot, 0])  # stored actions are in [-1, 1]; the box is [-2, 2]
        np.testing.assert_allclose(data["next_obs"][slot], pendulum_next_obs(data["obs"][slot], torque),
                                   rtol=1e-4, atol=1e-5)
        if slot < 4:  # within the episode, the next observation is the next step's observation
            np.testing.assert_allclose(data["next_obs"][slot], data["obs"][slot + 2], rtol=1e-6)
        else:  # the third step truncated: the agent moved on from a fresh reset
            assert not np.allclose(data["next_obs"][slot], states[3].obs[env], atol=1e-3)
    assert (states[3].env_state.episodes_done == 1).all()


def test_td_target_uses_final_obs_and_terminated_only(small):
    agent, states, _ = small
    st = states[3]
    batch = jax.tree.map(lambda x: jnp.asarray(x[:6]), st.replay.data["item"])
    batch["terminated"] = jnp.array([False, True, False, True, False, True])
    noise = agent.noise(jax.random.key(7), 6)
    alpha, gamma = 0.3, 0.9
    got = np.asarray(agent.td_target(st.params["actor"], st.target_critic, alpha, batch, noise, gamma))
    next_action, next_lp = agent._sample(st.params["actor"], batch["next_obs"], noise)
    next_q = np.asarray(agent._q(st.target_critic, batch["next_obs"], next_action).min(axis=0))
    reward = np.asarray(batch["reward"])
    expect = reward + gamma * (next_q - alpha * np.asarray(next_lp))
    live = np.array([0, 2, 4])  # slot 4 is a truncated step: it bootstraps like any other
    np.testing.assert_allclose(got[live], expect[live], rtol=1e-5)
    np.testing.assert_allclose(got[[1, 3, 5]], reward[[1, 3, 5]], rtol=1e-6)
    # bootstrapping reads next_obs, not obs
    moved = dict(batch, next_obs=batch["next_obs"] + 0.5)
    moved_target = np.asarray(agent.td_target(st.params["actor"], st.target_critic, alpha, moved, noise, gamma))
    assert not np.allclose(moved_target[live], got[live])
    np.testing.assert_allclose(moved_target[[1, 3, 5]], got[[1, 3, 5]])


def test_updates_start_at_learning_starts_and_targets_follow_by_polyak(small):
    agent, states, metrics = small
    leaves = lambda t: jax.tree.leaves(t)  # noqa: E731
    # steps 1 and 2 (4 env steps < learning_starts = 6): nothing learns, actions are uniform
    for s in states[1:3]:
        for a, b in zip(leaves(s.params), leaves(states[0].params)):
            np.testing.assert_array_equal(a, b)
    assert [int(m["updates"]) for m in metrics] == [0, 0, 1]
    assert [float(m["critic_loss"]) == 0.0 for m in metrics] == [True, True, False]
    # step 3 updates once: target = (1 - tau) * old target + tau * new critic
    old_target, new_critic, new_target = states[2].target_critic, states[3].params["critic"], states[3].target_critic
    for t_old, c_new, t_new in zip(leaves(old_target), leaves(new_critic), leaves(new_target)):
        np.testing.assert_allclose(t_new, (1 - TAU) * t_old + TAU * c_new, rtol=1e-5, atol=1e-7)
    assert any(not np.allclose(a, b) for a, b in zip(leaves(states[3].params), leaves(states[2].params)))
    # twin critics are initialised independently
    k = leaves(states[0].params["critic"])[-1]
    assert k.shape[0] == 2 and not np.allclose(k[0], k[1])
    # every hyperparameter is reported
    for name in ("actor_lr", "critic_lr", "alpha_lr", "gamma", "tau", "target_entropy_scale", "alpha", "entropy"):
        assert name in metrics[2], name
    assert float(metrics[2]["tau"]) == pytest.approx(TAU)


def test_greedy_action_is_the_rescaled_tanh_of_the_mean(small):
    agent, states, _ = small
    params = states[0].params
    obs = jnp.asarray(states[3].obs)
    mean, _ = agent.actor.apply(params["actor"], obs)
    got = np.asarray(agent.act(params, obs))
    assert got.shape == (2, 1)
    np.testing.assert_allclose(got, 2.0 * np.tanh(np.asarray(mean)), rtol=1e-6)


def test_config_errors_are_raised_at_config_time():
    with pytest.raises(rmtjax.ConfigError, match="sac needs continuous"):
        rmtjax.make_config("sac", "CartPole-v1")
    with pytest.raises(rmtjax.ConfigError, match="agent.learning_starts"):
        rmtjax.make_config("sac", "Pendulum-v1", {"train.total_steps": 500, "agent.learning_starts": 500})
    with pytest.raises(rmtjax.ConfigError, match="agent.log_std_min"):
        rmtjax.make_config("sac", "Pendulum-v1", {"agent.log_std_min": -1.0, "agent.log_std_max": -2.0})


@pytest.mark.slow
def test_sac_learns_pendulum_and_the_doctor_finds_nothing(tmp_path, capsys):
    cfg = rmtjax.make_config("sac", "Pendulum-v1", {
        "train.total_steps": 6000, "train.num_seeds": 2, "train.progress": False,
        "env.num_envs": 4, "agent.updates_per_step": 1.0, "agent.batch_size": 128})
    result = rmtjax.train(cfg, jax.random.key(0), run_dir=tmp_path / "run")
    returns = result.metrics["episode_return"]
    # the first episode of every env (800 env steps) is uniformly random, before learning_starts;
    # random torques score about -1200
    first = returns[:, 199]
    assert np.all(first < -800), first
    assert np.all(result.final_return > -600), result.final_return
    assert np.all(result.final_return > first + 500)
    assert_no_doctor_findings(result, capsys)  # a healthy run of every agent: no training doctor finding
