"""Real Atari through ale-py (`atari:<Game>`): the standard preprocessing, stepped on the host,
checked against the same ALE env stepped by hand; DQN trains on it through the Nature CNN."""

import functools

import jax
import numpy as np
import pytest

pytest.importorskip("ale_py", reason="atari: ids need the atari extra: pip install 'rmtjax[atari]'")
pytest.importorskip("cv2", reason="gymnasium's AtariPreprocessing needs OpenCV: pip install 'rmtjax[atari]'")

import gymnasium as gym  # noqa: E402

import rmtjax  # noqa: E402
from rmtjax.config import ConfigError, EnvConfig  # noqa: E402
from rmtjax.envs import make_env  # noqa: E402

from .test_gymnasium import rollout  # noqa: E402

# 760 emulator frames = 190 agent steps: random Breakout loses its 5 lives in 130-260 steps, so
# with these keys one env's games are lost (terminated) and the other's run into the time limit
LIMIT = {"max_num_frames_per_episode": 760}
STEPS = 400


def reference_env():
    """ALE/Breakout-v5 with the preprocessing the adapter promises, built here from its parts."""
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing

    gym.register_envs(ale_py)
    raw = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.25, full_action_space=False,
                   render_mode="rgb_array", **LIMIT)
    return AtariPreprocessing(raw, noop_max=0, frame_skip=4, screen_size=84, terminal_on_life_loss=False,
                              grayscale_obs=True, grayscale_newaxis=True, scale_obs=False)


@pytest.fixture(scope="module")
def breakout():
    env = make_env(EnvConfig(id="atari:Breakout", num_envs=2, params=LIMIT, reward_clip=1.0, reward_scale=0.5))
    key = jax.random.key(3)
    obs0, traj, state = rollout(env, STEPS, key)
    seeds = np.asarray(jax.random.bits(key, (2,), np.uint32))
    ref = {k: np.zeros_like(traj[k]) for k in ("next_obs", "final_obs", "raw_reward", "term", "trunc")}
    ref_obs0, screens = [], []
    for e in range(2):
        r_env = reference_env()
        obs, _ = r_env.reset(seed=int(seeds[e]))
        ref_obs0.append(obs)
        for t in range(STEPS):
            obs, r, term, trunc, _ = r_env.step(int(traj["action"][t, e]))
            ref["final_obs"][t, e], ref["raw_reward"][t, e] = obs, r
            ref["term"][t, e], ref["trunc"][t, e] = term, trunc
            if term or trunc:
                obs, _ = r_env.reset()
            ref["next_obs"][t, e] = obs
        screens.append(r_env.unwrapped.ale.getScreenRGB())
    return env, obs0, traj, state, np.stack(ref_obs0), ref, screens


def test_observations_are_84x84_grey_frames_of_the_preprocessed_game(breakout):
    env, obs0, traj, _, ref_obs0, ref, _ = breakout
    assert env.spec.obs_shape == (84, 84, 1) and env.spec.obs_dtype == np.uint8 and env.spec.num_actions == 4
    np.testing.assert_array_equal(obs0, ref_obs0)
    np.testing.assert_array_equal(traj["next_obs"], ref["next_obs"])
    np.testing.assert_array_equal(traj["final_obs"], ref["final_obs"])


def test_rewards_are_the_game_score_and_clipped_only_for_learning(breakout):
    _, _, traj, state, _, ref, _ = breakout
    np.testing.assert_array_equal(traj["raw_reward"], ref["raw_reward"])
    assert traj["raw_reward"].sum() > 0  # bricks were hit
    np.testing.assert_array_equal(traj["reward"], np.clip(ref["raw_reward"] * 0.5, -1, 1))
    for e in range(2):  # the logged return of each env's last finished episode is its raw score
        ends = np.concatenate([[-1], np.flatnonzero(traj["done"][:, e])])
        assert len(ends) >= 2
        assert float(state.last_return[e]) == pytest.approx(traj["raw_reward"][ends[-2] + 1: ends[-1] + 1, e].sum())


def test_lost_games_terminate_and_the_frame_limit_truncates(breakout):
    _, _, traj, state, _, ref, _ = breakout
    np.testing.assert_array_equal(traj["term"], ref["term"])
    np.testing.assert_array_equal(traj["trunc"], ref["trunc"] & ~ref["term"])
    assert traj["term"].any() and traj["trunc"].any()
    assert np.all(np.asarray(state.episodes_done) == traj["done"].sum(0))
    assert np.all(np.asarray(state.last_length) <= 190)


def test_render_returns_the_current_colour_screen(breakout):
    env, _, _, state, _, _, screens = breakout
    for e in range(2):
        frame = env.render(state, e)
        assert frame.shape == (210, 160, 3) and frame.dtype == np.uint8
        np.testing.assert_array_equal(frame, screens[e])


def test_dqn_trains_on_breakout_through_the_nature_cnn_with_stacked_frames():
    cfg = rmtjax.make_config("dqn", "atari:Breakout", {
        "env.params": {"max_num_frames_per_episode": 40}, "env.frame_stack": 4, "env.reward_clip": 1.0,
        "env.num_envs": 2, "agent.torso": "nature_cnn", "agent.hidden": [32], "agent.rollout_len": 4,
        "agent.learning_starts": 16, "agent.batch_size": 8, "agent.buffer_size": 64, "train.total_steps": 48,
        "train.num_chunks": 1, "train.progress": False})
    result = rmtjax.train(cfg, jax.random.key(0))
    m = result.metrics
    assert np.all(np.isfinite(m["loss"])) and m["loss"][0, -1] > 0
    # 40 frames = 10 agent steps: every episode is truncated at 10 steps (or lost sooner), so
    # each env's 24 steps end at least 2 episodes
    assert m["episode_count"].sum() >= 2 * 2
    assert 1 <= m["episode_length"][0, -1] <= 10
    obs = result.state.obs
    assert obs.shape == (1, 2, 84, 84, 4) and obs.dtype == np.uint8


def test_unknown_game_and_parameter_are_config_errors():
    with pytest.raises(ConfigError, match=r"atari has no environment 'Breakot'.*Breakout"):
        EnvConfig(id="atari:Breakot")
    with pytest.raises(ConfigError, match=r"env\.params\.frameskip: atari ids take"):
        make_env(EnvConfig(id="atari:Pong", params={"frameskip": 4}))
