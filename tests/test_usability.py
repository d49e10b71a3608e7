"""What users of other trainers expect: the config printed and listed, the policy as a function,
an env of their own, videos of the greedy policy, the notebooks out of the package."""

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import rmtjax
from rmtjax.cli import main

REPO = Path(__file__).resolve().parents[1]
SMALL = {"train.total_steps": 2048, "train.num_seeds": 2, "train.num_chunks": 1, "train.progress": False,
         "agent.rollout_len": 64}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("usability") / "run"
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**SMALL, "env.normalize_obs": True})
    rmtjax.train(cfg, jax.random.key(1), run_dir=path)
    return path


# -- the config on the shell --------------------------------------------------------------
def test_print_config_prints_and_exits_without_loading_the_driver(tmp_path):
    code = ("import sys; from rmtjax.cli import main; "
            "rc = main(['train', '--print-config', '--set', 'train.total_steps=1e5', '--run-dir', 'r']); "
            "print('driver loaded:', 'rmtjax.driver' in sys.modules, 'rc:', rc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    cfg = rmtjax.Config.from_dict(__import__("yaml").safe_load(out.stdout.rsplit("driver loaded", 1)[0]))
    assert cfg.train.total_steps == 100_000 and cfg.algo == "ppo"
    assert "driver loaded: False rc: 0" in out.stdout
    assert not (tmp_path / "r").exists()  # nothing trained, no run directory


def test_config_lists_every_field_with_type_default_range_and_doc(capsys):
    from rmtjax.config import TrainConfig
    from rmtjax.agents.sac import SACConfig
    import dataclasses

    assert main(["config", "train"]) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        assert f"  train.{f.name}: " in out, f.name
    assert "  train.total_steps: int = 500000, [1, 2147483647]\n      environment steps per seed" in out
    assert "train.wandb_mode: str = 'auto', one of auto, online, offline" in out
    assert "env." not in out  # only the section asked for
    assert main(["config", "agent", "--algo", "sac"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("agent (sac):")
    assert out.count("\n  agent.") == len(dataclasses.fields(SACConfig))
    assert "agent.gamma: float = 0.99, [0.0, 1.0]" in out.replace("(0.0", "[0.0") or "agent.gamma: float = 0.99" in out
    assert main(["config"]) == 0
    everything = capsys.readouterr().out
    for section in ("env:", "train:", "agent (ppo):", "precision:", "meta:", "curriculum:", "distributed:"):
        assert f"\n{section}" in "\n" + everything, section
    assert main(["config", "trian"]) == 2
    assert "no section 'trian'. Did you mean: train" in capsys.readouterr().err


def test_train_help_points_to_the_config_listing(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "rmtjax config [SECTION]" in " ".join(capsys.readouterr().out.split())


def test_notebooks_are_copied_out_of_the_package(tmp_path, capsys):
    assert main(["notebooks", str(tmp_path / "nb")]) == 0
    names = sorted(p.name for p in (tmp_path / "nb").iterdir())
    assert names == ["01_quickstart.ipynb", "02_sweeps.ipynb", "03_inside_rmt.ipynb"]
    assert (tmp_path / "nb" / "02_sweeps.ipynb").read_bytes() == (REPO / "rmtjax/notebooks/02_sweeps.ipynb").read_bytes()


# -- the policy as a function -------------------------------------------------------------
def test_load_policy_is_the_greedy_policy_with_the_training_normalisation(run_dir):
    result = rmtjax.load_run(run_dir)
    agent = __import__("rmtjax.agents", fromlist=["build_agent"]).build_agent(result.config)
    obs = jax.random.normal(jax.random.key(5), (64, 4)) * jnp.array([1.0, 2.0, 0.2, 2.0])
    for seed in (0, 1):
        policy = rmtjax.load_policy(run_dir, seed=seed)
        params = jax.tree.map(lambda x: x[seed], result.state.params)
        stats = jax.tree.map(lambda x: x[seed], result.state.env_state.obs_stats)
        mean, var = stats.mean, stats.var
        expected = agent.act(params, jnp.clip((obs - mean) / jnp.sqrt(var + 1e-8), -10, 10))
        np.testing.assert_array_equal(np.asarray(policy(obs)), np.asarray(expected))
        assert int(policy(obs[3])) == int(expected[3])  # one observation gives one action
    assert 0 < float(np.asarray(rmtjax.load_policy(run_dir)(obs)).mean()) < 1  # both actions are taken
    with pytest.raises(rmtjax.ConfigError, match=r"seed: expected an integer in \[0, 1\]"):
        result.policy(seed=2)


def test_the_policy_exports_and_runs_through_jax_export_alone(run_dir):
    policy = rmtjax.load_policy(run_dir)
    obs = jax.random.normal(jax.random.key(6), (16, 4))
    blob = jax.export.export(policy)(jax.ShapeDtypeStruct((16, 4), jnp.float32)).serialize()
    restored = jax.export.deserialize(blob)
    np.testing.assert_array_equal(np.asarray(restored.call(obs)), np.asarray(policy(obs)))


# -- an env of the user's own -------------------------------------------------------------
@struct.dataclass
class CountState:
    count: jax.Array
    time: int


@struct.dataclass
class CountParams:
    length: int = 5
    max_steps_in_episode: int = 100


class PickOne:
    """A gymnax-style env: 5 steps, reward 1 for action 1 and 0 for action 0; the observation
    counts down the steps left."""

    @property
    def default_params(self):
        return CountParams()

    def reset(self, key, params):
        state = CountState(jnp.int32(0), 0)
        return self._obs(state, params), state

    def step(self, key, state, action, params):
        after = CountState(state.count + 1, state.time + 1)
        reward = (action == 1).astype(jnp.float32)
        terminated = after.count >= params.length
        final = self._obs(after, params)
        fresh, fresh_obs = CountState(jnp.int32(0), 0), self._obs(CountState(jnp.int32(0), 0), params)
        state = jax.tree.map(lambda a, b: jnp.where(terminated, a, b), fresh, after)
        obs = jnp.where(terminated, fresh_obs, final)
        return obs, state, reward, terminated, jnp.bool_(False), {"final_observation": final}

    def _obs(self, state, params):
        return jnp.array([params.length - state.count], jnp.float32)

    def action_space(self, params=None):
        import gymnax

        return gymnax.environments.spaces.Discrete(2)


def test_an_env_of_the_users_own_trains_by_its_object_or_a_registered_id(capsys):
    cfg = rmtjax.make_config("ppo", PickOne(), {"train.total_steps": 4096, "train.progress": False,
                                                 "agent.rollout_len": 32, "agent.lr": 3e-3})
    assert cfg.env.id == "PickOne" and "PickOne" in rmtjax.envs.registered_envs()
    result = rmtjax.train(cfg, jax.random.key(0))
    np.testing.assert_array_equal(result.metrics["episode_length"][0, 1:], 5.0)  # every episode is 5 steps
    assert result.metrics["episode_return"][0, 0] < 4.0  # it starts random ...
    assert result.final_return[0] == 5.0  # ... and learns to pick 1
    assert rmtjax.evaluate(result, episodes=3).returns.tolist() == [[5.0, 5.0, 5.0]]
    # the same env by a registered id, with its own parameters overridden from the config
    rmtjax.register_env("PickOne-long", PickOne)
    long = rmtjax.make_config("ppo", "PickOne-long", {"env.params.length": 7, "train.total_steps": 512,
                                                      "train.progress": False, "agent.rollout_len": 32})
    assert long.env.params == {"length": 7}
    res = rmtjax.train(long, jax.random.key(0))
    np.testing.assert_array_equal(res.metrics["episode_length"][0, 1:], 7.0)
    with pytest.raises(rmtjax.ConfigError, match="PickOne-long has no parameter 'lenght'. Did you mean: length"):
        rmtjax.make_config("ppo", "PickOne-long", {"env.params.lenght": 7})
    with pytest.raises(rmtjax.ConfigError, match="'CartPole-v1' is a gymnax id already"):
        rmtjax.register_env("CartPole-v1", PickOne)


# -- videos -------------------------------------------------------------------------------
def _gif_frames(path):
    from PIL import Image

    img = Image.open(path)
    frames = []
    for i in range(img.n_frames):
        img.seek(i)
        frames.append(np.asarray(img.convert("RGB")))
    return frames


def test_eval_video_renders_differing_frames_of_each_seed(run_dir, tmp_path, capsys):
    # at most 40 steps an episode, as the Python call below: one compiled player serves both
    assert main(["eval", str(run_dir), "--video", str(tmp_path / "out.gif"), "--max-steps", "40"]) == 0
    assert "one greedy episode per seed" in capsys.readouterr().out
    frames = _gif_frames(tmp_path / "out.gif")
    assert len(frames) > 5
    assert frames[0].shape == (160, 2 * 240 + 2, 3)  # two seeds side by side
    assert np.mean(frames[0] != frames[len(frames) // 2]) > 0.001  # the cart and pole moved
    left, right = frames[3][:, :240], frames[3][:, 242:]
    assert np.any(left != right)  # each seed its own episode
    # the Python call, one MP4 per seed, and episodes that match the greedy evaluation
    video = rmtjax.render_video(run_dir, tmp_path / "v.mp4", per_seed=True, max_steps=40)
    assert [p.name for p in video.paths] == ["v_seed0.mp4", "v_seed1.mp4"]
    import imageio.v3 as iio

    mp4 = iio.imread(tmp_path / "v_seed0.mp4", plugin="pyav")
    assert mp4.shape[0] == min(40, int(video.lengths[0])) + (0 if video.finished[0] else 1) or mp4.shape[0] >= 2
    assert np.mean(mp4[0] != mp4[-1]) > 0.001
    assert np.all(video.lengths <= 40)


def test_minatar_and_classic_control_states_are_drawn(tmp_path):
    import gymnax

    from rmtjax import video

    for env_id in ("Breakout-MinAtar", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0"):
        env, params = gymnax.make(env_id)
        draw = video.renderer(env, params)
        obs, state = env.reset(jax.random.key(0), params)
        pictures = [draw((state, env.get_obs(state, params)))]
        for t in range(12):
            _, state, *_ = env.step(jax.random.key(t), state, jnp.int32(t % 2) if env_id != "Pendulum-v1"
                                    else jnp.array([2.0]), params)
            pictures.append(draw((state, env.get_obs(state, params))))
        assert pictures[0].dtype == np.uint8 and pictures[0].ndim == 3, env_id
        assert np.mean(pictures[0] != pictures[-1]) > 0.0005, env_id


def test_video_refuses_other_formats(run_dir, capsys):
    assert main(["eval", str(run_dir), "--video", "out.avi"]) == 2
    assert "the file must end in .gif or .mp4" in capsys.readouterr().err
