"""Hyperparameter sweeps: every cell of a grid × every seed in one compiled program.

    rmtjax sweep CONFIG --grid agent.lr=1e-4,3e-4,1e-3 --grid agent.gamma=0.97,0.99 --seeds 8

A sweep is one training run whose seeds are the cells' seeds, cell after cell (cell `c`, seed
`s` is run seed `c·S + s`), with the grid's hyperparameters given per seed
(`train(..., hparams={"lr": [num_cells·S values]})`): hyperparameters are arrays in the agent's
state, so the cells differ only in data and share one compiled program, chunks, progress bar,
checkpoints and resume (`sweep(resume=DIR)`, `rmtjax sweep --resume DIR`). Cell `c`'s seeds have
the keys of a plain run with S seeds, so every cell is trained on the same seeds.

Only fields held as arrays can be a grid axis: the agent's hyperparameters (`agent.lr`,
`agent.gamma`, ...; `sweepable(algo)` lists them). A field that changes the program's shapes
or structure (`env.num_envs`, `agent.hidden`, `agent.batch_size`, ...) would need a compile of
its own per value and is refused, naming it.

The run directory is a run directory (`rmtjax.rundir`) whose `metrics.jsonl`/`.csv` rows carry
`cell` and `seed` (and each hyperparameter's value, a metric), `run.json` holds the grid, and at
the end `sweep.csv` holds the summary table (per cell: the grid values, the IQM of the final
return over seeds with a 95% bootstrap interval, the mean) and `heatmap.png` its heat map
(with matplotlib).
"""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rmtjax import _callable_module
from rmtjax.config import Config
from rmtjax.schema import ConfigError


def sweepable(algo: str) -> list[str]:
    """The dotted fields a sweep over `algo` may vary: its hyperparameters held as arrays."""
    from rmtjax.agents import agent_class

    return [f"agent.{f.name}" for f in dataclasses.fields(agent_class(algo).HParams)]


def check_grid(config: Config, grid: Mapping[str, Sequence[Any]]) -> dict[str, list]:
    """The grid with each value checked as the config checks it (a `ConfigError` names the field
    and value); fields that are not hyperparameters held as arrays are refused, all named."""
    if not isinstance(grid, Mapping) or not grid:
        raise ConfigError("grid: give at least one field and its values, e.g. --grid agent.lr=1e-4,3e-4")
    allowed = sweepable(config.algo)
    refused = [f for f in grid if f not in allowed]
    if refused:
        for f in refused:
            config.override({f: _default_of(config, f)})  # an unknown field fails here, with close matches
        raise ConfigError(f"grid: {', '.join(refused)} cannot be swept in one compiled program: "
                          f"{'it changes' if len(refused) == 1 else 'they change'} the program's shapes or structure "
                          f"(array sizes, network widths, loop lengths, choices), not a number held as an array. "
                          f"Sweepable fields of {config.algo}: {', '.join(allowed)}. Run one sweep per value of "
                          f"{'it' if len(refused) == 1 else 'each'} instead.")
    out = {}
    for field, values in grid.items():
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        if not values:
            raise ConfigError(f"grid: {field} has no values")
        checked = [getattr(config.override({field: v}).agent, field.split(".", 1)[1]) for v in values]
        if len(set(checked)) != len(checked):
            raise ConfigError(f"grid: {field} lists a value twice: {values}")
        out[field] = checked
    return out


def _default_of(config: Config, field: str):
    node: Any = config.to_dict()
    for part in field.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


@dataclasses.dataclass
class SweepResult:
    """A sweep's results. `metrics[name]` is `[num_cells, seeds, iterations]`, `final_return`
    `[num_cells, seeds]`; `cells[c]` is cell `c`'s `{field: value}`."""

    config: Config  # the base config: train.num_seeds is the seeds per cell
    grid: dict[str, list]
    cells: list[dict]
    metrics: dict[str, np.ndarray]
    final_return: np.ndarray
    compile_seconds: float
    run_seconds: float
    run_dir: Path | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)

    def table(self, confidence: float = 0.95) -> list[dict]:
        """One row per cell: its grid values, `iqm` of the final return over its seeds with the
        percentile-bootstrap interval `low`, `high`, and `mean`."""
        from rmtjax.stats import iqm_ci

        rows = []
        for c, cell in enumerate(self.cells):
            scores = self.final_return[c]
            scores = scores[np.isfinite(scores)]
            if scores.size:
                mid, lo, hi = iqm_ci(scores, confidence=confidence)
                mean = float(scores.mean())
            else:  # no episode finished in any seed
                mid = lo = hi = mean = math.nan
            rows.append({"cell": c, **cell, "iqm": mid, "low": lo, "high": hi, "mean": mean,
                         "seeds": int(scores.size)})
        return rows

    def best(self) -> dict:
        """The row of `table()` with the highest IQM."""
        rows = [r for r in self.table() if math.isfinite(r["iqm"])]
        return max(rows, key=lambda r: r["iqm"]) if rows else self.table()[0]

    def table_text(self) -> str:
        fields = list(self.grid)
        head = ["cell", *fields, "IQM final return [95% CI]", "mean", "seeds"]
        lines = [head]
        for r in self.table():
            lines.append([str(r["cell"]), *(f"{r[f]:g}" for f in fields),
                          f"{r['iqm']:.1f} [{r['low']:.1f}, {r['high']:.1f}]", f"{r['mean']:.1f}", str(r["seeds"])])
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        return "\n".join("  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in lines)

    def table_csv(self) -> str:
        import csv

        buf = io.StringIO()
        fields = list(self.grid)
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["cell", *fields, "iqm", "low", "high", "mean", "seeds"])
        for r in self.table():
            writer.writerow([r["cell"], *(r[f] for f in fields), *(repr(float(r[k])) for k in ("iqm", "low", "high", "mean")),
                             r["seeds"]])
        return buf.getvalue()

    def heatmap(self) -> bytes:
        """A PNG heat map of the IQM final return: rows are the first field's values, columns the
        other fields' combinations. Needs matplotlib."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fields = list(self.grid)
        rows_of = self.grid[fields[0]]
        cols = [dict(zip(fields[1:], combo)) for combo in _product([self.grid[f] for f in fields[1:]])]
        iqms = np.array([r["iqm"] for r in self.table()]).reshape(len(rows_of), len(cols))
        fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(cols), 1.2 + 0.6 * len(rows_of)))
        im = ax.imshow(iqms, cmap="viridis", aspect="auto")
        ax.set_yticks(range(len(rows_of)), [f"{v:g}" for v in rows_of])
        ax.set_ylabel(fields[0])
        ax.set_xticks(range(len(cols)), [", ".join(f"{k.split('.')[-1]}={v:g}" for k, v in c.items()) or "-"
                                         for c in cols], rotation=30 if len(cols) > 3 else 0)
        ax.set_xlabel(", ".join(fields[1:]) or "")
        for i in range(iqms.shape[0]):
            for j in range(iqms.shape[1]):
                ax.text(j, i, f"{iqms[i, j]:.1f}", ha="center", va="center", color="w", fontsize=9)
        fig.colorbar(im, ax=ax, label="IQM final return")
        ax.set_title(f"{self.config.algo} on {self.config.env.id}, {self.final_return.shape[1]} seed(s) per cell",
                     fontsize=9)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        return buf.getvalue()

    def summary(self) -> str:
        best = self.best()
        where = ", ".join(f"{f}={best[f]:g}" for f in self.grid)
        return (f"{self.config.algo} on {self.config.env.id}: {len(self.cells)} cell(s) × "
                f"{self.final_return.shape[1]} seed(s), {int(self.metrics['env_steps'][0, 0, -1]):,} env steps each, "
                f"one program; best IQM final return {best['iqm']:.1f} at {where}"
                + "".join(f"\nWARNING: {w}" for w in self.warnings))


def _product(lists):
    import itertools

    return list(itertools.product(*lists))


def sweep(config: Config | None, grid: Mapping[str, Sequence[Any]] | None = None, key=None, *,
          progress: bool | None = None, on_chunk: Callable | None = None, run_dir=None, resume=None) -> SweepResult:
    """Train every cell of `grid` (`{"agent.lr": [1e-4, 3e-4], ...}`) × `config.train.num_seeds`
    seeds in one compiled program. `run_dir`, `resume`, `progress` and `on_chunk` as for
    `rmtjax.train`; `resume=DIR` continues a sweep (config, grid and key may then be None)."""
    from rmtjax.driver import config_cells, train

    if resume is not None:
        from rmtjax.rundir import RunDir

        opened = RunDir.open(resume)
        if opened.sweep is None:
            raise ConfigError(f"{opened.path} holds a training run, not a sweep: continue it with "
                              f"rmtjax train --resume {opened.path}")
        info = opened.sweep
        if grid is not None and check_grid(_base(opened.config, info), grid) != info["grid"]:
            raise ConfigError(f"grid: {opened.path} was swept over {info['grid']}, not {dict(grid)}; resume it "
                              f"without a grid")
        run_config = None
        if config is not None:
            run_config = config.override({"train.num_seeds": config.train.num_seeds * len(config_cells(info))})
        result = train(run_config, key, progress=progress, on_chunk=on_chunk, resume=resume, _sweep=info)
        return _result(_base(result.config, info), info, result)
    if config is None or key is None or grid is None:
        raise TypeError("sweep(config, grid, key): all three are needed unless resume=RUN_DIR is given")
    if config.meta.mode == "pbt":
        raise ConfigError("meta.mode: pbt copies between the run's seeds, which in a sweep belong to different "
                          "cells; sweep without it (meta.mode: off, rules or bandit)")
    if config.distributed.devices > 1:
        raise ConfigError("distributed.devices: a sweep runs on one device; set distributed.devices: 1")
    checked = check_grid(config, grid)
    seeds = config.train.num_seeds
    info = {"grid": checked, "seeds": seeds}
    cells = config_cells(info)
    run_config = config.override({"train.num_seeds": seeds * len(cells)})
    hparams = {field.split(".", 1)[1]: np.repeat(np.asarray([c[field] for c in cells], np.float32), seeds)
               for field in checked}
    result = train(run_config, key, hparams=hparams, progress=progress, on_chunk=on_chunk, run_dir=run_dir,
                   _sweep=info)
    return _result(config, info, result)


def _base(run_config: Config, info: dict) -> Config:
    return run_config.override({"train.num_seeds": int(info["seeds"])})


def _result(config: Config, info: dict, result) -> SweepResult:
    from rmtjax.driver import config_cells

    cells = config_cells(info)
    seeds = int(info["seeds"])
    shape = (len(cells), seeds)
    metrics = {k: v.reshape(shape + v.shape[1:]) for k, v in result.metrics.items()}
    out = SweepResult(config, dict(info["grid"]), cells, metrics, np.asarray(result.final_return).reshape(shape),
                      result.compile_seconds, result.run_seconds, result.run_dir, list(result.warnings))
    if result.run_dir is not None:
        from rmtjax import safefs

        safefs.write_atomic(Path(result.run_dir) / "sweep.csv", out.table_csv())
        try:
            png = out.heatmap()
        except ImportError:
            png = None  # no matplotlib: the table is there, the plot is not
        if png is not None:
            safefs.write_atomic(Path(result.run_dir) / "heatmap.png", png)
    return out




_callable_module(__name__, sweep)  # rmtjax.sweep stays the function after this module is imported
