"""The training doctor (rmtjax.doctor): each detector on constructed signal sequences, and real runs
that provoke a finding (a DQN at Huber δ=1 on CartPole diverges, ε pinned at 0 on MountainCar, two
seeds at different learning rates) or none (healthy short preset runs); `rmtjax doctor RUN`."""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rmtjax
from rmtjax import doctor
from rmtjax.cli import main
from rmtjax.distributed import AXIS
from rmtjax.protocol import Signals
from tests.helpers import assert_no_doctor_findings

CFG = doctor.DoctorConfig()


def scan(signals: dict, steps: int = 100, seeds: int = 1, cells: int = 1, max_entropy=None, device_return=None,
         cfg=CFG):
    """Run the detectors over a sequence of signals (name -> [T, S] arrays); metrics name -> [T, S]."""
    doc = doctor.Doctor(cfg, steps, max_entropy, seeds, cells)
    T = next(iter(signals.values())).shape[0]
    xs = {k: jnp.asarray(v, jnp.float32) for k, v in signals.items()}

    def body(d, x):
        t, sig = x
        dev = sig.pop("device_return", None)
        return doc.update(d, Signals(**sig), t, dev)

    if device_return is not None:  # [T, D, S]: each device's own return, the detectors under a named axis
        def per_device(dr):
            return jax.lax.scan(body, doc.init(seeds), (jnp.arange(T), {**xs, "device_return": dr}))[1]

        metrics = jax.vmap(per_device, in_axes=1, axis_name=AXIS)(jnp.asarray(device_return, jnp.float32))
        return {k: np.asarray(v[0]) for k, v in metrics.items()}
    _, metrics = jax.lax.scan(body, doc.init(seeds), (jnp.arange(T), xs))
    return {k: np.asarray(v) for k, v in metrics.items()}


def sig(T, seeds=1, ret=20.0, **extra):
    """Signals for T iterations: an episode every iteration with return `ret` (scalar, [T] or [T, S])."""
    full = lambda x: np.broadcast_to(np.asarray(x, np.float32).reshape((-1, 1) if np.ndim(x) == 1 else np.shape(x)),
                                     (T, seeds)).copy()  # noqa: E731
    out = {"episode_return": full(ret), "episodes": full(1.0)}
    out.update({k: full(v) for k, v in extra.items()})
    return out


def first(flag):
    hit = np.flatnonzero(np.asarray(flag) > 0.5)
    return int(hit[0]) if hit.size else None


# -- the detectors on constructed sequences --------------------------------------------------------
def test_a_steadily_improving_run_has_no_findings():
    T = 600
    ret = np.linspace(20, 400, T)
    m = scan(sig(T, seeds=2, ret=ret, value_loss=np.linspace(5, 2, T), q_magnitude=np.linspace(1, 90, T),
                 skipped_frac=0.0, entropy=np.linspace(0.69, 0.05, T), explore=np.linspace(1, 0.02, T)),
             seeds=2, max_entropy=np.log(2))
    for k in doctor.KINDS:
        if doctor.PREFIX + k in m:
            assert not m[doctor.PREFIX + k].any(), k
    assert {doctor.PREFIX + k for k in ("early_collapse", "value_divergence", "entropy_collapse", "exploration_stuck",
                                        "seed_disagreement")} <= set(m)


def test_early_collapse_fires_inside_the_early_window_only():
    T = 400  # 100 env steps an iteration: the early window is 500 iterations
    ret = np.where(np.arange(T) < 100, 22.0, 9.5)
    m = scan(sig(T, ret=ret))
    hit = first(m["doctor_early_collapse"])
    assert hit is not None and 100 < hit < 200
    assert m["doctor_early_collapse"][-1, 0] == 1.0  # held while the return stays down
    np.testing.assert_allclose(m["doctor_return_first"][-1, 0], 22.0)
    late = scan(sig(T, ret=ret), cfg=doctor.DoctorConfig(early_steps=5_000))  # the fall comes after the window
    assert not late["doctor_early_collapse"].any()


def test_value_divergence_from_q_growth_skipped_updates_or_the_value_loss_trend():
    T = 300
    q = np.where(np.arange(T) < 100, 20.0, 20.0 * 1.05 ** np.maximum(np.arange(T) - 100, 0))
    m = scan(sig(T, value_loss=1.0, q_magnitude=q))
    hit = first(m["doctor_value_divergence"])
    assert hit is not None and m["doctor_q"][hit, 0] > CFG.q_ratio * 20.0 > m["doctor_q"][hit - 1, 0] * 0.9
    skipped = scan(sig(T, skipped_frac=np.where(np.arange(T) < 150, 0.0, 1.0)))
    assert 160 <= first(skipped["doctor_value_divergence"]) <= 166  # an EMA at 0.05 an iteration passes 0.5 after 14
    loss = scan(sig(T, value_loss=np.where(np.arange(T) < 100, 2.0, 2.0 * 1.1 ** np.maximum(np.arange(T) - 100, 0))))
    hit = first(loss["doctor_value_divergence"])
    assert hit is not None and loss["doctor_value"][hit, 0] > CFG.value_growth * 2.0 * 0.99
    # a loss that grows as the returns do is no finding: PPO's critic on CartPole-v1 (the README's
    # first command) went from a low of 0.5 to 116 as the return rose from 20 to 355
    rising = np.linspace(20, 400, T)
    grows = scan(sig(T, ret=rising, value_loss=np.where(np.arange(T) < 100, 0.5, np.linspace(0.5, 500, T))))
    assert grows["doctor_value"][-1, 0] > CFG.value_growth * 1.0 and not grows["doctor_value_divergence"].any()
    # ... until it is beyond the returns' own scale squared
    beyond = scan(sig(T, ret=rising, value_loss=np.where(np.arange(T) < 100, 0.5, 1e6)))
    hit = first(beyond["doctor_value_divergence"])
    assert hit is not None and beyond["doctor_value"][hit, 0] > beyond["doctor_return"][hit, 0] ** 2 > 100.0 ** 2
    # with a Q magnitude reported, the loss trend alone is no finding (SAC's critic loss grows with Q)
    both = scan(sig(T, value_loss=np.where(np.arange(T) < 100, 2.0, 2e4), q_magnitude=20.0))
    assert not both["doctor_value_divergence"].any()


def test_entropy_collapse_needs_no_progress_and_low_exploration():
    T = 300
    ent = np.where(np.arange(T) < 50, 0.69, 0.001)
    m = scan(sig(T, entropy=ent), max_entropy=np.log(2))
    assert first(m["doctor_entropy_collapse"]) is not None
    learned = scan(sig(T, ret=np.linspace(20, 300, T), entropy=ent), max_entropy=np.log(2))
    assert not learned["doctor_entropy_collapse"].any()
    eps = scan(sig(T, entropy=ent, explore=0.05), max_entropy=np.log(2))  # ε-greedy: the greedy part's entropy
    assert not eps["doctor_entropy_collapse"].any()
    assert "doctor_entropy_collapse" not in scan(sig(T, entropy=ent))  # no maximum (continuous): no detector


def test_exploration_stuck_after_the_patience_without_progress():
    T = 400  # patience 20,000 env steps = 200 iterations
    m = scan(sig(T, ret=-200.0, explore=0.0))
    hit = first(m["doctor_exploration_stuck"])
    assert hit is not None and 200 <= hit <= 230
    moving = scan(sig(T, ret=np.linspace(-200, -100, T), explore=0.0))
    assert not moving["doctor_exploration_stuck"].any()
    floor = scan(sig(T, ret=-200.0, explore=0.05))  # ε at 0.05 is not stuck
    assert not floor["doctor_exploration_stuck"].any()


def test_seed_disagreement_within_cells_and_device_disagreement():
    T = 400
    ret = np.stack([np.full(T, 400.0), np.full(T, 20.0)], axis=1)
    m = scan(sig(T, seeds=2, ret=ret), seeds=2)
    hit = first(m["doctor_seed_disagreement"][:, 0])
    assert hit == 199 and m["doctor_seed_disagreement"][-1].all()  # apart from the first iteration, 200 of them
    np.testing.assert_allclose(m["doctor_seed_spread"][-1], 0.95, atol=1e-3)
    # a sweep: two cells of one seed each have no seeds to compare
    assert "doctor_seed_disagreement" not in scan(sig(T, seeds=2, ret=ret), seeds=2, cells=2)
    # two cells of two agreeing seeds, the cells far apart: no finding
    ret4 = np.stack([np.full(T, 400.0), np.full(T, 390.0), np.full(T, 20.0), np.full(T, 21.0)], axis=1)
    assert not scan(sig(T, seeds=4, ret=ret4), seeds=4, cells=2)["doctor_seed_disagreement"].any()
    # devices: each device's own return, the spread across them
    dev = np.broadcast_to(np.array([300.0, 100.0])[None, :, None], (T, 2, 1))
    d = scan(sig(T, ret=200.0), device_return=dev)
    assert first(d["doctor_device_disagreement"]) is not None and d["doctor_device_spread"][-1, 0] > 0.6
    same = scan(sig(T, ret=200.0), device_return=np.full((T, 2, 1), 200.0))
    assert not same["doctor_device_disagreement"].any()


def test_a_fix_the_config_already_has_is_not_suggested():
    two = rmtjax.make_config("ppo", "CartPole-v1", {"train.num_seeds": 2})
    eight = rmtjax.make_config("ppo", "CartPole-v1", {"train.num_seeds": 8})
    assert any(f.startswith("train.num_seeds: 5 or more") and f.endswith("(now 2)")
               for f in doctor.fixes("seed_disagreement", two))
    assert [f for f in doctor.fixes("seed_disagreement", eight) if "num_seeds" in f] == []
    assert any(f.startswith("agent.lr:") for f in doctor.fixes("seed_disagreement", eight))
    assert [f for f in doctor.fixes("early_collapse", rmtjax.make_config("ppo", "CartPole-v1", {"train.num_seeds": 3}))
            if "num_seeds" in f] == []
    assert "train.num_seeds: 3 or more (now 1)" in doctor.fixes("early_collapse", rmtjax.make_config("ppo", "CartPole-v1"))
    assert "train.num_seeds: 5 or more, and report an interval" in doctor.fixes("seed_disagreement")  # no config


def test_exploration_fixes_only_ask_for_more_exploration_than_the_config_has():
    # "too little initial exploration" never suggests an ε start below the one in force
    full = doctor.fixes("early_collapse", rmtjax.make_config("rmt", "Acrobot-v1"))  # eps_start 1.0
    assert [f for f in full if f.startswith("agent.eps_start")] == []
    low = doctor.fixes("early_collapse", rmtjax.make_config("rmt", "Acrobot-v1", {"agent.eps_start": 0.5}))
    assert "agent.eps_start: 0.9 (an initial exploration rate of 0.8-0.99) (now 0.5)" in low
    # exploration stuck: ε already ending at 0.1 and starting at 1.0 leaves the longer decay to suggest
    stuck = doctor.fixes("exploration_stuck", rmtjax.make_config("dqn", "CartPole-v1", {"agent.eps_end": 0.1}))
    assert [f.split(":")[0] for f in stuck] == ["agent.eps_decay_frac"]
    pinned = doctor.fixes("exploration_stuck", rmtjax.make_config("dqn", "CartPole-v1",
                                                                  {"agent.eps_start": 0.0, "agent.eps_end": 0.0}))
    assert pinned[:2] == ["agent.eps_end: 0.05 (now 0.0)", "agent.eps_start: 1.0 (now 0.0)"]


# -- real runs ---------------------------------------------------------------------------------------
def train(tmp_path_factory, name, algo, env, overrides, hparams=None):
    path = tmp_path_factory.mktemp("doctor") / name
    cfg = rmtjax.make_config(algo, env, {"train.progress": False, **overrides})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = rmtjax.train(cfg, jax.random.key(0), hparams=hparams, run_dir=path)
    said = [str(w.message) for w in caught if issubclass(w.category, doctor.DoctorWarning)]
    return result, path, said


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    # rmtjax/agents/dqn.py: Huber δ=1 at the CleanRL settings diverges on CartPole-v1
    return train(tmp_path_factory, "huber", "dqn", "CartPole-v1",
                 {"train.total_steps": 60_000, "agent.loss": "huber", "agent.huber_delta": 1.0, "train.num_chunks": 2})


def kinds(path):
    return {(r["finding"], r["seed"]) for r in map(json.loads, (path / "doctor.jsonl").read_text().splitlines())}


def test_a_dqn_at_huber_delta_1_diverges_and_the_doctor_says_so(diverged, capsys):
    result, path, said = diverged
    assert ("value_divergence", 0) in kinds(path) and ("early_collapse", 0) in kinds(path)
    assert result.metrics["doctor_value_divergence"][0, -1] == 1.0
    assert any(m.startswith("doctor: value divergence in seed 0") and "agent.max_grad_norm: 0.5 (now 0.0)" in m
               and "agent.loss: mse" in m for m in said)
    summary = json.loads((path / "summary.json").read_text())
    assert any("value divergence" in w for w in summary["warnings"])
    assert main(["doctor", str(path), "--plot", str(path / "doctor.png")]) == 0
    out = capsys.readouterr().out
    assert "value divergence in seed 0 at iteration" in out and "early collapse in seed 0" in out
    assert (path / "doctor.png").stat().st_size > 10_000
    assert main(["doctor", str(path / "metrics.csv")]) == 0  # the CSV says the same
    assert capsys.readouterr().out.splitlines()[:2] == out.splitlines()[:2]


def test_epsilon_pinned_at_zero_on_a_sparse_env_is_stuck(tmp_path_factory, capsys):
    result, path, said = train(tmp_path_factory, "eps0", "dqn", "MountainCar-v0",
                               {"train.total_steps": 30_000, "agent.eps_start": 0.0, "agent.eps_end": 0.0,
                                "agent.learning_starts": 1000, "train.num_chunks": 1})
    assert ("exploration_stuck", 0) in kinds(path)
    assert any(m.startswith("doctor: exploration stuck") and "agent.eps_end: 0.05 (now 0.0)" in m for m in said)
    assert main(["doctor", str(path / "metrics.jsonl")]) == 0
    assert "exploration stuck in seed 0" in capsys.readouterr().out


def test_two_seeds_at_different_learning_rates_disagree(tmp_path_factory, capsys):
    result, path, said = train(tmp_path_factory, "lrs", "ppo", "CartPole-v1",
                               {"train.total_steps": 40_000, "train.num_seeds": 2, "train.num_chunks": 1},
                               hparams={"lr": np.array([2.5e-3, 1e-7], np.float32)})
    assert {("seed_disagreement", 0), ("seed_disagreement", 1)} <= kinds(path)
    assert result.metrics["doctor_seed_spread"][0, -1] > 0.5
    assert main(["doctor", str(path)]) == 0
    assert "seed disagreement in seed 0" in capsys.readouterr().out


# PPO's, SAC's and RMT's healthy preset runs are their learning tests (tests/agents/), which end
# with the same check
@pytest.mark.parametrize("algo,env,steps", [("pqn", "CartPole-v1", 20_000), ("dqn", "CartPole-v1", 40_000)])
def test_healthy_short_preset_runs_have_no_findings(tmp_path_factory, capsys, algo, env, steps):
    result, path, said = train(tmp_path_factory, algo, algo, env, {"train.total_steps": steps, "train.num_seeds": 2,
                                                                   "train.num_chunks": 1})
    assert said == []
    assert_no_doctor_findings(result, capsys)


def test_the_doctor_off_leaves_the_run_as_it_was():
    # test_meta.py's small PPO run in one chunk: the run with the doctor off is the program it compiles
    small = {"train.total_steps": 2048, "train.num_seeds": 2, "train.progress": False, "agent.rollout_len": 32,
             "train.num_chunks": 1}
    on = rmtjax.train(rmtjax.make_config("ppo", "CartPole-v1", small), jax.random.key(1))
    off_cfg = rmtjax.make_config("ppo", "CartPole-v1", {**small, "doctor.enabled": False})
    assert "doctor" in off_cfg.to_dict() and "doctor" not in rmtjax.make_config("ppo").to_dict()
    off = rmtjax.train(off_cfg, jax.random.key(1))
    assert not any(k.startswith("doctor_") for k in off.metrics)
    assert set(on.metrics) - set(off.metrics) == {k for k in on.metrics if k.startswith("doctor_")}
    for k in off.metrics:
        np.testing.assert_array_equal(on.metrics[k], off.metrics[k], err_msg=k)
    assert isinstance(on.state, doctor.DoctorTrainState) and not isinstance(off.state, doctor.DoctorTrainState)
    for a, b in zip(jax.tree.leaves(on.state.params), jax.tree.leaves(off.state.params)):
        np.testing.assert_array_equal(a, b)


def test_doctor_config_fields_are_checked_and_reading_other_files_is_refused(tmp_path, capsys):
    with pytest.raises(rmtjax.ConfigError, match="doctor.collapse_drop"):
        rmtjax.make_config("ppo", "CartPole-v1", {"doctor.collapse_drop": 0})
    with pytest.raises(rmtjax.ConfigError, match="unknown key doctor.nope"):
        rmtjax.make_config("ppo", "CartPole-v1", {"doctor.nope": 1})
    (tmp_path / "metrics.txt").write_text("x")
    assert main(["doctor", str(tmp_path / "metrics.txt")]) == 2
    assert "expected a run directory, metrics.jsonl or metrics.csv" in capsys.readouterr().err
    assert main(["doctor", str(tmp_path)]) == 2
    assert main(["config", "doctor"]) == 0
    assert "q_ratio: float = 10.0" in capsys.readouterr().out


def test_the_doctor_state_reads_and_writes_through_to_the_inner_state():
    from flax import struct

    @struct.dataclass
    class Inner:
        params: jax.Array
        replay: jax.Array

    s = doctor.DoctorTrainState(Inner(jnp.zeros(2), jnp.ones(3)), doctor.DoctorState.zeros())
    assert s.replay.shape == (3,) and s.params.shape == (2,)
    t = s.replace(replay=jnp.zeros(3))  # as the hierarchical replay's between-chunks sync does
    assert isinstance(t, doctor.DoctorTrainState) and float(t.inner.replay.sum()) == 0.0
    assert t.doctor is s.doctor and float(s.inner.replay.sum()) == 3.0
    with pytest.raises(AttributeError):
        s.nothing_here
