"""The notebooks run top to bottom, headless, and show what they say they show.

Each notebook ends with a cell tagged `result` that prints one JSON line; the tests execute the
notebook with nbclient (in a fresh kernel, from the rmtjax/notebooks/ folder) and check those values and
that the plots were drawn.
"""

import json
from pathlib import Path

import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "rmtjax" / "notebooks"
pytestmark = pytest.mark.slow


def execute(name: str):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def result_of(nb) -> dict:
    cells = [c for c in nb.cells if "result" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "one cell tagged 'result'"
    text = "".join(o.get("text", "") for o in cells[0].outputs if o.output_type == "stream")
    return json.loads(text.strip().splitlines()[-1])


def images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_notebooks_are_stored_without_outputs():
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert all(not c.get("outputs") and c.get("execution_count") is None
                   for c in nb.cells if c.cell_type == "code"), path.name


def test_quickstart_trains_plots_and_evaluates():
    nb = execute("01_quickstart.ipynb")
    r = result_of(nb)
    assert images(nb) == 1
    assert r["env_steps"] >= 49_000  # whole iterations of 4 envs × 128 steps
    assert len(r["final_return"]) == 4 and np.all(np.isfinite(r["final_return"]))
    # learning: later iterations score above the first quarter's, and well above a random policy (~22)
    assert r["last_returns"] > r["first_returns"]
    assert r["last_returns"] > 40
    ev = np.asarray(r["eval_returns"])
    assert ev.shape == (4, 5) and np.all(ev >= 1) and np.all(ev <= 500)


def test_sweeps_notebook_trains_the_grid_in_one_program():
    nb = execute("02_sweeps.ipynb")
    r = result_of(nb)
    assert images(nb) == 1
    score = np.asarray(r["score"])
    assert score.shape == (4, 2) and np.all(np.isfinite(score))
    assert r["return_shape"][:2] == [8, 3]  # grid cells × seeds
    np.testing.assert_allclose(r["logged_lr"], np.repeat(r["lrs"], 2), rtol=1e-6)
    assert np.ptp(score) > 0  # the hyperparameters made a difference
    assert score.max() > 30


def test_inside_rmt_notebook_shows_tiers_shares_and_meta_traces():
    nb = execute("03_inside_rmt.ipynb")
    r = result_of(nb)
    assert images(nb) == 3
    sizes = np.asarray(r["tier_sizes"])  # [tier, seed]
    np.testing.assert_array_equal(sizes.sum(axis=0), r["replay_size"])
    assert np.all(np.asarray(r["replay_size"]) <= r["capacity"]) and np.all(sizes[2] > 0)
    assert sum(r["shares_late"]) == pytest.approx(1.0, abs=1e-5)
    assert r["top_td_share_late"] > 0.2  # tiered sampling concentrates on high |TD error| (uniform: 0.10)
    b = r["bounds"]
    for name, bound in (("lr", "lr"), ("gamma", "gamma"), ("eps_start", "eps")):
        lo, hi = r[name]  # the hyperparameters are float32, the bounds float64
        assert b[bound][0] * (1 - 1e-6) <= lo <= hi <= b[bound][1] * (1 + 1e-6), (name, r[name], b[bound])
    assert r["meta_signals_finite"]
