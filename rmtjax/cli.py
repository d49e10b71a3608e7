"""`rmtjax` on the shell.

    rmtjax train [CONFIG.yaml] [--algo A] [--env E] [--set key=value ...] [--run-dir DIR]
    rmtjax train --resume DIR [--set train.progress=false ...]
    rmtjax train ... --init-from SOURCE_DIR      # start from another run's parameters (config: transfer:)
    rmtjax train ... --print-config              # print the resolved config and exit
    rmtjax eval DIR [--episodes N] [--seed S] [--max-steps N] [--video out.gif|out.mp4] [--which last|best]
    rmtjax sweep [CONFIG.yaml] --grid agent.lr=1e-4,3e-4 [--grid ...] [--seeds N] [--run-dir DIR]
    rmtjax sweep --resume DIR
    rmtjax config [SECTION] [--algo A] [--env E] # every field: type, default (or the preset's value), range, doc
    rmtjax compare --algos A,B --envs E1,E2 [--seeds N] [--budget-seconds S] [--out DIR]
    rmtjax export RUN_DIR out.policy [--seed S] [--which last|best]   # one seed's policy in one file
    rmtjax doctor RUN [--plot PATH]              # the training doctor's findings in a run (docs/doctor.md)
    rmtjax notebooks [DEST]                      # copy the example notebooks out of the package

Both take `--allow-import MODULE` (repeatable): an env id `gymnasium:MODULE:EnvId` may then
import MODULE when the env is built; without it no config or run directory makes rmtjax
import anything. Every failure is one line on stderr: exit 2 for a config or run-directory
problem the user can fix, 1 for an operating-system error (the message names the path).
"""

from __future__ import annotations

import argparse
import errno
import sys
import warnings

SEED_MAX = 2**31 - 1  # like train.seed

DEFAULT_ALGO, DEFAULT_ENV = "ppo", "CartPole-v1"


def _build_config(args):
    from rmtjax.config import load_config, make_config, parse_override

    overrides = dict(parse_override(s) for s in args.set or [])
    if args.resume and not (args.config or args.algo or args.env):
        # the run's own config, with --set on top (checked against the run's when resuming)
        from rmtjax.rundir import RunDir

        return RunDir.open(args.resume).config.override(overrides)
    if args.config:
        cfg = load_config(args.config)
        if args.algo or args.env:
            algo = args.algo or cfg.algo
            data = cfg.to_dict()
            if algo != cfg.algo:  # the agent section belongs to the other algorithm
                data.update(algo=algo, agent={})
            if args.env:
                data["env"]["id"] = args.env
            cfg = type(cfg).from_dict(data)
        return cfg.override(overrides)
    return make_config(args.algo or DEFAULT_ALGO, args.env, overrides)  # no --env: the algorithm's default


def _integer(text, flag: str, lo: int, hi: int) -> int:
    """An integer flag's value in [lo, hi], written as an integer or a whole number (1e4)."""
    from rmtjax.schema import ConfigError

    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            f = None
        if f is None or f != f or f in (float("inf"), float("-inf")) or not f.is_integer():
            raise ConfigError(f"{flag}: expected an integer in [{lo}, {hi:,}], got {text!r}") from None
        value = int(f)
    if not lo <= value <= hi:
        raise ConfigError(f"{flag}: expected an integer in [{lo}, {hi:,}], got {text}")
    return value


def _check_dir_flag(value, flag: str) -> None:
    from rmtjax.schema import ConfigError

    if value is not None and not value.strip():
        raise ConfigError(f"{flag}: an empty path was given; name a directory, e.g. {flag} runs/ppo1")


def _allow_imports(args) -> None:
    if getattr(args, "allow_import", None):
        from rmtjax.envs import allow_import

        allow_import(*args.allow_import)


def cmd_train(args) -> int:
    from rmtjax import cache, distributed

    args.seed = _integer(args.seed, "--seed", 0, SEED_MAX)
    _check_dir_flag(args.run_dir, "--run-dir")
    _check_dir_flag(args.resume, "--resume")
    _check_dir_flag(args.init_from, "--init-from")
    _allow_imports(args)
    if args.print_config:  # nothing is compiled or trained
        print(_build_config(args).to_yaml(), end="")
        return 0
    distributed.initialize()  # a multi-host run (RMTJAX_* variables) joins before JAX starts
    cache.enable(disable=args.no_compile_cache)
    cfg = _build_config(args)
    import jax
    import numpy as np

    from rmtjax.driver import train

    progress = False if args.quiet else None
    if args.resume:
        key = None if args.seed is None else jax.random.key(args.seed)  # None: the run's own key
        result = train(cfg, key, progress=progress, resume=args.resume, init_from=args.init_from)
    else:
        seed = cfg.train.seed if args.seed is None else args.seed
        result = train(cfg, jax.random.key(seed), progress=progress, run_dir=args.run_dir, init_from=args.init_from)
    print(result.summary())
    fr = np.array2string(result.final_return, precision=1, separator=", ")
    print(f"final return per seed: {fr}")
    if result.run_dir is not None:
        print(f"run directory: {result.run_dir}")
    return 0


def cmd_eval(args) -> int:
    import jax

    from rmtjax.driver import evaluate, load_run

    episodes = _integer(args.episodes, "--episodes", 1, 2**31 - 1)
    seed = _integer(args.seed, "--seed", 0, SEED_MAX)
    max_steps = _integer(args.max_steps, "--max-steps", 1, 2**31 - 1)
    _check_dir_flag(args.run_dir, "run directory")
    _allow_imports(args)
    if args.video and not args.per_seed:
        from rmtjax.video import _check_path, _check_target

        _check_target(_check_path(args.video), args.overwrite)  # before the run is read
    result = load_run(args.run_dir)
    if args.which == "best":  # the parameters of each seed's best periodic evaluation (train.eval_every)
        import dataclasses

        from rmtjax.evaluation import which_state

        result = dataclasses.replace(result, state=which_state(result.state, "best"))
    if args.video:
        from rmtjax.video import render_video

        video = render_video(result, args.video, key=jax.random.key(seed), max_steps=max_steps,
                             per_seed=args.per_seed, overwrite=args.overwrite)
        print(video.summary())
        return 0
    ev = evaluate(result, episodes=episodes, key=jax.random.key(seed), max_steps=max_steps)
    print(f"{result.config.algo} on {result.config.env.id} ({args.run_dir}, {result.env_steps:,} env steps per seed): "
          f"{ev.summary()}")
    print(f"mean return {ev.mean:.2f} ± std {ev.std:.2f}")
    return 0


def parse_grid(texts) -> dict:
    """`["agent.lr=1e-4,3e-4", ...]` -> `{"agent.lr": [0.0001, 0.0003], ...}` (each value read as YAML)."""
    from rmtjax.config import parse_override
    from rmtjax.schema import ConfigError

    grid = {}
    for text in texts or []:
        if "=" not in text:
            raise ConfigError(f"--grid {text!r}: expected field=v1,v2,..., e.g. --grid agent.lr=1e-4,3e-4,1e-3")
        field, raw = text.split("=", 1)
        field = field.strip()
        if field in grid:
            raise ConfigError(f"--grid {field}: given twice; list all its values in one --grid")
        values = [parse_override(f"{field}={v.strip()}")[1] for v in raw.split(",") if v.strip()]
        if not values:
            raise ConfigError(f"--grid {text!r}: no values after '='")
        grid[field] = values
    return grid


def cmd_sweep(args) -> int:
    from rmtjax import cache
    from rmtjax.schema import ConfigError

    args.seed = _integer(args.seed, "--seed", 0, SEED_MAX)
    seeds = _integer(args.seeds, "--seeds", 1, 2**20)
    _check_dir_flag(args.run_dir, "--run-dir")
    _check_dir_flag(args.resume, "--resume")
    _allow_imports(args)
    grid = parse_grid(args.grid)
    if not grid and not args.resume:
        raise ConfigError("rmtjax sweep: give at least one --grid FIELD=V1,V2,..., e.g. --grid agent.lr=1e-4,3e-4,1e-3")
    cache.enable(disable=args.no_compile_cache)
    if seeds is not None:
        args.set = [*(args.set or []), f"train.num_seeds={seeds}"]
    import jax

    from rmtjax.sweep import sweep

    progress = False if args.quiet else None
    if args.resume:
        from rmtjax.rundir import RunDir

        from rmtjax.config import parse_override

        if args.config or args.algo or args.env:
            raise ConfigError("rmtjax sweep --resume DIR: the config is the sweep's own (DIR/config.yaml); give no "
                              "CONFIG, --algo or --env (--set may change train.progress and the like)")
        run = RunDir.open(args.resume)
        if run.sweep is None:
            raise ConfigError(f"{run.path} holds a training run, not a sweep: continue it with "
                              f"rmtjax train --resume {run.path}")
        cfg = None
        if args.set:  # the sweep's base config with --set on top (checked against the run's when resuming)
            base = run.config.override({"train.num_seeds": int(run.sweep["seeds"])})
            cfg = base.override(dict(parse_override(x) for x in args.set))
        key = None if args.seed is None else jax.random.key(args.seed)
        result = sweep(cfg, grid or None, key, progress=progress, resume=args.resume)
    else:
        cfg = _build_config(args)
        seed = cfg.train.seed if args.seed is None else args.seed
        result = sweep(cfg, grid, jax.random.key(seed), progress=progress, run_dir=args.run_dir)
    print(result.table_text())
    print(result.summary())
    if result.run_dir is not None:
        have_plot = (result.run_dir / "heatmap.png").exists()
        print(f"run directory: {result.run_dir} (metrics.csv, sweep.csv{', heatmap.png' if have_plot else ''})")
    return 0


def cmd_config(args) -> int:
    from rmtjax.agents import agent_config_class, available_algos
    from rmtjax.config import EnvConfig, TrainConfig
    from rmtjax.distributed import DistributedConfig
    from rmtjax.doctor import DoctorConfig
    from rmtjax.meta.config import CurriculumConfig, MetaConfig
    from rmtjax.precision import PrecisionConfig
    from rmtjax.schema import ConfigError, close_matches, describe
    from rmtjax.transfer import TransferConfig

    sections = {"env": EnvConfig, "train": TrainConfig, "agent": None, "precision": PrecisionConfig,
                "meta": MetaConfig, "curriculum": CurriculumConfig, "distributed": DistributedConfig,
                "transfer": TransferConfig, "doctor": DoctorConfig}
    algo = args.algo or DEFAULT_ALGO
    wanted = args.section
    if wanted in available_algos():  # `rmtjax config sac`: that algorithm's agent section
        algo, wanted = wanted, "agent"
    values, note = _preset_values(algo, args.env) if (args.algo or args.env or wanted == "agent" and args.section != wanted) \
        else (None, None)
    if wanted is not None and wanted not in sections:
        raise ConfigError(f"rmtjax config: no section {wanted!r}.{close_matches(wanted, [*sections, *available_algos()])} "
                          f"Sections: {', '.join(sections)}; or an algorithm: {', '.join(available_algos())}")
    for name, cls in sections.items():
        if wanted is not None and name != wanted:
            continue
        cls = cls or agent_config_class(algo)
        title = f"{name} ({algo})" if name == "agent" else name
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        if doc.startswith(f"{cls.__name__}("):  # the dataclass's generated signature, not a description
            doc = ""
        print(f"{title}:{' ' + doc if doc else ''}")
        for row in describe(cls, name):
            rng = f", {row['allowed']}" if row["allowed"] else ""
            print(f"  {row['name']}: {row['type']} = {_shown_value(row, values)}{rng}")
            if row["doc"]:
                print(f"      {row['doc']}")
        print()
    if note is not None:
        print(note)
    return 0


def _preset_values(algo: str, env: str | None) -> tuple[dict, str]:
    """`{dotted field: value}` of `make_config(algo, env)` (the bundled preset where one exists),
    and the line that says so."""
    from rmtjax.config import _flatten, _preset_path, default_env, make_config

    env = env or default_env(algo)
    cfg = make_config(algo, env)
    preset = _preset_path(algo, env)
    note = (f"(values for {algo} on {env}: {'preset ' + preset.name if preset.exists() else 'no preset, the defaults'}; "
            f"where they differ, the schema default follows in parentheses)")
    return _flatten(cfg.to_dict()), note


def _shown_value(row: dict, values: dict | None) -> str:
    default = row["default"]
    if values is None or row["name"] not in values:
        return repr(default)
    value = values[row["name"]]
    value = list(value) if isinstance(value, tuple) else value
    return repr(value) if value == default else f"{value!r} (default {default!r})"


def cmd_notebooks(args) -> int:
    from pathlib import Path

    from rmtjax import notebooks

    _check_dir_flag(args.dest, "DEST")
    there = {p.name for p in notebooks.paths() if (Path(args.dest) / p.name).exists()}
    for path in notebooks.copy_to(args.dest):
        print(f"{path} (kept: a file of this name was already there; not overwritten)" if path.name in there
              else path)
    if there:
        print(f"kept {len(there)} existing file(s) unchanged; remove them (or choose another DEST) for fresh copies")
    return 0


def cmd_compare(args) -> int:
    from rmtjax import cache
    from rmtjax.compare import compare
    from rmtjax.config import parse_override

    seeds = _integer(args.seeds, "--seeds", 1, 2**20)
    seed = _integer(args.seed, "--seed", 0, SEED_MAX)
    episodes = _integer(args.eval_episodes, "--eval-episodes", 1, 100_000)
    budget = None
    if args.budget_seconds is not None:
        budget = _positive_seconds(args.budget_seconds, "--budget-seconds")
    _check_dir_flag(args.out, "--out")
    _allow_imports(args)
    cache.enable(disable=args.no_compile_cache)
    overrides = dict(parse_override(s) for s in args.set or [])
    if args.total_steps is not None:
        overrides["train.total_steps"] = _integer(args.total_steps, "--total-steps", 1, 2**31 - 1)
    result = compare(args.algos, args.envs, seeds, configs=args.config or (), overrides=overrides,
                     budget_seconds=budget, eval_episodes=episodes, out_dir=args.out, key=seed,
                     progress=False if args.quiet else None)
    print(result.table_markdown(), end="")
    print(result.summary())
    have_plot = (result.out_dir / "curves.png").exists()
    print(f"written: {result.out_dir} (compare.md, compare.csv, results.json{', curves.png' if have_plot else ''})")
    return 0


def _positive_seconds(text: str, flag: str) -> float:
    from rmtjax.schema import ConfigError

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ConfigError(f"{flag}: expected a number of seconds > 0, got {text!r}")
    return value


def cmd_export(args) -> int:
    from rmtjax.driver import export_policy

    seed = _integer(args.seed, "--seed", 0, SEED_MAX)
    _check_dir_flag(args.run_dir, "run directory")
    _allow_imports(args)
    path = export_policy(args.run_dir, args.out, seed=seed, which=args.which)
    print(f"{path}: seed {seed}'s {args.which} greedy policy of {args.run_dir}, one file; "
          f"load it with rmtjax.load_policy({str(path)!r})")
    return 0


def cmd_doctor(args) -> int:
    from rmtjax import doctor
    from rmtjax.config import load_config

    history, config_path = doctor.read_metrics(args.run)
    config = None if config_path is None else load_config(config_path)  # to name the fields to change
    if not any(k.startswith(doctor.PREFIX) for k in history):
        print(f"{args.run}: no doctor metrics (the run had doctor.enabled: false, or predates the doctor)")
        return 1
    found = doctor.findings(history, config)
    for f in found:
        print(f"{f.message} [held {f.evidence['iterations_held']} iteration(s)]")
    if not found:
        print(f"{args.run}: no findings")
    if args.plot:
        doctor.plot(history, found, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"rmtjax: warning: {message}", file=sys.stderr if file is None else file)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="rmtjax", description="Train RL agents as one compiled JAX program.")
    sub = parser.add_subparsers(dest="command", required=True)
    fields_note = ("Every config field (type, default, range, what it does): rmtjax config [SECTION], e.g. "
                   "rmtjax config train, rmtjax config agent --algo sac. Set one with --set section.field=value.")
    p = sub.add_parser("train", help="train an agent (no arguments: PPO on CartPole-v1, a short solving run)",
                       epilog=fields_note)
    p.add_argument("config", nargs="?", help="a YAML config file")
    p.add_argument("--algo", help=f"algorithm (default {DEFAULT_ALGO})")
    p.add_argument("--env", help=f"environment id (default {DEFAULT_ENV}; Pendulum-v1 for sac)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. agent.lr=3e-4")
    p.add_argument("--seed", help=f"PRNG seed in [0, {SEED_MAX}] (default: train.seed)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (with --set and the file applied) and exit without training")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="do not read or write the persistent compilation cache (see RMTJAX_CACHE_DIR)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--run-dir", metavar="DIR", help="write config, metrics, checkpoints and summary into DIR")
    where.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    p.add_argument("--init-from", metavar="DIR", help="start from the parameters of the run in DIR (another env's "
                                                      "or settings'); what is frozen, staged or re-initialised and "
                                                      "the KL penalty: the config's transfer section "
                                                      "(rmtjax config transfer)")
    p.add_argument("--allow-import", action="append", metavar="MODULE",
                   help="let an env id gymnasium:MODULE:EnvId import MODULE (runs its code); repeatable")
    p.set_defaults(func=cmd_train)
    e = sub.add_parser("eval", help="greedy evaluation episodes of a run directory's saved policy")
    e.add_argument("run_dir", help="a run directory written by rmtjax train --run-dir")
    e.add_argument("--episodes", default="10", help="episodes per seed (default 10)")
    e.add_argument("--seed", default="0", help=f"PRNG seed of the evaluation environments in [0, {SEED_MAX}] (default 0)")
    e.add_argument("--max-steps", help="cut episodes off after this many steps, ≥ 1 (default: the env's limit)")
    e.add_argument("--allow-import", action="append", metavar="MODULE",
                   help="let an env id gymnasium:MODULE:EnvId import MODULE (runs its code); repeatable")
    e.add_argument("--video", metavar="PATH",
                   help="instead of scoring, render one greedy episode per seed into PATH (.gif or .mp4): "
                        "the seeds side by side in one video (with --per-seed one file each, PATH_seed<k>)")
    e.add_argument("--per-seed", action="store_true", help="with --video: one file per seed instead of a grid")
    e.add_argument("--overwrite", action="store_true", help="with --video: replace an existing file (a symbolic "
                                                            "link is never written through)")
    e.add_argument("--which", choices=("last", "best"), default="last",
                   help="last: the parameters at the end; best: each seed's of its best periodic evaluation "
                        "(train.eval_every)")
    e.set_defaults(func=cmd_eval)
    w = sub.add_parser("sweep", help="train a hyperparameter grid × seeds in one compiled program",
                       epilog="Only the agent's hyperparameters held as arrays can be swept (rmtjax config agent "
                              "shows them); fields that change shapes (env.num_envs, agent.hidden, ...) are refused.")
    w.add_argument("config", nargs="?", help="a YAML config file")
    w.add_argument("--algo", help=f"algorithm (default {DEFAULT_ALGO})")
    w.add_argument("--env", help=f"environment id (default {DEFAULT_ENV}; Pendulum-v1 for sac)")
    w.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. train.total_steps=1e5")
    w.add_argument("--grid", action="append", metavar="FIELD=V1,V2,...",
                   help="a grid axis, e.g. agent.lr=1e-4,3e-4,1e-3; repeat for more axes (every combination is a cell)")
    w.add_argument("--seeds", help="seeds per cell (default: train.num_seeds)")
    w.add_argument("--seed", help=f"PRNG seed in [0, {SEED_MAX}] (default: train.seed)")
    w.add_argument("--quiet", action="store_true", help="no progress bar")
    w.add_argument("--no-compile-cache", action="store_true", help="do not use the persistent compilation cache")
    wwhere = w.add_mutually_exclusive_group()
    wwhere.add_argument("--run-dir", metavar="DIR", help="write metrics (with a cell column), checkpoints, "
                                                          "sweep.csv and heatmap.png into DIR")
    wwhere.add_argument("--resume", metavar="DIR", help="continue the sweep in DIR from its last checkpoint")
    w.add_argument("--allow-import", action="append", metavar="MODULE",
                   help="let an env id gymnasium:MODULE:EnvId import MODULE (runs its code); repeatable")
    w.set_defaults(func=cmd_sweep)
    c = sub.add_parser("config", help="list every config field with its type, default, range and doc")
    c.add_argument("section", nargs="?", help="env, train, agent, precision, meta, curriculum, distributed, transfer or doctor "
                                              "(or an algorithm name: its agent section); default: all")
    c.add_argument("--algo", help=f"whose agent section to list (default {DEFAULT_ALGO}); with --algo or --env "
                                  f"the values shown are that preset's")
    c.add_argument("--env", help="show the values of the algorithm's preset for this environment")
    c.set_defaults(func=cmd_config)
    m = sub.add_parser("compare", help="compare algorithms × environments × seeds at their presets: a table of "
                                       "greedy-evaluation IQMs and learning curves",
                       epilog="Writes compare.md, compare.csv, results.json and curves.png into --out. "
                              "Example: rmtjax compare --algos rmt,dqn,pqn --envs CartPole-v1,Acrobot-v1 --seeds 5")
    m.add_argument("config", nargs="*", help="config files to compare too (each on its own env, or on every --envs)")
    m.add_argument("--algos", action="append", metavar="A,B,...", help="algorithms, each at its preset")
    m.add_argument("--envs", action="append", metavar="E1,E2,...",
                   help="environments (default: each algorithm's default env)")
    m.add_argument("--seeds", default="3", help="seeds per (algorithm, env) (default 3)")
    m.add_argument("--seed", default="0", help=f"PRNG seed in [0, {SEED_MAX}] every run starts from (default 0)")
    m.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field in every config")
    m.add_argument("--total-steps", help="env steps per seed for every run (default: each preset's)")
    m.add_argument("--budget-seconds", help="give every agent this much training wall-clock instead "
                                            "(compilation not counted), then evaluate it")
    m.add_argument("--eval-episodes", default="10", help="greedy episodes per seed at each evaluation (default 10)")
    m.add_argument("--out", default="rmtjax-compare", metavar="DIR", help="output directory (default ./rmtjax-compare)")
    m.add_argument("--quiet", action="store_true", help="no progress bars")
    m.add_argument("--no-compile-cache", action="store_true", help="do not use the persistent compilation cache")
    m.add_argument("--allow-import", action="append", metavar="MODULE",
                   help="let an env id gymnasium:MODULE:EnvId import MODULE (runs its code); repeatable")
    m.set_defaults(func=cmd_compare)
    x = sub.add_parser("export", help="write one seed's greedy policy of a run into a single file")
    x.add_argument("run_dir", help="a run directory written by rmtjax train --run-dir")
    x.add_argument("out", help="the file to write, e.g. agent.policy (load it with rmtjax.load_policy(FILE))")
    x.add_argument("--seed", default="0", help="which seed's policy (default 0)")
    x.add_argument("--which", choices=("last", "best"), default="last",
                   help="last: the parameters at the end; best: those of the best periodic evaluation "
                        "(train.eval_every)")
    x.add_argument("--allow-import", action="append", metavar="MODULE",
                   help="let an env id gymnasium:MODULE:EnvId import MODULE (runs its code); repeatable")
    x.set_defaults(func=cmd_export)
    d = sub.add_parser("doctor", help="the training doctor's findings in a run directory (or a metrics file), "
                                      "with their evidence and the config fields to change")
    d.add_argument("run", help="a run directory, or a metrics.jsonl / metrics.csv file")
    d.add_argument("--plot", metavar="PATH", help="also draw the signals the detectors used into PATH (.png, .pdf)")
    d.set_defaults(func=cmd_doctor)
    n = sub.add_parser("notebooks", help="copy the example notebooks (shipped in the package) into a folder")
    n.add_argument("dest", nargs="?", default="rmtjax-notebooks", help="where (default ./rmtjax-notebooks)")
    n.set_defaults(func=cmd_notebooks)
    args = parser.parse_args(argv)
    from rmtjax.checkpoint import quiet_unawaited_metadata_reads

    try:
        return _run(args)
    finally:
        quiet_unawaited_metadata_reads()  # outside _run's block: it must outlive main (see its doc)


def _run(args) -> int:
    """`args.func(args)`, its warnings shown in one line each and its errors said as one line."""
    from rmtjax.checkpoint import CheckpointError
    from rmtjax.rundir import RunDirError
    from rmtjax.schema import ConfigError

    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return args.func(args)
        except ConfigError as e:
            print(f"rmtjax: config error: {e}", file=sys.stderr)
            return 2
        except (RunDirError, CheckpointError) as e:
            print(f"rmtjax: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"rmtjax: error: {describe_os_error(e)}", file=sys.stderr)
            return 1


_ADVICE = {
    errno.ENOSPC: "free space on that device; a run keeps its last complete checkpoint, so continue it with "
                  "rmtjax train --resume DIR",
    errno.EROFS: "the file system is read-only: choose a directory on a writable one",
    errno.EACCES: "permission denied: choose a directory you may write, or fix its permissions",
    errno.EPERM: "not permitted: choose a directory you may write",
    errno.ENOTDIR: "a part of the path is a file, not a directory: choose another path",
    errno.ENOENT: "a part of the path does not exist (or cannot be made there): check the path",
    errno.EEXIST: "something already exists there: choose another path",
    errno.EISDIR: "it is a directory: name a file",
    errno.ELOOP: "a symbolic link is in the way: rmtjax never writes through one; remove it",
    errno.EDQUOT: "the disk quota is exhausted: free space, then resume",
}


def describe_os_error(e: OSError) -> str:
    """One line for an operating-system error: what failed, the path, what to do."""
    what = e.strerror or str(e) or type(e).__name__
    where = f" {e.filename!s}" if e.filename else ""
    if e.filename2:
        where += f" -> {e.filename2!s}"
    advice = _ADVICE.get(e.errno, "check the path and try again")
    return f"{what}:{where} ({advice})" if where else f"{what} ({advice})"


if __name__ == "__main__":
    sys.exit(main())
