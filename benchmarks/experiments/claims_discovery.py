"""The MountainCar-v0 discovery claim alone, at a budget of its own: ε+Boltzmann against ε-greedy,
env steps to the first episode that reaches the flag (the suite's claims row, run apart); prints
its row and writes results/claims/claims_discovery.md (its own file, which the suite's
regenerated claims.md does not overwrite).

    python -m benchmarks claims_discovery --discovery-steps N [--seeds S] [--jobs 2]
"""

from __future__ import annotations

import dataclasses
import os
import time

from benchmarks.experiments.suite import QUICK, Suite, discovery_row, parse_args
from benchmarks.lib.runner import command
from benchmarks.lib.tables import write_table


def add_arguments(ap) -> None:
    ap.add_argument("--discovery-steps", type=int, required=True)
    ap.add_argument("--seeds", type=int, default=QUICK.seeds)
    ap.add_argument("--jobs", type=int, default=2)


def run(a) -> None:
    args, _ = parse_args(["--quick", "--sections", "claims", "--jobs", str(a.jobs)])
    budget = dataclasses.replace(QUICK, discovery_steps=a.discovery_steps, seeds=a.seeds)
    suite = Suite(args, budget)
    suite.plan = lambda: [suite._key("rmt", "MountainCar-v0", a.discovery_steps, s)
                          for s in ([], ["agent.exploration=eps_greedy"])]
    suite.prefetch()
    row = discovery_row(suite, f"`{command()}`")
    l0 = os.getloadavg()
    write_table("claims", "claims_discovery", "The exploration-discovery claim at a budget of its own",
                ["claim", "measured", "reading", "command"], [row],
                f"Run alone: {(time.perf_counter() - suite.t0) / 60:.1f} min wall, load average {l0[0]:.1f} at the end. "
                "This file is this script's own, so the suite's regenerated `claims.md` does not overwrite it.")
