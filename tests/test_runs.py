"""Run directories: what a run writes, resuming after a kill, damaged checkpoints, refusals."""

import csv
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import jax
import numpy as np
import pytest

import rmtjax
from rmtjax.checkpoint import CheckpointError, CheckpointWarning
from rmtjax.cli import main
from rmtjax.config import load_config
from rmtjax.rundir import RunDir, RunDirError
from tests.helpers import host

REPO = Path(__file__).resolve().parents[1]
# 16 iterations of 256 steps in 4 chunks of 4: checkpoints at iterations 4, 8, 12, 16
OVERRIDES = {"train.total_steps": 4096, "train.num_seeds": 2, "train.num_chunks": 4, "train.progress": False,
             "agent.rollout_len": 64}
CLI_SETS = [arg for k, v in OVERRIDES.items() for arg in ("--set", f"{k}={str(v).lower()}")]

try:
    import tensorboardX  # noqa: F401

    HAVE_TB = True
except ImportError:
    HAVE_TB = False


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run written to a run directory, with the state after every chunk."""
    path = tmp_path_factory.mktemp("runs") / "reference"
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**OVERRIDES, "train.tensorboard": HAVE_TB})
    states = {}
    result = rmtjax.train(cfg, jax.random.key(0), run_dir=path,
                          on_chunk=lambda state, chunks, done: states.__setitem__(done, host(state)))
    return {"path": path, "config": cfg, "result": result, "states": states}


@pytest.fixture
def run_copy(reference, tmp_path):
    """A copy of the reference run directory that a test may damage."""
    path = tmp_path / "run"
    shutil.copytree(reference["path"], path)
    return path


# -- what a run writes ------------------------------------------------------------------------
def test_run_directory_holds_config_logs_checkpoints_and_summary(reference):
    path, result = reference["path"], reference["result"]
    assert load_config(path / "config.yaml") == reference["config"]
    assert result.run_dir == path
    assert sorted(int(p.name) for p in (path / "checkpoints").iterdir()) == [8, 12, 16]  # keep_checkpoints: 3

    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 16 * 2
    assert [(r["iteration"], r["seed"]) for r in rows[:3]] == [(1, 0), (1, 1), (2, 0)]
    for name, values in result.metrics.items():
        logged = np.array([[r[name] for r in rows if r["seed"] == s] for s in (0, 1)], dtype=values.dtype)
        np.testing.assert_array_equal(logged, values, err_msg=name)

    with open(path / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 32 and list(table[0])[:4] == ["iteration", "seed", "env_steps", "episode_return"]
    np.testing.assert_array_equal([np.float32(r["value_loss"]) for r in table if r["seed"] == "1"],
                                  result.metrics["value_loss"][1])

    summary = json.loads((path / "summary.json").read_text())
    assert summary["iterations"] == 16 and summary["env_steps_per_seed"] == 4096
    np.testing.assert_array_equal(np.float32(summary["final_return"]), result.final_return)
    assert summary["resumed_from_iteration"] is None
    assert json.loads((path / "run.json").read_text())["key"] == {"impl": "threefry2x32", "data": [0, 0]}


def test_load_run_gives_back_the_final_state_and_metrics(reference):
    loaded = rmtjax.load_run(reference["path"])
    assert_trees_equal(host(loaded.state), reference["states"][16])
    for name, values in reference["result"].metrics.items():
        np.testing.assert_array_equal(loaded.metrics[name], values, err_msg=name)
    np.testing.assert_array_equal(loaded.final_return, reference["result"].final_return)


@pytest.mark.skipif(not HAVE_TB, reason="tensorboardX (extra 'tensorboard') is not installed")
def test_tensorboard_events_hold_the_seed_mean_of_each_metric(reference):
    from tensorboardX.proto.event_pb2 import Event

    scalars = {}
    for events in (reference["path"] / "tensorboard").iterdir():
        data = events.read_bytes()
        i = 0
        while i < len(data):  # TFRecord: length, its crc, payload, payload crc
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                scalars.setdefault(v.tag, {})[event.step] = v.simple_value
    m = reference["result"].metrics
    steps = m["env_steps"][0]
    assert sorted(scalars["episode_return/mean"]) == list(steps)
    np.testing.assert_allclose([scalars["value_loss/mean"][s] for s in steps], m["value_loss"].mean(0), rtol=1e-6)
    np.testing.assert_array_equal([scalars["episode_return/seed_1"][s] for s in steps], m["episode_return"][1])


# -- resume after a kill ----------------------------------------------------------------------
# Runs the CLI, but holds the save of checkpoint PAUSE_STEP inside orbax just before it is
# committed (renamed), so that the parent's SIGKILL lands while that checkpoint is half-written.
PAUSING_CLI = """
import sys, time
from orbax.checkpoint._src.path import atomicity

pause_step, argv = sys.argv[1], sys.argv[2:]
commit = atomicity.AtomicRenameTemporaryPath.finalize

async def finalize(self):
    if self.get().name.startswith(pause_step + "."):
        print("PAUSED", flush=True)
        time.sleep(900)
    return await commit(self)

atomicity.AtomicRenameTemporaryPath.finalize = finalize
from rmtjax.cli import main
sys.exit(main(argv))
"""


def _env(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    # the resumed process loads the chunk the killed one compiled (same program, no recompile)
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax_cache")
    return env


def test_killed_run_resumes_to_the_same_parameters_and_metrics(reference, tmp_path):
    path = tmp_path / "killed"
    script = tmp_path / "pausing_cli.py"
    script.write_text(PAUSING_CLI)
    proc = subprocess.Popen([sys.executable, str(script), "12", "train", "--quiet", "--run-dir", str(path), *CLI_SETS],
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(900, proc.kill)  # a hung child must not hang the suite
    watchdog.start()
    try:
        first = proc.stdout.readline()
        assert first == "PAUSED\n", f"child ended before the pause: {first!r}\n{proc.stderr.read()}"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    finally:
        watchdog.cancel()
        proc.kill()
        proc.stdout.close()
        proc.stderr.close()

    # killed mid-write: checkpoints 4 and 8 are complete, 12 exists only as orbax's temporary directory
    listing = sorted(p.name for p in (path / "checkpoints").iterdir())
    assert listing == ["12.orbax-checkpoint-tmp", "4", "8"], listing
    assert len((path / "metrics.jsonl").read_text().splitlines()) == 12 * 2  # logged before the checkpoint
    assert not (path / "summary.json").exists()

    done = subprocess.run([sys.executable, "-m", "rmtjax.cli", "train", "--quiet", "--resume", str(path)],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert "4,096 env steps" in done.stdout

    ref = reference["path"]
    for name in ("metrics.jsonl", "metrics.csv"):
        assert (path / name).read_text() == (ref / name).read_text(), name
    assert_trees_equal(host(rmtjax.load_run(path).state), reference["states"][16])
    assert sorted(p.name for p in (path / "checkpoints").iterdir()) == ["12", "16", "8"]
    assert json.loads((path / "summary.json").read_text())["resumed_from_iteration"] == 8
    assert [r["from_iteration"] for r in json.loads((path / "run.json").read_text())["resumed"]] == [8]


# -- damaged checkpoints ----------------------------------------------------------------------
def _truncate_arrays(step_dir: Path):
    for f in (step_dir / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def test_damaged_latest_checkpoint_falls_back_to_the_previous_with_a_warning(reference, run_copy):
    _truncate_arrays(run_copy / "checkpoints" / "16")
    with pytest.warns(CheckpointWarning, match=r"checkpoints/16 is unusable \(.*\); falling back to the one at iteration 12"):
        loaded = rmtjax.load_run(run_copy)
    assert_trees_equal(host(loaded.state), reference["states"][12])
    np.testing.assert_array_equal(loaded.metrics["policy_loss"], reference["result"].metrics["policy_loss"][:, :12])
    assert (run_copy / "checkpoints" / "16").exists()  # reading changes nothing


def test_checkpoint_whose_contents_do_not_match_their_digest_is_skipped(reference, run_copy):
    meta = run_copy / "checkpoints" / "16" / "meta" / "metadata"
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps({**data, "state_sha256": "0" * 64}))
    with pytest.warns(CheckpointWarning, match="does not match its SHA-256"):
        loaded = rmtjax.load_run(run_copy)
    assert_trees_equal(host(loaded.state), reference["states"][12])


def test_resume_moves_unusable_checkpoints_aside_and_restores_the_previous(reference, run_copy):
    shutil.rmtree(run_copy / "checkpoints" / "16" / "state")  # a missing part
    run = RunDir.resume(run_copy)
    with pytest.warns(CheckpointWarning) as caught:
        snap = run.restore(reference["result"].state)
    run.close()
    assert snap.iterations == 12 and [s for s, _ in snap.skipped] == [16]
    assert_trees_equal(host(snap.state), reference["states"][12])
    assert sorted(p.name for p in (run_copy / "checkpoints").iterdir()) == ["12", "8"]
    assert (run_copy / "unusable_checkpoints" / "16" / "meta").is_dir()
    assert any("moved 1 unusable checkpoint" in str(w.message) for w in caught)


def test_missing_final_checkpoint_is_reported(reference, run_copy):
    shutil.rmtree(run_copy / "checkpoints" / "16")
    with pytest.warns(CheckpointWarning, match=r"final checkpoint of .* \(iteration 16, per summary\.json\) is "
                                               r"missing; using the one at iteration 12"):
        loaded = rmtjax.load_run(run_copy)
    assert_trees_equal(host(loaded.state), reference["states"][12])


def test_resume_before_the_first_checkpoint_starts_over_with_a_warning(reference, tmp_path):
    path = tmp_path / "fresh"
    RunDir.create(path, reference["config"], jax.random.key(0)).close()
    run = RunDir.resume(path)
    with pytest.warns(CheckpointWarning, match="no checkpoint yet: the run starts again from its beginning"):
        assert run.restore(reference["result"].state) is None
    run.close()


def test_a_run_directory_has_one_writer_at_a_time(reference, tmp_path):
    path = tmp_path / "busy"
    writer = RunDir.create(path, reference["config"], jax.random.key(0))
    with pytest.raises(RunDirError, match=rf"being written by another process \(pid {os.getpid()}\)"):
        RunDir.resume(path)
    assert RunDir.open(path).config == reference["config"]  # readers are welcome
    writer.close()
    RunDir.resume(path).close()


def test_no_usable_checkpoint_is_a_clear_error(run_copy, capsys):
    for step in (8, 12, 16):
        _truncate_arrays(run_copy / "checkpoints" / str(step))
    with pytest.raises(CheckpointError, match=r"no usable checkpoint in .*checkpoints \(3 found, none readable\)"):
        rmtjax.load_run(run_copy)
    assert main(["eval", str(run_copy)]) == 2
    assert "no usable checkpoint" in capsys.readouterr().err


# -- refusals ---------------------------------------------------------------------------------
def test_resume_with_another_config_is_refused_naming_the_fields(reference):
    other = reference["config"].override({"agent.lr": 1e-3, "env.num_envs": 8})
    with pytest.raises(rmtjax.ConfigError, match=r"another config.*agent\.lr: 0\.00025 in the run, 0\.001 given; "
                                                 r"env\.num_envs: 4 in the run, 8 given"):
        rmtjax.train(other, resume=reference["path"])


def test_cli_resume_with_a_changed_field_exits_2(reference, capsys):
    assert main(["train", "--resume", str(reference["path"]), "--set", "agent.gamma=0.9"]) == 2
    assert "agent.gamma: 0.99 in the run, 0.9 given" in capsys.readouterr().err


def test_resuming_a_finished_run_may_change_how_it_is_watched(reference, run_copy):
    cfg = reference["config"].override({"train.checkpoint_every": 2, "train.tensorboard": False})
    summary = (run_copy / "summary.json").read_text()
    again = rmtjax.train(cfg, resume=run_copy)  # nothing left to train: no chunk is compiled
    assert_trees_equal(host(again.state), reference["states"][16])
    assert load_config(run_copy / "config.yaml") == cfg
    assert (run_copy / "summary.json").read_text() == summary  # the training run's timings stay
    assert (run_copy / "metrics.jsonl").read_text() == (reference["path"] / "metrics.jsonl").read_text()


def test_resume_with_another_key_is_refused(reference):
    with pytest.raises(RunDirError, match="began with another PRNG key"):
        rmtjax.train(reference["config"], jax.random.key(1), resume=reference["path"])


def test_hparams_a_run_began_with_are_kept_and_checked_on_resume(reference, tmp_path):
    path = tmp_path / "hp"
    RunDir.create(path, reference["config"], jax.random.key(0), {"lr": 1e-3}).close()
    run = RunDir.resume(path)
    assert run.hparams == {"lr": np.float32(1e-3)}
    run.close()
    with pytest.raises(rmtjax.ConfigError, match=r"hparams: .* began with hparams \{'lr': 0\.001"):
        rmtjax.train(None, resume=path, hparams={"lr": 3e-4})


def test_new_run_refuses_a_directory_that_holds_one(reference):
    with pytest.raises(RunDirError, match=r"already holds a run \(config\.yaml, run\.json.*--resume"):
        rmtjax.train(reference["config"], jax.random.key(0), run_dir=reference["path"])


def test_resume_of_a_directory_without_a_run_is_refused(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "nothing does not exist" in capsys.readouterr().err
    with pytest.raises(RunDirError, match="holds no run"):
        rmtjax.train(None, resume=tmp_path)


def test_tensorboard_without_a_run_directory_is_a_config_error():
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**OVERRIDES, "train.tensorboard": True})
    with pytest.raises(rmtjax.ConfigError, match="train.tensorboard.*run directory"):
        rmtjax.train(cfg, jax.random.key(0))


# -- evaluation -------------------------------------------------------------------------------
def test_evaluate_plays_each_seeds_greedy_policy_like_a_step_by_step_loop(reference):
    import dataclasses

    from rmtjax.agents import build_agent
    from rmtjax.envs import make_env

    ev = rmtjax.evaluate(reference["path"], episodes=3, key=jax.random.key(5))
    assert ev.returns.shape == ev.lengths.shape == (2, 3) and ev.finished.all()

    # reference model: the same keys, one jitted env step at a time, returns summed from raw rewards
    cfg, state = reference["config"], reference["result"].state
    agent, env = build_agent(cfg), make_env(dataclasses.replace(cfg.env, num_envs=3))
    act = jax.jit(agent.act)
    step = jax.jit(lambda k, s, a: env.step(k, s, a, frozen=True))
    for seed, key in enumerate(jax.random.split(jax.random.key(5), 2)):
        params = jax.tree.map(lambda x: x[seed], state.params)
        key, k_reset = jax.random.split(key)
        obs, env_state = env.reset(k_reset)
        running, first = np.zeros(3), [None] * 3
        while any(r is None for r in first):
            key, k_act, k_env = jax.random.split(key, 3)
            obs, env_state, _, _, _, info = step(k_env, env_state, act(params, obs, k_act))
            running += np.asarray(info["raw_reward"])
            for e in np.flatnonzero(np.asarray(info["done"])):
                first[e] = running[e] if first[e] is None else first[e]
                running[e] = 0.0
        np.testing.assert_array_equal(ev.returns[seed], first)
    assert ev.mean == pytest.approx(np.mean(ev.returns)) and ev.std == pytest.approx(np.std(ev.returns))


def test_cli_eval_prints_the_mean_and_std_of_the_saved_policy(reference, capsys):
    expected = rmtjax.evaluate(reference["result"], episodes=4, key=jax.random.key(0))
    assert main(["eval", str(reference["path"]), "--episodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "4 greedy episode(s) × 2 seed(s)" in out
    assert f"mean return {expected.mean:.2f} ± std {expected.std:.2f}" in out


# -- the training doctor turned off and on across a resume ---------------------------------------
def test_a_resume_may_turn_the_doctor_off_and_on_and_the_agent_goes_on_exactly(reference, tmp_path, capsys):
    import warnings

    from rmtjax import doctor

    ref, path = reference["result"], tmp_path / "run"
    shutil.copytree(reference["path"], path)
    for step in ("12", "16"):
        shutil.rmtree(path / "checkpoints" / step)
    (path / "summary.json").unlink()
    agent_ref = doctor.split(reference["states"][16])[0]  # the agent's state, the doctor's level left out
    assert (path / "checkpoints" / "8" / "doctor").is_dir()  # the doctor's state is kept apart

    # off: from the checkpoint at 8 (which has a doctor state), through the CLI
    with warnings.catch_warnings():
        warnings.simplefilter("error", doctor.DoctorWarning)
        assert main(["train", "--quiet", "--resume", str(path), "--set", "doctor.enabled=false"]) == 0
    capsys.readouterr()
    off = rmtjax.load_run(path)
    assert not off.config.doctor.enabled and not any(k.startswith("doctor_") for k in off.metrics)
    assert_trees_equal(host(off.state), agent_ref)
    for k in off.metrics:
        np.testing.assert_array_equal(off.metrics[k], ref.metrics[k], err_msg=k)
    assert not (path / "checkpoints" / "16" / "doctor").exists()
    assert "doctor_return" not in json.loads((path / "metrics.jsonl").read_text().splitlines()[-1])

    # on again: from the checkpoint at 12, written with the doctor off; it starts afresh there
    shutil.rmtree(path / "checkpoints" / "16")
    (path / "summary.json").unlink()
    with pytest.warns(doctor.DoctorWarning, match=r"starts afresh at iteration 12: .*doctor.enabled false"):
        on = rmtjax.train(reference["config"], resume=path)
    assert_trees_equal(doctor.split(host(on.state))[0], agent_ref)
    assert isinstance(on.state, doctor.DoctorTrainState)
    assert set(on.metrics) == set(ref.metrics)
    for k in ref.metrics:
        if not k.startswith("doctor_"):
            np.testing.assert_array_equal(on.metrics[k], ref.metrics[k], err_msg=k)
    assert np.isnan(on.metrics["doctor_return"][:, :12]).all() and np.isfinite(on.metrics["doctor_return"][:, 12:]).all()
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    assert [r["doctor_return"] is None for r in rows] == [r["iteration"] <= 12 for r in rows]
    assert (path / "checkpoints" / "16" / "doctor").is_dir()
    assert main(["doctor", str(path)]) == 0
    assert capsys.readouterr().out.strip().endswith("no findings")
