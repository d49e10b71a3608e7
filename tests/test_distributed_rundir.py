"""A run directory for a run on 4 CPU devices: killed by SIGKILL after a checkpoint, resumed, it
ends with the parameters and metrics of the uninterrupted run; load_run and evaluate read it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
import rmtjax
cfg = rmtjax.make_config("dqn", "CartPole-v1", {
    "env.num_envs": 4, "agent.rollout_len": 4, "agent.updates_per_step": 0.25, "agent.learning_starts": 256,
    "agent.hidden": [16, 16], "agent.buffer_size": 1024, "train.total_steps": 4096, "train.num_seeds": 2,
    "train.num_chunks": 4, "train.progress": False, "distributed.devices": 4, "distributed.fusion": "topk"})
"""
KILLED = CONFIG + """
import os, signal, sys, jax
rmtjax.train(cfg, jax.random.key(3), run_dir=sys.argv[1],
             on_chunk=lambda state, chunks, done: os.kill(os.getpid(), signal.SIGKILL) if done >= 128 else None)
"""
RESUMED = CONFIG + """
import json, sys, jax, numpy as np
resumed = rmtjax.train(None, None, resume=sys.argv[1])
reference = rmtjax.train(cfg, jax.random.key(3))
loaded = rmtjax.load_run(sys.argv[1])
leaves = lambda r: [np.asarray(x) for x in jax.tree.leaves(r.state.params)]
from rmtjax import limits
from rmtjax.driver import Program
program = Program(cfg)  # the memory floor counts one device's state, traced under the mesh
floor = limits.check_train_fits(cfg, program.agent, program.init,
                                shapes=program.sharded.local_state_shapes(program.init))
made = sum(x.nbytes if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else 8 * x.size
           for x in jax.tree.leaves(reference.state))
state_floor = floor - limits._rollout_bytes(cfg, program.agent) - limits._activation_bytes(cfg)
print("RESULT " + json.dumps({
    "params_equal": all(np.array_equal(a, b) for a, b in zip(leaves(resumed), leaves(reference))),
    "loaded_equal": all(np.array_equal(a, b) for a, b in zip(leaves(loaded), leaves(reference))),
    "metrics_equal": all(np.array_equal(resumed.metrics[k], reference.metrics[k]) for k in reference.metrics),
    "moved": bool(reference.metrics["loss"][:, -1].min() > 0),
    "shape": list(leaves(loaded)[0].shape), "final_return": loaded.final_return.tolist(),
    "reference_return": reference.final_return.tolist(),
    "eval_shape": list(rmtjax.evaluate(loaded, episodes=2).returns.shape),
    "state_floor": state_floor, "state_made": made}))
"""


def test_a_killed_run_on_4_devices_resumes_to_the_uninterrupted_result(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache")}
    path = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILLED, str(path)], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=900)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert sorted(p.name for p in (path / "checkpoints").iterdir()) == ["128", "64"]
    done = subprocess.run([sys.executable, "-c", RESUMED, str(path)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["moved"] and r["params_equal"] and r["metrics_equal"] and r["loaded_equal"], r
    assert r["shape"][0] == 2  # this process's first device's state: [num_seeds, ...]
    assert r["final_return"] == r["reference_return"] and r["eval_shape"] == [2, 2]
    assert r["state_floor"] == r["state_made"]  # the floor holds one device's whole state
