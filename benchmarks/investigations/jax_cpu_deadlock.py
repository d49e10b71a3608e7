"""A minimal reproduction of the jaxlib CPU deadlock that made rmtjax pin jax below 0.8 (for an
upstream report; pure jax + numpy).

    python -m benchmarks jax_cpu_deadlock [ITERS=300] [N=256] [BATCH=2] [NUM_QR=4]
    python benchmarks/investigations/jax_cpu_deadlock.py ...   # the same, outside this repository

What happens. A jitted program holds several independent batched QR factorisations (a network
initialised with orthogonal kernels under `vmap` over seeds has one per layer). XLA:CPU runs
independent operations at the same time on its intra-op thread pool. jaxlib 0.10.0 to 0.11.x
split each batched LAPACK call into chunks (`jax::ParallelBatchMap`, when the batch costs more
than ~200k flops), schedule the chunks on that same pool and block the calling pool thread in
`absl::BlockingCounter::Wait` until they are done. Once every pool thread (one per core: two on a
2-core machine) is such a waiting caller, nobody runs the queued chunks: the process hangs at 0%
CPU, the main thread waiting in a device-to-host copy. One batched QR alone cannot hang (the other
thread runs its chunks); `--xla_cpu_multi_thread_eigen=false` and
`jax_cpu_enable_async_dispatch=False` do not help; one core per process (`taskset -c 0`) does.

Measured on this project's 2-core machine (2026-12-03): with jax 0.10.2, `300 256 2 4` hung in
10 of 10 tries (within the first ~100 iterations), `300 64 2 4` (layer-sized matrices) in 8 of
10, `300 256 2 1` (one QR) in 0 of 3; with jax 0.7.2 (before the batch splitting) 0 of 10.

A watchdog thread exits with status 3 and prints `DEADLOCK` when the process used no CPU time
for 10 s (so a slow, loaded machine is not mistaken for a hang); otherwise the script prints
`OK`. rmtjax itself avoids the hang by initialising orthogonal kernels without LAPACK
(`rmtjax/networks/init.py`).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np


def add_arguments(ap) -> None:
    ap.add_argument("sizes", nargs="*", type=int, metavar="ITERS N BATCH NUM_QR", help="default 300 256 2 4")


def run(args) -> int:
    return main(args.sizes)


def main(argv=None) -> int:
    args = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    iters, n, batch, num_qr = (args + [300, 256, 2, 4][len(args):])[:4]

    @jax.jit
    def independent_qrs(key):
        # `num_qr` batched QRs that do not depend on each other: XLA may run them at once
        return jnp.stack([jnp.linalg.qr(jax.random.normal(k, (batch, n, n)))[0] for k in jax.random.split(key, num_qr)])

    progress = {"iteration": -1}

    def watchdog():
        last = time.process_time()
        while True:
            time.sleep(10)
            now = time.process_time()
            if now - last < 0.05:
                print(f"DEADLOCK at iteration {progress['iteration']}: no CPU time used in 10 s", flush=True)
                os._exit(3)
            last = now

    threading.Thread(target=watchdog, daemon=True).start()
    print(f"jax {jax.__version__} {jax.devices()}: {iters} iterations of {num_qr} batched QRs of "
          f"[{batch}, {n}, {n}]", flush=True)
    t0 = time.perf_counter()
    key = jax.random.key(0)
    for i in range(iters):
        progress["iteration"] = i
        key, sub = jax.random.split(key)
        np.asarray(independent_qrs(sub))  # a device-to-host copy, where rmtjax's main thread hung
    print(f"OK: {iters} iterations in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":  # a file to hand upstream: it runs alone, with jax and numpy only
    sys.exit(main())
