"""benchmarks/reports/compare_curves.py: one table from curves saved by benchmarks.experiments.curves and benchmarks.experiments.hierarchical."""

import numpy as np
import pytest

import benchmarks.lib.runner
from benchmarks.__main__ import main as bench


def test_curves_of_both_formats_make_one_table_of_late_means(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmarks.lib.runner, "RESULTS", tmp_path)
    steps = np.arange(1, 101) * 1000  # 100 iterations of 1,000 env steps
    ramp = np.stack([steps / 1000.0 + s for s in range(4)])  # seed s: return = iteration + s
    episodes = np.ones_like(ramp)
    episodes[:, :5] = 0  # no episode finished yet: those entries are not returns
    np.savez(tmp_path / "c.npz", dqn=ramp, dqn_env_steps=steps, dqn_episode_count=episodes)
    np.savez(tmp_path / "h.npz", env_steps=steps, tiered=2 * ramp)
    bench(["compare_curves", f"dqn={tmp_path / 'c.npz'}:dqn", f"rmt={tmp_path / 'h.npz'}:tiered",
                         "--env", "Test", "--steps", "100000", "--name", "cc"])
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in (tmp_path / "compare_curves" / "cc.md").read_text().splitlines() if line.startswith("| dqn") or line.startswith("| rmt")}
    # the last tenth is iterations 91..100 (mean 95.5); seed s adds s
    assert rows["dqn"][3] == "95.5 96.5 97.5 98.5"
    assert rows["rmt"][3] == "191.0 193.0 195.0 197.0"
    assert rows["dqn"][2].startswith("97.00 [")  # the IQM of four evenly spaced scores is their mean
    assert rows["dqn"][4] == "11.5"  # the first tenth's point: iteration 10 (10 + mean seed offset 1.5)


def test_a_run_of_another_budget_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmarks.lib.runner, "RESULTS", tmp_path)
    np.savez(tmp_path / "h.npz", env_steps=np.arange(1, 11) * 1000, tiered=np.ones((2, 10)))
    with pytest.raises(SystemExit, match="ends at 10,000 env steps"):
        bench(["compare_curves", f"rmt={tmp_path / 'h.npz'}:tiered", "--env", "T", "--steps", "20000", "--name", "x"])
