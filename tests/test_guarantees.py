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
from rmtjax.checkpoint import CheckpointWarning, Checkpoints
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
    """A finished small run."""
    path = tmp_path_factory.mktemp("runs") / "small"
    cfg = rmtjax.make_config("ppo", "CartPole-v1", SMALL)
    result = rmtjax.train(cfg, jax.random.key(0), run_dir=path)
    return {"path": path, "config": cfg, "result": result}


@pytest.fixture
def run_copy(small_run, tmp_path):
    path = tmp_path / "copy"
    shutil.copytree(small_run["path"], path, symlinks=True)
    (path / ".lock").unlink()
    return path


def _one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("rmtjax: warning:")]
    assert len(lines) == 1, err
    return lines[0]


# -- 1. planted links never make a run write outside its directory ------------------------------
def test_a_new_run_refuses_a_directory_holding_planted_temporary_links(small_run, tmp_path, outside):
    path = tmp_path / "planted"
    path.mkdir()
    targets = {n: _plant(path / n, outside / f"target{n}") for n in TMP_NAMES}
    with pytest.raises(RunDirError, match=r"holds symbolic link\(s\) .*remove them or choose a new directory"):
        rmtjax.train(small_run["config"], jax.random.key(0), run_dir=path)
    for name, target in targets.items():
        assert target.read_text() == "precious\n", name  # nothing written through the link
        assert (path / name).is_symlink()  # and the link itself left alone
    assert sorted(p.name for p in path.iterdir()) == sorted(TMP_NAMES)  # nothing written at all
    small = small_run["path"]  # a run in a clean directory writes regular files only
    for name in ("config.yaml", "run.json", "metrics.jsonl", "metrics.csv", "summary.json"):
        assert (small / name).is_file() and not (small / name).is_symlink(), name
    assert load_config(small / "config.yaml") == small_run["config"]
    assert len((small / "metrics.jsonl").read_text().splitlines()) == 4
    assert not [p for p in small.iterdir() if p.name.endswith(".tmp")]  # no leftovers


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

    def save(self, state, history, iterations, chunks, config=None, parts=None, doctor=None):
        if iterations == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.directory / "4.orbax-checkpoint-tmp"))
        return real_save(self, state, history, iterations, chunks, config, parts, doctor)

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


LEFT_FOR_EXIT = """
import sys, warnings
import rmtjax.cli

class Store:  # the qualname of orbax's metadata read that a failed restore can leave unrun
    async def _get_array_metadatas(self):
        pass

class Other:
    async def _read(self):
        pass

with warnings.catch_warnings():  # leaves CPython's C side holding a list in which 'always' comes first
    warnings.simplefilter("always")
    warnings.warn("an earlier warning", UserWarning)
left = [Store()._get_array_metadatas(), Other()._read()]  # collected only at interpreter exit
sys.exit(rmtjax.cli.main(["train", "--quiet", "--resume", sys.argv[1]]))
"""


def test_orbax_s_unrun_metadata_read_says_nothing_at_exit_and_other_unrun_coroutines_still_do(tmp_path):
    """CI once printed "sys:1: RuntimeWarning: coroutine 'Store._get_array_metadatas' was never
    awaited" after the one line above; it depends on thread timing, so it is planted here."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", LEFT_FOR_EXIT, str(tmp_path / "absent")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.strip() and "an earlier warning" not in ln]
    assert lines == [f"rmtjax: error: run directory {tmp_path / 'absent'} does not exist",
                     "sys:1: RuntimeWarning: coroutine 'Other._read' was never awaited"], done.stderr


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


# == issue 34: hostile run directories, replay levels and inputs ================================
def _demo_arrays(n=8):
    obs = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    return dict(obs=obs, action=np.arange(n) % 2, reward=np.ones(n, np.float32), terminated=np.zeros(n, bool),
                truncated=np.zeros(n, bool), next_obs=obs + 0.5)


DEMO_ENV = dict(obs_shape=(4,), discrete=True, num_actions=2)


def _npz_with(path: Path, arrays: dict, patch=None, compression=0) -> Path:
    """An .npz of `arrays`, each member's .npy bytes passed through `patch(name, data)`."""
    import io
    import zipfile

    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, value in arrays.items():
            buf = io.BytesIO()
            np.save(buf, value)
            data = buf.getvalue()
            z.writestr(f"{name}.npy", patch(name, data) if patch else data)
    return path


# -- 9. demonstrations: bounded, plain files, no code -------------------------------------------
def test_damaged_or_hostile_demonstration_files_are_one_line_config_errors(tmp_path, outside, monkeypatch):
    from rmtjax.replay import demonstrations as demo_io

    good = demo_io.save(tmp_path / "good.npz", **_demo_arrays())
    assert demo_io.load(good, **DEMO_ENV)["obs"].shape == (8, 4)
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all")
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:300])
    np.savez(tmp_path / "strings.npz", **{**_demo_arrays(), "action": np.array(["left"] * 8)})
    # a header claiming 10^13 rows where 8 are stored
    _npz_with(tmp_path / "claims.npz", _demo_arrays(),
              lambda k, d: d.replace(b"(8, 4)", b"(10000000000000, 4)") if k == "obs" else d)
    _npz_with(tmp_path / "bomb.npz", {**_demo_arrays(), "obs": np.zeros((1 << 16, 4), np.float32)},
              compression=8)  # 1 MiB of zeros deflated to ~1 KiB
    _plant(tmp_path / "link.npz", outside / "demo_target.npz")
    os.mkfifo(tmp_path / "fifo.npz")
    monkeypatch.setattr(demo_io, "MAX_BYTES", 1 << 19)  # 512 KiB: the bomb's members exceed it uncompressed
    cases = {"junk.npz": "not a readable .npz", "cut.npz": "not a readable .npz",
             "strings.npz": "'action' holds <U4 values", "claims.npz": r"claims shape \[10000000000000, 4\]",
             "bomb.npz": "bytes uncompressed; demonstrations are held in memory", "link.npz": "symbolic link",
             "fifo.npz": "not a regular file"}
    for name, says in cases.items():
        with pytest.raises(ConfigError, match=rf"agent\.demonstrations: .*{name}: .*{says}") as caught:
            demo_io.load(tmp_path / name, **DEMO_ENV)
        assert "\n" not in str(caught.value) and len(str(caught.value)) < 400, name
    with pytest.raises(ConfigError, match="lies outside"):
        demo_io.load(good, **DEMO_ENV, root=outside)


def _hostile_minari_dataset(root: Path, dataset_id: str, marker: Path) -> dict:
    """A Minari dataset (hdf5) whose metadata has no spaces and an env_spec whose entry point
    would run a shell command if an environment were made from it."""
    h5py = pytest.importorskip("h5py")
    data = root / dataset_id / "data"
    data.mkdir(parents=True)
    spec = {"id": "Evil-v0", "entry_point": "os:system", "reward_threshold": None, "nondeterministic": False,
            "max_episode_steps": None, "order_enforce": True, "disable_env_checker": True,
            "kwargs": {"command": f"touch {marker}"}, "additional_wrappers": [], "vector_entry_point": None}
    (data / "metadata.json").write_text(json.dumps({"data_format": "hdf5", "total_episodes": 1, "total_steps": 3,
                                                    "env_spec": json.dumps(spec), "dataset_id": dataset_id}))
    obs = np.arange(16, dtype=np.float32).reshape(4, 4)
    with h5py.File(data / "main_data.hdf5", "w") as f:
        g = f.create_group("episode_0")
        g["observations"], g["actions"], g["rewards"] = obs, np.array([0, 1, 0]), np.ones(3)
        g["terminations"], g["truncations"] = np.array([False, False, True]), np.zeros(3, bool)
    return {"obs": obs}


def test_a_minari_dataset_is_read_without_running_its_env_spec_and_ids_are_names(tmp_path, monkeypatch):
    from rmtjax.replay import demonstrations as demo_io

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MINARI_DATASETS_PATH", raising=False)
    with pytest.raises(ConfigError, match="no such dataset on this machine"):
        demo_io.load("minari:cartpole/absent-v0", **DEMO_ENV)
    assert not (tmp_path / "home").exists()  # ~/.minari/datasets is not created

    root, marker = tmp_path / "datasets", tmp_path / "ran"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    made = _hostile_minari_dataset(root, "evil/spec-v0", marker)
    data = demo_io.load("minari:evil/spec-v0", **DEMO_ENV)
    np.testing.assert_array_equal(data["obs"], made["obs"][:-1])
    np.testing.assert_array_equal(data["next_obs"], made["obs"][1:])
    assert not marker.exists()  # no environment was made from the stored spec

    _hostile_minari_dataset(tmp_path / "elsewhere", "x-v0", marker)
    for bad in ("../elsewhere/x-v0", "/abs/x-v0", "evil/../../elsewhere/x-v0", "evil/spec"):
        with pytest.raises(ConfigError, match="a Minari dataset id is a name"):
            demo_io.load(f"minari:{bad}", **DEMO_ENV)
    (root / "linked-v0").symlink_to(tmp_path / "elsewhere" / "x-v0")
    with pytest.raises(ConfigError, match="symbolic link"):
        demo_io.load("minari:linked-v0", **DEMO_ENV)
    assert not marker.exists()


def test_checking_a_demonstration_source_touches_no_file(tmp_path):
    from rmtjax.replay import demonstrations as demo_io

    for ok in ("", str(tmp_path / "not-there-yet.npz"), "minari:D4RL/door/human-v2", "minari:cartpole/x-v0"):
        demo_io.check_source(ok)
    for bad, says in (("minari:../x-v0", "is a name"), ("minari:x", "is a name"), ("a\x00b", "NUL"),
                      ("x" * 5000, "at most 4096")):
        with pytest.raises(ConfigError, match=rf"agent\.demonstrations: .*{says}"):
            demo_io.check_source(bad)
    assert list(tmp_path.iterdir()) == []


DEMO_RUN = {"train.total_steps": 256, "train.num_chunks": 1, "train.progress": False, "env.num_envs": 4,
            "agent.rollout_len": 4, "agent.updates_per_step": 0.25, "agent.batch_size": 16, "agent.buffer_size": 128,
            "agent.learning_starts": 64, "agent.hidden": [8]}


def test_reading_a_config_that_names_demonstrations_does_not_read_them(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(f"algo: rmt\nenv: {{id: CartPole-v1}}\nagent: {{demonstrations: {tmp_path / 'absent.npz'}}}\n")
    assert load_config(path).agent.demonstrations == str(tmp_path / "absent.npz")  # no file is opened


def test_evaluating_a_run_trained_on_demonstrations_needs_no_demonstration_file(tmp_path, capsys):
    from rmtjax.replay import demonstrations as demo_io

    demos = demo_io.save(tmp_path / "demos.npz", **_demo_arrays(32))
    cfg = rmtjax.make_config("rmt", "CartPole-v1", {**DEMO_RUN, "agent.demonstrations": str(demos)})
    rmtjax.train(cfg, jax.random.key(0), run_dir=tmp_path / "run")
    demos.unlink()
    assert main(["eval", str(tmp_path / "run"), "--episodes", "1", "--max-steps", "5"]) == 0
    assert rmtjax.load_policy(tmp_path / "run")(np.zeros(4, np.float32)).shape == ()


# -- 10. every file a run writes or prunes stays in its directory --------------------------------
@pytest.mark.parametrize("name", ["replay_disk", "replay_levels", "sub/deep", "timing.jsonl"])
def test_a_new_run_refuses_a_planted_link_anywhere_before_writing(small_run, tmp_path, outside, name):
    path = tmp_path / "fresh"
    (path / name).parent.mkdir(parents=True)
    target = outside / f"dir_{name.replace('/', '_')}"
    target.mkdir(exist_ok=True)
    (target / "7.npz").write_text("precious\n")
    (path / name).symlink_to(target)
    with pytest.raises(RunDirError, match=rf"{name.split('/')[0]}"):
        RunDir.create(path, small_run["config"], jax.random.key(0))
    assert (target / "7.npz").read_text() == "precious\n" and sorted(p.name for p in target.iterdir()) == ["7.npz"]
    assert not (path / "config.yaml").exists() and not (path / ".lock").exists()


def _levels(**kw):
    from rmtjax.replay.hierarchical import Levels

    return Levels(seeds=1, host_capacity=8, cold_rows=(0, 4), refresh_share=0.0, warmup=0, priority="1",
                  **{"disk_capacity": 0, **kw})


def test_replay_levels_are_never_saved_pruned_or_mapped_through_a_link(tmp_path, outside):
    (outside / "levels").mkdir()
    (outside / "levels" / "7.npz").write_text("precious\n")
    (tmp_path / "replay_levels").symlink_to(outside / "levels")
    levels = _levels()
    with pytest.raises(safefs.UnsafePathError, match="symbolic link"):
        levels.prune(tmp_path / "replay_levels", keep=[])  # used to delete 7.npz there
    with pytest.raises(safefs.UnsafePathError, match="symbolic link"):
        levels.save(tmp_path / "replay_levels", 3)
    assert sorted(p.name for p in (outside / "levels").iterdir()) == ["7.npz"]

    real = tmp_path / "real"  # a level file name planted as a link inside a real directory
    real.mkdir()
    (real / "5.npz").symlink_to(outside / "levels" / "7.npz")
    (real / "notes.txt").write_text("mine\n")
    levels.save(real, 3)
    levels.prune(real, keep=[3])
    assert (outside / "levels" / "7.npz").read_text() == "precious\n"
    assert sorted(p.name for p in real.iterdir()) == ["3.npz", "5.npz", "notes.txt", "segments"]

    disk = tmp_path / "disk"  # a leaf file of the disk level planted as a link
    disk.mkdir()
    (disk / "leaf0.dat").symlink_to(outside / "leaf_target")
    (outside / "leaf_target").write_text("precious\n")
    with pytest.raises(ConfigError, match=r"agent\.disk_dir: .*holds symbolic link"):
        _levels(disk_capacity=8, disk_dir=disk)
    assert (outside / "leaf_target").read_text() == "precious\n"


def test_a_disk_dir_is_used_by_one_run_at_a_time(tmp_path):
    first = _levels(disk_capacity=8, disk_dir=tmp_path / "shared")
    with pytest.raises(ConfigError, match=r"agent\.disk_dir: .*shared holds the disk level of another running run "
                                          rf"\(pid {os.getpid()}\)"):
        _levels(disk_capacity=8, disk_dir=tmp_path / "shared")
    del first  # its lock goes with it
    _levels(disk_capacity=8, disk_dir=tmp_path / "shared")


def test_a_video_is_never_written_through_a_link_nor_over_a_file_unasked(small_run, tmp_path, outside, capsys):
    target = _plant(tmp_path / "link.gif", outside / "video_target.gif")
    assert main(["eval", str(small_run["path"]), "--video", str(tmp_path / "link.gif"), "--overwrite"]) == 2
    assert "symbolic link" in _one_line_error(capsys.readouterr().err)
    (tmp_path / "old.gif").write_text("mine\n")
    assert main(["eval", str(small_run["path"]), "--video", str(tmp_path / "old.gif")]) == 2
    assert "the file exists; choose another name or pass --overwrite" in _one_line_error(capsys.readouterr().err)
    assert target.read_text() == "precious\n" and (tmp_path / "old.gif").read_text() == "mine\n"
    pytest.importorskip("PIL")
    assert main(["eval", str(small_run["path"]), "--video", str(tmp_path / "old.gif"), "--overwrite",
                 "--max-steps", "3"]) == 0
    assert (tmp_path / "old.gif").read_bytes()[:3] == b"GIF"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.gif", "old.gif"]  # no temporary file left


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in for the wandb package whose `init` records its call (or raises `fail`)."""
    import types

    module = types.ModuleType("wandb")
    module.calls, module.fail = [], None

    def init(**kw):
        module.calls.append(kw)
        if module.fail is not None:
            raise module.fail
        return types.SimpleNamespace(id=kw["id"], define_metric=lambda *a, **k: None, log=lambda *a: None,
                                     finish=lambda **k: None, summary={})

    module.init, module.Settings = init, lambda **kw: kw
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(Path(os.devnull)))
    return module


def test_wandb_that_cannot_start_or_would_link_into_the_run_directory_is_refused_first(small_run, tmp_path,
                                                                                         fake_wandb, monkeypatch):
    cfg = small_run["config"].override({"train.wandb": True, "train.wandb_mode": "online"})
    with pytest.raises(ConfigError, match="train.wandb_mode: online .* needs a W&B API key"):
        rmtjax.train(cfg, jax.random.key(0), run_dir=tmp_path / "nokey")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    fake_wandb.fail = TimeoutError("timed out after 90 s waiting for the W&B service")
    with pytest.raises(ConfigError, match=r"train.wandb: W&B could not start the run \(TimeoutError: timed out"):
        rmtjax.train(cfg, jax.random.key(0), run_dir=tmp_path / "nonet")
    offline = cfg.override({"train.wandb_mode": "offline"})
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "inside"))
    with pytest.raises(ConfigError, match=r"train.wandb: W&B would keep its files .* inside the run directory"):
        rmtjax.train(offline, jax.random.key(0), run_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run directory, half-made or other
    assert len(fake_wandb.calls) == 1


# -- 11. resume from the newest checkpoint whose every part is intact ---------------------------
HIER = {"train.total_steps": 1200, "train.num_seeds": 1, "train.progress": False, "env.num_envs": 4,
        "agent.rollout_len": 2, "agent.torso": "mlp", "agent.hidden": [16], "agent.batch_size": 16,
        "agent.learning_starts": 200, "agent.replay": "hierarchical", "agent.hier_sampling": "cache",
        "agent.buffer_size": 800, "agent.device_fraction": 0.25, "agent.disk_fraction": 0.5, "agent.sync_every": 25,
        "agent.tier_fractions": [0.05, 0.15, 0.8], "train.num_chunks": 3}


@pytest.fixture(scope="module")
def hier_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("hier") / "ref"
    result = rmtjax.train(rmtjax.make_config("rmt", "CartPole-v1", HIER), jax.random.key(3), run_dir=path)
    return {"path": path, "result": result}


def _cut_copy(hier_run, dest: Path) -> Path:
    shutil.copytree(hier_run["path"], dest)
    (dest / ".lock").unlink()
    (dest / "summary.json").unlink()  # as a run killed before it finished left it
    return dest


@pytest.mark.parametrize("damage", ["missing", "host_td rewritten", "another level copied over it"])
def test_a_checkpoint_whose_replay_levels_are_missing_or_damaged_resumes_from_the_one_before(hier_run, tmp_path,
                                                                                           damage):
    from tests.helpers import assert_same_run

    run = _cut_copy(hier_run, tmp_path / "run")
    steps = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    last = run / "replay_levels" / f"{steps[-1]}.npz"
    if damage == "missing":  # a SIGKILL between the checkpoint's commit and its levels (the old order)
        last.unlink()
    elif damage == "host_td rewritten":
        with np.load(last) as z:
            arrays = {k: z[k].copy() for k in z.files}
        arrays["host_td"] = arrays["host_td"] * 2
        np.savez(last, **arrays)
    else:
        shutil.copyfile(run / "replay_levels" / f"{steps[-2]}.npz", last)
    with pytest.warns(CheckpointWarning, match=rf"checkpoint .*{steps[-1]} is unusable \(LevelsError: .*{last.name}"):
        resumed = rmtjax.train(None, resume=run)
    assert resumed.metrics["env_steps"].shape == hier_run["result"].metrics["env_steps"].shape
    assert_same_run(hier_run["result"], resumed)
    # the logs are the same bytes: no wall-clock value among the metrics
    assert (run / "metrics.jsonl").read_bytes() == (hier_run["path"] / "metrics.jsonl").read_bytes()


def test_wall_clock_seconds_are_kept_apart_from_the_metrics(hier_run):
    result, path = hier_run["result"], hier_run["path"]
    assert not [k for k in result.metrics if "seconds" in k]
    assert set(result.timing) == {"replay_move_seconds", "replay_move_seconds_total"}
    lines = [json.loads(x) for x in (path / "timing.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines][-1] == 150 and lines[-1]["replay_move_seconds_total"] > 0


def test_a_damaged_transfer_source_or_run_json_is_one_line(small_run, tmp_path, capsys):
    run = tmp_path / "child"
    rmtjax.train(small_run["config"], jax.random.key(1), run_dir=run, init_from=small_run["path"])
    shutil.rmtree(run / "checkpoints" / "4")
    (run / "summary.json").unlink()
    source = run / "transfer_source.npz"
    data = bytearray(source.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    original, source_bytes = (run / "run.json").read_text(), source.read_bytes()
    source.write_bytes(bytes(data))
    assert main(["train", "--quiet", "--resume", str(run)]) == 2
    assert "transfer_source.npz is missing or unreadable" in _one_line_error(capsys.readouterr().err)
    source.write_bytes(source_bytes)
    info = json.loads(original)
    for part, value in (("seed_map", "x"), ("source_seeds", None), ("sha256", 5)):
        (run / "run.json").write_text(json.dumps({**info, "init_from": {**info["init_from"], part: value}}))
        assert main(["train", "--quiet", "--resume", str(run)]) == 2
        assert f"'init_from.{part}'" in _one_line_error(capsys.readouterr().err)
    for sweep in ({"grid": 5, "seeds": "x"}, {"grid": {"agent.lr": [0.1, 0.2]}, "seeds": 1}):
        (run / "run.json").write_text(json.dumps({**info, "sweep": sweep}))
        assert main(["sweep", "--quiet", "--resume", str(run)]) == 2
        assert "run.json: 'sweep" in _one_line_error(capsys.readouterr().err)


# -- 12. bounded parsing ------------------------------------------------------------------------
@pytest.mark.parametrize("value, says", [
    ("9" * 5000, "a number literal of 5,000 characters"),
    ("[" * 3000 + "]" * 3000, "nested too deeply"),
    ("0x" + "f" * 300, "a number literal of 302 characters"),
])
def test_huge_or_deep_override_values_are_one_line(value, says, capsys):
    assert main(["train", "--print-config", "--set", f"train.seed={value}"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert line.startswith("rmtjax: config error: --set train.seed: the value ") and says in line and len(line) < 300


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    text = "algo: ppo\nenv:\n  id: CartPole-v1\n  params:\n    a: &a [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):  # 9^9 = 387 million scalars once expanded, in a few hundred bytes
        prev, name = chr(96 + i), chr(97 + i)
        text += f"    {name}: &{name} [{', '.join(['*' + prev] * 9)}]\n"
    (tmp_path / "bomb.yaml").write_text(text)
    assert len(text) < 600
    with pytest.raises(ConfigError, match=r"bomb\.yaml is not a usable config: its YAML expands \(aliases followed\) "
                                          r"to more than 200,000 nodes") as caught:
        load_config(tmp_path / "bomb.yaml")
    assert len(str(caught.value)) < 300
    (tmp_path / "cycle.yaml").write_text("algo: ppo\nenv: &e {id: CartPole-v1, params: {x: *e}}\n")
    with pytest.raises(ConfigError, match="holds an alias to a node that contains it"):
        load_config(tmp_path / "cycle.yaml")
    with pytest.raises(ConfigError, match=r"train\.seed: an integer of 1,200 bits is out of range"):
        rmtjax.make_config("ppo", "CartPole-v1", {"train.seed": 16**300 - 1})


def test_a_very_long_priority_formula_is_refused():
    from rmtjax.replay.hierarchical import priority_function

    with pytest.raises(ConfigError, match=r"agent\.priority: a formula of 8,999 characters; at most 256"):
        priority_function(" + ".join(["td"] * 3000)[:8999])
    assert priority_function("|td|^0.6 + 0.01")(np.array([1.0]))[0] == pytest.approx(1.01)
