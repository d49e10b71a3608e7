"""Sweeps: a grid × seeds as one compiled run, its run directory, table, heat map and resume."""

import csv
import json

import jax
import numpy as np
import pytest

import rmtjax
from rmtjax.cli import main
from rmtjax.sweep import sweep

SETS = {"train.total_steps": 1024, "train.num_chunks": 2, "agent.rollout_len": 32, "train.progress": False}
GRID = {"agent.lr": [1e-4, 1e-3], "agent.gamma": [0.97, 0.99]}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "grid"
    args = ["sweep", "--quiet", "--seeds", "2", "--run-dir", str(path),
            "--grid", "agent.lr=1e-4,1e-3", "--grid", "agent.gamma=0.97,0.99"]
    for k, v in SETS.items():
        args += ["--set", f"{k}={str(v).lower()}"]
    assert main(args) == 0
    return path


def rows(path):
    with open(path / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_the_run_directory_has_one_metrics_file_with_the_cell_as_a_column(swept):
    table = rows(swept)
    n_iter = 1024 // (4 * 32)
    assert len(table) == n_iter * 4 * 2
    assert list(table[0])[:3] == ["iteration", "cell", "seed"]
    cells = [(0.0001, 0.97), (0.0001, 0.99), (0.001, 0.97), (0.001, 0.99)]  # row-major over the grid
    for r in table:
        lr, gamma = cells[int(r["cell"])]
        assert float(r["lr"]) == pytest.approx(lr) and float(r["gamma"]) == pytest.approx(gamma)
        assert r["seed"] in ("0", "1")
    info = json.loads((swept / "run.json").read_text())
    assert info["sweep"] == {"grid": {"agent.lr": [0.0001, 0.001], "agent.gamma": [0.97, 0.99]}, "seeds": 2}


def test_summary_table_holds_each_cells_iqm_and_interval_and_a_heat_map(swept):
    with open(swept / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert [(float(r["agent.lr"]), float(r["agent.gamma"])) for r in table] == \
        [(0.0001, 0.97), (0.0001, 0.99), (0.001, 0.97), (0.001, 0.99)]
    summary = json.loads((swept / "summary.json").read_text())
    final = np.asarray(summary["final_return"], np.float64).reshape(4, 2)
    for c, r in enumerate(table):
        # with two seeds the IQM is their mean, and the bootstrap interval spans the two values
        assert float(r["iqm"]) == pytest.approx(final[c].mean(), rel=1e-6)
        assert float(r["low"]) == pytest.approx(final[c].min(), rel=1e-6)
        assert float(r["high"]) == pytest.approx(final[c].max(), rel=1e-6)
        assert r["seeds"] == "2"
    assert (swept / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_grid_runs_as_one_program_and_each_cell_equals_its_own_run():
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**SETS, "train.num_seeds": 2})
    calls = []
    result = sweep(cfg, GRID, jax.random.key(0), on_chunk=lambda s, chunks, it: calls.append(chunks[-1]["lr"].shape))
    # every chunk of the program steps all 4 cells × 2 seeds at once
    assert calls == [(4, 8), (4, 8)]
    assert result.metrics["episode_return"].shape == (4, 2, 8)
    np.testing.assert_allclose(result.metrics["lr"][:, :, 0], [[1e-4] * 2, [1e-4] * 2, [1e-3] * 2, [1e-3] * 2], rtol=1e-6)
    # cell 2 (lr 1e-3, gamma 0.97) is the run with those values, seed for seed
    alone = rmtjax.train(cfg.override({"agent.lr": 1e-3, "agent.gamma": 0.97}), jax.random.key(0))
    for name in ("episode_return", "value_loss", "policy_loss"):
        np.testing.assert_allclose(result.metrics[name][2], alone.metrics[name], rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(result.final_return[2], alone.final_return, rtol=1e-6)
    assert result.best()["cell"] in range(4)


def test_an_interrupted_sweep_resumes_to_the_same_metrics(swept, tmp_path):
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**SETS, "train.num_seeds": 2})

    def stop(state, chunks, iteration):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(cfg, GRID, jax.random.key(0), run_dir=tmp_path / "s", on_chunk=stop)
    assert not (tmp_path / "s" / "sweep.csv").exists()
    assert main(["train", "--resume", str(tmp_path / "s")]) == 2  # a sweep is resumed as a sweep
    assert main(["sweep", "--quiet", "--resume", str(tmp_path / "s")]) == 0
    assert (tmp_path / "s" / "metrics.jsonl").read_text() == (swept / "metrics.jsonl").read_text()
    assert (tmp_path / "s" / "sweep.csv").read_text() == (swept / "sweep.csv").read_text()


def test_fields_that_change_shapes_are_refused_by_name(capsys):
    assert main(["sweep", "--grid", "env.num_envs=4,8", "--grid", "agent.hidden=[8],[16]",
                 "--grid", "agent.lr=1e-4,1e-3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "grid: env.num_envs, agent.hidden cannot be swept in one compiled program" in err
    assert "Sweepable fields of ppo: agent.lr, agent.gamma" in err
    assert main(["sweep", "--grid", "agent.lr=1e-4,2"]) == 2
    assert "agent.lr: 2.0 is out of range" in capsys.readouterr().err
    assert main(["sweep", "--grid", "agent.lrr=1e-4"]) == 2
    assert "unknown key agent.lrr. Did you mean: lr" in capsys.readouterr().err
    assert main(["sweep"]) == 2
    assert "give at least one --grid" in capsys.readouterr().err
