"""Weights & Biases logging (`train.wandb`), in wandb's offline mode: the run file it writes is
read back record by record and compared with the run directory's metrics."""

import json
import struct
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import rmtjax
from rmtjax.cli import main

wandb = pytest.importorskip("wandb", reason="the wandb extra (pip install 'rmtjax[wandb]') is not installed")

OVERRIDES = {"train.total_steps": 2048, "train.num_seeds": 2, "train.num_chunks": 2, "train.progress": False,
             "agent.rollout_len": 64, "train.wandb": True, "train.wandb_mode": "offline",
             "train.wandb_project": "rmtjax-test"}


def read_records(path: Path):
    """The protobuf records of a W&B run file (`run-<id>.wandb`): a 7-byte header, then 32 KiB
    blocks of records, each with a 7-byte header (checksum, length, kind: whole, first, middle
    or last piece)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pieces, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pieces += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pieces)
            records.append(record)
            pieces = b""
    return records


def history_and_summary(wandb_dir: Path):
    (run_file,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    history, summary, config = [], {}, None
    # wandb's service process writes the file on its own: wait for its closing record
    deadline = time.monotonic() + 60
    while True:
        records = read_records(run_file)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "history":
            history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            summary.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.summary.update})
        elif kind == "run" and r.run.config.update:
            config = {i.key: json.loads(i.value_json) for i in r.run.config.update}
    return history, summary, config


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("wandb")
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_DIR", str(base))
    mp.setenv("WANDB_SILENT", "true")
    try:
        cfg = rmtjax.make_config("ppo", "CartPole-v1", OVERRIDES)
        result = rmtjax.train(cfg, jax.random.key(0), run_dir=base / "run")
    finally:
        mp.undo()
    return base, result


def test_offline_wandb_run_holds_the_tensorboard_scalars_against_env_steps(offline_run):
    base, result = offline_run
    history, summary, config = history_and_summary(base)
    n_iter = result.metrics["env_steps"].shape[1]
    assert len(history) == n_iter == 8
    for t, row in enumerate(history):
        assert row["iteration"] == t + 1
        assert row["env_steps"] == int(result.metrics["env_steps"][0, t]) == 256 * (t + 1)
        for name in ("episode_return", "value_loss", "lr", "env_steps"):
            np.testing.assert_allclose(row[f"{name}/mean"], result.metrics[name][:, t].mean(), rtol=1e-6, err_msg=name)
        for s in range(2):
            np.testing.assert_allclose(row[f"episode_return/seed_{s}"], result.metrics["episode_return"][s, t], rtol=1e-6)
    # the config and the summary
    assert config is not None and config["algo"] == "ppo"
    assert config["train"]["total_steps"] == 2048 and config["agent"]["rollout_len"] == 64
    np.testing.assert_allclose(summary["final_return_mean"], np.nanmean(result.final_return), rtol=1e-6)
    for s in range(2):
        np.testing.assert_allclose(summary[f"final_return/seed_{s}"], result.final_return[s], rtol=1e-6)
    assert summary["env_steps_per_seed"] == 2048


def test_the_run_directory_records_the_wandb_run_and_stays_free_of_links(offline_run):
    base, result = offline_run
    info = json.loads((base / "run" / "run.json").read_text())
    (run_file,) = base.glob("wandb/offline-run-*/run-*.wandb")
    assert run_file.name == f"run-{info['wandb_id']}.wandb"
    assert not (base / "run" / "wandb").exists()
    assert not [p for p in (base / "run").rglob("*") if p.is_symlink()]


def test_wandb_fields_may_change_on_resume_and_bad_modes_are_refused(capsys):
    from rmtjax.config import RUN_INDEPENDENT_FIELDS

    assert {"train.wandb", "train.wandb_mode", "train.wandb_project"} <= RUN_INDEPENDENT_FIELDS
    assert main(["train", "--print-config", "--set", "train.wandb_mode=offlin"]) == 2
    assert "train.wandb_mode: 'offlin' is not one of ['auto', 'online', 'offline']" in capsys.readouterr().err
