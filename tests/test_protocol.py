"""An agent that implements only `rmtjax.protocol` (tests/toy_agent.py) gets every shared layer:
the meta-controller's rules, bandit and PBT, the curriculum, low precision with the guard, run
directories with a kill and a resume — with no change to shared code and no names to match."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import rmtjax
import tests.toy_agent  # noqa: F401 (registers algo: toy)
from rmtjax.agents import agent_class, register_agent
from rmtjax.protocol import hparam_groups
from rmtjax.schema import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BASE = {"algo": "toy", "env": {"id": "CartPole-v1", "num_envs": 8},
        "train": {"total_steps": 4000, "num_seeds": 4, "num_chunks": 2, "progress": False}, "agent": {}}


def toy_config(**sections):
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return rmtjax.Config.from_dict(data)


def test_the_toy_declares_its_groups_and_nothing_else_is_looked_up():
    assert hparam_groups(agent_class("toy").HParams) == {"lr": ("step_size",), "gamma": ("discount",),
                                                         "eps": ("eps_from", "eps_to")}
    with pytest.raises(TypeError, match="missing .*signals"):
        register_agent("broken", type("Broken", (), {"Config": None, "HParams": None}))
    with pytest.raises(ConfigError, match="env.num_envs: 8 must be a multiple of distributed.devices"):
        toy_config(distributed={"devices": 3})


def test_rules_move_the_groups_the_toy_declares():
    # every decision: the value loss counts as converged (huge tolerance) and the policy as
    # matured, so γ rises and ε falls at every interval
    cfg = toy_config(meta={"mode": "rules", "warmup": 2, "interval": 2, "loss_tolerance": 1e9,
                           "entropy_tolerance": 1e9, "return_tolerance": 1e9, "gamma_min": 0.9, "gamma_max": 0.999,
                           "explore_target": 0.0, "lr_max": 0.1}, agent={"discount": 0.95})
    m = rmtjax.train(cfg, jax.random.key(0)).metrics
    assert m["discount"][:, -1].min() > 0.99 and m["discount"][:, 0].max() <= 0.95 + 1e-6
    assert m["eps_from"][:, -1].max() < 0.9 * m["eps_from"][:, 0].min()
    assert np.all(m["step_size"] == np.float32(0.01))  # no lr rule fired: the return never fell
    # the meta metrics follow the signals the toy reports: a value loss and an exploration share, no entropy
    assert "meta_loss_trend" in m and "meta_explore" in m and "meta_entropy_rate" not in m
    np.testing.assert_allclose(m["meta_explore"][:, 0], m["random_share"][:, 0], rtol=1e-6)


def test_the_bandit_plays_arms_named_by_group():
    cfg = toy_config(meta={"mode": "bandit", "warmup": 1, "interval": 5, "lr_max": 0.1,
                           "arms": [{"lr": 0.002}, {"lr": 0.05, "gamma": 0.9}]})
    m = rmtjax.train(cfg, jax.random.key(1)).metrics
    played = set(np.unique(m["step_size"][:, 10:]).tolist())
    assert played == {float(np.float32(0.002)), float(np.float32(0.05))}
    # the second arm sets γ as well (the first leaves it as it is): 0.9 from its first play on
    second = m["step_size"] == np.float32(0.05)
    assert np.all(m["discount"][second] == np.float32(0.9))
    before = np.cumsum(second, axis=1) == 0
    assert np.all(m["discount"][before] == np.float32(0.99)) and before.any()


def test_pbt_copies_the_learner_and_the_hyperparameters_of_good_seeds():
    cfg = toy_config(meta={"mode": "pbt", "warmup": 5, "interval": 5, "lr_max": 0.1})
    result = rmtjax.train(cfg, jax.random.key(2))
    source = result.metrics["meta_pbt_source"]
    assert (source >= 0).any() and (source == -1).any()
    t = int(np.argwhere((source >= 0).any(0))[0, 0])  # the first round that copied
    worst = int(np.flatnonzero(source[:, t] >= 0)[0])
    src = int(source[worst, t])
    ratio = result.metrics["step_size"][worst, t] / result.metrics["step_size"][src, t]
    assert ratio == pytest.approx(1.25, rel=1e-5) or ratio == pytest.approx(0.8, rel=1e-5)


def test_curriculum_sets_hparams_and_env_parameters_of_the_toy():
    cfg = toy_config(curriculum={"metric": "episode_return", "stages": [
        {"threshold": 0.0, "hparams": {"gamma": 0.9}, "env": {"max_steps_in_episode": 50}}]})
    result = rmtjax.train(cfg, jax.random.key(3))
    assert np.all(result.metrics["curriculum_stage"][:, -1] == 1)
    assert np.all(result.metrics["discount"][:, -1] == np.float32(0.9))
    assert np.all(np.asarray(result.state.env_state.params.max_steps_in_episode) == 50)
    assert result.metrics["episode_length"].max() <= 50


def test_bf16_and_the_guard_skip_the_toys_diverging_updates():
    from rmtjax.health import HealthWarning

    cfg = toy_config(precision={"compute": "bf16"}, agent={"step_size": 1.0, "clip": 0.0})
    with pytest.warns(HealthWarning, match="skipped every update"):  # and the run says so
        result = rmtjax.train(cfg, jax.random.key(4))
    m = result.metrics
    assert np.all(m["precision_bits"] == 16)
    assert m["skipped_updates"][:, -1].min() > 0  # the unclipped step of 1.0 overflows, and is skipped
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(result.state.params))


def test_4_devices_with_mean_fusion_give_the_toy_the_parameters_of_1_device_with_the_global_batch():
    from tests.test_distributed import run_worker

    r = run_worker(["toy"])
    assert r["max_param_move"] > 1e-4  # the three steps did move the parameters
    assert r["max_param_diff"] < 1e-6 * max(1.0, r["param_scale"]), r
    np.testing.assert_allclose(r["loss_four"], r["loss_one"], rtol=1e-6)
    np.testing.assert_allclose(r["grad_norm_four"], r["grad_norm_one"], rtol=1e-6)


KILL_AFTER_FIRST_CHUNK = """
import os, signal, sys
import jax, rmtjax, tests.toy_agent
from tests.test_protocol import toy_config
cfg = toy_config(**{"train": {"num_chunks": 4}})
rmtjax.train(cfg, jax.random.key(5), run_dir=sys.argv[1],
             on_chunk=lambda state, chunks, done: os.kill(os.getpid(), signal.SIGKILL) if done >= 2 * 125 // 4 else None)
"""
RESUME = """
import sys, rmtjax, tests.toy_agent
rmtjax.train(None, None, resume=sys.argv[1])
"""


def test_a_killed_toy_run_resumes_to_the_uninterrupted_result(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache")}
    path = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_FIRST_CHUNK, str(path)], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (path / "summary.json").exists()
    done = subprocess.run([sys.executable, "-c", RESUME, str(path)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = rmtjax.load_run(path)
    reference = rmtjax.train(toy_config(train={"num_chunks": 4}), jax.random.key(5))
    for name in ("episode_return", "td_loss", "random_share"):
        np.testing.assert_array_equal(resumed.metrics[name], reference.metrics[name], err_msg=name)
    for a, b in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(reference.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
