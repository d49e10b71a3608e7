"""The persistent compilation cache (`rmtjax.cache`), each case in a fresh process: JAX decides
on its cache when it first compiles."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
import jax, rmtjax
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
cfg = rmtjax.make_config("ppo", "CartPole-v1", {"train.total_steps": 1024, "train.progress": False,
                                                "agent.hidden": [8, 8]})
counts = []
for _ in range(int(sys.argv[1])):
    events.clear()
    rmtjax.train(cfg, jax.random.key(0))
    counts.append(events.count("/jax/compilation_cache/cache_hits"))
print(json.dumps({"hits": counts, "dir": jax.config.jax_compilation_cache_dir}))
"""


def run(env_extra, trainings=2):
    env = {**os.environ, **env_extra}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(trainings)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_identical_run_reads_its_programs_from_the_cache(tmp_path):
    out = run({"RMTJAX_CACHE_DIR": str(tmp_path / "cache")})
    assert out["dir"] == str(tmp_path / "cache")
    first, second = out["hits"]
    assert first == 0 and second >= 1  # the training chunk, compiled again, came from disk
    assert any((tmp_path / "cache").iterdir())


def test_the_cache_can_be_turned_off(tmp_path):
    # one training: with the cache on, it would already have set the directory and written into it
    out = run({"RMTJAX_CACHE_DIR": "off", "XDG_CACHE_HOME": str(tmp_path)}, trainings=1)
    assert out["hits"] == [0] and not out["dir"]
    assert not (tmp_path / "rmtjax").exists()
