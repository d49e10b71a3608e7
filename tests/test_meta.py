"""The meta-controller and curriculum: config checks, bounded moves, each mode's direction, PBT,
curriculum stages, mode `off` unchanged, tiny end-to-end runs and resume."""

import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from hypothesis import given, settings
from hypothesis import strategies as st

import rmtjax
from rmtjax.agents import build_agent
from rmtjax.config import Config, ConfigError
from rmtjax.meta import core
from rmtjax.meta.config import CurriculumConfig, MetaConfig
from rmtjax.protocol import Learner, hparam


# -- small stand-ins for an agent's hparams and state -----------------------------------------
@struct.dataclass
class HP:  # like RMT's: lr, γ and the ε schedule
    lr: jax.Array = hparam("lr")
    gamma: jax.Array = hparam("gamma")
    eps_start: jax.Array = hparam("eps")
    eps_end: jax.Array = hparam("eps")
    tau: jax.Array = hparam()


@struct.dataclass
class PPOLikeHP:  # no ε
    lr: jax.Array = hparam("lr")
    gamma: jax.Array = hparam("gamma")


@struct.dataclass
class SACLikeHP:  # two learning rates
    actor_lr: jax.Array = hparam("lr")
    critic_lr: jax.Array = hparam("lr")
    gamma: jax.Array = hparam("gamma")


def hp(lr=5e-4, gamma=0.95, eps_start=1.0, eps_end=0.05, tau=0.005):
    return HP(*(jnp.float32(x) for x in (lr, gamma, eps_start, eps_end, tau)))


def sig(ret=0.0, loss=1.0, entropy=0.5, explore=0.5, episodes=1.0):
    f = jnp.float32
    return core.Signals(episode_return=f(ret), episodes=f(episodes), value_loss=f(loss), entropy=f(entropy),
                        explore=f(explore))


def run(cfg, signals, hparams, max_entropy=None):
    """Feed a sequence of signals through the per-seed update; the hparams after each."""
    update = jax.jit(core.make_update(cfg, max_entropy))
    m = core.init_state(jax.random.key(0), cfg.window)
    out = []
    for s in signals:
        m, hparams = update(m, s, hparams)
        out.append(hparams)
    return m, out


def small(algo="ppo", **overrides):
    base = {"train.total_steps": 2048, "train.num_seeds": 2, "train.progress": False}
    if algo == "ppo":
        base["agent.rollout_len"] = 32
    else:
        base.update({"train.total_steps": 1600, "agent.learning_starts": 400, "agent.buffer_size": 2000})
    return rmtjax.make_config(algo, "CartPole-v1", {**base, **overrides})


# -- config --------------------------------------------------------------------------------------
def test_meta_and_curriculum_round_trip_through_yaml_dict_and_override(tmp_path):
    cfg = small(**{"meta.mode": "bandit", "meta.arms": [{"lr": 1e-4}, {"lr": 3e-4, "gamma": 0.95}],
                   "curriculum.stages": [{"threshold": 50, "hparams": {"ent_coef": 0.0}},
                                         {"threshold": 100, "env": {"max_steps_in_episode": 300}}]})
    assert cfg.meta.arms == ({"lr": 1e-4}, {"lr": 3e-4, "gamma": 0.95})
    assert cfg.curriculum.stages[1] == {"threshold": 100.0, "hparams": {}, "env": {"max_steps_in_episode": 300}}
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert rmtjax.load_config(path) == cfg
    assert Config.from_dict(cfg.to_dict()) == cfg
    assert cfg.override({"meta.lr_max": 5e-4}).meta.lr_max == 5e-4
    assert small().meta.mode == "off" and not small().curriculum.stages


@pytest.mark.parametrize("overrides, message", [
    ({"meta.mode": "ucb"}, "meta.mode: 'ucb' is not one of"),
    ({"meta.lr_min": 1e-2}, "meta.lr_min: 0.01 is above meta.lr_max"),
    ({"meta.gamma_max": 1.5}, r"meta.gamma_max: 1.5 is out of range; allowed \[0.0, 1.0\]"),
    ({"meta.mode": "rules", "agent.lr": 3e-3}, r"agent.lr: 0.003 lies outside the meta-controller's bounds"),
    ({"meta.mode": "bandit", "meta.arms": [{"lrr": 1e-4}]}, "meta.arms\\[0\\].lrr: not a hyperparameter of ppo"),
    ({"meta.mode": "bandit", "meta.arms": [{"eps": 0.1}]}, "meta.arms\\[0\\].eps: ppo has no eps hyperparameter"),
    ({"meta.mode": "bandit", "meta.arms": [{"lr": 0.1}]}, "meta.arms\\[0\\].lr: 0.1 lies outside"),
    ({"meta.mode": "pbt", "train.num_seeds": 1}, "pbt .* needs train.num_seeds ≥ 2"),
    ({"meta.slow_rate": 0.5}, "meta.slow_rate: 0.5 must be below meta.fast_rate"),
    ({"meta.colour": 1}, "unknown key meta.colour"),
    ({"curriculum.stages": [{"threshold": 10, "hparams": {"lr": 1e-4}}, {"threshold": 5, "hparams": {"lr": 1e-5}}]},
     r"curriculum.stages\[1\].threshold: 5.0 is below the previous"),
    ({"curriculum.stages": [{"threshold": 10}]}, r"curriculum.stages\[0\]: a stage sets hparams or env"),
    ({"curriculum.stages": [{"hparams": {"lr": 1e-4}}]}, r"curriculum.stages\[0\]: missing threshold"),
    ({"curriculum.stages": [{"threshold": 1, "hparams": {"gamma": 2.0}}]},
     r"curriculum.stages\[0\].hparams.gamma: agent.gamma: 2.0 is out of range"),
    ({"curriculum.stages": [{"threshold": 1, "env": {"gravityy": 2.0}}]},
     r"curriculum.stages\[0\].env.gravityy: CartPole-v1 has no parameter 'gravityy'"),
])
def test_bad_meta_and_curriculum_settings_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        small(**overrides)


def test_curriculum_env_parameters_of_a_non_gymnax_env_are_refused():
    from rmtjax.meta.config import check_meta

    cfg = small(**{"curriculum.stages": [{"threshold": 1, "env": {"gravity": 2.0}}]})
    fake = type("C", (), {"meta": cfg.meta, "curriculum": cfg.curriculum, "algo": "ppo", "agent": cfg.agent,
                          "train": cfg.train, "env": type("E", (), {"id": "brax:ant"})()})()
    with pytest.raises(ConfigError, match="supported for gymnax environments only"):
        check_meta(fake)


# -- bounds: never left ----------------------------------------------------------------------------
signal_seq = st.lists(st.tuples(st.floats(-1e4, 1e4), st.floats(0.0, 1e6), st.floats(-5.0, 5.0),
                                st.floats(0.0, 1.0)), min_size=1, max_size=60)


@settings(max_examples=25, deadline=None)
@given(seq=signal_seq, mode=st.sampled_from(["rules", "bandit"]), interval=st.integers(1, 4),
       lr_factor=st.floats(0.01, 0.99), eps_factor=st.floats(0.01, 0.99), gamma_factor=st.floats(0.01, 0.99))
def test_moves_never_leave_the_bounds(seq, mode, interval, lr_factor, eps_factor, gamma_factor):
    cfg = MetaConfig(mode=mode, interval=interval, warmup=0, lr_factor=lr_factor, eps_factor=eps_factor,
                     gamma_factor=gamma_factor, loss_tolerance=0.0 if lr_factor < 0.5 else 10.0,
                     arms=({"lr": 1e-5, "gamma": 0.9}, {"lr": 1e-3, "gamma": 0.99, "eps": 0.01}), window=3)
    _, hps = run(cfg, [sig(*s) for s in seq], hp(gamma=0.97))
    for h in hps:
        assert 1e-5 * (1 - 1e-6) <= float(h.lr) <= 1e-3 * (1 + 1e-6)
        assert np.float32(0.9) <= float(h.gamma) <= np.float32(0.99)
        for e in (h.eps_start, h.eps_end):
            assert np.float32(0.01) <= float(e) <= 1.0


@settings(max_examples=15, deadline=None)
@given(scores=st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=8), seed=st.integers(0, 2**16),
       perturb=st.floats(1.01, 9.0))
def test_pbt_perturbations_never_leave_the_bounds(scores, seed, perturb):
    cfg = MetaConfig(mode="pbt", warmup=1, interval=1, perturb=perturb, pbt_quantile=0.5)
    n = len(scores)
    state = FakeState(params={"w": jnp.arange(n, dtype=jnp.float32)},
                      opt_state={"mu": jnp.zeros(n)}, hparams=jax.vmap(lambda _: hp(lr=1e-3, gamma=0.99,
                                                                                    eps_start=1.0, eps_end=0.01))(jnp.arange(n)))
    m = batched_meta(n, seed, scores)
    for _ in range(3):
        state, m, _ = pbt(state, m, cfg)
        m = m.replace(seen=m.seen + 1)
        h = state.hparams
        assert np.all((np.asarray(h.lr) >= 1e-5 * (1 - 1e-6)) & (np.asarray(h.lr) <= 1e-3 * (1 + 1e-6)))
        assert np.all((np.asarray(h.gamma) >= np.float32(0.9)) & (np.asarray(h.gamma) <= np.float32(0.99)))
        assert np.all((np.asarray(h.eps_end) >= np.float32(0.01)) & (np.asarray(h.eps_start) <= 1.0))


# -- rules -----------------------------------------------------------------------------------------
RULES = MetaConfig(mode="rules", warmup=5, interval=5)


def test_rules_cut_the_learning_rate_when_the_value_loss_rises_and_the_return_falls():
    rising = [sig(ret=100.0 * 0.8**t, loss=np.exp(0.2 * t), entropy=0.5, explore=0.0) for t in range(30)]
    _, hps = run(RULES, rising, hp())
    lrs = np.array([float(h.lr) for h in hps])
    assert lrs[-1] < lrs[0] * 0.5
    assert np.all(np.diff(lrs) <= 0)
    cut = np.flatnonzero(np.diff(lrs) < 0) + 1
    np.testing.assert_array_equal(cut, [4, 9, 14, 19, 24, 29])  # a decision every 5 iterations after warmup
    np.testing.assert_allclose(lrs[4], 5e-4 * 0.7, rtol=1e-6)
    assert float(hps[-1].gamma) == np.float32(0.95)  # a rising loss has not converged: γ stays


def test_rules_keep_the_learning_rate_while_the_return_improves_or_holds():
    # values propagating: the loss rises as the return climbs (SAC on Pendulum does this)
    climbing = [sig(ret=-1000.0 + 40.0 * t, loss=np.exp(0.2 * t), explore=0.0) for t in range(30)]
    _, hps = run(RULES, climbing, hp())
    assert float(hps[-1].lr) == np.float32(5e-4)
    flat = [sig(ret=100.0, loss=np.exp(0.2 * t), explore=0.0) for t in range(30)]
    _, hps = run(RULES, flat, hp())
    assert float(hps[-1].lr) == np.float32(5e-4)
    # the return reads 0 until the first episode ends: the first real return is not a fall
    first = [sig(ret=0.0 if t < 12 else -1000.0, loss=np.exp(0.2 * t), explore=0.0, episodes=float(t >= 12))
             for t in range(30)]
    m, hps = run(RULES, first, hp())
    assert float(hps[-1].lr) == np.float32(5e-4)
    assert float(m.return_slow) == pytest.approx(-1000.0) and float(m.episodes_seen) == 18
    # the same sequence without that guard would read as a falling return and cut the lr
    _, hps = run(RULES, [s.replace(episodes=jnp.float32(1.0)) for s in first], hp())
    assert float(hps[-1].lr) < 5e-4


def test_rules_raise_gamma_as_the_value_loss_converges():
    flat = [sig(loss=1.0, explore=0.0) for _ in range(20)]
    _, hps = run(RULES, flat, hp(gamma=0.95))
    gammas = np.array([float(h.gamma) for h in hps])
    np.testing.assert_allclose(gammas[4], 1 - 0.05 * 0.9, rtol=1e-6)
    assert gammas[-1] > gammas[4] > 0.95 and gammas.max() <= np.float32(0.99)
    assert float(hps[-1].lr) == np.float32(5e-4)


def test_rules_decay_epsilon_as_the_policy_matures_and_not_while_it_changes():
    mature = [sig(ret=100.0, loss=1.0, entropy=0.3, explore=0.4) for _ in range(20)]
    _, hps = run(RULES, mature, hp(), max_entropy=np.log(2))
    assert float(hps[-1].eps_start) == pytest.approx(0.9**4, rel=1e-5)
    assert float(hps[-1].eps_end) == pytest.approx(0.05 * 0.9**4, rel=1e-5)
    # the entropy still falling fast: not mature, ε stays
    changing = [sig(ret=100.0, loss=1.0, entropy=0.69 * 0.8**t, explore=0.4) for t in range(20)]
    _, hps = run(RULES, changing, hp(), max_entropy=np.log(2))
    assert float(hps[-1].eps_start) == 1.0
    # exploring less than the target already: ε stays
    _, hps = run(RULES, [sig(ret=100.0, entropy=0.3, explore=0.01) for _ in range(20)], hp(), max_entropy=np.log(2))
    assert float(hps[-1].eps_start) == 1.0


def test_moves_skip_hyperparameters_an_agent_lacks():
    rising = [sig(ret=100.0 * 0.8**t, loss=np.exp(0.2 * t), entropy=0.3, explore=0.5) for t in range(20)]
    _, hps = run(RULES, rising, PPOLikeHP(jnp.float32(5e-4), jnp.float32(0.95)))
    assert float(hps[-1].lr) < 5e-4 and isinstance(hps[-1], PPOLikeHP)
    _, hps = run(RULES, rising, SACLikeHP(jnp.float32(1e-3), jnp.float32(3e-4), jnp.float32(0.95)))
    assert float(hps[-1].actor_lr) < 1e-3 and float(hps[-1].critic_lr) < 3e-4  # the lr group: both rates


# -- bandit -----------------------------------------------------------------------------------------
def test_bandit_plays_the_arm_that_improves_the_return_most():
    cfg = MetaConfig(mode="bandit", warmup=1, interval=1, fast_rate=1.0, slow_rate=0.5, window=30, ucb_c=0.5,
                     arms=({"lr": 1e-5}, {"lr": 3e-4}, {"lr": 1e-3}))
    update = jax.jit(core.make_update(cfg))
    m = core.init_state(jax.random.key(0), cfg.window)
    h, ret, plays = core.apply_arm(hp(), m.arm, cfg), 0.0, []
    for _ in range(60):
        ret += {1e-5: 0.0, 3e-4: 10.0, 1e-3: 1.0}[round(float(h.lr), 6)]  # the return grows fastest with lr 3e-4
        m, h = update(m, sig(ret=ret), h)
        plays.append(int(m.arm))
    counts = np.bincount(plays, minlength=3)
    assert counts[1] > counts[0] + counts[2], counts
    assert plays[:2] == [1, 2]  # every arm is tried (arm 0 first) before UCB ranks them
    assert int(m.plays) == 60


# -- PBT ---------------------------------------------------------------------------------------------
@struct.dataclass
class FakeState:
    params: dict
    opt_state: dict
    hparams: HP


def pbt(state: FakeState, m, cfg):
    """A PBT round on the learner of a stand-in state (no env parameters)."""
    learner, hps, _, m, source = core.pbt_round(Learner(state.params, state.opt_state), state.hparams, None, m, cfg)
    return state.replace(params=learner.params, opt_state=learner.opt_state, hparams=hps), m, source


def batched_meta(n, seed, scores):
    m = jax.vmap(lambda k: core.init_state(k, 1))(jax.random.split(jax.random.key(seed), n))
    return m.replace(seen=jnp.full((n,), 10, jnp.int32), return_fast=jnp.asarray(scores, jnp.float32))


def test_pbt_replaces_the_worst_seeds_by_copies_of_the_best_and_perturbs_them():
    cfg = MetaConfig(mode="pbt", warmup=10, interval=5, perturb=1.25, pbt_quantile=0.25)
    n = 8
    scores = [5.0, -3.0, 7.0, 1.0, 9.0, 2.0, -8.0, 4.0]  # worst: seeds 6, 1; best: 2, 4
    hps = HP(lr=jnp.full(n, 2e-4), gamma=jnp.full(n, 0.95), eps_start=jnp.full(n, 0.5), eps_end=jnp.full(n, 0.05),
             tau=jnp.arange(n, dtype=jnp.float32))
    state = FakeState(params={"w": jnp.arange(n, dtype=jnp.float32)[:, None] * jnp.ones((n, 3))},
                      opt_state={"mu": 10.0 * jnp.arange(n, dtype=jnp.float32)}, hparams=hps)
    new, m, source = pbt(state, batched_meta(n, 0, scores), cfg)
    source = np.asarray(source)
    assert set(np.flatnonzero(source >= 0)) == {1, 6}
    for w in (1, 6):
        s = source[w]
        assert s in (2, 4)
        np.testing.assert_array_equal(new.params["w"][w], state.params["w"][s])
        assert float(new.opt_state["mu"][w]) == 10.0 * s
        assert float(new.hparams.tau[w]) == s  # unbounded hparams are copied as they are
        assert float(m.return_fast[w]) == scores[s]
        assert float(new.hparams.lr[w]) / 2e-4 in (pytest.approx(1.25), pytest.approx(0.8))
        assert float(new.hparams.eps_start[w]) / 0.5 in (pytest.approx(1.25), pytest.approx(0.8))
        assert (1 - float(new.hparams.gamma[w])) / 0.05 in (pytest.approx(0.8), pytest.approx(1.25))
    for keep in set(range(n)) - {1, 6}:
        np.testing.assert_array_equal(new.params["w"][keep], state.params["w"][keep])
        assert float(new.hparams.lr[keep]) == np.float32(2e-4)
    # not a decision iteration: nothing moves
    new, _, source = pbt(state, batched_meta(n, 0, scores).replace(seen=jnp.full((n,), 11)), cfg)
    assert np.all(np.asarray(source) == -1)
    np.testing.assert_array_equal(new.params["w"], state.params["w"])


# -- curriculum ---------------------------------------------------------------------------------------
def test_curriculum_stages_advance_at_their_thresholds():
    @struct.dataclass
    class EnvParams:
        gravity: jax.Array
        max_steps: jax.Array

    stages = ({"threshold": 10.0, "hparams": {"lr": 1e-4}, "env": {}},
              {"threshold": 20.0, "hparams": {"gamma": 0.99}, "env": {"gravity": 12.0, "max_steps": 300}})
    fn = jax.jit(lambda m, v, h, e: core.curriculum_update(m, v, h, e, stages, 2, None))
    m, h, e = core.init_state(jax.random.key(0), 1), hp(), EnvParams(jnp.float32(9.8), jnp.int32(200))
    values = [0, 12, 5, 11, 11, 25, 25, 25, 30, 30]
    got = []
    for v in values:
        m, h, e = fn(m, jnp.float32(v), h, e)
        got.append((int(m.stage), float(h.lr), float(h.gamma), float(e.gravity), int(e.max_steps)))
    stages_seen = [g[0] for g in got]
    # patience 2: 12 alone does not count (5 breaks the run); 11, 11 enters stage 1; 25, 25 enters stage 2
    assert stages_seen == [0, 0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert got[4][1:] == (pytest.approx(1e-4), pytest.approx(0.95), pytest.approx(9.8), 200)
    assert got[6][1:] == (pytest.approx(1e-4), pytest.approx(0.99), pytest.approx(12.0), 300)
    assert e.max_steps.dtype == jnp.int32


# -- in the driver --------------------------------------------------------------------------------------
def test_mode_off_runs_the_agents_own_step_bit_for_bit():
    from rmtjax.driver import INIT_COMPILER_OPTIONS, _masked_chunk, chunk_compiler_options

    cfg = small(**{"train.num_chunks": 1, "doctor.enabled": False})  # the doctor's layer off too
    result = rmtjax.train(cfg, jax.random.key(1))
    agent = build_agent(cfg)
    n = agent.num_iterations
    # the driver compiles init at its own options (no LLVM passes), whose floats may differ in the last bit
    init = jax.jit(jax.vmap(agent.init), compiler_options=INIT_COMPILER_OPTIONS)
    state = init(jax.random.split(jax.random.key(1), 2))
    # and the chunk at its own (LLVM level 2 on the CPU), which may round differently from XLA's defaults
    chunk = jax.jit(_masked_chunk(jax.vmap(agent.step, in_axes=(0, None)), n)).lower(
        state, np.int32(0), np.int32(n)).compile(chunk_compiler_options())
    state, packed = chunk(state, np.int32(0), np.int32(n))
    metrics = packed.unpack()
    assert type(result.state) is type(state)  # no meta state beside it
    assert set(result.metrics) == set(metrics)  # no meta metrics
    for k, v in metrics.items():
        np.testing.assert_array_equal(result.metrics[k], np.asarray(v).T, err_msg=k)
    for a, b in zip(jax.tree.leaves(result.state.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["rules", "bandit", "pbt"])
def test_each_mode_trains_end_to_end_and_logs_hparams_after_its_moves(mode):
    cfg = small(**{"meta.mode": mode, "meta.warmup": 2, "meta.interval": 2, "train.num_seeds": 4,
                   "meta.arms": [{"lr": 1e-4}, {"lr": 1e-3, "gamma": 0.97}],
                   "curriculum.stages": [{"threshold": 12, "hparams": {"ent_coef": 0.0}}]})
    result = rmtjax.train(cfg, jax.random.key(0))
    n_iter = 2048 // (4 * 32)
    for name in ("lr", "gamma", "ent_coef", "curriculum_stage", "meta_return_trend", "meta_loss_trend"):
        assert result.metrics[name].shape == (4, n_iter), name
    # the last logged hyperparameters are those the state holds after the last move
    np.testing.assert_array_equal(result.metrics["lr"][:, -1], np.asarray(result.state.hparams.lr))
    np.testing.assert_array_equal(result.metrics["gamma"][:, -1], np.asarray(result.state.hparams.gamma))
    lr = result.metrics["lr"]
    assert np.all((lr >= 1e-5 * (1 - 1e-6)) & (lr <= 1e-3 * (1 + 1e-6)))
    stage = result.metrics["curriculum_stage"]
    assert np.all(np.diff(stage, axis=1) >= 0)
    assert np.all(result.metrics["ent_coef"][stage == 1] == 0.0)
    if mode == "bandit":
        assert set(np.unique(lr)) <= {np.float32(1e-4), np.float32(1e-3)}
        assert "meta_arm" in result.metrics
    if mode == "pbt":
        assert (result.metrics["meta_pbt_source"] >= 0).any()
    assert np.all(np.isfinite(result.metrics["meta_loss_trend"]))


def test_rules_on_rmt_move_epsilon_and_report_it():
    cfg = small("rmt", **{"meta.mode": "rules", "meta.warmup": 4, "meta.interval": 4, "meta.explore_target": 0.0,
                          "meta.entropy_tolerance": 1.0, "meta.return_tolerance": 100.0})
    result = rmtjax.train(cfg, jax.random.key(0))
    eps = result.metrics["eps_start"]
    assert eps[:, 0].tolist() == [1.0, 1.0] and np.all(eps[:, -1] < 1.0) and np.all(eps >= np.float32(0.01))
    assert {"meta_explore", "meta_entropy_rate", "nongreedy_frac"} <= set(result.metrics)


def test_a_resumed_meta_run_equals_an_uninterrupted_one(tmp_path):
    cfg = small(**{"meta.mode": "pbt", "meta.warmup": 2, "meta.interval": 3, "train.num_chunks": 4,
                   "train.num_seeds": 4, "curriculum.stages": [{"threshold": 15, "env": {"max_steps_in_episode": 300}}]})
    ref = rmtjax.train(cfg, jax.random.key(5), run_dir=tmp_path / "ref")
    run = tmp_path / "cut"
    shutil.copytree(tmp_path / "ref", run)
    for step in ("12", "16"):  # as if the run had stopped after the checkpoint at iteration 8
        shutil.rmtree(run / "checkpoints" / step)
    (run / "summary.json").unlink()
    resumed = rmtjax.train(None, resume=run)
    for k in ref.metrics:
        np.testing.assert_array_equal(resumed.metrics[k], ref.metrics[k], err_msg=k)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(ref.state)[0], jax.tree.leaves(resumed.state)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
    assert (run / "metrics.jsonl").read_text() == (tmp_path / "ref" / "metrics.jsonl").read_text()
    assert rmtjax.load_run(run).state.meta.stage.shape == (4,)


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
anything = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=3)),
    max_leaves=12)
stage_like = st.lists(st.fixed_dictionaries({"threshold": anything}, optional={
    "hparams": st.dictionaries(st.sampled_from(["lr", "gamma", "eps", "ent_coef", "x"]), anything, max_size=2),
    "env": st.dictionaries(st.sampled_from(["gravity", "max_steps_in_episode", "y"]), anything, max_size=2)}),
    max_size=3)


@settings(max_examples=80, deadline=None)
@given(field=st.sampled_from([("meta", f.name) for f in dataclasses.fields(MetaConfig)]
                              + [("curriculum", f.name) for f in dataclasses.fields(CurriculumConfig)]),
       value=st.one_of(anything, stage_like))
def test_junk_in_the_meta_sections_is_a_config_error_never_a_crash(field, value):
    data = small(**{"meta.mode": "bandit"}).to_dict()
    data[field[0]][field[1]] = value
    try:
        Config.from_dict(data)
    except ConfigError as e:
        assert str(e).strip()
