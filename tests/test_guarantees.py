"""Issue 20: a run directory or a config cannot be turned against the user, and every fault is
one clear line. Each section holds one numbered item of the issue."""

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import rmtjax
from rmtjax import envs, limits, safefs
from rmtjax.checkpoint import Checkpoints
from rmtjax.cli import main
from rmtjax.config import Config, ConfigError, load_config
from rmtjax.health import HealthWarning, nonfinite_obs_stats, skipped_everything
from rmtjax.rundir import RunDir, RunDirError

REPO = Path(__file__).resolve().parents[1]
# 4 iterations of 256 steps in 2 chunks: checkpoints at iterations 2 and 4
SMALL = {"train.total_steps": 1024, "train.num_chunks": 2, "train.progress": False, "agent.rollout_len": 64,
         "agent.hidden": [8], "agent.num_epochs": 2}
SETS = [a for k, v in SMALL.items() for a in ("--set", f"{k}={json.dumps(v) if isinstance(v, list) else str(v).lower()}")]
TMP_NAMES = (".config.yaml.tmp", ".run.json.tmp", ".metrics.jsonl.tmp", ".metrics.csv.tmp", ".summary.json.tmp")


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A directory outside every run directory, holding files a planted link points at."""
    return tmp_path_factory.mktemp("outside")


def _plant(link: Path, target: Path, text: str = "precious\n") -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    link.symlink_to(target)
    return target


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, outside):
    """A finished small run, written into a directory where the old temporary-file names had
    been planted as links to files outside it."""
    path = tmp_path_factory.mktemp("runs") / "small"
    path.mkdir()
    targets = {n: _plant(path / n, outside / f"target{n}") for n in TMP_NAMES}
    cfg = rmtjax.make_config("ppo", "CartPole-v1", SMALL)
    result = rmtjax.train(cfg, jax.random.key(0), run_dir=path)
    return {"path": path, "config": cfg, "result": result, "targets": targets}


@pytest.fixture
def run_copy(small_run, tmp_path):
    path = tmp_path / "copy"
    shutil.copytree(small_run["path"], path, symlinks=True)
    for n in TMP_NAMES:
        (path / n).unlink()
    (path / ".lock").unlink()
    return path


def _one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("rmtjax: warning:")]
    assert len(lines) == 1, err
    return lines[0]


# -- 1. planted links never make a run write outside its directory ------------------------------
def test_a_new_run_writes_its_files_as_regular_files_past_planted_temporary_links(small_run):
    path = small_run["path"]
    for name, target in small_run["targets"].items():
        assert target.read_text() == "precious\n", name  # nothing written through the link
        assert (path / name).is_symlink()  # and the link itself left alone
    for name in ("config.yaml", "run.json", "metrics.jsonl", "metrics.csv", "summary.json"):
        assert (path / name).is_file() and not (path / name).is_symlink(), name
    assert load_config(path / "config.yaml") == small_run["config"]
    assert len((path / "metrics.jsonl").read_text().splitlines()) == 4
    assert not [p for p in path.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]  # no leftovers


@pytest.mark.parametrize("name", [".lock", "checkpoints", "unusable_checkpoints", "config.yaml", "tensorboard"])
def test_a_new_run_refuses_a_directory_with_a_planted_run_file(small_run, tmp_path, outside, name):
    path = tmp_path / "fresh"
    path.mkdir()
    target = _plant(path / name, outside / f"fresh{name}")
    with pytest.raises(RunDirError, match=rf"{name}"):
        RunDir.create(path, small_run["config"], jax.random.key(0))
    assert target.read_text() == "precious\n"
    assert sorted(p.name for p in path.iterdir()) == [name]


def test_a_new_run_refuses_a_directory_that_holds_a_lock_file(small_run, tmp_path):
    path = tmp_path / "locked"
    path.mkdir()
    (path / ".lock").write_text("123\n")
    with pytest.raises(RunDirError, match=r"holds \.lock .*remove them or choose a new directory"):
        RunDir.create(path, small_run["config"], jax.random.key(0))


@pytest.mark.parametrize("name", [".lock", ".config.yaml.tmp", ".run.json.tmp", ".metrics.jsonl.tmp",
                                  "unusable_checkpoints", "checkpoints/4.orbax-checkpoint-tmp", "summary.json"])
def test_resume_refuses_a_run_directory_holding_a_link(run_copy, outside, name):
    if (run_copy / name).exists():
        (run_copy / name).unlink()
    target = _plant(run_copy / name, outside / "resume" / name.replace("/", "_"))
    with pytest.raises(RunDirError, match=rf"symbolic link\(s\) \(.*{name}"):
        rmtjax.train(None, resume=run_copy)
    assert target.read_text() == "precious\n"


def test_setting_aside_a_damaged_checkpoint_never_moves_it_through_a_link(run_copy, outside):
    dest = outside / "aside"
    dest.mkdir()
    (run_copy / "unusable_checkpoints").symlink_to(dest)
    ckpt = Checkpoints(run_copy / "checkpoints")
    with pytest.raises(safefs.UnsafePathError, match="symbolic link"):
        ckpt.set_aside([4], run_copy / "unusable_checkpoints")
    ckpt.close()
    assert list(dest.iterdir()) == [] and (run_copy / "checkpoints" / "4").is_dir()

    # a real directory holding a dangling link of the step's name: the move takes another name
    (run_copy / "unusable_checkpoints").unlink()
    (run_copy / "unusable_checkpoints").mkdir()
    (run_copy / "unusable_checkpoints" / "4").symlink_to(outside / "aside" / "missing")
    ckpt = Checkpoints(run_copy / "checkpoints")
    moved = ckpt.set_aside([4], run_copy / "unusable_checkpoints")
    ckpt.close()
    assert moved == [run_copy / "unusable_checkpoints" / "4.1"] and (moved[0] / "state").is_dir()
    assert not (outside / "aside" / "missing").exists()


def test_safe_writes_refuse_links_and_special_files(tmp_path, outside):
    target = _plant(tmp_path / "log.jsonl", outside / "log_target")
    with pytest.raises(safefs.UnsafePathError, match="symbolic link"):
        safefs.append_text(tmp_path / "log.jsonl", "x\n")
    with pytest.raises(safefs.UnsafePathError, match="symbolic link"):
        safefs.open_lock_file(tmp_path / "log.jsonl")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(safefs.UnsafePathError, match="not a regular file"):
        safefs.open_lock_file(tmp_path / "fifo")  # returns at once: a FIFO is not waited on
    safefs.write_atomic(tmp_path / "log.jsonl", "new\n")  # replaces the link, not its target
    assert target.read_text() == "precious\n"
    assert not (tmp_path / "log.jsonl").is_symlink() and (tmp_path / "log.jsonl").read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "log.jsonl"]


# -- 2. a config never imports the module it names unless the user allowed it -------------------
PLUGIN = """
from pathlib import Path
Path({marker!r}).write_text("imported")
import gymnasium
gymnasium.register("{env}", entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=50)
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A module that leaves a marker file when it is imported (and registers a CartPole copy)."""
    name = f"rmtjax_test_plugin_{os.getpid()}_{time.monotonic_ns()}"
    marker = tmp_path / "imported.txt"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / f"{name}.py").write_text(PLUGIN.format(marker=str(marker), env=f"{name}-v0"))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.setattr(envs.imports, "_ALLOWED_IMPORTS", set())
    yield {"module": name, "id": f"gymnasium:{name}:{name}-v0", "marker": marker}
    sys.modules.pop(name, None)


def test_reading_a_config_that_names_a_module_does_not_import_it(plugin, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(f"algo: ppo\nenv: {{id: '{plugin['id']}'}}\ntrain: {{total_steps: 1024}}\nagent: {{rollout_len: 64}}\n")
    cfg = load_config(path)
    assert cfg.env.id == plugin["id"]
    with pytest.raises(ConfigError, match=rf"asks to import the Python module '{plugin['module']}'.*"
                                          rf"--allow-import {plugin['module']}"):
        envs.make_env(cfg.env)
    assert not plugin["marker"].exists() and plugin["module"] not in sys.modules

    envs.allow_import(plugin["module"])  # the user's own decision, from outside the config
    env = envs.make_env(cfg.env)
    assert plugin["marker"].read_text() == "imported" and env.spec.num_actions == 2


def test_eval_of_a_run_directory_naming_a_module_does_not_import_it(plugin, small_run, run_copy, capsys):
    text = (run_copy / "config.yaml").read_text().replace("id: CartPole-v1", f"id: {plugin['id']}")
    (run_copy / "config.yaml").write_text(text)
    assert main(["eval", str(run_copy)]) == 2
    assert "--allow-import" in _one_line_error(capsys.readouterr().err)
    assert not plugin["marker"].exists() and plugin["module"] not in sys.modules


def test_allow_import_takes_module_names_only():
    with pytest.raises(ConfigError, match="not a module name"):
        envs.allow_import("os; rm -rf /")


# -- 3. the memory a config asks for is checked before anything is compiled -------------------
@pytest.mark.parametrize("algo, env, overrides, part", [
    ("ppo", "CartPole-v1", {"train.num_seeds": 10**9}, "opt_state"),
    ("dqn", "CartPole-v1", {"agent.buffer_size": 2 * 10**9}, "replay"),
    ("ppo", "CartPole-v1", {"agent.hidden": [100000, 100000]}, "params"),
    ("ppo", "CartPole-v1", {"env.num_envs": 10**8, "train.total_steps": 16 * 10**8, "agent.rollout_len": 8}, "rollout"),
])
def test_a_state_too_big_for_the_device_is_refused_in_milliseconds(algo, env, overrides, part, tmp_path, monkeypatch):
    monkeypatch.setenv(limits.ENV_MEMORY_LIMIT, "16e9")
    cfg = rmtjax.make_config(algo, env, {**overrides, "train.progress": False})
    t0 = time.perf_counter()
    with pytest.raises(limits.MemoryLimitError, match=rf"needs at least .* per device .*{part}.*there is 16\.0 GB"):
        rmtjax.train(cfg, jax.random.key(0), run_dir=tmp_path / "big")
    assert time.perf_counter() - t0 < 10  # traced, never compiled (a compile alone takes longer)
    assert not (tmp_path / "big").exists()  # refused before the run directory was made


def test_the_estimate_is_the_bytes_of_the_state_the_run_makes(small_run):
    from rmtjax.driver import Program

    cfg = small_run["config"]
    program = Program(cfg)
    agent, init = program.agent, program.init
    made = sum(x.nbytes if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else 8 * x.size
               for x in jax.tree.leaves(small_run["result"].state))
    assert limits.tree_bytes(limits.state_shapes(cfg, init)) == made
    rollout = 4 * 64 * 4 * 4  # envs × rollout_len × CartPole's 4 float32 observations
    activations = 4 * 64 / 4 * 8 * 4  # a minibatch (envs × rollout_len / 4) × hidden width 8 × float32
    assert limits.check_train_fits(cfg, agent, init) == made + rollout + activations


def test_evaluation_with_too_many_episodes_is_refused_before_compiling(small_run, monkeypatch):
    monkeypatch.setenv(limits.ENV_MEMORY_LIMIT, "1e9")
    t0 = time.perf_counter()
    with pytest.raises(limits.MemoryLimitError, match=r"evaluation needs .*100,000,000 episodes.*--episodes"):
        rmtjax.evaluate(small_run["result"], episodes=10**8)
    assert time.perf_counter() - t0 < 10


def test_a_config_file_is_read_only_up_to_a_bound(tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"/dev/zero is larger than 1,048,576 bytes"):
        load_config("/dev/zero")
    big = tmp_path / "big.yaml"
    big.write_text("algo: ppo\n" + "#" * (2 << 20))
    with pytest.raises(ConfigError, match="big.yaml is larger than"):
        load_config(big)
    assert time.perf_counter() - t0 < 2


# -- 4. operating-system errors: one line, a non-zero exit, the last good checkpoint kept --------
@pytest.mark.parametrize("where, says", [("file", "Not a directory"), ("proc", "No such file or directory")])
def test_a_run_directory_that_cannot_be_made_is_one_line(where, says, tmp_path, capsys, monkeypatch):
    if where == "file":
        (tmp_path / "plain").write_text("x")
        path = tmp_path / "plain" / "run"
    else:
        path = Path("/proc/rmtjax-no-such-dir/run")
    assert main(["train", "--quiet", "--run-dir", str(path), *SETS]) == 1
    line = _one_line_error(capsys.readouterr().err)
    assert line.startswith(f"rmtjax: error: {says}:") and str(path.parent) in line


def test_a_read_only_directory_is_one_line(tmp_path, capsys, monkeypatch):
    real_mkdir = Path.mkdir

    def read_only(self, *a, **k):  # what a read-only mount answers (as root, chmod would not)
        if self.name == "run":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert main(["train", "--quiet", "--run-dir", str(tmp_path / "run"), *SETS]) == 1
    line = _one_line_error(capsys.readouterr().err)
    assert "Read-only file system" in line and "choose a directory on a writable one" in line


def test_a_full_disk_mid_run_is_one_line_and_keeps_the_last_checkpoint(small_run, tmp_path, capsys, monkeypatch):
    path = tmp_path / "full"
    real_save = Checkpoints.save

    def save(self, state, history, iterations, chunks, config=None):
        if iterations == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.directory / "4.orbax-checkpoint-tmp"))
        return real_save(self, state, history, iterations, chunks, config)

    monkeypatch.setattr(Checkpoints, "save", save)
    assert main(["train", "--quiet", "--run-dir", str(path), *SETS]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "could not write the checkpoint at iteration 4" in line and "No space left on device" in line
    assert "the checkpoint at iteration 2 is kept" in line and f"--resume {path}" in line
    monkeypatch.setattr(Checkpoints, "save", real_save)
    kept = rmtjax.load_run(path)
    assert kept.metrics["env_steps"].shape == (1, 2)

    def full(path_, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path_))

    monkeypatch.setattr(safefs, "append_text", full)
    assert main(["train", "--quiet", "--resume", str(path)]) == 1
    line = _one_line_error(capsys.readouterr().err)
    assert line == (f"rmtjax: error: No space left on device: {path / 'metrics.jsonl'} (free space on that device; "
                    f"a run keeps its last complete checkpoint, so continue it with rmtjax train --resume DIR)")


# -- 5. an edited config.yaml is refused on resume ----------------------------------------------
def test_resume_with_an_edited_config_yaml_is_refused_naming_the_fields(run_copy):
    text = (run_copy / "config.yaml").read_text()
    assert "num_epochs: 2" in text
    (run_copy / "config.yaml").write_text(text.replace("num_epochs: 2", "num_epochs: 3"))
    with pytest.raises(ConfigError, match=r"config\.yaml was edited after the checkpoint at iteration 4.*"
                                          r"agent\.num_epochs: 2 at the checkpoint, 3 now"):
        rmtjax.train(None, resume=run_copy)
    with pytest.raises(ConfigError, match="agent.num_epochs: 2 at the checkpoint, 3 now"):
        rmtjax.load_run(run_copy)


def test_a_config_yaml_edited_only_in_how_the_run_is_watched_is_accepted(run_copy, small_run):
    text = (run_copy / "config.yaml").read_text()
    (run_copy / "config.yaml").write_text(text.replace("keep_checkpoints: 3", "keep_checkpoints: 5"))
    again = rmtjax.load_run(run_copy)
    np.testing.assert_array_equal(again.metrics["episode_return"], small_run["result"].metrics["episode_return"])


# -- 6. small inputs: a ConfigError or a clear message ------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    ({"agent.hidden": []}, r"agent\.hidden: expected at least one value, got an empty list"),
    ({"env.reward_scale": 1e300}, r"env\.reward_scale: 1e\+300 .*"),
    ({"env.reward_scale": 1e7}, r"env\.reward_scale: 10000000\.0 is out of range; allowed \(0\.0, 1000000\.0\]"),
    ({"agent.lr": 1e39}, r"agent\.lr: 1e\+39 does not fit in a 32-bit float"),
    ({"env.params.max_steps_in_episode": 0}, r"env\.params\.max_steps_in_episode: expected an integer ≥ 1"),
    ({"env.params.max_steps_in_episode": -5}, r"env\.params\.max_steps_in_episode: expected an integer ≥ 1"),
    ({"algo": "rmt"}, r"algo: changed from 'ppo' to 'rmt', but the agent section is ppo's .*--algo rmt"),
])
def test_small_bad_inputs_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        rmtjax.make_config("ppo", "CartPole-v1", overrides)


def test_a_key_given_twice_in_a_config_file_is_refused(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("algo: ppo\nagent:\n  lr: 0.001\n  gamma: 0.9\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"twice\.yaml is not valid YAML: .*the key 'lr' appears twice "
                                          r"\(lines 3 and 5\); keep one of them"):
        load_config(path)


def test_total_steps_that_are_not_whole_iterations_are_said(small_run):
    cfg = small_run["config"].override({"train.total_steps": 1000})
    with pytest.warns(limits.ConfigWarning, match=r"train\.total_steps: 1,000 is not a multiple of the 256 env "
                                                  r"steps of one iteration; the run trains 3 iteration\(s\) = 768"):
        rmtjax.make_train(cfg)


@pytest.mark.parametrize("argv, message", [
    (["eval", "RUN", "--max-steps", "-5"], r"--max-steps: expected an integer in \[1, 2,147,483,647\], got -5"),
    (["eval", "RUN", "--max-steps", "0"], r"--max-steps: expected an integer in \[1"),
    (["eval", "RUN", "--seed", "99999999999999999999"], r"--seed: expected an integer in \[0, 2,147,483,647\]"),
    (["eval", "RUN", "--seed", "-1"], r"--seed: expected an integer in \[0"),
    (["eval", "RUN", "--episodes", "0"], r"--episodes: expected an integer in \[1"),
    (["train", "--seed", "-1"], r"--seed: expected an integer in \[0"),
    (["train", "--seed", "1.5"], r"--seed: expected an integer in \[0, 2,147,483,647\], got '1\.5'"),
    (["train", "--run-dir", ""], r"--run-dir: an empty path was given"),
    (["train", "--resume", " "], r"--resume: an empty path was given"),
    (["train", "--set", "algo=rmt"], r"algo: changed from 'ppo' to 'rmt'"),
])
def test_bad_command_line_values_are_one_line_and_exit_2(argv, message, small_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --run-dir '' must not write here
    argv = [str(small_run["path"]) if a == "RUN" else a for a in argv]
    assert main(argv) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert line.startswith("rmtjax: config error: ")
    import re

    assert re.search(message, line), line
    assert list(tmp_path.iterdir()) == []


def test_evaluate_refuses_max_steps_below_one(small_run):
    for bad in (0, -5, 2**31):
        with pytest.raises(ConfigError, match=r"max_steps: expected an integer ≥ 1"):
            rmtjax.evaluate(small_run["result"], episodes=1, max_steps=bad)
    ev = rmtjax.evaluate(small_run["result"], episodes=2, max_steps=3)
    assert np.all(ev.lengths <= 3) and ev.lengths.max() == 3


def test_an_empty_run_directory_path_is_refused_in_python(small_run):
    with pytest.raises(RunDirError, match="empty path"):
        rmtjax.train(small_run["config"], jax.random.key(0), run_dir="")


# -- 7. a run that stopped learning says so ----------------------------------------------------
def test_a_run_whose_updates_are_all_skipped_warns_and_says_so_in_its_summary(tmp_path):
    # a force of 1e38 pushes CartPole's observations past float32: the statistics go non-finite,
    # every observation the agent sees is NaN, and every update is skipped by the guard
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**SMALL, "env.normalize_obs": True,
                                                    "env.params.force_mag": 1e38})
    with pytest.warns(HealthWarning) as caught:
        result = rmtjax.train(cfg, jax.random.key(0), run_dir=tmp_path / "stuck")
    said = [str(w.message) for w in caught if issubclass(w.category, HealthWarning)]
    assert len(said) == 2  # each kind once, however many chunks
    assert np.all(result.metrics["skipped_frac"] == 1.0)
    assert result.warnings[0].startswith("seed(s) 0 skipped every update of the last 4 iteration(s)")
    assert result.warnings[1].startswith("the observation statistics (env.normalize_obs) of seed(s) 0 are not finite")
    assert "\nWARNING: seed(s) 0 skipped every update" in result.summary()
    summary = json.loads((tmp_path / "stuck" / "summary.json").read_text())
    assert summary["warnings"] == result.warnings
    assert rmtjax.load_run(tmp_path / "stuck").warnings == result.warnings


def test_a_healthy_run_has_no_warnings(small_run):
    assert small_run["result"].warnings == []
    assert json.loads((small_run["path"] / "summary.json").read_text())["warnings"] == []


def test_the_health_checks_look_at_the_last_window_of_iterations_per_seed():
    ok, stuck = np.zeros((6, 3)), np.ones((6, 3))
    stuck[:, 1] = 0.5
    assert skipped_everything([{"skipped_frac": ok}]) is None
    # seeds 0 and 2 skipped everything in the last 10 iterations (spread over two chunks), seed 1 did not
    msg = skipped_everything([{"skipped_frac": ok}, {"skipped_frac": stuck}, {"skipped_frac": stuck}])
    assert msg.startswith("seed(s) 0, 2 skipped every update of the last 10 iteration(s)")
    recovered = np.vstack([stuck, np.zeros((1, 3))])
    assert skipped_everything([{"skipped_frac": recovered}]) is None
    assert skipped_everything([{"loss": ok}]) is None  # an agent without the guard's metric

    from types import SimpleNamespace

    stats = {"mean": np.array([[0.0, 1.0], [np.nan, 1.0], [0.0, 2.0]], np.float32), "count": np.full(3, 3.0)}
    state = SimpleNamespace(env_state=SimpleNamespace(obs_stats=stats))
    assert nonfinite_obs_stats(state).startswith("the observation statistics (env.normalize_obs) of seed(s) 1 ")
    stats["count"][2] = np.inf
    assert "of seed(s) 1, 2 are not finite" in nonfinite_obs_stats(state)
    stats.update(mean=np.zeros((3, 2), np.float32), count=np.full(3, 3.0))
    assert nonfinite_obs_stats(state) is None
    assert nonfinite_obs_stats(SimpleNamespace(env_state=SimpleNamespace(obs_stats=None))) is None


# -- 8. no asyncio noise after a failed checkpoint read ----------------------------------------
def test_a_failed_checkpoint_read_is_one_clear_line(run_copy):
    for step in (2, 4):
        for f in (run_copy / "checkpoints" / str(step) / "state").rglob("*"):
            if f.is_file() and f.parent.name == "d":
                f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-m", "rmtjax.cli", "train", "--quiet", "--resume", str(run_copy)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 2
    assert "Event loop is closed" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert _one_line_error(done.stderr).startswith(f"rmtjax: error: no usable checkpoint in {run_copy / 'checkpoints'}")
    # the line holds a reason for each checkpoint, not asyncio's account of a stray future
    assert "Future exception was never retrieved" not in done.stderr


def test_a_collected_future_with_a_read_error_is_not_logged_but_other_ones_are(caplog):
    """Which of orbax's futures is still pending when a restore fails depends on timing (CI
    saw one); the asyncio filter must drop those and nothing else."""
    import asyncio
    import gc

    from rmtjax.checkpoint import _ocp

    _ocp()  # the filter is installed when orbax is first used, not when rmtjax.checkpoint is imported
    read_error = ValueError('OUT_OF_RANGE: Error reading "x/.zarray" [tensorstore_spec=\'{}\']')
    other = ValueError("a bug of the user's own callback")
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level("ERROR", logger="asyncio"):
            for exc in (read_error, other):
                fut = loop.create_future()
                fut.set_exception(exc)
                del fut
                gc.collect()
    finally:
        loop.close()
    logged = [r.exc_info[1] for r in caplog.records if r.name == "asyncio" and r.exc_info]
    assert logged == [other]
