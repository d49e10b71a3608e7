"""Demonstrations in replay (issue 23): loading and checking, the scheduled share of each
minibatch, the replay's write-back leaving demonstration rows alone, the large-margin loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rmtjax
from rmtjax.agents import build_agent
from rmtjax.config import ConfigError
from rmtjax.replay import make_replay
from rmtjax.replay import demonstrations as demo_io

N = 64


def _write(path, n=N, **changes):
    rng = np.random.default_rng(0)
    obs = (1000.0 + np.arange(n, dtype=np.float32))[:, None] * np.ones((1, 4), np.float32)  # recognisable rows
    arrays = dict(obs=obs, action=rng.integers(0, 2, n), reward=np.ones(n, np.float32), terminated=np.zeros(n, bool),
                  truncated=np.zeros(n, bool), next_obs=obs + 0.5)
    arrays.update(changes)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def _config(path, **sets):
    return rmtjax.make_config("rmt", "CartPole-v1", {
        "train.total_steps": 4096, "train.num_seeds": 1, "train.progress": False, "env.num_envs": 4,
        "agent.rollout_len": 4, "agent.updates_per_step": 0.25, "agent.batch_size": 32, "agent.buffer_size": 512,
        "agent.learning_starts": 256, "agent.hidden": [16, 16], "agent.demonstrations": str(path), **sets})


@pytest.mark.parametrize("change, message", [
    ({"action": None}, "missing action"),
    ({"obs": np.zeros((N, 5), np.float32)}, r"'obs' rows are \[5\], this env's observations are \[4\]"),
    ({"action": np.full(N, 2)}, r"actions 0..1"),
    ({"action": np.zeros(N, np.float32)}, "must be .* integers"),
    ({"reward": np.ones(N - 1)}, "'reward' has shape"),
    ({"next_obs": np.full((N, 4), np.nan, np.float32)}, "'next_obs' holds non-finite"),
    ({"terminated": np.full(N, 3)}, "'terminated' must be"),
])
def test_a_bad_demonstration_file_is_refused_naming_the_key_and_what_is_wrong(tmp_path, change, message):
    arrays = {k: v for k, v in change.items() if v is not None}
    path = tmp_path / "demos.npz"
    _write(path, **arrays)
    if change.get("action", 0) is None:  # drop the key altogether
        with np.load(path) as z:
            kept = {k: z[k] for k in z.files if k != "action"}
        np.savez(path, **kept)
    cfg = _config(path)  # reading the config touches no file: the file is read when training starts
    with pytest.raises(ConfigError, match=rf"agent\.demonstrations: .*demos\.npz: .*{message}"):
        build_agent(cfg).replay.demos  # read when training starts


def test_a_missing_file_and_normalised_envs_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="agent.demonstrations: .*nothere.npz: no such file"):
        build_agent(_config(tmp_path / "nothere.npz")).replay.demos
    with pytest.raises(ConfigError, match="env.normalize_obs is on"):
        _config(_write(tmp_path / "d.npz"), **{"env.normalize_obs": True})


def test_the_minibatch_takes_exactly_the_scheduled_rows_from_the_demonstrations(tmp_path):
    agent = build_agent(_config(_write(tmp_path / "d.npz"), **{"agent.demo_share": 0.5, "agent.demo_share_end": 0.0,
                                                                "agent.demo_decay_frac": 0.5,
                                                                "agent.replay": "uniform"}))
    mixer = agent.replay
    assert mixer.max_rows == 16
    example = jax.tree.map(lambda v: jnp.zeros(v.shape[1:], v.dtype), mixer.demos)
    state = mixer.add(mixer.init(example), jax.tree.map(lambda v: jnp.zeros((32,) + v.shape[1:], v.dtype), mixer.demos))
    for rows, progress in ((0, 0.5), (5, 0.5 * (1 - 5 / 16)), (16, 0.0)):
        mixed, info = mixer.sample(state, jax.random.key(rows), 32, 0.4, progress=jnp.float32(progress))
        is_demo, w = info.is_demo, info.weight
        assert int(is_demo.sum()) == rows
        obs = np.asarray(mixed["obs"])
        # demonstration rows hold demonstration obs (>= 1000), the others the replay's zeros
        assert (obs[np.asarray(is_demo)] >= 1000).all() and (obs[~np.asarray(is_demo)] == 0).all()
        np.testing.assert_array_equal(np.asarray(w), np.ones(32, np.float32))  # uniform rows weigh 1 too
        np.testing.assert_array_equal(np.asarray(mixed["steps"])[np.asarray(is_demo)], 1)


def test_training_draws_the_scheduled_share_and_decays_it(tmp_path):
    cfg = _config(_write(tmp_path / "d.npz"), **{"agent.demo_share": 0.5, "agent.demo_share_end": 0.125,
                                                  "agent.demo_decay_frac": 0.5, "agent.demo_margin": 1.0})
    result = rmtjax.train(cfg, jax.random.key(0))
    agent = build_agent(cfg)
    share = np.asarray(result.metrics["demo_share"])[0]
    t = np.arange(share.shape[0])
    learning = t >= agent.first_learning_iteration
    progress = t / agent.num_iterations
    expected = 0.5 + np.clip(progress / 0.5, 0, 1) * (0.125 - 0.5)
    expected_rows = np.minimum(np.round(expected.astype(np.float32) * 32), 16) / 32
    np.testing.assert_allclose(share[learning], expected_rows[learning], atol=1e-6)
    assert (share[~learning] == 0).all()
    assert np.isfinite(np.asarray(result.metrics["loss"])).all()


@pytest.mark.parametrize("kind", ["uniform", "tiered", "prioritized", "ranked"])
def test_the_write_back_leaves_the_rows_it_is_told_to_keep_out(kind):
    replay = make_replay(kind, capacity=64)
    example = {"x": jnp.zeros((2,))}
    state = replay.init(example)
    state = jax.jit(replay.add)(state, {"x": jnp.arange(128.0).reshape(64, 2)}, jnp.linspace(0.1, 1.0, 64))
    _, info = jax.jit(replay.sample, static_argnums=2)(state, jax.random.key(0), 16, 0.4)
    new_td = jnp.full((16,), 50.0)
    update = jax.jit(replay.update)
    none_kept = update(state, info, new_td, jnp.zeros((16,), bool))
    for a, b in zip(jax.tree.leaves(none_kept), jax.tree.leaves(state)):
        if kind not in ("tiered", "ranked"):  # ranked counts updates since its last re-ranking  # the tiered buffer's thresholds track the batch even when no item is written
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if kind == "tiered":
        np.testing.assert_array_equal(np.asarray(none_kept.abs_td_error), np.asarray(state.abs_td_error))
        np.testing.assert_array_equal(np.asarray(none_kept.uid), np.asarray(state.uid))
    all_kept = update(state, info, new_td, jnp.ones((16,), bool))
    stored = {"tiered": lambda s: s.abs_td_error, "ranked": lambda s: s.td}.get(kind, lambda s: s.data["td"])(all_kept)
    if kind == "ranked":
        np.testing.assert_array_equal(np.asarray(none_kept.td), np.asarray(state.td))
    drawn = info.uid if kind == "tiered" else info.slot  # tiered items may move rows: count them by id
    assert int((np.asarray(stored) == 50.0).sum()) == len(set(np.asarray(drawn).tolist()))


def test_the_margin_loss_is_zero_when_the_demonstrated_action_leads_by_the_margin(tmp_path):
    from rmtjax.replay.mixer import margin_loss

    q_all = jnp.array([[2.0, 1.0], [2.0, 1.5], [0.0, 3.0]])
    action = jnp.array([0, 0, 0])
    is_demo = jnp.array([True, True, False])
    # row 0 leads by 1.0 >= 0.8: 0; row 1 leads by 0.5: 0.8 - 0.5 = 0.3; row 2 is not a demonstration
    np.testing.assert_allclose(float(margin_loss(q_all, action, is_demo, 0.8)), (0.0 + 0.3) / 2, rtol=1e-6)
    np.testing.assert_allclose(float(margin_loss(q_all, action, jnp.zeros(3, bool), 0.8)), 0.0)


def test_pretraining_on_demonstrations_imitates_them_before_the_first_env_step(tmp_path):
    """DQfD's pre-training with the margin loss: after `demo_pretrain` steps on demonstrations of a
    scripted CartPole policy the greedy policy takes the demonstrated action on nearly every
    demonstrated state; without pre-training the initial state is the same as before the option
    existed (no key of the run is consumed)."""
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(512, 4)).astype(np.float32)
    action = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)  # push toward the pole's lean
    path = _write(tmp_path / "d.npz", n=512, obs=obs, action=action, next_obs=obs,
                  reward=np.ones(512, np.float32))
    plain = build_agent(_config(path, **{"agent.demo_margin": 1.0}))
    trained = build_agent(_config(path, **{"agent.demo_margin": 1.0, "agent.demo_pretrain": 300}))
    key = jax.random.key(3)
    before, after = jax.jit(plain.init)(key), jax.jit(trained.init)(key)
    agree = lambda params: float(np.mean(np.asarray(plain.act(params, jnp.asarray(obs))) == action))  # noqa: E731
    assert agree(after.params) > 0.9
    assert agree(before.params) < 0.75  # an untrained network does not already play the script
    # the pre-training leaves the run's own random streams alone
    assert (np.asarray(jax.random.key_data(after.key)) == np.asarray(jax.random.key_data(before.key))).all()
    np.testing.assert_array_equal(np.asarray(after.obs), np.asarray(before.obs))
    with pytest.raises(ConfigError, match="agent.demo_pretrain: 10 steps on demonstrations, but"):
        rmtjax.make_config("rmt", "CartPole-v1", {"agent.demo_pretrain": 10})
