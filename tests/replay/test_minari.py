"""Demonstrations from a Minari dataset (`agent.demonstrations: minari:<id>`, the minari extra):
a dataset recorded here from gymnasium's CartPole, read back as transitions and trained on."""

import warnings

import gymnasium as gym
import jax
import numpy as np
import pytest

import rmtjax
from rmtjax.agents import build_agent
from rmtjax.config import ConfigError
from rmtjax.replay import demonstrations as demo_io

minari = pytest.importorskip("minari", reason="the minari extra is not installed")

DATASET = "cartpole/scripted-v0"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A Minari dataset of 3 CartPole episodes (one cut by a 40-step time limit) in a private
    datasets directory, and the transitions as recorded step by step beside it."""
    root = tmp_path_factory.mktemp("minari")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINARI_DATASETS_PATH", str(root))
        env = minari.DataCollector(gym.make("CartPole-v1", max_episode_steps=40))
        rows = {k: [] for k in demo_io.KEYS}
        for episode in range(3):
            obs, _ = env.reset(seed=episode)
            done = False
            while not done:
                action = int(obs[2] > 0) if episode != 1 else int(obs[3] > 0)  # two scripted policies
                next_obs, reward, term, trunc, _ = env.step(action)
                for k, v in zip(demo_io.KEYS, (obs, action, reward, term, trunc, next_obs)):
                    rows[k].append(v)
                obs, done = next_obs, term or trunc
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # minari's advice to name an author, a permalink, ...
            env.create_dataset(dataset_id=DATASET, algorithm_name="scripted")
        yield root, {k: np.asarray(v) for k, v in rows.items()}


def test_a_dataset_reads_back_as_the_transitions_that_were_recorded(recorded, monkeypatch):
    root, rows = recorded
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    data = demo_io.from_minari(DATASET)
    assert data["obs"].shape == rows["obs"].shape == data["next_obs"].shape
    for k in demo_io.KEYS:
        np.testing.assert_allclose(data[k].astype(np.float64), rows[k].astype(np.float64), rtol=1e-6)
    assert data["truncated"].sum() >= 1 and data["terminated"].sum() >= 1  # both ways an episode ends
    assert not (data["terminated"] & data["truncated"]).any()


def test_training_takes_its_scheduled_share_from_a_minari_dataset(recorded, monkeypatch):
    root, rows = recorded
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    cfg = rmtjax.make_config("rmt", "CartPole-v1", {
        "train.total_steps": 2048, "train.num_seeds": 1, "train.progress": False, "env.num_envs": 4,
        "agent.rollout_len": 4, "agent.updates_per_step": 0.25, "agent.batch_size": 32, "agent.buffer_size": 512,
        "agent.learning_starts": 256, "agent.hidden": [16, 16], "agent.demonstrations": f"minari:{DATASET}",
        "agent.demo_share": 0.25, "agent.demo_share_end": 0.25})
    agent = build_agent(cfg)
    np.testing.assert_allclose(np.asarray(agent.replay.demos["obs"])[: len(rows["obs"])], rows["obs"], rtol=1e-6)
    result = rmtjax.train(cfg, jax.random.key(0))
    share = np.asarray(result.metrics["demo_share"])[0]
    assert (share[agent.first_learning_iteration:] == 0.25).all()  # 8 of each minibatch's 32 rows
    assert np.isfinite(np.asarray(result.metrics["loss"])).all()


def test_a_dataset_that_is_not_here_or_does_not_fit_the_env_is_refused(recorded, monkeypatch):
    root, _ = recorded
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    with pytest.raises(ConfigError, match=r"minari:cartpole/nothere-v0: no such dataset .*minari download"):
        demo_io.from_minari("cartpole/nothere-v0")
    with pytest.raises(ConfigError, match=r"'obs' rows are \[4\], this env's observations are \[6\]"):
        build_agent(rmtjax.make_config("rmt", "Acrobot-v1", {"agent.demonstrations": f"minari:{DATASET}"})).replay.demos
