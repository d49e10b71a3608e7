"""`rmtjax` on the shell.

    rmtjax train [CONFIG.yaml] [--algo A] [--env E] [--set key=value ...] [--run-dir DIR]
    rmtjax train --resume DIR [--set train.progress=false ...]
    rmtjax eval DIR [--episodes N] [--seed S]
"""

from __future__ import annotations

import argparse
import sys
import warnings

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
    return make_config(args.algo or DEFAULT_ALGO, args.env or DEFAULT_ENV, overrides)


def cmd_train(args) -> int:
    import jax
    import numpy as np

    from rmtjax import cache, distributed
    from rmtjax.driver import train

    distributed.initialize()  # a multi-host run (RMTJAX_* variables) joins before JAX starts
    cache.enable(disable=args.no_compile_cache)
    cfg = _build_config(args)
    if args.print_config:
        print(cfg.to_yaml())
    progress = False if args.quiet else None
    if args.resume:
        key = None if args.seed is None else jax.random.key(args.seed)  # None: the run's own key
        result = train(cfg, key, progress=progress, resume=args.resume)
    else:
        seed = cfg.train.seed if args.seed is None else args.seed
        result = train(cfg, jax.random.key(seed), progress=progress, run_dir=args.run_dir)
    print(result.summary())
    fr = np.array2string(result.final_return, precision=1, separator=", ")
    print(f"final return per seed: {fr}")
    if result.run_dir is not None:
        print(f"run directory: {result.run_dir}")
    return 0


def cmd_eval(args) -> int:
    import jax

    from rmtjax.config import ConfigError
    from rmtjax.driver import evaluate, load_run

    if args.episodes < 1:
        raise ConfigError(f"--episodes: expected an integer ≥ 1, got {args.episodes}")
    result = load_run(args.run_dir)
    ev = evaluate(result, episodes=args.episodes, key=jax.random.key(args.seed), max_steps=args.max_steps)
    print(f"{result.config.algo} on {result.config.env.id} ({args.run_dir}, {result.env_steps:,} env steps per seed): "
          f"{ev.summary()}")
    print(f"mean return {ev.mean:.2f} ± std {ev.std:.2f}")
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"rmtjax: warning: {message}", file=sys.stderr if file is None else file)


def main(argv=None) -> int:
    from rmtjax.config import ConfigError

    parser = argparse.ArgumentParser(prog="rmtjax", description="Train RL agents as one compiled JAX program.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train an agent (no arguments: PPO on CartPole-v1, a short solving run)")
    p.add_argument("config", nargs="?", help="a YAML config file")
    p.add_argument("--algo", help=f"algorithm (default {DEFAULT_ALGO})")
    p.add_argument("--env", help=f"environment id (default {DEFAULT_ENV})")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. agent.lr=3e-4")
    p.add_argument("--seed", type=int, help="PRNG seed (default: train.seed)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--print-config", action="store_true", help="print the resolved config first")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="do not read or write the persistent compilation cache (see RMTJAX_CACHE_DIR)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--run-dir", metavar="DIR", help="write config, metrics, checkpoints and summary into DIR")
    where.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    p.set_defaults(func=cmd_train)
    e = sub.add_parser("eval", help="greedy evaluation episodes of a run directory's saved policy")
    e.add_argument("run_dir", help="a run directory written by rmtjax train --run-dir")
    e.add_argument("--episodes", type=int, default=10, help="episodes per seed (default 10)")
    e.add_argument("--seed", type=int, default=0, help="PRNG seed of the evaluation environments (default 0)")
    e.add_argument("--max-steps", type=int, help="cut episodes off after this many steps (default: the env's limit)")
    e.set_defaults(func=cmd_eval)
    args = parser.parse_args(argv)
    from rmtjax.checkpoint import CheckpointError
    from rmtjax.rundir import RunDirError

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


if __name__ == "__main__":
    sys.exit(main())
