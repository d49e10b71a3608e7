"""Data-parallel training (rmtjax.distributed): config, gradient fusion, what crosses the mesh,
and (in subprocesses, since JAX fixes the device count when it starts) runs on 4 CPU devices
and on 2 processes joined by jax.distributed."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rmtjax
from rmtjax import distributed
from rmtjax.config import ConfigError
from rmtjax.distributed import DistributedConfig, Fusion, FusionState, collective_bytes

WORKER = Path(__file__).with_name("distributed_worker.py")
ROOT = Path(__file__).resolve().parents[1]
D = 4


# -- config ------------------------------------------------------------------------------------
def test_distributed_section_round_trips_and_defaults_to_one_device():
    cfg = rmtjax.make_config("rmt", "CartPole-v1", {"distributed.devices": 4, "distributed.fusion": "topk",
                                                    "distributed.topk_fraction": 0.1})
    assert cfg.distributed.devices == 4 and cfg.distributed.topk_fraction == 0.1
    assert rmtjax.Config.from_dict(cfg.to_dict()) == cfg
    assert rmtjax.make_config("rmt", "CartPole-v1").distributed.devices == 1


@pytest.mark.parametrize("overrides, message", [
    ({"distributed.devices": 0}, r"distributed.devices: 0 is out of range; allowed \[1, "),
    ({"distributed.fusion": "topk"}, "with distributed.devices: 1 there is nothing to fuse"),
    ({"distributed.devices": 4, "distributed.fusion": "median"}, "distributed.fusion: 'median' is not one of"),
    ({"distributed.devices": 4, "distributed.topk_fraction": 0.1}, "applies only with distributed.fusion: topk"),
    ({"distributed.devices": 4, "distributed.fusion": "topk", "distributed.topk_fraction": 0.0},
     r"topk_fraction: 0.0 is out of range; allowed \(0.0, 1.0\]"),
    ({"distributed.devices": 4, "distributed.error_feedback": False}, "mean fusion is exact"),
    ({"distributed.devices": 3}, r"env.num_envs: \d+ must be a multiple of distributed.devices"),
    ({"distributed.devices": 4, "agent.batch_size": 66}, "agent.batch_size: 66 must be a multiple"),
    ({"algo": "ppo", "distributed.devices": 4, "agent.rollout_len": 6}, "agent.num_minibatches: 4 must divide each "
                                                                         "device's share of the rollout"),
    ({"algo": "sac", "distributed.devices": 4, "agent.buffer_size": 1002}, "agent.buffer_size: 1002 must be a "
                                                                           "multiple of distributed.devices"),
    ({"distributed.device": 4}, "unknown key distributed.device"),
])
def test_bad_distributed_settings_are_config_errors(overrides, message):
    overrides = dict(overrides)
    algo = overrides.pop("algo", "rmt")
    with pytest.raises(ConfigError, match=message):
        rmtjax.make_config(algo, "Pendulum-v1" if algo == "sac" else "CartPole-v1", overrides)


def test_algorithms_without_gradient_fusion_refuse_several_devices():
    with pytest.raises(ConfigError, match="pqn does not train on several devices"):
        rmtjax.make_config("pqn", "CartPole-v1", {"distributed.devices": 2})
    for algo, env in (("ppo", "CartPole-v1"), ("sac", "Pendulum-v1"), ("rmt", "CartPole-v1")):
        assert rmtjax.make_config(algo, env, {"distributed.devices": 4}).distributed.devices == 4


def test_multi_host_settings_come_from_config_or_environment(monkeypatch):
    assert distributed.process_settings(DistributedConfig()) is None
    monkeypatch.setenv("RMTJAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("RMTJAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("RMTJAX_PROCESS_ID", "1")
    assert distributed.process_settings(DistributedConfig()) == ("10.0.0.1:1234", 2, 1)
    assert distributed.process_settings(DistributedConfig(process_id=0)) == ("10.0.0.1:1234", 2, 0)
    monkeypatch.delenv("RMTJAX_PROCESS_ID")
    with pytest.raises(ConfigError, match="RMTJAX_PROCESS_ID"):
        distributed.process_settings(DistributedConfig())


def test_more_devices_than_there_are_is_an_error_with_the_fix():
    cfg = DistributedConfig(devices=jax.device_count() + 1)
    with pytest.raises(ConfigError, match="xla_force_host_platform_device_count"):
        distributed.make_mesh(cfg)


# -- fusion: D workers emulated by vmap with the mesh axis's name ------------------------------
def workers_grads(seed=0, n=(40, 7)):
    """D workers' gradients: a pytree of two leaves, [D, ...] each."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {"w": jax.random.normal(k1, (D, n[0])), "b": 0.01 * jax.random.normal(k2, (D, n[1]))}


def fuse_on_workers(fusion, grads, state, loss=None):
    loss = jnp.ones(D) if loss is None else loss
    return jax.vmap(fusion.fuse, axis_name=distributed.AXIS)(grads, loss, state)


def fresh_state(fusion, grads):
    return jax.vmap(fusion.init)(jax.tree.map(lambda g: g, grads))


def test_mean_fusion_is_the_all_reduce_mean():
    grads = workers_grads()
    fusion = Fusion(DistributedConfig(devices=D))
    fused, loss, _ = fuse_on_workers(fusion, grads, fresh_state(fusion, grads), jnp.arange(4.0))
    for name in grads:
        np.testing.assert_allclose(fused[name], np.broadcast_to(grads[name].mean(0), grads[name].shape), rtol=1e-6)
    np.testing.assert_allclose(loss, 1.5)


def test_a_non_finite_gradient_on_one_worker_makes_the_loss_nan_on_all():
    grads = workers_grads()
    grads["w"] = grads["w"].at[2, 3].set(jnp.nan)
    fusion = Fusion(DistributedConfig(devices=D, fusion="topk"))
    fused, loss, state = fuse_on_workers(fusion, grads, fresh_state(fusion, grads))
    assert np.all(np.isnan(loss))  # the guard skips the step everywhere
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves((fused, state)))


def test_topk_sends_k_entries_keeps_the_rest_and_averages_with_momentum():
    grads = workers_grads()
    n = 47
    cfg = DistributedConfig(devices=D, fusion="topk", topk_fraction=0.2, momentum=0.5)
    fusion = Fusion(cfg)
    fused, _, state = fuse_on_workers(fusion, grads, fresh_state(fusion, grads))
    k = int(np.ceil(0.2 * n))
    flat = np.concatenate([np.asarray(grads["b"]), np.asarray(grads["w"])], axis=1)  # ravel order: sorted keys
    sparse = np.zeros_like(flat)
    for d in range(D):
        top = np.argsort(-np.abs(flat[d]))[:k]
        sparse[d, top] = flat[d, top]
    residual = np.concatenate([np.asarray(state.residual["b"]), np.asarray(state.residual["w"])], axis=1)
    np.testing.assert_allclose(residual, flat - sparse, atol=1e-7)  # error feedback: what was not sent
    assert np.all((residual != 0).sum(1) == n - k)
    expected = 0.5 * sparse.mean(0)  # momentum starts at 0
    got = np.concatenate([np.asarray(fused["b"]), np.asarray(fused["w"])], axis=1)
    np.testing.assert_allclose(got, np.broadcast_to(expected, got.shape), rtol=1e-5, atol=1e-7)


def test_topk_error_feedback_delays_entries_but_loses_none():
    """A constant gradient fused with top-k, error feedback and no momentum: what was sent in
    T steps plus what the workers still hold is exactly T gradients, and what they hold stays
    bounded (every entry is sent sooner or later)."""
    grads = workers_grads(n=(20, 5))
    fusion = Fusion(DistributedConfig(devices=D, fusion="topk", topk_fraction=0.2, momentum=0.0))
    state = fresh_state(fusion, grads)
    sent = jax.tree.map(jnp.zeros_like, grads)
    step = jax.jit(lambda s: fuse_on_workers(fusion, grads, s))
    T = 200
    for _ in range(T):
        fused, _, state = step(state)
        sent = jax.tree.map(jnp.add, sent, fused)
    for name in grads:
        held = np.asarray(state.residual[name]).mean(0)
        np.testing.assert_allclose(np.asarray(sent[name][0]) + held, T * np.asarray(grads[name].mean(0)),
                                   rtol=1e-4, atol=1e-4)
    biggest = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads))
    assert max(float(jnp.abs(r).max()) for r in jax.tree.leaves(state.residual)) < 10 * biggest


@pytest.mark.parametrize("mode, tol", [("int8", 0.05), ("bf16", 0.01)])
def test_quantised_fusion_is_close_to_the_mean_and_feeds_back_the_rounding(mode, tol):
    grads = workers_grads()
    fusion = Fusion(DistributedConfig(devices=D, fusion=mode))
    fused, _, state = fuse_on_workers(fusion, grads, fresh_state(fusion, grads))
    for name in grads:
        mean = np.asarray(grads[name].mean(0))
        np.testing.assert_allclose(np.asarray(fused[name][0]), mean, atol=tol * np.abs(mean).max())
        np.testing.assert_allclose(np.asarray(fused[name][0]), np.asarray(fused[name][3]))  # the same everywhere
        assert np.abs(np.asarray(state.residual[name])).max() > 0  # the rounding error is kept, not lost


def test_reduced_metrics_sum_counts_and_average_statistics():
    metrics = {"episode_count": jnp.arange(4, dtype=jnp.int32), "loss": jnp.arange(4.0),
               "env_steps": jnp.full(4, 64, jnp.int32), "updates": jnp.full(4, 7, jnp.int32),
               "replay_size": jnp.full(4, 100, jnp.int32)}
    out = jax.vmap(distributed.reduce_metrics, axis_name=distributed.AXIS)(metrics)
    np.testing.assert_array_equal(out["episode_count"], [6] * 4)
    np.testing.assert_allclose(out["loss"], [1.5] * 4)
    np.testing.assert_array_equal(out["replay_size"], [400] * 4)  # each device's shard: the whole fill
    np.testing.assert_array_equal(out["env_steps"], [64] * 4)  # the clock's counts: the same everywhere
    np.testing.assert_array_equal(out["updates"], [7] * 4)


def test_the_guard_skips_on_every_device_when_one_has_a_non_finite_gradient():
    """The guard transform with fusion (4 workers emulated by vmap): worker 2's gradient is NaN,
    so no worker's parameters, inner optimiser state or fusion state move; the next finite step
    moves all of them alike."""
    import optax

    from rmtjax.guard import guard

    fusion = Fusion(DistributedConfig(devices=D, fusion="topk"))
    tx = guard(optax.adam(0.1), fusion)
    params = {"w": jnp.ones((D, 5))}
    state = jax.vmap(tx.init)(params)
    grads = workers_grads(n=(5, 1))
    bad = {"w": grads["w"].at[2, 1].set(jnp.nan)}

    def update(g, s, p):
        u, s = tx.update(g, s, p, loss=jnp.float32(1.0), clip=0.5)
        return optax.apply_updates(p, u), s

    run = jax.vmap(update, axis_name=distributed.AXIS)
    p1, s1 = run(bad, state, params)
    assert not np.any(np.asarray(s1.finite))
    for a, b in zip(jax.tree.leaves((params, state.inner, state.fusion)), jax.tree.leaves((p1, s1.inner, s1.fusion))):
        np.testing.assert_array_equal(a, b)
    p2, s2 = run({"w": grads["w"]}, s1, p1)
    assert np.all(np.asarray(s2.finite)) and np.all(np.asarray(s2.grad_norm) > 0)
    assert not np.allclose(p2["w"], p1["w"])
    np.testing.assert_array_equal(p2["w"], np.broadcast_to(p2["w"][0], p2["w"].shape))  # the same update everywhere
    assert np.abs(np.asarray(s2.fusion.residual["w"])).max() > 0  # error feedback kept in the optimiser state


# -- the HLO reader ----------------------------------------------------------------------------
def test_collective_bytes_reads_ops_and_operand_sizes():
    hlo = """
  %all-reduce.1 = f32[100]{0} all-reduce(f32[100]{0} %x), channel_id=1, replica_groups=[1,4]<=[4], to_apply=%add
  %ag = s32[4,20]{1,0} all-gather(s32[20]{0} %idx), channel_id=2, dimensions={0}
  %ars = (s8[10]{0}, f32[3]{0}) all-reduce-start(s8[10]{0} %q, f32[3]{0} %s), channel_id=3
  %ard = (s8[10]{0}, f32[3]{0}) all-reduce-done((s8[10]{0}, f32[3]{0}) %ars)
  %add.2 = f32[100]{0} add(f32[100]{0} %a, f32[100]{0} %b)
"""
    ops = collective_bytes(hlo)
    assert [o["op"] for o in ops] == ["all-reduce", "all-gather", "all-reduce"]
    assert [o["operand_bytes"] for o in ops] == [400, 80, 22]
    assert ops[1]["result_bytes"] == 320


def test_collective_bytes_derives_operands_in_compiled_hlo():
    # compiled HLO names operands without their types
    hlo = """
  %psum.7 = f32[] all-reduce(%and_select_fusion), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%r
  %all_gather.15 = f32[4,922]{1,0} all-gather(%fusion), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}
  %rs = bf16[10]{0} reduce-scatter(%y), channel_id=3, replica_groups=[1,4]<=[4], dimensions={0}
"""
    ops = collective_bytes(hlo)
    assert [o["operand_bytes"] for o in ops] == [4, 922 * 4, 80]
    assert [o["group_size"] for o in ops] == [4, 4, 4]


# -- 4 CPU devices and 2 processes, in subprocesses ----------------------------------------
def run_worker(args, devices=D, timeout=600, env=None):
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    proc = subprocess.run([sys.executable, str(WORKER), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"worker {args} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def equivalence():
    return run_worker(["equivalence"])


@pytest.mark.parametrize("algo", ["rmt", "dqn", "ppo", "sac"])
def test_mean_fusion_on_4_devices_gives_the_parameters_of_1_device_with_the_global_batch(equivalence, algo):
    assert equivalence["devices"] == D
    r = equivalence[algo]
    assert r["max_param_move"] > 1e-4  # the three steps did move the parameters
    assert r["max_param_diff"] < 1e-6 * max(1.0, r["param_scale"]), r
    np.testing.assert_allclose(r["loss_four"], r["loss_one"], rtol=1e-6)
    np.testing.assert_allclose(r["grad_norm_four"], r["grad_norm_one"], rtol=1e-6)


def test_make_train_on_4_devices_keeps_the_replicas_equal_and_the_envs_apart(equivalence):
    r = equivalence["make_train"]
    assert r["param_shape"][:2] == [D, 2] and r["metric_shape"] == [2, 1024 // 16]  # [devices, seeds, ...]
    assert r["moved"] and r["replicas_equal"]  # int8-fused updates, the same on every device
    assert r["obs_differ"]  # each device steps its own envs


@pytest.mark.slow
def test_topk_fusion_with_error_feedback_learns_cartpole_on_4_devices():
    r = run_worker(["learn", "topk", "40000"], timeout=900)
    # top 20% of entries, error feedback, momentum 0.5 (the defaults); random play scores about
    # 22. Scored by each seed's mean return over the last tenth of training, steadier than the
    # last episode's. Top-k learns more slowly than mean fusion here, and one seed in a few is
    # slow at 40k steps; which one moves with the last bit of the floats, which differs between
    # CPUs: with 4 seeds, key 0 gave a mean of 88 (lowest seed 59) on one AMD EPYC and 58 (64,
    # 26, 86, 55) on another. So 8 seeds, and one may lag. On the second machine (jax 0.10.2, 4 CPU
    # devices), keys 0-2: means 76.5, 92.4, 79.5, lowest seeds 26/54, 60/67, 39/60; mean
    # fusion, key 0: 145, lowest 94.
    # 40k steps is a CI budget: the longer runs are in benchmarks/distributed.py
    late = sorted(r["late_mean"])
    assert len(late) == 8 and np.mean(late) > 65 and late[1] > 40, r


@pytest.mark.slow
def test_ppo_learns_cartpole_on_4_devices():
    r = run_worker(["learn_ppo", "149504"], timeout=900)  # 292 whole iterations
    # 8 envs (2 per device) × 64 steps, 4 minibatches of 128 split over the devices, mean fusion;
    # random play scores about 22; measured 253 and 314 (jax 0.10.2, 4 CPU devices), about 50 s with compile
    assert r["env_steps"] == 149504
    assert np.mean(r["final_return"]) > 200 and min(r["final_return"]) > 150, r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_available() -> bool:
    from jax._src.lib import xla_client

    return hasattr(xla_client._xla, "make_gloo_tcp_collectives")


@pytest.mark.skipif(not gloo_available(), reason="this jax has no CPU collectives option (gloo)")
def test_two_processes_on_one_mesh_train_to_the_same_parameters():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), "multihost", str(port), str(i)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
            assert p.returncode == 0 and lines, f"process failed ({p.returncode}):\n{err[-4000:]}"
            results.append(json.loads(lines[-1][len("RESULT "):]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert sorted(r["process_id"] for r in results) == [0, 1]
    assert all(r["processes"] == 2 and r["devices"] == 4 and r["local_devices"] == 2 for r in results)
    assert results[0]["env_steps"] == results[1]["env_steps"] == 2048
    assert results[0]["abs_sum"] > 0
    assert results[0]["checksum"] == results[1]["checksum"], results
    assert results[0]["final_return"] == results[1]["final_return"]
