"""Compare agents: several algorithms × environments × seeds, each at its preset (or a given
config), in one compiled program per (algorithm, environment); a table and learning curves.

    result = rmtjax.compare(["rmt", "dqn", "pqn"], ["CartPole-v1", "Acrobot-v1"], seeds=5)
    print(result.table_markdown())

    rmtjax compare --algos rmt,dqn,pqn --envs CartPole-v1,Acrobot-v1 --seeds 5 --out cmp/

Every run evaluates its greedy policy inside the compiled loop (`train.eval_every`, about
`eval_points` times, and after the last iteration: `rmtjax.evaluation`). The table gives, per
(algorithm, environment): the IQM over seeds of the final greedy evaluation and of the training
return (the mean of `episode_return` over the last tenth of the run, exploration included), each
with its 95% percentile-bootstrap interval (`rmtjax.stats`), env steps per second (all seeds),
compile and wall-clock seconds. `curves.png` plots, per environment, the IQM of the training return
(lines) and of the greedy evaluations (markers) against env steps (needs matplotlib).

`budget_seconds` gives each agent the same training wall-clock (compilation not counted): it
trains until the iteration boundary nearest the budget (`rmtjax.train`'s `budget_seconds`: its
chunks run in pieces sized from the measured speed), then its greedy policy is evaluated
(`rmtjax.evaluate`, the same episodes per seed). Its schedules (learning rate, exploration) still
run over the config's `train.total_steps`, and an agent that gets through all of them sooner stops
there (the table says how many env steps each did).

With `out_dir` the directory receives `compare.md` (the table), `compare.csv`, `results.json`
(every seed's numbers and the curves) and `curves.png`, each written atomically
(`rmtjax.safefs`); a directory that already holds a comparison is refused.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rmtjax import _callable_module, stats
from rmtjax.config import Config, ConfigError, load_config, make_config

OUTPUTS = ("compare.md", "compare.csv", "results.json", "curves.png")


@dataclasses.dataclass
class Entry:
    """One (algorithm, environment) of a comparison: per-seed numbers and curves."""

    label: str
    config: Config
    eval_return: np.ndarray  # [seeds]: the final greedy evaluation's mean return per seed
    train_return: np.ndarray  # [seeds]: mean episode_return over the last tenth of the iterations
    env_steps: int  # per seed
    compile_seconds: float
    run_seconds: float
    eval_seconds: float  # the final evaluation's, when it ran apart (budget mode); else 0
    curve_steps: np.ndarray  # [iterations] env steps per seed
    curve_return: np.ndarray  # [seeds, iterations] episode_return (NaN before the seed's first episode ended)
    eval_steps: np.ndarray  # [evaluations] env steps at each periodic evaluation
    eval_curve: np.ndarray  # [seeds, evaluations]
    stopped_by_budget: bool = False

    @property
    def algo(self) -> str:
        return self.config.algo

    @property
    def env(self) -> str:
        return self.config.env.id

    @property
    def steps_per_second(self) -> float:
        return self.env_steps * self.config.train.num_seeds / self.run_seconds if self.run_seconds > 0 else math.nan

    @property
    def wall_seconds(self) -> float:
        return self.compile_seconds + self.run_seconds + self.eval_seconds


@dataclasses.dataclass
class CompareResult:
    entries: list[Entry]
    budget_seconds: float | None = None
    out_dir: Path | None = None

    def table(self, confidence: float = 0.95) -> list[dict]:
        """One row per entry: IQM and interval of the greedy evaluation and of the training
        return, env steps, env steps/s, compile and wall-clock seconds."""
        rows = []
        for e in self.entries:
            ev, ev_lo, ev_hi = _iqm_ci(e.eval_return, confidence)
            tr, tr_lo, tr_hi = _iqm_ci(e.train_return, confidence)
            rows.append({"algo": e.algo, "env": e.env, "label": e.label, "seeds": int(e.eval_return.shape[0]),
                         "eval_iqm": ev, "eval_lo": ev_lo, "eval_hi": ev_hi,
                         "train_iqm": tr, "train_lo": tr_lo, "train_hi": tr_hi,
                         "env_steps": e.env_steps, "steps_per_second": e.steps_per_second,
                         "compile_seconds": e.compile_seconds, "wall_seconds": e.wall_seconds,
                         "stopped_by_budget": e.stopped_by_budget})
        return rows

    def table_markdown(self) -> str:
        head = ("| algo | env | seeds | greedy eval IQM [95% CI] | training return IQM [95% CI] | env steps/seed | "
                "env steps/s | compile s | wall-clock s |")
        lines = [head, "|" + "---|" * 9]
        for r in self.table():
            lines.append(f"| {r['label']} | {r['env']} | {r['seeds']} | {_ci(r, 'eval')} | {_ci(r, 'train')} | "
                         f"{r['env_steps']:,}{' (budget)' if r['stopped_by_budget'] else ''} | "
                         f"{r['steps_per_second']:,.0f} | {r['compile_seconds']:.1f} | {r['wall_seconds']:.1f} |")
        note = (f"\nEach agent trained for {self.budget_seconds:g} s of wall-clock (compilation not counted), then "
                f"its greedy policy was evaluated." if self.budget_seconds else "")
        return "\n".join(lines) + "\n" + note + ("\n" if note else "")

    def table_csv(self) -> str:
        import csv

        rows = self.table()
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()

    def to_json(self) -> str:
        out = {"budget_seconds": self.budget_seconds, "entries": []}
        for e, row in zip(self.entries, self.table()):
            out["entries"].append({**row, "eval_return": _floats(e.eval_return), "train_return": _floats(e.train_return),
                                   "run_seconds": e.run_seconds, "eval_seconds": e.eval_seconds,
                                   "curve_steps": e.curve_steps.tolist(),
                                   "curve_return_iqm": _floats(stats.iqm_along(e.curve_return, axis=0)),
                                   "eval_steps": e.eval_steps.tolist(), "eval_curve": [_floats(s) for s in e.eval_curve],
                                   "config": e.config.to_dict()})
        return json.dumps(_finite(out), indent=1) + "\n"

    def curves_png(self) -> bytes:
        """Per environment, the IQM over seeds of the training return (lines) and of the greedy
        evaluations (markers) against env steps. Needs matplotlib."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        envs = list(dict.fromkeys(e.env for e in self.entries))
        fig, axes = plt.subplots(1, len(envs), figsize=(5.2 * len(envs), 3.8), squeeze=False)
        for ax, env in zip(axes[0], envs):
            for i, e in enumerate(x for x in self.entries if x.env == env):
                color = f"C{i}"
                ax.plot(e.curve_steps, stats.iqm_along(e.curve_return, axis=0), color=color, lw=1.2,
                        label=f"{e.label} (training)")
                if e.eval_curve.size:
                    ax.plot(e.eval_steps, stats.iqm_along(e.eval_curve, axis=0), color=color, ls="--", marker="o",
                            ms=3.5, label=f"{e.label} (greedy)")
            ax.set_title(env)
            ax.set_xlabel("env steps per seed")
            ax.set_ylabel("return (IQM over seeds)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        return buf.getvalue()

    def summary(self) -> str:
        best = {}
        for r in self.table():
            if math.isfinite(r["eval_iqm"]) and (r["env"] not in best or r["eval_iqm"] > best[r["env"]]["eval_iqm"]):
                best[r["env"]] = r
        said = "; ".join(f"{env}: {r['label']} (greedy IQM {r['eval_iqm']:.1f})" for env, r in best.items())
        return f"{len(self.entries)} run(s) compared; best by greedy evaluation: {said}"


def _iqm_ci(values, confidence: float) -> tuple[float, float, float]:
    x = np.asarray(values, np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    return stats.iqm_ci(x, confidence=confidence)


def _ci(row: dict, which: str) -> str:
    mid, lo, hi = row[f"{which}_iqm"], row[f"{which}_lo"], row[f"{which}_hi"]
    return "n/a" if not math.isfinite(mid) else f"{mid:.1f} [{lo:.1f}, {hi:.1f}]"


def _floats(x) -> list:
    return [float(v) for v in np.asarray(x, np.float64).ravel()]


def _finite(obj):
    """JSON has no NaN: non-finite numbers become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _names(value, what: str) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    out = []
    for v in items:
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(f"{what}: expected names (strings), got {v!r}")
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def plan(algos=None, envs=None, configs: Sequence[Any] = (), overrides: Mapping[str, Any] | None = None
         ) -> list[tuple[str, Config]]:
    """`(label, config)` of every entry: each algorithm × environment at its preset
    (`make_config`), then each given config (a path to a YAML file or a `Config`; with `envs`,
    one entry per environment), `overrides` (dotted keys) on top of all."""
    from rmtjax.config import default_env

    algos, envs = _names(algos, "algos"), _names(envs, "envs")
    entries: list[tuple[str, Config]] = []
    for algo in algos:
        for env in envs or [default_env(algo)]:
            entries.append((algo, make_config(algo, env, overrides)))
    for i, c in enumerate(configs or ()):
        base = c if isinstance(c, Config) else load_config(c)
        label = base.algo if isinstance(c, Config) else f"{base.algo} ({Path(c).stem})"
        for env in envs or [base.env.id]:
            data = base.to_dict()
            data["env"]["id"] = env
            entries.append((label, Config.from_dict(data).override(overrides)))
    if not entries:
        raise ConfigError("compare: nothing to compare; give algorithms (e.g. --algos rmt,dqn,pqn) or config files")
    seen = set()
    for label, cfg in entries:
        if (label, cfg.env.id) in seen:
            raise ConfigError(f"compare: {label} on {cfg.env.id} is listed twice")
        seen.add((label, cfg.env.id))
    return entries


def compare(algos=None, envs=None, seeds: int = 3, *, configs: Sequence[Any] = (),
            overrides: Mapping[str, Any] | None = None, budget_seconds: float | None = None,
            eval_episodes: int = 10, eval_points: int = 10, out_dir=None, key: int = 0,
            progress: bool | None = None) -> CompareResult:
    """Train every algorithm of `algos` on every environment of `envs` (each at its preset;
    `envs` None: each algorithm's default environment) and every config of `configs`, with
    `seeds` seeds each, in one compiled program per entry, and compare them (see the module's
    doc). `key`: the integer seed every entry starts from (the same seeds for all).
    `budget_seconds`: train each for that many seconds of wall-clock instead of its
    `train.total_steps`. `out_dir`: write the table, the numbers and the curves there."""
    from rmtjax.agents import build_agent
    from rmtjax.driver import evaluate, train

    import jax

    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ConfigError(f"seeds: expected an integer ≥ 1, got {seeds!r}")
    if not isinstance(eval_points, int) or isinstance(eval_points, bool) or eval_points < 1:
        raise ConfigError(f"eval_points: expected an integer ≥ 1, got {eval_points!r}")
    if budget_seconds is not None and (isinstance(budget_seconds, bool) or not isinstance(budget_seconds, (int, float))
                                       or not 0 < budget_seconds < math.inf):
        raise ConfigError(f"budget_seconds: expected a number of seconds > 0, got {budget_seconds!r}")
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= 2**31 - 1:
        raise ConfigError(f"key: expected an integer seed in [0, {2**31 - 1}], got {key!r}")
    entries = plan(algos, envs, configs, overrides)
    out = _prepare_out_dir(out_dir) if out_dir is not None else None  # refused before anything trains
    results = []
    for label, cfg in entries:
        n_iter = build_agent(cfg).num_iterations
        settings = {"train.num_seeds": seeds, "train.eval_episodes": eval_episodes,
                    "train.eval_every": max(1, math.ceil(n_iter / eval_points))}
        if progress is not None:
            settings["train.progress"] = progress
        cfg = cfg.override(settings)
        result = train(cfg, jax.random.key(key), budget_seconds=budget_seconds)
        iterations = result.metrics["env_steps"].shape[1]
        stopped = iterations < n_iter
        eval_seconds = 0.0
        if stopped:  # the in-loop evaluation did not reach its last one: evaluate now
            t0 = time.perf_counter()
            final = evaluate(result, episodes=eval_episodes, key=jax.random.key(key)).returns.mean(axis=1)
            eval_seconds = time.perf_counter() - t0
        else:
            final = result.metrics["eval_return"][:, -1]
        ret = result.metrics["episode_return"].astype(np.float64)
        # before a seed's first finished episode its episode_return is a placeholder 0: not a return
        begun = np.maximum.accumulate(result.metrics["episode_count"] > 0, axis=1)
        ret = np.where(begun, ret, np.nan)
        tail = max(1, iterations // 10)
        ev_iter = result.eval_iterations
        steps = result.metrics["env_steps"][0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a seed without a finished episode: NaN, said as n/a
            train_return = np.nanmean(ret[:, -tail:], axis=1)
        results.append(Entry(label, cfg, np.asarray(final, np.float64), train_return,
                             int(steps[-1]), result.compile_seconds, result.run_seconds, eval_seconds,
                             steps.copy(), ret, steps[ev_iter - 1].copy(),
                             np.asarray(result.eval_return, np.float64), stopped_by_budget=stopped))
    cmp = CompareResult(results, budget_seconds, out)
    if out is not None:
        _write(cmp, out)
    return cmp


def _prepare_out_dir(path) -> Path:
    if path is None or not str(path).strip():
        raise ConfigError("out_dir: an empty path was given; name a directory, e.g. --out compare1")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out_dir: {path} is a file, not a directory")
    found = [n for n in OUTPUTS if os.path.lexists(path / n)]
    if found:
        raise ConfigError(f"out_dir: {path} already holds a comparison ({', '.join(found)}); choose a new directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write(cmp: CompareResult, out: Path) -> None:
    from rmtjax import safefs

    safefs.write_atomic(out / "compare.md", cmp.table_markdown())
    safefs.write_atomic(out / "compare.csv", cmp.table_csv())
    safefs.write_atomic(out / "results.json", cmp.to_json())
    try:
        png = cmp.curves_png()
    except ImportError:
        png = None  # no matplotlib: the table is there, the plot is not (pip install 'rmtjax[plot]')
    if png is not None:
        safefs.write_atomic(out / "curves.png", png)




_callable_module(__name__, compare)  # rmtjax.compare stays the function after this module is imported
