"""The benchmark suite: agents × environments × seeds, RMT ablations, throughput against peers, claims.

    python -m benchmarks suite --quick          # small budgets; the whole suite on a 2-core CPU
    python -m benchmarks suite --full           # the budgets the results are meant to be quoted at
    python -m benchmarks suite --quick --sections curves --agents ppo dqn --envs CartPole-v1

Sections (all by default, in this order; `--sections` picks some):

- `curves`: every agent of {rmt, dqn, ppo, sac} on every env of {CartPole-v1, Acrobot-v1,
  Breakout-MinAtar, Pendulum-v1, MountainCarContinuous-v0} whose action space it handles
  (dqn: discrete; sac: continuous; rmt and ppo: both), each from its preset for the env (else
  its defaults), all agents at the same env steps per seed, all seeds vmapped in one compile.
  Reported per (env, agent): final return and area under the learning curve (AUC), each as
  the IQM over seeds with a 95% percentile-bootstrap interval; pooled over envs per agent as
  a stratified-bootstrap IQM of normalised scores; learning-curve plots.
- `ablations`: RMT with every component on (tiered replay, ε+Boltzmann exploration, the fractal
  torso — one 64-wide dense block, set explicitly since RMT's default and its CartPole and Acrobot
  presets take a one-layer torso — and meta-controller `rules`), then one component switched off
  at a time.
- `throughput`: whole-loop env-steps/s and compile time per agent (one seed, one compiled
  program), against rejax (JAX) and stable-baselines3 (PyTorch, CPU, gymnasium envs) at
  matched settings, measured in this one run and reported as ratios.
- `claims`: each quantitative claim of the design next to what this run measured
  (`results/claims/claims.md`).

Budgets (`QUICK`, `FULL` below): `--quick` runs 4 seeds, 10,000 env steps per env (20,000 on
MountainCarContinuous-v0, whose episodes last 999 steps), ablations on CartPole-v1 at 10,000, the
MountainCar-v0 discovery claim at 20,000, throughput runs of 2,000-20,000 steps: about 23 learning
runs, most of the time going to compiles (RMT's compile is the longest, 30-170 s here). `--full`
runs 16 seeds, CartPole/Acrobot 300k, Breakout-MinAtar 1M, Pendulum/MountainCarContinuous 100k,
ablations on CartPole and Acrobot at 300k, discovery at 200k, throughput at 20k-500k: hours on a
2-core CPU (RMT trains at roughly 1,000 env-steps/s there), meant for a bigger machine.

Results: `results/suite/suite_<mode>.md` (tables; command, machine, load, date, commit),
`results/suite/suite_<mode>_curves.png`, `results/suite/suite_<mode>_ablations.png`,
`results/suite/suite_<mode>.npz` (every run's per-iteration returns) and `results/claims/claims.md`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time

import jax
import numpy as np

import rmtjax
from benchmarks.lib import cli, peers, runner
from benchmarks.lib.curves import curve_points
from benchmarks.lib.plots import pyplot
from benchmarks.lib.runner import run_agent
from benchmarks.lib.stats import bootstrap_band, iqm_ci, stratified_iqm_ci
from benchmarks.lib.tables import provenance, table as _table
from benchmarks.reports import claims
from rmtjax.envs import make_env

AGENTS = ("rmt", "dqn", "ppo", "sac")
ENVS = ("CartPole-v1", "Acrobot-v1", "Breakout-MinAtar", "Pendulum-v1", "MountainCarContinuous-v0")
SECTIONS = ("curves", "ablations", "throughput", "claims")

# Return ranges for normalised scores: (about a random policy, about a solved env). A score is
# (return - low) / (high - low); it can leave [0, 1].
SCORE_RANGE = {
    "CartPole-v1": (22.0, 500.0),
    "Acrobot-v1": (-500.0, -60.0),
    "Breakout-MinAtar": (0.0, 30.0),
    "Pendulum-v1": (-1300.0, -150.0),
    "MountainCarContinuous-v0": (-35.0, 95.0),
}

# RMT ablations: the full agent, then one component off at a time; the fractal torso is named, as
# RMT's default torso and its CartPole and Acrobot presets' are one dense layer
FRACTAL = ["agent.torso=dense_fractal", "agent.hidden=[64]"]
FULL_RMT = FRACTAL + ["meta.mode=rules"]
ABLATIONS = (
    ("full", "all components on", []),
    ("uniform replay", "agent.replay=uniform", ["agent.replay=uniform"]),
    ("ε only", "agent.exploration=eps_greedy", ["agent.exploration=eps_greedy"]),
    ("MLP torso", "agent.torso=mlp", ["agent.torso=mlp"]),
    ("meta off", "meta.mode=off", ["meta.mode=off"]),
)


def ablation_sets(name: str, sets: list) -> list:
    """The overrides of the ablation row `name` (one of ABLATIONS): FULL_RMT plus the row's change;
    `meta off` is FRACTAL alone (the preset's meta is off)."""
    return FRACTAL if name == "meta off" else FULL_RMT + sets


@dataclasses.dataclass(frozen=True)
class Budget:
    seeds: int
    steps: dict  # env id -> env steps per seed (every agent on that env gets the same)
    ablation_envs: tuple
    ablation_steps: int
    # claims
    convergence_threshold: float  # CartPole return for steps-to-threshold (fractal vs residual)
    discovery_steps: int  # MountainCar-v0, ε+Boltzmann vs ε only
    # throughput: env steps per run, one seed
    throughput_steps: dict
    # per (algo, env) overrides that fit an agent to the small budget (documented in the table)
    fit: dict = dataclasses.field(default_factory=dict)


QUICK = Budget(
    seeds=4,
    # MountainCarContinuous episodes last 999 steps: 20k lets the 16-env presets finish one or two
    steps={**{e: 10_000 for e in ENVS}, "MountainCarContinuous-v0": 20_000},
    ablation_envs=("CartPole-v1",),
    ablation_steps=10_000,
    convergence_threshold=100.0,
    discovery_steps=20_000,
    throughput_steps={"ppo": 20_000, "dqn": 10_000, "sac": 2_000, "rmt": 10_000},
    # PPO's Pendulum preset takes 10,000 env steps per iteration (100 envs × 100): at 10k steps
    # that would be one update. 16 envs × 64 steps keep ~10 iterations.
    fit={("ppo", "Pendulum-v1"): ["env.num_envs=16", "agent.rollout_len=64", "agent.num_minibatches=4"]},
)
FULL = Budget(
    seeds=16,
    steps={"CartPole-v1": 300_000, "Acrobot-v1": 300_000, "Breakout-MinAtar": 1_000_000, "Pendulum-v1": 100_000,
           "MountainCarContinuous-v0": 100_000},
    ablation_envs=("CartPole-v1", "Acrobot-v1"),
    ablation_steps=300_000,
    convergence_threshold=475.0,
    discovery_steps=200_000,
    throughput_steps={"ppo": 500_000, "dqn": 100_000, "sac": 20_000, "rmt": 100_000},
    fit={},
)


def fits(algo: str, env_id: str) -> bool:
    discrete = make_env(rmtjax.make_config("ppo", env_id).env).spec.discrete
    return not ((algo == "dqn" and not discrete) or (algo == "sac" and discrete))


def normalise(env_id: str, returns):
    lo, hi = SCORE_RANGE.get(env_id, (0.0, 1.0))
    return (np.asarray(returns, np.float64) - lo) / (hi - lo)


@dataclasses.dataclass
class Run:
    """One (agent, env, settings) run of `seeds` vmapped seeds."""

    algo: str
    env: str
    sets: list
    result: rmtjax.TrainResult
    wall: float

    @property
    def returns(self) -> np.ndarray:  # [seeds, iterations]
        return self.result.metrics["episode_return"]

    @property
    def env_steps(self) -> np.ndarray:  # [iterations]
        return self.result.metrics["env_steps"][0]

    @property
    def final(self) -> np.ndarray:
        return self.result.final_return

    @property
    def started(self) -> np.ndarray:
        """[seeds, iterations]: whether every env could have finished an episode by then (as many
        episodes completed as there are envs). Before that `episode_return` holds zeros, which are
        no return at all, so learning curves leave those iterations out."""
        return np.cumsum(self.result.metrics["episode_count"], axis=1) >= self.result.config.env.num_envs

    @property
    def episodes(self) -> np.ndarray:
        """Episodes completed per seed (all its envs)."""
        return self.result.metrics["episode_count"].sum(axis=1)

    def curve(self) -> np.ndarray:
        """[seeds, iterations] returns, NaN before the seed's envs finished their first episodes."""
        return np.where(self.started, self.returns, np.nan)

    def auc(self) -> np.ndarray:
        """Per seed: mean of the normalised learning curve at ten evenly spaced points (the points
        before its first finished episodes left out; NaN if none is left)."""
        _, pts = curve_points(self.curve(), self.env_steps)
        pts = normalise(self.env, pts)
        ok = np.isfinite(pts)
        n = ok.sum(axis=1)
        return np.where(n > 0, np.where(ok, pts, 0.0).sum(axis=1) / np.maximum(n, 1), np.nan)

    @property
    def sps(self) -> float:
        r = self.result
        return r.env_steps * r.config.train.num_seeds / r.run_seconds

    def late_mean(self, name: str) -> float:
        """Mean of a metric over the second half of training (nan if the agent has none)."""
        m = self.result.metrics.get(name)
        return float("nan") if m is None else float(np.mean(m[:, m.shape[1] // 2:]))

    def steps_to(self, threshold: float) -> np.ndarray:
        """Per seed: env steps at the first iteration whose return reaches `threshold` (inf: never)."""
        hit = self.curve() >= threshold  # NaN (no episode finished yet) never counts
        first = np.where(hit.any(axis=1), hit.argmax(axis=1), -1)
        return np.where(first >= 0, self.env_steps[first], np.inf)


class Suite:
    def __init__(self, args, budget: Budget):
        self.args, self.budget = args, budget
        self.runs: dict[tuple, Run] = {}
        self.main_runs: dict[tuple, Run] = {}  # (algo, env) -> the curves section's run
        self.pending: dict = {}  # key -> Future of a prefetched run (--jobs > 1)
        self.sections: dict[str, str] = {}  # section name -> markdown
        self.figures: list[str] = []
        self.throughput: dict = {}
        self.extra: dict = {}
        self.t0 = time.perf_counter()
        self.load0 = os.getloadavg()

    # -- running ----------------------------------------------------------------------------
    def _key(self, algo: str, env_id: str, steps: int, sets: list) -> tuple:
        return (algo, env_id, steps, tuple(list(self.budget.fit.get((algo, env_id), [])) + list(sets)))

    def _train(self, key: tuple, tag: str) -> Run:
        algo, env_id, steps, sets = key
        t0 = time.perf_counter()
        result = run_agent(algo, env_id, steps, self.budget.seeds, list(sets), self.args.seed)
        run = Run(algo, env_id, list(sets), result, time.perf_counter() - t0)
        self.log(f"{tag or algo} on {env_id} {' '.join(sets)}: final IQM {iqm_ci(run.final, reps=200)[0]:.1f}, "
                 f"{run.sps:,.0f} env-steps/s, compile {result.compile_seconds:.0f}s, wall {run.wall:.0f}s")
        return run

    def run(self, algo: str, env_id: str, steps: int, sets: list, tag: str = "") -> Run:
        key = self._key(algo, env_id, steps, sets)
        if key not in self.runs:
            pending = self.pending.pop(key, None)
            self.runs[key] = pending.result() if pending is not None else self._train(key, tag)
        return self.runs[key]

    def plan(self) -> list[tuple]:
        """Every learning run the chosen sections will ask for, in the order they ask."""
        b, a = self.budget, self.args
        keys = []
        if "curves" in a.sections:
            keys += [self._key(algo, e, b.steps[e], []) for e in a.envs for algo in a.agents if fits(algo, e)]
        if "ablations" in a.sections:
            keys += [self._key("rmt", e, b.ablation_steps, ablation_sets(name, sets))
                     for e in a.ablation_envs for name, _, sets in ABLATIONS]
        if "claims" in a.sections:
            uniform = dict((n, s) for n, _, s in ABLATIONS)["uniform replay"]
            keys += [self._key("rmt", a.ablation_envs[0], b.ablation_steps, FULL_RMT),
                     self._key("rmt", a.ablation_envs[0], b.ablation_steps, FULL_RMT + uniform),
                     self._key("sac", "Pendulum-v1", b.steps["Pendulum-v1"], []),
                     self._key("sac", "Pendulum-v1", b.steps["Pendulum-v1"], ["meta.mode=rules"]),
                     self._key("rmt", "CartPole-v1", b.steps["CartPole-v1"], FRACTAL),
                     self._key("rmt", "CartPole-v1", b.steps["CartPole-v1"], FRACTAL + ["agent.torso=residual"]),
                     self._key("rmt", "MountainCar-v0", b.discovery_steps, []),
                     self._key("rmt", "MountainCar-v0", b.discovery_steps, ["agent.exploration=eps_greedy"])]
        return list(dict.fromkeys(keys))

    def prefetch(self):
        """With `--jobs N > 1`, start every planned run on N threads now: one run's compile (mostly
        one core) overlaps another's training. The sections then wait for the runs they use."""
        if self.args.jobs <= 1:
            return
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(self.args.jobs)
        for key in self.plan():
            self.pending[key] = self.pool.submit(self._train, key, "")

    def drain(self):
        """Wait for every prefetched run (so that throughput is timed on an otherwise idle process)."""
        for key in list(self.pending):
            self.runs[key] = self.pending.pop(key).result()

    def log(self, msg: str):
        print(f"[{time.perf_counter() - self.t0:6.0f}s] {msg}", flush=True)

    # -- sections ---------------------------------------------------------------------------
    def curves(self):
        b = self.budget
        rows, pooled_final, pooled_auc = [], {}, {}
        for env_id in self.args.envs:
            for algo in self.args.agents:
                if not fits(algo, env_id):
                    continue
                run = self.main_runs[(algo, env_id)] = self.run(algo, env_id, b.steps[env_id], [])
                f, a = iqm_ci(run.final), finite_iqm_ci(run.auc())
                rows.append([env_id, algo, _ci(f), _ci(a, 3), f"{np.mean(run.final):.1f}", f"{run.episodes.min():,}",
                             f"{run.sps:,.0f}", f"{run.result.compile_seconds:.0f}",
                             " ".join(run.sets) or "preset"])
                pooled_final.setdefault(algo, {})[env_id] = normalise(env_id, run.final)
                pooled_auc.setdefault(algo, {})[env_id] = run.auc()
            self._write()  # after every env, so a cut-short run leaves what it measured
        agg = []
        for algo in self.args.agents:
            if algo not in pooled_final:
                continue
            envs = list(pooled_final[algo])
            f = _pooled(np.stack([pooled_final[algo][e] for e in envs], axis=1))
            a = _pooled(np.stack([pooled_auc[algo][e] for e in envs], axis=1))
            agg.append([algo, _ci(f, 3), _ci(a, 3), ", ".join(envs)])
        steps = ", ".join(f"{e} {b.steps[e]:,}" for e in self.args.envs)
        ranges = ", ".join(f"{e} [{lo:g}, {hi:g}]" for e, (lo, hi) in SCORE_RANGE.items() if e in self.args.envs)
        md = [
            f"## Sample efficiency: agents × environments ({b.seeds} seeds each)", "",
            _table(["env", "agent", "final return IQM [95% CI]", "AUC IQM [95% CI]", "final mean", "episodes/seed",
                    "env-steps/s", "compile s", "settings"], rows), "",
            f"Env steps per seed (equal for every agent on an env): {steps}. Each agent starts from its preset for "
            "the env (`rmtjax/configs/`), else from its defaults; `settings` lists what the suite changed. "
            "**Final return**: each seed's mean, over its envs, of the return of the last completed episode. "
            "**AUC** (area under the learning curve): the mean of the learning curve at ten evenly spaced "
            "points of training (each point: the mean over the seed's envs of the last completed episode's "
            "return), after normalising each return as (return − low) / (high − low) with [low, high] = "
            f"{ranges} (about a random policy, about a solved env). IQM: the mean of the middle 50% of the "
            "seeds; 95% CI: percentile bootstrap over the seeds (2,000 resamples). Iterations before a seed's "
            "envs had finished as many episodes as there are envs are left out of its curve and AUC (the metric "
            "holds 0 there, not a return); `episodes/seed`: episodes finished, fewest over the seeds (a final "
            "return from 0 episodes is 0 and means nothing). Env-steps/s: all seeds, the "
            "whole loop (acting, replay, learning), compile excluded"
            + (f"; with `--jobs {self.args.jobs}` up to {self.args.jobs} runs trained at once and shared the cores, "
               "so env-steps/s and compile s here are not clean measurements (the throughput section is)."
               if self.args.jobs > 1 else "."), "",
            "### Pooled over environments (normalised scores)", "",
            _table(["agent", "final score IQM [95% CI]", "AUC IQM [95% CI]", "envs"], agg), "",
            "IQM over every (env, seed) run of the agent, with a stratified bootstrap (seeds resampled within "
            "each env, 2,000 times). Agents cover different envs (dqn: discrete only, sac: continuous only), so "
            "compare pooled rows only across agents with the same envs.", "",
            f"![learning curves]({self.args.name}_curves.png)",
        ]
        self.sections["curves"] = "\n".join(md)
        self._plot_curves()
        self._write()

    def ablations(self):
        b = self.budget
        rows = []
        self.extra["ablations"] = {}
        for env_id in self.args.ablation_envs:
            full = None
            for name, change, sets in ABLATIONS:
                run = self.run("rmt", env_id, b.ablation_steps, ablation_sets(name, sets), tag=f"rmt ablation '{name}'")
                self.extra["ablations"][(env_id, name)] = run
                full = full or run
                f, a = iqm_ci(run.final), finite_iqm_ci(run.auc())
                d_auc = float(np.nanmean(run.auc()) - np.nanmean(full.auc()))
                rows.append([env_id, name, change, _ci(f), _ci(a, 3), f"{d_auc:+.3f}",
                             f"{run.late_mean('top_td_share'):.3f}", f"{run.sps:,.0f}"])
            self._write()
        md = [
            f"## RMT ablations: one component off at a time ({b.seeds} seeds, {b.ablation_steps:,} env steps)", "",
            _table(["env", "variant", "change from full", "final return IQM [95% CI]", "AUC IQM [95% CI]",
                    "Δ mean AUC vs full", "top_td_share", "env-steps/s"], rows), "",
            "`full`: the RMT preset with tiered replay, ε+Boltzmann exploration, the fractal torso (one 64-wide "
            "dense block) and "
            "`meta.mode=rules`; every other row changes one setting. AUC as in the table above. "
            "`top_td_share`: share of each minibatch whose |TD error| is in the buffer's top 10% (mean over the "
            "second half of training; a uniform draw gives 0.10).", "",
            f"![ablations]({self.args.name}_ablations.png)",
        ]
        self.sections["ablations"] = "\n".join(md)
        self._plot_ablations()
        self._write()

    def throughput_section(self):
        b = self.budget
        rows = []
        self.drain()
        for algo in self.args.agents:
            steps = b.throughput_steps[algo]
            env_id = peers.THROUGHPUT_ENV[algo]
            self.log(f"throughput {algo} on {env_id}, {steps:,} env steps")
            row, self.throughput[algo] = peers.throughput_row(algo, steps)
            for k, v in self.throughput[algo].items():
                self.log(f"  {k}: {v}")
            rows.append(row)
            self._throughput_md(rows)
            self._write()

    def _throughput_md(self, rows):
        self.sections["throughput"] = "\n".join([
            "## Throughput: whole training loop, one seed, against rejax and stable-baselines3", "",
            _table(peers.THROUGHPUT_HEADER, rows), "",
            peers.SETTINGS_NOTE, "",
            "Each trainer runs the same number of env steps, one after the other in this process; env-steps/s "
            "excludes compile (rmtjax, rejax: `jit(...).lower().compile()` timed apart) and SB3's model "
            "construction. A ratio above 1 means rmtjax is faster. On a shared machine the three did not see the "
            "same load: read the ratios as rough.",
        ])

    def claims(self):
        text = claims_table(self)
        name = "claims.md" if self.args.name == f"suite_{self.args.mode}" else f"{self.args.name}_claims.md"
        (runner.out("claims") / name).write_text(text)
        self.log(f"wrote results/claims/{name}")
        print(text)

    # -- output -----------------------------------------------------------------------------
    def header(self, title: str) -> list[str]:
        elapsed = time.perf_counter() - self.t0
        l0, l1 = self.load0, os.getloadavg()
        return [f"# {title}", "", *provenance(),
                f"- load average (1/5/15 min) at start {l0[0]:.1f}/{l0[1]:.1f}/{l0[2]:.1f}, at the last write "
                f"{l1[0]:.1f}/{l1[1]:.1f}/{l1[2]:.1f} (above the core count: the machine was shared)",
                f"- wall time so far: {elapsed / 60:.1f} min (sections: {', '.join(self.args.sections)}; "
                f"{self.args.jobs} learning run(s) at a time)", ""]

    def _write(self):
        out = runner.out("suite")
        body = [self.sections[s] for s in ("curves", "ablations", "throughput") if s in self.sections]
        text = "\n".join(self.header(f"Benchmark suite ({self.args.mode})")) + "\n" + "\n\n".join(body) + "\n"
        (out / f"{self.args.name}.md").write_text(text)
        arrays = {}
        for (algo, env_id, steps, sets), run in self.runs.items():
            name = "|".join([algo, env_id, str(steps), *sets])
            arrays[name + "|return"] = run.returns.astype(np.float32)
            arrays[name + "|env_steps"] = run.env_steps
        if arrays:
            np.savez_compressed(out / f"{self.args.name}.npz", **arrays)

    def _plot_curves(self):
        plt = pyplot()
        if plt is None:
            return
        envs = [e for e in self.args.envs if any(k[1] == e for k in self.main_runs)]
        fig, axes = plt.subplots(1, len(envs), figsize=(4 * len(envs), 3.4), squeeze=False)
        for ax, env_id in zip(axes[0], envs):
            for algo in self.args.agents:
                run = self.main_runs.get((algo, env_id))
                if run is not None:
                    _band(ax, run, algo)
            ax.set_title(env_id)
            ax.set_xlabel("env steps per seed")
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel("episode return (IQM, 95% CI)")
        fig.tight_layout()
        fig.savefig(runner.out("suite") / f"{self.args.name}_curves.png", dpi=90)
        plt.close(fig)

    def _plot_ablations(self):
        plt = pyplot()
        if plt is None:
            return
        envs = self.args.ablation_envs
        fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.6), squeeze=False)
        for ax, env_id in zip(axes[0], envs):
            for name, *_ in ABLATIONS:
                _band(ax, self.extra["ablations"][(env_id, name)], name)
            ax.set_title(f"RMT ablations, {env_id}")
            ax.set_xlabel("env steps per seed")
            ax.set_ylabel("episode return (IQM, 95% CI)")
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(runner.out("suite") / f"{self.args.name}_ablations.png", dpi=90)
        plt.close(fig)


COLORS = {"rmt": "tab:blue", "dqn": "tab:orange", "ppo": "tab:green", "sac": "tab:red"}


def _band(ax, run: Run, label: str, points: int = 40):
    ret = run.curve()
    begun = np.isfinite(ret).all(axis=0)  # every seed has finished its first episodes
    if not begun.any():
        return
    first = int(begun.argmax())
    idx = np.unique(np.linspace(first, ret.shape[1] - 1, min(points, ret.shape[1] - first)).round().astype(int))
    mid, lo, hi = bootstrap_band(ret[:, idx])
    x = run.env_steps[idx]
    color = COLORS.get(label)  # an agent keeps its colour across panels
    ax.plot(x, mid, label=label, color=color)
    ax.fill_between(x, lo, hi, alpha=0.2, color=color)


def finite_iqm_ci(values) -> tuple[float, float, float]:
    """`iqm_ci` of the finite values (a seed with no finished episode has none); NaNs if none."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    return iqm_ci(v) if v.size else (math.nan, math.nan, math.nan)


def _pooled(scores) -> tuple[float, float, float]:
    return stratified_iqm_ci(scores) if np.isfinite(scores).any() else (math.nan, math.nan, math.nan)


def _ci(t, digits: int = 1) -> str:
    mid, lo, hi = t
    if not math.isfinite(mid):
        return "—"
    return f"{mid:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def add_arguments(ap) -> None:
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help=f"{QUICK.seeds} seeds, {QUICK.steps['CartPole-v1']:,} env steps per env")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help=f"{FULL.seeds} seeds, 100k-1M env steps per env")
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    ap.add_argument("--agents", nargs="+", default=list(AGENTS), choices=AGENTS)
    ap.add_argument("--envs", nargs="+", default=list(ENVS), choices=ENVS)
    ap.add_argument("--ablation-envs", nargs="+", default=None, help="default: the mode's (CartPole-v1 in quick)")
    ap.add_argument("--seed", type=int, default=0, help="PRNG seed of every run")
    ap.add_argument("--name", default=None,
                    help="results/suite/NAME.md, NAME_curves.png, ... (default: suite_<mode>)")
    ap.add_argument("--jobs", type=int, default=2,
                    help="learning runs at a time (threads; compile of one overlaps training of another). "
                         "The throughput section always runs alone")


def resolve(args) -> Budget:
    """The mode's budget; fills in what the arguments leave to the mode (ablation envs, name)."""
    budget = QUICK if args.mode == "quick" else FULL
    args.ablation_envs = tuple(args.ablation_envs or budget.ablation_envs)
    args.name = args.name or f"suite_{args.mode}"
    args.sections = [s for s in SECTIONS if s in args.sections]
    return budget


def parse_args(argv=None):
    """(arguments, budget) of a suite command line (`argv` without the experiment's name)."""
    args = cli.parse(sys.modules[__name__], argv)
    return args, resolve(args)


def run(args) -> None:
    budget = resolve(args)
    suite = Suite(args, budget)
    suite.prefetch()
    for section in args.sections:
        suite.log(f"section {section}")
        getattr(suite, {"throughput": "throughput_section"}.get(section, section))()
    suite.drain()
    suite._write()
    suite.log(f"done: results/suite/{args.name}.md ({(time.perf_counter() - suite.t0) / 60:.1f} min)")


# -- the claims section ---------------------------------------------------------------------

# MountainCar-v0: -1 per step, 200 steps at most; a return above -200 means the car reached the flag
MOUNTAINCAR_SUCCESS = -199.5


def env_step_times(envs: int = 64, steps: int = 2_000, repeats: int = 3) -> dict:
    """Microseconds per environment step of CartPole-v1, the best of `repeats` timings: gymnax
    (jitted scan, 1 env and `envs` vmapped envs, random actions, auto-reset) and gymnasium (its
    Python env, 1 env; its numpy vector env, `envs` envs)."""
    import gymnasium
    import gymnax

    out = {}
    env, params = gymnax.make("CartPole-v1")

    def rollout(n):
        def run(key):
            keys = jax.random.split(key, n)
            obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)

            def body(carry, k):
                state = carry
                ka, ks = jax.random.split(k)
                a = jax.random.randint(ka, (n,), 0, 2)
                _, state, r, *_ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(jax.random.split(ks, n), state, a,
                                                                             params)
                return state, r.sum()

            return jax.lax.scan(body, state, jax.random.split(key, steps))[1].sum()

        fn = jax.jit(run).lower(jax.random.key(0)).compile()
        jax.block_until_ready(fn(jax.random.key(1)))
        best = math.inf
        for rep in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(jax.random.key(2 + rep)))
            best = min(best, time.perf_counter() - t0)
        return best / (steps * n) * 1e6

    out["gymnax_1"] = rollout(1)
    out[f"gymnax_{envs}"] = rollout(envs)

    g = gymnasium.make("CartPole-v1")
    g.reset(seed=0)
    rng = np.random.default_rng(0)
    acts = rng.integers(0, 2, steps)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for a in acts:
            _, _, term, trunc, _ = g.step(int(a))
            if term or trunc:
                g.reset()
        best = min(best, time.perf_counter() - t0)
    out["gymnasium_1"] = best / steps * 1e6
    try:
        vec = gymnasium.make_vec("CartPole-v1", num_envs=envs, vectorization_mode="vector_entry_point")
        vec.reset(seed=0)
        va = rng.integers(0, 2, (steps, envs))
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            for a in va:
                vec.step(a)
            best = min(best, time.perf_counter() - t0)
        out[f"gymnasium_{envs}"] = best / (steps * envs) * 1e6
    except Exception:  # noqa: BLE001 - an older gymnasium without CartPole's vector env
        out[f"gymnasium_{envs}"] = math.nan
    return out


def _median_steps(x: np.ndarray) -> str:
    reached = np.isfinite(x)
    med = np.median(x)
    per_seed = ", ".join(f"{v / 1000:.1f}k" if math.isfinite(v) else "never" for v in sorted(x))
    return ((f"{med:,.0f}" if math.isfinite(med) else "not reached") +
            f" ({reached.sum()}/{x.size} seeds reached; per seed, sorted: {per_seed})")


def claims_table(suite) -> str:
    """The claims table of `suite`'s runs (running what it lacks), with the rows read from stored results."""
    b, mode = suite.budget, suite.args.mode
    cmd = f"`python -m benchmarks suite --{mode}`"
    rows = []

    # 1. key-sample share: full RMT (tiered) against the same with uniform replay
    env = suite.args.ablation_envs[0]
    full = suite.run("rmt", env, b.ablation_steps, FULL_RMT, tag="rmt full (claims)")
    uni = suite.run("rmt", env, b.ablation_steps, FULL_RMT + dict((n, s) for n, _, s in ABLATIONS)["uniform replay"],
                    tag="rmt uniform (claims)")
    s_full, s_uni = full.late_mean("top_td_share"), uni.late_mean("top_td_share")
    rows.append(["Tiered replay raises the share of key samples (buffer's top 10% of \\|TD error\\|) in a minibatch "
                 "from 12% to 58%",
                 f"uniform {100 * s_uni:.1f}% → tiered {100 * s_full:.1f}% (RMT on {env}, {b.ablation_steps:,} steps, "
                 f"{b.seeds} seeds; `top_td_share`, mean over the second half of training)",
                 "supported" if s_full >= 0.5 and s_uni <= 0.15 else "partly" if s_full > 2 * s_uni else "not supported",
                 cmd + " (ablations: full vs uniform replay)"])

    # 2. meta-controller on Pendulum
    steps = b.steps["Pendulum-v1"]
    off = suite.run("sac", "Pendulum-v1", steps, [], tag="sac Pendulum meta off (claims)")
    on = suite.run("sac", "Pendulum-v1", steps, ["meta.mode=rules"], tag="sac Pendulum meta rules (claims)")
    f_off, f_on = iqm_ci(off.final), iqm_ci(on.final)
    change = (f_on[0] - f_off[0]) / abs(f_off[0]) if f_off[0] else math.nan
    rows.append(["The meta-controller adds 37% to the return on Pendulum",
                 f"final return IQM: meta off {f_off[0]:.0f} [{f_off[1]:.0f}, {f_off[2]:.0f}], `rules` {f_on[0]:.0f} "
                 f"[{f_on[1]:.0f}, {f_on[2]:.0f}]: {100 * change:+.0f}% (relative to \\|off\\|; SAC preset, {steps:,} steps, "
                 f"{b.seeds} seeds)",
                 _overlap_reading(f_off, f_on, change, 0.37),
                 cmd + " (claims: sac Pendulum-v1, meta.mode off vs rules)"])

    # 3. fractal torso vs plain residual MLP on CartPole
    steps, thr = b.steps["CartPole-v1"], b.convergence_threshold
    frac = suite.run("rmt", "CartPole-v1", steps, FRACTAL, tag="rmt fractal (claims)")
    res = suite.run("rmt", "CartPole-v1", steps, FRACTAL + ["agent.torso=residual"], tag="rmt residual (claims)")
    s_frac, s_res = frac.steps_to(thr), res.steps_to(thr)
    m_frac, m_res = np.median(s_frac), np.median(s_res)
    if math.isfinite(m_frac) and math.isfinite(m_res):
        faster = 1 - m_frac / m_res
        meas = f"{100 * faster:+.0f}% fewer steps with the fractal torso"
        reading = ("supported" if faster >= 0.3 else "not supported" if faster <= 0 else "partly") + \
            f" (one run of {b.seeds} seeds)"
    else:
        meas, reading = "not resolved at this budget", "inconclusive"
    rows.append(["The fractal block converges 40% faster than a plain residual MLP on CartPole",
                 f"median env steps to a return ≥ {thr:g}: fractal {_median_steps(s_frac)}, residual "
                 f"{_median_steps(s_res)}; {meas} (RMT preset with one 64-wide block, {steps:,} steps, {b.seeds} seeds)",
                 reading, cmd + " (claims: rmt CartPole-v1, agent.torso fractal vs residual)"])

    rows.append(discovery_row(suite, cmd + " (claims: rmt MountainCar-v0, agent.exploration)"))

    # 5. env step time against gymnasium's own CartPole
    suite.log("claims: env step times (gymnax vs gymnasium CartPole)")
    t = env_step_times()
    n = [k for k in t if k.startswith("gymnax_") and k != "gymnax_1"][0].split("_")[1]
    rows.append(["The JAX env steps faster than gymnasium's own CartPole",
                 f"µs per env step: gymnax 1 env {t['gymnax_1']:.2f}, {n} vmapped envs {t[f'gymnax_{n}']:.3f}; "
                 f"gymnasium Python env {t['gymnasium_1']:.2f}, its numpy vector env × {n} {t[f'gymnasium_{n}']:.3f}. "
                 f"Speedup: {t['gymnasium_1'] / t['gymnax_1']:.1f}× at 1 env, "
                 f"{t[f'gymnasium_{n}'] / t[f'gymnax_{n}']:.1f}× at {n} envs",
                 "measured (random actions, compile excluded, best of 3)", cmd + " (claims: `benchmarks.experiments.suite.env_step_times`)"])

    # 6. training speedup against a PyTorch baseline
    tp = suite.throughput
    if tp:
        parts = []
        for algo, r in tp.items():
            sb = r["sb3"].get("sps")
            if sb:
                parts.append(f"{algo.upper()} {r['rmtjax']['sps'] / sb:.1f}× ({r['rmtjax']['sps']:,.0f} vs {sb:,.0f} "
                             "env-steps/s)")
        meas = ("rmtjax ÷ stable-baselines3 (PyTorch CPU), whole training loop, one seed: " + "; ".join(parts)
                if parts else "not measured (stable-baselines3 did not run: see the throughput notes)")
        reading = "measured (one seed; more seeds cost rmtjax one vmap, SB3 one process each)" if parts else "—"
    else:
        meas, reading = "not measured (the throughput section was not run)", "—"
    rows.append(["Training is faster than a PyTorch baseline", meas, reading, cmd + " (throughput section)"])
    for row in (claims.transfer_row(), claims.headline_row()):
        if row is not None:
            rows.append(row)

    lines = ["# Claims of the design, and what was measured", ""] + suite.header("")[2:] + [
        "| claim | measured | reading | command |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", f"Budgets are the suite's `--{mode}` ones ({b.seeds} seeds per run, all seeds vmapped in one "
              "compile). A reading of one small run is not a verdict: the quick budgets are far below the ones "
              "the claims were made at, and the intervals of a few seeds are wide. `--full` measures the same "
              "with 16 seeds and 100k-1M env steps."]
    return "\n".join(lines) + "\n"


def discovery_row(suite, command: str) -> list[str]:
    """ε+Boltzmann against ε only on MountainCar-v0: env steps to the first episode that reaches the flag."""
    b = suite.budget
    steps = b.discovery_steps
    eb = suite.run("rmt", "MountainCar-v0", steps, [], tag="rmt MountainCar ε+Boltzmann (claims)")
    eg = suite.run("rmt", "MountainCar-v0", steps, ["agent.exploration=eps_greedy"],
                   tag="rmt MountainCar ε only (claims)")
    d_eb, d_eg = eb.steps_to(MOUNTAINCAR_SUCCESS), eg.steps_to(MOUNTAINCAR_SUCCESS)
    m_eb, m_eg = np.median(d_eb), np.median(d_eg)
    if math.isfinite(m_eb) and math.isfinite(m_eg):
        ratio = m_eg / m_eb
        meas, reading = f"ε only ÷ ε+Boltzmann = {ratio:.2f}×", ("supported" if ratio >= 2.5 else "not supported"
                                                                  if ratio <= 1 else "partly") + " (few seeds)"
    elif math.isfinite(m_eb):
        meas, reading = (f"ε only did not reach the flag in the median seed within {steps:,} steps",
                         f"consistent (ratio > {steps / m_eb:.1f}×, censored)")
    elif math.isfinite(m_eg):
        meas, reading = (f"ε+Boltzmann did not reach the flag in the median seed within {steps:,} steps, ε only did",
                         "not supported")
    else:
        meas, reading = "neither reached the flag in the median seed", "inconclusive at this budget"
    return ["ε+Boltzmann exploration discovers the reward of a sparse task 3× faster than ε-greedy",
            f"MountainCar-v0 (RMT defaults, {steps:,} steps, {b.seeds} seeds), median env steps to the first "
            f"episode that reaches the flag: ε+Boltzmann {_median_steps(d_eb)}, ε only {_median_steps(d_eg)}; {meas}",
            reading, command]


def _overlap_reading(off, on, change, claimed) -> str:
    separated = on[1] > off[2] or on[2] < off[1]
    if not separated:
        return "inconclusive (95% intervals overlap)"
    if change >= 0.8 * claimed:
        return "supported"
    return "partly" if change > 0 else "not supported"
