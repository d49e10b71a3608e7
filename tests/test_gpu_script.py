"""`benchmarks/experiments/gpu.py --smoke`: every row of the GPU table runs (tiny sizes, on the CPU here)."""

import numpy as np

import benchmarks.lib.runner
from benchmarks.__main__ import main as bench
from benchmarks.experiments import gpu


def test_the_gpu_benchmark_runs_every_row_in_smoke_mode(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmarks.lib.runner, "RESULTS", tmp_path)
    path = bench(["gpu", "--smoke"])
    rows = [line for line in path.read_text().splitlines() if line.startswith("| ") and "precision" not in line]
    assert len(rows) == len(gpu.CASES) + 1  # every case in fp32, the first in bf16 too
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] in gpu.PRECISIONS
        assert float(cells[5].replace(",", "")) > 0  # env-steps/s
        assert np.isfinite(float(cells[6]))  # final return
    text = path.read_text()
    assert "Rows: PPO on CartPole-v1" in text and "(finished)" in text


def test_rows_past_the_time_budget_are_listed_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmarks.lib.runner, "RESULTS", tmp_path)
    text = bench(["gpu", "--smoke", "--max-seconds", "-1", "--name", "budget"]).read_text()
    assert not [line for line in text.splitlines() if line.startswith("| ") and "precision" not in line]
    skipped = text.split("Not run (past --max-seconds): ")[1]
    assert skipped.count(";") == len(gpu.CASES)  # every case in fp32 + the first in bf16, "; "-separated
    assert "(finished)" in text
