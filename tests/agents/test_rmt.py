import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rmtjax
from rmtjax.agents import build_agent
from rmtjax.agents import qlearn
from rmtjax.agents.qlearn import NStepWindow


def agent_for(algo="rmt", env="CartPole-v1", **extra):
    cfg = rmtjax.make_config(algo, env, {"train.total_steps": 2000, "train.progress": False, "agent.n_step": 3,
                                         "env.num_envs": 4, "agent.rollout_len": 4, "agent.updates_per_step": 0.25,
                                         "agent.hidden": [16, 16], "agent.buffer_size": 2000, "agent.batch_size": 8,
                                         **extra})
    return build_agent(cfg)


def window(done_rows, term_rows, n=3):
    N = len(done_rows)
    obs = jnp.arange(N * n * 4, dtype=jnp.float32).reshape(N, n, 4)
    return NStepWindow(obs=obs, action=jnp.tile(jnp.arange(n), (N, 1)), reward=jnp.tile(jnp.array([1.0, 2.0, 4.0]), (N, 1)),
                       terminated=jnp.array(term_rows), done=jnp.array(done_rows), next_obs=obs + 1000.0)


def test_nstep_emission_cuts_at_the_first_episode_end():
    w = window([[False, False, False], [False, True, False], [True, False, True]],
               [[False, False, False], [False, True, False], [False, False, True]])
    out = jax.device_get(qlearn.emit(w))
    np.testing.assert_array_equal(out["steps"], [3, 2, 1])
    np.testing.assert_array_equal(out["rewards"], [[1, 2, 4], [1, 2, 0], [1, 0, 0]])
    np.testing.assert_array_equal(out["terminated"], [False, True, False])  # row 2 ended by truncation at k=0
    np.testing.assert_allclose(out["boot_obs"][0], w.next_obs[0, 2])
    np.testing.assert_allclose(out["boot_obs"][1], w.next_obs[1, 1])
    np.testing.assert_allclose(out["boot_obs"][2], w.next_obs[2, 0])
    np.testing.assert_allclose(out["obs"], w.obs[:, 0])


def test_targets_bootstrap_through_truncation_but_not_termination():
    agent = agent_for()
    params = agent.net.init(jax.random.key(0), jnp.zeros((1, 4)))
    w = window([[False, False, False], [False, True, False], [False, True, False]],
               [[False, False, False], [False, True, False], [False, False, False]])
    batch = qlearn.emit(w)
    gamma = 0.9
    q_next = agent.q_values(params, batch["boot_obs"])
    td, q = qlearn.nstep_td(agent.q_values(params, batch["obs"]), q_next, q_next, batch, gamma)
    y = np.asarray(td + q)
    q_next = np.asarray(agent.q_values(params, batch["boot_obs"]))
    boot = q_next[np.arange(3), q_next.argmax(-1)]  # double-Q with online == target params
    np.testing.assert_allclose(y[0], 1 + 2 * 0.9 + 4 * 0.81 + 0.9**3 * boot[0], rtol=1e-5)
    np.testing.assert_allclose(y[1], 1 + 2 * 0.9, rtol=1e-5)  # terminal: no bootstrap
    np.testing.assert_allclose(y[2], 1 + 2 * 0.9 + 0.81 * boot[2], rtol=1e-5)  # truncated: bootstrap


def test_per_dimension_heads_map_bins_to_the_action_box():
    agent = agent_for(env="Pendulum-v1", **{"agent.bins": 5})
    bins = jnp.array([[0], [2], [4]])
    np.testing.assert_allclose(np.asarray(agent.env_action(bins))[:, 0], [-2.0, 0.0, 2.0])
    q = jnp.arange(2 * 1 * 5, dtype=jnp.float32).reshape(2, 1, 5)
    np.testing.assert_allclose(qlearn.q_of(q, jnp.array([[1], [3]])), [1.0, 8.0])


def test_per_dimension_q_is_the_mean_over_dimensions():
    q = jnp.array([[[0.0, 1.0], [10.0, 20.0]]])  # one state, two dims, two bins
    np.testing.assert_allclose(qlearn.q_of(q, jnp.array([[1, 0]])), [(1.0 + 10.0) / 2])


def test_dqn_is_its_own_plain_agent():
    from rmtjax.agents.dqn import DQN
    from rmtjax.agents.rmt import RMT
    from rmtjax.replay import UniformReplay

    agent = agent_for("dqn")
    assert not isinstance(agent, RMT) and isinstance(agent, DQN)
    assert isinstance(agent.replay, UniformReplay) and agent.cfg.torso == "mlp" and agent.cfg.n_step == 3
    params = agent.net.init(jax.random.key(0), jnp.zeros((1, 4)))["params"]
    assert set(params["head"]) == {"Dense_0"} and not any("LayerNorm" in k for k in params["torso"])  # no dueling, no LN
    with pytest.raises(rmtjax.ConfigError, match="dqn needs discrete actions"):
        rmtjax.make_config("dqn", "Pendulum-v1")


def test_one_iteration_stores_transitions_and_counts_steps():
    agent = agent_for(**{"agent.replay": "uniform", "agent.learning_starts": 0})
    state = agent.init(jax.random.key(0))
    assert agent.initial_env_steps == 4 * 2  # the n-1 random steps that fill the window
    state2, m = jax.jit(agent.step)(state, 0)
    assert int(state2.replay.size) == 4 * 4  # num_envs × rollout_len new transitions
    assert int(m["env_steps"]) == 8 + 16
    assert float(m["loss"]) > 0 and np.isfinite(float(m["grad_norm"]))
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state.params, state2.params)
    assert any(jax.tree.leaves(changed))


@pytest.mark.parametrize("replay", ["tiered", "ranked", "uniform", "prioritized"])
def test_a_write_back_changes_the_drawn_items_priorities(replay):
    from rmtjax.replay import make_replay

    buf = make_replay(replay, 64)
    example = {"obs": jnp.zeros(3), "action": jnp.int32(0)}
    state = buf.init(example)
    items = {"obs": jnp.arange(90.0).reshape(30, 3), "action": jnp.arange(30, dtype=jnp.int32)}
    state = buf.add(state, items, jnp.linspace(0.01, 3.0, 30))
    _, info = buf.sample(state, jax.random.key(1), 16, 0.5)
    moved = buf.update(state, info, jnp.full((16,), 50.0))  # moves every drawn item to the hot tier
    changed = [bool(jnp.any(a != b)) for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(moved))]
    assert any(changed)
    # no item is lost or altered: the ring and the sum-tree keep every item in its slot, the
    # tiered stores move the drawn items into the hot tier's rows (demoting hot's oldest)
    if replay == "tiered":
        from rmtjax.replay import tiered

        def items(s):
            obs = np.asarray(s.data["obs"])[np.asarray(tiered.live(s))]
            return obs[np.lexsort(obs.T)]

        np.testing.assert_array_equal(items(state), items(moved))
        assert not np.array_equal(np.asarray(state.uid), np.asarray(moved.uid))  # items changed rows
    else:
        for a, b in zip(jax.tree.leaves(state.data), jax.tree.leaves(moved.data)):
            if a.shape[1:] == (3,):
                np.testing.assert_array_equal(a, b)


def test_before_learning_starts_the_seeds_store_but_do_not_learn():
    # the clock `t` is shared by the seeds, so under vmap this is a real branch
    agent = agent_for(**{"agent.learning_starts": 40})
    assert agent.first_learning_iteration == 1  # 8 env steps at init, 16 per iteration: 40 after iteration 1
    state = jax.vmap(agent.init)(jax.random.split(jax.random.key(0), 2))  # 8 env steps per seed
    step = jax.jit(jax.vmap(agent.step, in_axes=(0, None)))
    s1, m1 = step(state, 0)  # 24 env steps < 40: stores, no update
    for a, b in zip(jax.tree.leaves((state.params, state.opt_state, state.target_params)),
                    jax.tree.leaves((s1.params, s1.opt_state, s1.target_params))):
        np.testing.assert_array_equal(a, b)
    assert np.all(np.asarray(m1["loss"]) == 0) and np.all(np.asarray(m1["grad_norm"]) == 0)
    np.testing.assert_array_equal(m1["env_steps"], [24, 24])
    assert np.all(np.asarray(m1["replay_size"]) == 16)  # 4 envs × 4 steps stored per seed
    s2, m2 = step(s1, 1)  # 40 env steps: learning
    assert np.all(np.asarray(m2["loss"]) > 0)
    moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state.params, s2.params)
    assert all(jax.tree.leaves(moved))


def test_eps_hold_keeps_exploratory_actions_for_several_steps():
    with pytest.raises(rmtjax.ConfigError, match="agent.eps_hold"):
        rmtjax.make_config("rmt", "Pendulum-v1", {"agent.eps_hold": 0})
    agent = agent_for(env="Pendulum-v1", **{"agent.bins": 3, "agent.eps_hold": 8, "agent.learning_starts": 10_000})
    state = agent.init(jax.random.key(0))
    assert state.hold.left.shape == (agent.config.env.num_envs, 1) and not np.asarray(state.hold.left).any()
    state, m = jax.jit(agent.step)(state, 0)  # ε = 1 at the start: every env is exploring
    left = np.asarray(state.hold.left)
    assert left.max() <= 7 and float(m["explore_frac"]) == 1.0
    actions = np.asarray(state.window.action)[:, -1]  # the last action each env took
    np.testing.assert_array_equal(np.asarray(state.hold.action)[left > 0], actions[left > 0])


def test_learning_rate_decays_linearly_to_its_end_share():
    cfg = rmtjax.make_config("rmt", "CartPole-v1", {
        "train.total_steps": 640, "train.progress": False, "agent.hidden": [8, 8], "agent.buffer_size": 400, "agent.replay": "uniform",
        "env.num_envs": 4, "agent.rollout_len": 4,
        "agent.batch_size": 8, "agent.learning_starts": 0, "agent.lr": 1e-3, "agent.lr_end_frac": 0.1})
    lr = rmtjax.train(cfg, jax.random.key(0)).metrics["lr_in_force"][0]  # 640 / (4 envs × 4 steps) = 40 iterations
    progress = np.arange(40) / 40
    np.testing.assert_allclose(lr, 1e-3 * (1 - 0.9 * progress), rtol=1e-5)


def test_config_rejects_tier_shares_that_do_not_sum_to_one():
    with pytest.raises(rmtjax.ConfigError, match="tier_proportions.*summing to 1"):
        rmtjax.make_config("rmt", "CartPole-v1", {"agent.tier_proportions": [0.5, 0.5, 0.5]})


def test_cnn_torso_needs_images():
    with pytest.raises(rmtjax.ConfigError, match="'cnn' needs image observations"):
        rmtjax.make_config("rmt", "CartPole-v1", {"agent.torso": "cnn"})


@pytest.mark.slow
def test_rmt_with_tiered_replay_learns_cartpole(tmp_path, capsys):
    cfg = rmtjax.make_config("rmt", "CartPole-v1", {"train.total_steps": 20_000, "train.progress": False,
                                                    "train.num_chunks": 2})
    result = rmtjax.train(cfg, jax.random.key(0), run_dir=tmp_path / "run")
    # random play scores about 22
    assert result.final_return[0] > 100, result.final_return
    m = result.metrics
    # the tiers are in use and the minibatches draw from all three
    assert m["hot_size"][0, -1] > 0 and m["warm_size"][0, -1] > 0 and m["cold_size"][0, -1] > 0
    assert m["hot_share"][0, -1] > 0.1 and m["cold_share"][0, -1] > 0.1
    assert np.all(np.isfinite(m["td_error_ema"]))
    from tests.helpers import assert_no_doctor_findings

    assert_no_doctor_findings(result, capsys)  # a healthy run of every agent: no training doctor finding


def test_uniform_replay_computes_no_td_at_insertion_and_the_top_share_is_periodic():
    cfg = rmtjax.make_config("rmt", "CartPole-v1", {"train.total_steps": 1600, "train.progress": False,
                                                    "agent.hidden": [8], "agent.learning_starts": 0, "env.num_envs": 10,
                                                    "agent.rollout_len": 1, "agent.replay": "uniform",
                                                    "agent.batch_size": 8, "agent.diagnostics_every": 10})
    agent = build_agent(cfg)
    assert not agent.replay.needs_td
    result = rmtjax.train(cfg, jax.random.key(0))
    assert "td_new_abs" not in result.metrics  # no TD error was computed for new transitions
    share = result.metrics["top_td_share"][0]  # 160 iterations (10 envs), recomputed at 0, 10, 20, ...
    assert len(share) == 160
    for start in range(0, 100, 10):
        assert (share[start:start + 10] == share[start]).all()
    assert len(set(share.tolist())) > 1


def test_the_loss_is_the_weighted_huber_or_mean_squared_td_error():
    td, w = jnp.array([0.5, -3.0, 2.0]), jnp.array([1.0, 0.5, 2.0])
    huber = agent_for(**{"agent.huber_delta": 1.0}).cfg
    expected = (1.0 * 0.125 + 0.5 * (3.0 - 0.5) + 2.0 * (2.0 - 0.5)) / 3
    np.testing.assert_allclose(float(qlearn.td_loss(td, w, huber.loss, huber.huber_delta)), expected, rtol=1e-6)
    mse = agent_for("dqn").cfg
    assert mse.loss == "mse"  # DQN's default: the squared TD error, as CleanRL and PureJaxRL
    np.testing.assert_allclose(float(qlearn.td_loss(td, w, mse.loss, 1.0)), (0.25 + 0.5 * 9.0 + 2.0 * 4.0) / 3,
                               rtol=1e-6)


def test_rmsprop_is_the_minatar_papers_centered_variant():
    agent = agent_for("dqn", **{"agent.optimizer": "rmsprop", "agent.lr": 0.1, "agent.max_grad_norm": 0.0})
    state = agent.init(jax.random.key(0))
    B = 8
    k = jax.random.split(jax.random.key(1), 4)
    batch = {"obs": jax.random.normal(k[0], (B, 4)), "action": jax.random.randint(k[1], (B,), 0, 2),
             "rewards": jax.random.normal(k[2], (B, 3)), "steps": jnp.full((B,), 3, jnp.int32),
             "boot_obs": jax.random.normal(k[3], (B, 4)), "terminated": jnp.zeros((B,), bool)}
    out = agent.gradient_step(state.params, state.target_params, state.opt_state, state.precision, batch,
                              jnp.ones(B), jnp.float32(0.99), jnp.float32(0.0))
    def loss(p):
        q_next = agent.q_values(state.target_params, batch["boot_obs"])
        td, _ = qlearn.nstep_td(agent.q_values(p, batch["obs"]), q_next, q_next, batch, 0.99)
        return qlearn.td_loss(td, jnp.ones(B), "mse", 1.0)

    grads = jax.grad(loss)(state.params)
    # one centered RMSProp step from zero moments: g / (sqrt(0.05 g² - (0.05 g)²) + 0.01)
    expected = jax.tree.map(lambda p, g: p - 0.1 * g / (jnp.sqrt(0.05 * g**2 - (0.05 * g) ** 2) + 0.01),
                            state.params, grads)
    for a, b in zip(jax.tree.leaves(out.params), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_new_transitions_enter_the_tiered_replay_fresh_without_a_forward_pass():
    agent = agent_for(**{"agent.learning_starts": 10_000})
    state = agent.init(jax.random.key(0))
    state, m = jax.jit(agent.step)(state, 0)
    td = np.asarray(state.replay.td)
    assert int(m["fresh"]) == 16 and np.isinf(td[:16]).all() and (td[:16] > 0).all()  # +inf: hottest until drawn
    assert np.isneginf(td[16:]).all()  # empty slots


def test_the_fractal_torso_is_convolutional_on_images():
    agent = agent_for(env="Breakout-MinAtar", **{"agent.torso": "fractal", "agent.hidden": [32],
                                                  "agent.learning_starts": 10_000})
    params = agent.net.init(jax.random.key(0), jnp.zeros((1,) + agent.spec.obs_shape))["params"]["torso"]
    block = params["ConvFractalBlock_0"]
    assert block["Conv_0"]["kernel"].shape == (3, 3, 16, 16) and block["Conv_1"]["kernel"].shape == (3, 3, 16, 16)
    assert params["Dense_0"]["kernel"].shape == (10 * 10 * 16, 32)  # padded convolutions keep the 10×10 grid
    q = agent.q_values(agent.net.init(jax.random.key(0), jnp.zeros((2,) + agent.spec.obs_shape)),
                       jnp.ones((2,) + agent.spec.obs_shape))
    assert q.shape == (2, agent.spec.num_actions) and np.isfinite(np.asarray(q)).all()


def test_the_3x3_convolution_as_one_matrix_product_is_the_convolution():
    from flax import linen as nn

    from rmtjax.networks.torsos import Conv3x3

    x = jax.random.normal(jax.random.key(0), (3, 10, 10, 4))
    fast = Conv3x3(16)
    params = fast.init(jax.random.key(1), x)
    params = jax.tree.map(lambda p: p + 0.1, params)  # a non-zero bias too
    reference = nn.Conv(16, (3, 3), padding="SAME").apply(params, x)  # the same parameter names and shapes
    np.testing.assert_allclose(fast.apply(params, x), reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(Conv3x3(16, op=True).apply(params, x), reference, rtol=1e-5, atol=1e-5)
    # an edge pixel sees zero padding: a one-hot input at the corner reaches only its 2×2 neighbourhood
    corner = jnp.zeros((1, 10, 10, 4)).at[0, 0, 0, 0].set(1.0)
    out = np.asarray(fast.apply(params, corner) - fast.apply(params, jnp.zeros_like(corner)))
    assert np.abs(out[0, :2, :2]).min() > 0 and np.abs(out[0, 2:]).max() == 0 and np.abs(out[0, :, 2:]).max() == 0


def test_the_dense_fractal_torso_flattens_images():
    agent = agent_for(env="Breakout-MinAtar", **{"agent.torso": "dense_fractal", "agent.learning_starts": 10_000})
    params = agent.net.init(jax.random.key(0), jnp.zeros((1,) + agent.spec.obs_shape))["params"]["torso"]
    assert params["Dense_0"]["kernel"].shape == (10 * 10 * agent.spec.obs_shape[-1], agent.cfg.hidden[0])
    assert "FractalBlock_0" in params and not any(k.startswith("Conv") for k in params)


def test_the_default_torso_is_one_dense_layer_with_layer_norm():
    cfg = rmtjax.make_config("rmt", "Breakout-MinAtar").agent  # no preset: the agent's own defaults
    assert (cfg.torso, cfg.hidden, cfg.layer_norm) == ("mlp", (64,), True)
    agent = build_agent(rmtjax.make_config("rmt", "Breakout-MinAtar", {"agent.learning_starts": 10_000}))
    params = agent.net.init(jax.random.key(0), jnp.zeros((1,) + agent.spec.obs_shape))["params"]["torso"]
    assert params["Dense_0"]["kernel"].shape == (10 * 10 * agent.spec.obs_shape[-1], 64)
    assert sorted(params) == ["Dense_0", "LayerNorm_0"]
