"""The Nature-CNN torso (Mnih et al. 2015): its layer shapes, its pixel scaling, and that RMT,
DQN, PQN and PPO build it and take gradient steps through it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rmtjax
from rmtjax.config import ConfigError
from rmtjax.networks import NatureCNN, make_torso

# DQN trains on real Atari through this torso in tests/envs/test_atari.py


def test_layers_have_the_shapes_of_the_nature_network():
    net = NatureCNN(hidden=(512,))
    x = jnp.zeros((2, 84, 84, 4), jnp.uint8)
    params = jax.eval_shape(net.init, jax.random.key(0), x)  # shapes only: traced, not run
    shapes = {k: v["kernel"].shape for k, v in params["params"].items()}
    assert shapes == {"Conv_0": (8, 8, 4, 32), "Conv_1": (4, 4, 32, 64), "Conv_2": (3, 3, 64, 64),
                      "Dense_0": (7 * 7 * 64, 512)}
    assert jax.eval_shape(net.apply, params, x).shape == (2, 512)
    # 8,224 + 32,832 + 36,928 + 1,606,144 weights and biases: the paper's network without its output layer
    assert sum(int(np.prod(v.shape)) for v in jax.tree.leaves(params)) == 1_684_128


def test_uint8_pixels_are_scaled_to_unit_range_and_floats_are_not():
    net = make_torso("nature_cnn", (16,), "relu", False, jnp.float32)
    pixels = np.random.default_rng(1).integers(0, 256, (3, 36, 36, 2)).astype(np.uint8)
    params = random_params(net, pixels)
    apply = jax.jit(net.apply)
    out_pixels = apply(params, pixels)
    out_floats = apply(params, pixels.astype(np.float32) / 255.0)
    assert out_pixels.shape == (3, 16)
    np.testing.assert_allclose(out_pixels, out_floats, rtol=1e-5, atol=1e-6)
    assert not np.allclose(apply(params, pixels.astype(np.float32)), out_floats)


def random_params(net, x):
    """Parameters of `net`'s shapes drawn from N(0, 0.1²) (its own orthogonal init compiles a loop per
    layer, seconds each on a CPU, and these tests need any parameters, not good ones)."""
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda leaf: (0.1 * rng.standard_normal(leaf.shape)).astype(leaf.dtype),
                        jax.eval_shape(net.init, jax.random.key(0), x))


SMALL = {"rmt": {"agent.learning_starts": 32, "agent.batch_size": 16, "agent.buffer_size": 256, "agent.rollout_len": 8},
         "dqn": {"agent.learning_starts": 32, "agent.batch_size": 16, "agent.buffer_size": 256, "agent.rollout_len": 8},
         "pqn": {"agent.rollout_len": 8, "agent.num_minibatches": 2, "agent.num_epochs": 1},
         "ppo": {"agent.rollout_len": 8, "agent.num_minibatches": 2, "agent.num_epochs": 1}}
PER_STACK = [(3, 3, 64, 64), (4, 4, 32, 64), (8, 8, 4, 32)]  # four stacked grey frames


@pytest.mark.parametrize("algo", ["rmt", "dqn", "pqn", "ppo"])
def test_each_value_and_policy_agent_builds_the_nature_cnn(algo):
    pytest.importorskip("ale_py", reason="the image env of this test is real Atari: pip install 'rmtjax[atari]'")
    pytest.importorskip("cv2", reason="the image env of this test is real Atari: pip install 'rmtjax[atari]'")
    from rmtjax.agents import build_agent

    cfg = rmtjax.make_config(algo, "atari:Pong", {
        **SMALL[algo], "agent.torso": "nature_cnn", "agent.hidden": [512], "env.frame_stack": 4, "env.num_envs": 2,
        "train.total_steps": 64, "train.progress": False})
    state = jax.eval_shape(build_agent(cfg).init, jax.random.key(0))  # traced, not compiled
    kernels = sorted(leaf.shape for leaf in jax.tree.leaves(state.params) if leaf.ndim == 4)
    # one conv stack per network: the Q-network (RMT, DQN, PQN), or PPO's actor and its critic
    assert kernels == sorted(PER_STACK * (2 if algo == "ppo" else 1))


def test_ppo_actor_and_critic_pass_gradients_into_their_convolutions():
    from rmtjax.networks import ActorNet, CriticNet

    obs = np.random.default_rng(2).integers(0, 256, (4, 36, 36, 4)).astype(np.uint8)
    actor = ActorNet((16,), "relu", 3, False, 0.0, jnp.float32, "nature_cnn")
    assert jax.eval_shape(actor.apply, jax.eval_shape(actor.init, jax.random.key(0), obs), obs)[0].shape == (4, 3)
    critic = CriticNet((16,), "relu", jnp.float32, "nature_cnn")
    params = random_params(critic, obs)
    grads = jax.jit(jax.grad(lambda p: jnp.sum(critic.apply(p, obs) ** 2)))(params)["params"]
    for conv in ("Conv_0", "Conv_1", "Conv_2"):
        assert float(jnp.abs(grads["NatureCNN_0"][conv]["kernel"]).sum()) > 0, conv


def test_nature_cnn_on_small_or_flat_observations_is_a_config_error():
    with pytest.raises(ConfigError, match=r"agent\.torso: 'nature_cnn' needs images of at least 36×36.*10×10"):
        rmtjax.make_config("dqn", "Breakout-MinAtar", {"agent.torso": "nature_cnn"})
    with pytest.raises(ConfigError, match=r"agent\.torso: 'nature_cnn' needs image observations \[H, W, C\]"):
        rmtjax.make_config("ppo", "CartPole-v1", {"agent.torso": "nature_cnn"})
