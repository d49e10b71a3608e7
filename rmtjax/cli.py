"""`rmtjax` on the shell: `rmtjax train [CONFIG.yaml] [--algo A] [--env E] [--set key=value ...]`."""

from __future__ import annotations

import argparse
import sys

DEFAULT_ALGO, DEFAULT_ENV = "ppo", "CartPole-v1"


def _build_config(args):
    from rmtjax.config import load_config, make_config, parse_override

    overrides = dict(parse_override(s) for s in args.set or [])
    if args.config:
        cfg = load_config(args.config)
        if args.algo or args.env:
            algo = args.algo or cfg.algo
            data = cfg.to_dict() if algo == cfg.algo else {"algo": algo, "env": cfg.env.to_dict(), "train": cfg.train.to_dict(), "agent": {}}
            if args.env:
                data["env"]["id"] = args.env
            cfg = type(cfg).from_dict(data)
        return cfg.override(overrides)
    return make_config(args.algo or DEFAULT_ALGO, args.env or DEFAULT_ENV, overrides)


def cmd_train(args) -> int:
    import jax
    import numpy as np

    from rmtjax.train import train

    cfg = _build_config(args)
    if args.print_config:
        print(cfg.to_yaml())
    seed = cfg.train.seed if args.seed is None else args.seed
    result = train(cfg, jax.random.key(seed), progress=False if args.quiet else None)
    print(result.summary())
    fr = np.array2string(result.final_return, precision=1, separator=", ")
    print(f"final return per seed: {fr}")
    return 0


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
    p.set_defaults(func=cmd_train)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"rmtjax: config error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
