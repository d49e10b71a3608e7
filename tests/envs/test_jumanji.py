"""The Jumanji adapter (`jumanji:<id>`), checked against jumanji's own reset/step."""

import jax
import numpy as np
import pytest

jumanji = pytest.importorskip("jumanji", reason="jumanji: ids need the jumanji extra: pip install 'rmtjax[jumanji]'")

import rmtjax  # noqa: E402
from rmtjax.config import ConfigError, EnvConfig  # noqa: E402
from rmtjax.envs import make_env  # noqa: E402
from rmtjax.envs.jumanji_env import flatten_observation  # noqa: E402

from .suites import assert_steps_match, assert_ends_match, episode_recount, replay, rollout  # noqa: E402

# an 8×8 board: a random snake runs into a wall or itself within about 10 steps, or meets the time limit
SNAKE = {"num_rows": 8, "num_cols": 8, "time_limit": 10}


@pytest.fixture(scope="module")
def snake():
    env = make_env(EnvConfig(id="jumanji:Snake-v1", num_envs=3, params=SNAKE))
    key = jax.random.key(0)
    obs0, traj, state = rollout(env, 80, key)
    own = jumanji.make("Snake-v1", **SNAKE)
    reset = jax.jit(lambda k: (lambda s, ts: (flatten_observation(ts.observation), s))(*own.reset(jax.random.key_data(k))))

    @jax.jit
    def step(k, s, a):
        s, ts = own.step(s, a)
        # dm_env's convention, which jumanji keeps: the last step of an episode has discount 0
        # when the episode terminated, 1 when it was cut by the time limit
        return flatten_observation(ts.observation), s, ts.reward, ts.last() & (ts.discount == 0), \
            ts.last() & (ts.discount > 0)

    ref_obs0, ref = replay(key, 3, traj, reset, step)
    return env, obs0, traj, state, ref_obs0, ref


def test_observation_is_every_field_flattened():
    env = make_env(EnvConfig(id="jumanji:Snake-v1", num_envs=1, params=SNAKE))
    # grid 6×6×5, step count, action mask of 4
    assert env.spec.obs_shape == (8 * 8 * 5 + 1 + 4,) and env.spec.num_actions == 4
    assert env.spec.max_episode_steps == 10


def test_steps_match_jumanji_run_by_hand(snake):
    _, obs0, traj, _, ref_obs0, ref = snake
    np.testing.assert_array_equal(obs0, ref_obs0)
    assert_steps_match(traj, ref, rtol=1e-6)


def test_episode_ends_are_what_jumanji_reports(snake):
    _, _, traj, _, _, ref = snake
    assert_ends_match(traj, ref)
    # Snake ends an episode at its time limit with discount 0 (its observation holds the step
    # count, so the limit is part of the task): a termination, as jumanji reports it
    assert traj["term"].any() and not traj["trunc"].any()
    lengths = [np.diff(np.concatenate([[-1], np.flatnonzero(traj["done"][:, e])])) for e in range(3)]
    assert 10 in np.concatenate(lengths) and np.concatenate(lengths).max() == 10


def test_episode_statistics_recount_the_raw_rewards(snake):
    _, _, traj, state, _, _ = snake
    episode_recount(traj, state, 3)


def test_render_returns_the_viewer_frame(snake):
    env, _, _, state, _, _ = snake
    frame = env.render(state, 0)
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3 and min(frame.shape[:2]) >= 100


def test_dqn_trains_on_jumanji():
    cfg = rmtjax.make_config("dqn", "jumanji:Snake-v1", {
        "env.params": SNAKE, "train.total_steps": 256, "train.num_chunks": 1, "train.progress": False,
        "agent.learning_starts": 64, "agent.batch_size": 16, "agent.buffer_size": 256, "agent.hidden": [32]})
    m = rmtjax.train(cfg, jax.random.key(0)).metrics
    assert np.all(np.isfinite(m["loss"])) and m["loss"][0, -1] > 0
    assert np.all(m["episode_count"].sum(1) >= 4 * 64 // 10)
    assert np.all((m["episode_length"][:, 4:] >= 1) & (m["episode_length"][:, 4:] <= 10))


def test_unsupported_action_spec_and_bad_argument_are_config_errors():
    with pytest.raises(ConfigError, match=r"jumanji:BinPack-v2 has actions MultiDiscreteArray.*only one discrete"):
        make_env(EnvConfig(id="jumanji:BinPack-v2"))
    with pytest.raises(ConfigError, match=r"env\.params: jumanji env 'Snake-v1' does not take"):
        make_env(EnvConfig(id="jumanji:Snake-v1", params={"rows": 3}))
