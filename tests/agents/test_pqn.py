import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rmtjax
from rmtjax.agents.pqn import PQNState, lambda_returns
from rmtjax.config import ConfigError

# one tiny agent for every test that steps: 4 envs × 8 steps, two 16-wide layers, 2 × 2 updates
TINY = {"env.num_envs": 4, "agent.rollout_len": 8, "agent.num_minibatches": 2, "agent.num_epochs": 2,
        "agent.hidden": [16, 16], "train.total_steps": 320, "agent.lr": 1e-3}


@pytest.fixture(scope="module")
def tiny():
    """(agent, jitted step, initial state) shared by the file, so `step` compiles once."""
    agent = rmtjax.agents.build_agent(rmtjax.make_config("pqn", "CartPole-v1", TINY))
    return agent, jax.jit(agent.step), agent.init(jax.random.key(0))


def test_lambda_returns_hand_computed_with_a_termination_and_a_truncation():
    # env 0: terminated at t=1, truncated at t=3, t=4 the rollout's last step; env 1: no episode end
    reward = jnp.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0], [5.0, 1.0]])
    next_q = jnp.array([[10.0, 4.0], [20.0, 4.0], [30.0, 4.0], [40.0, 4.0], [50.0, 8.0]])
    terminated = jnp.array([[False, False], [True, False], [False, False], [False, False], [False, False]])
    done = terminated.at[3, 0].set(True)
    g = lambda_returns(reward, next_q, terminated, done, 0.5, 0.5)
    # env 0, by hand with γ = λ = 0.5:
    # G4 = 5 + .5·50 = 30 (last step: full bootstrap); G3 = 4 + .5·40 = 24 (truncation bootstraps)
    # G2 = 3 + .5(.5·30 + .5·24) = 16.5; G1 = 2 (termination: no bootstrap); G0 = 1 + .5(.5·10 + .5·2) = 4
    np.testing.assert_array_equal(np.asarray(g[:, 0]), [4.0, 2.0, 16.5, 24.0, 30.0])
    # env 1: G4 = 1 + .5·8 = 5, then G_t = .5(.5·4 + .5·G_{t+1}): 2.25, 1.5625, 1.390625, 1.34765625
    np.testing.assert_array_equal(np.asarray(g[:, 1]), [1.34765625, 1.390625, 1.5625, 2.25, 5.0])
    # λ = 0 is the one-step target everywhere, r + γ (1 - terminated) next_q
    g0 = lambda_returns(reward, next_q, terminated, done, 0.5, 0.0)
    np.testing.assert_array_equal(np.asarray(g0), np.asarray(reward + 0.5 * (1.0 - terminated) * next_q))


def test_act_is_the_argmax_of_q(tiny):
    agent, _, state = tiny
    params = state.params
    head = params["params"]["head"]["Dense_0"]
    obs = jax.random.normal(jax.random.key(1), (5, 4))
    for bias, want in (([0.0, 1.0], 1), ([2.0, 1.0], 0)):
        # a zero kernel makes Q(s, ·) the bias for every observation
        fixed = jax.tree.map(lambda x: x, params)
        fixed["params"]["head"]["Dense_0"] = {"kernel": jnp.zeros_like(head["kernel"]), "bias": jnp.array(bias)}
        np.testing.assert_array_equal(np.asarray(agent.act(fixed, obs)), [want] * 5)
    q = np.asarray(agent.q_values(params, obs))
    np.testing.assert_array_equal(np.asarray(agent.act(params, obs)), q.argmax(-1))


def test_continuous_actions_are_refused_with_the_alternatives():
    with pytest.raises(ConfigError, match=r"pqn needs discrete actions; Pendulum-v1 .*rmt.*ppo.*sac"):
        rmtjax.make_config("pqn", "Pendulum-v1")
    with pytest.raises(ConfigError, match=r"num_minibatches: 3 must divide .* = 32"):
        rmtjax.make_config("pqn", "CartPole-v1", {**TINY, "agent.num_minibatches": 3})
    with pytest.raises(ConfigError, match=r"'cnn' needs image observations"):
        rmtjax.make_config("pqn", "CartPole-v1", {**TINY, "agent.torso": "cnn", "agent.hidden": [16]})


def test_one_iteration_learns_and_reports_finite_scalars(tiny):
    agent, step, state = tiny
    new, metrics = step(state, jnp.int32(0))
    before, after = jax.tree.leaves(state.params), jax.tree.leaves(new.params)
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))  # every parameter moved
    for name in ("env_steps", "episode_return", "episode_length", "episode_count", "loss", "q_mean", "grad_norm",
                 "epsilon", "lr_in_force", "skipped_frac", "td_lambda", "eps_end", "precision_bits"):
        assert name in metrics, name
    for name, v in metrics.items():
        assert np.shape(v) == () and np.isfinite(v), (name, v)
    assert int(metrics["env_steps"]) == 32
    assert float(metrics["epsilon"]) == 1.0 and float(metrics["lr_in_force"]) == pytest.approx(1e-3)
    assert float(metrics["skipped_frac"]) == 0.0 and float(metrics["loss"]) > 0.0


def test_the_clock_comes_from_t_and_the_state_keeps_no_counters(tiny):
    agent, step, state = tiny
    assert {f.name for f in dataclasses.fields(PQNState)} == {
        "params", "opt_state", "env_state", "obs", "precision", "hparams", "key"}
    # the same state stepped as iteration 1 of 10: env steps, ε and lr follow t alone
    _, m = step(state, jnp.int32(1))
    assert agent.num_iterations == 10 and int(m["env_steps"]) == 2 * 32
    # the CartPole preset's ε: 1 -> 0.2 over the first 20%, so halfway down at 10%
    assert float(m["epsilon"]) == pytest.approx(0.6)
    assert float(m["lr_in_force"]) == pytest.approx(1e-3 * 0.9)  # linear decay to 0 over the run


def test_cnn_torso_puts_a_layer_norm_after_the_convolution_and_the_dense_layer():
    cfg = rmtjax.make_config("pqn", "Breakout-MinAtar", {"env.num_envs": 2, "agent.num_minibatches": 1,
                                                         "train.total_steps": 64})
    agent = rmtjax.agents.build_agent(cfg)
    params = agent.net.init(jax.random.key(0), jnp.zeros((2, 10, 10, 4)))["params"]
    shapes = jax.tree.map(jnp.shape, params["torso"])
    assert shapes["LayerNorm_0"]["scale"] == (16,) and shapes["LayerNorm_1"]["scale"] == (128,)
    assert shapes["Dense_0"]["kernel"] == (8 * 8 * 16, 128) and params["head"]["Dense_0"]["bias"].shape == (3,)
