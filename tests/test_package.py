"""The package as a user installs it: a wheel built from the source, installed without
`-e` into a folder of its own, run from outside the repository."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("setuptools", reason="the dev extra installs setuptools to build the wheel")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("package")
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "rmtjax", src / "rmtjax", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # no build isolation: setuptools and wheel come from the dev extra, nothing is downloaded
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(base / "dist"), str(src)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = (base / "dist").glob("rmtjax-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(base / "site"),
                    str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    return base, wheel


def run_installed(base: Path, *args, timeout=600):
    env = {**os.environ, "PYTHONPATH": str(base / "site")}
    return subprocess.run(list(args), cwd=base, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_holds_the_presets_notebooks_license_and_type_marker(installed):
    _, wheel = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = {p.name for p in (REPO / "rmtjax" / "configs").glob("*.yaml")}
    assert presets and {f"rmtjax/configs/{p}" for p in presets} <= names
    assert {"rmtjax/notebooks/01_quickstart.ipynb", "rmtjax/notebooks/02_sweeps.ipynb",
            "rmtjax/notebooks/03_inside_rmt.ipynb", "rmtjax/py.typed"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)


def test_the_installed_package_trains_from_outside_the_repository(installed):
    base, _ = installed
    probe = run_installed(base, sys.executable, "-c",
                          "import rmtjax, rmtjax.config as c; print(rmtjax.__file__); print(len(c.available_presets()));"
                          "print(c.make_config('dqn', 'CartPole-v1').agent.buffer_size)")
    assert probe.returncode == 0, probe.stderr
    where, count, buffer = probe.stdout.split()
    assert Path(where).resolve() == (base / "site" / "rmtjax" / "__init__.py").resolve()  # not the source tree
    assert int(count) == len(list((REPO / "rmtjax" / "configs").glob("*.yaml")))
    assert int(buffer) == 10_000  # read from the installed preset (the default is another)
    script = base / "site" / "bin" / "rmtjax"
    out = run_installed(base, str(script), "train", "--quiet", "--set", "train.total_steps=2048",
                        "--set", "agent.rollout_len=64", "--run-dir", "run")  # as tests/test_train.py: a cached program
    assert out.returncode == 0, out.stderr
    assert "ppo on CartPole-v1: 2,048 env steps" in out.stdout
    assert (base / "run" / "summary.json").is_file()
    nb = run_installed(base, str(script), "notebooks", "nb")
    assert nb.returncode == 0, nb.stderr
    assert sorted(p.name for p in (base / "nb").iterdir()) == ["01_quickstart.ipynb", "02_sweeps.ipynb",
                                                                "03_inside_rmt.ipynb"]
