import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import yaml

import rmtjax
from rmtjax.agents import build_agent
from rmtjax.config import Config, ConfigError
from rmtjax.guard import GuardState, guard
from rmtjax.precision import Precision, PrecisionConfig


# -- the guard and the loss scale, on a toy problem ------------------------------------------
def toy(**cfg):
    """A policy, params w = [1, 1, 1], guarded SGD(0.1) and a loss that is sum(w²) or, on request, not finite."""
    prec = Precision(PrecisionConfig(**cfg))
    params = {"w": jnp.ones(3)}
    tx = guard(optax.sgd(0.1))
    return prec, prec.init(), params, tx.init(params), tx


def step(prec, ps, params, opt, tx, bad=False, bad_only_in_low=False, clip=0.0):
    def loss_fn(p, dtype):
        loss = jnp.sum(p["w"] ** 2)
        overflow = bad and (not bad_only_in_low or dtype != jnp.float32)
        return (loss + jnp.inf if overflow else loss), ()

    out = prec.step(ps, loss_fn, params, opt, tx, clip)
    return out.precision, out.params, out.opt_state, out.stats


def test_loss_scale_doubles_after_the_growth_interval_and_halves_on_overflow():
    prec, ps, params, opt, tx = toy(compute="fp16", loss_scale_init=8.0, loss_scale_growth_interval=3,
                                    loss_scale_min=2.0, loss_scale_max=32.0, escalate_after_consecutive=0)
    scales = []
    for bad in [False] * 9 + [True] * 4 + [False] * 3:
        ps, params, opt, _ = step(prec, ps, params, opt, tx, bad)
        scales.append(float(prec.loss_scale(ps)))
    # ×2 every 3 finite updates up to the max (32); /2 per overflow down to the min (2)
    assert scales == [8, 8, 16, 16, 16, 32, 32, 32, 32, 16, 8, 4, 2, 2, 2, 4]
    assert int(ps.skipped) == 4
    # the gradient is unscaled: 12 accepted SGD steps on sum(w²) shrink w by 0.8 each, whatever the scale
    np.testing.assert_allclose(params["w"], 0.8**12 * np.ones(3), rtol=1e-6)


def test_a_non_finite_update_leaves_params_and_optimiser_state_unchanged():
    prec = Precision(PrecisionConfig())
    params = {"w": jnp.array([1.0, 0.0])}
    tx = guard(optax.adam(0.1))
    opt = tx.init(params)
    ps = prec.init()
    out = prec.step(ps, lambda p, dt: (jnp.sum(p["w"] ** 2), ()), params, opt, tx)
    params, opt, ps = out.params, out.opt_state, out.precision
    assert bool(opt.finite) and int(opt.inner[0].count) == 1
    # a finite loss whose gradient is not finite: d/dw sqrt(w) at w = 0
    before = jax.tree.leaves((params, opt.inner))
    out = prec.step(ps, lambda p, dt: (jnp.sum(jnp.sqrt(jnp.abs(p["w"]))), ()), params, opt, tx)
    assert np.isfinite(float(out.loss)) and not np.isfinite(float(out.stats["grad_norm"]))
    assert float(out.stats["update_skipped"]) == 1.0 and int(out.precision.skipped) == 1
    assert isinstance(out.opt_state, GuardState) and not bool(out.opt_state.finite)
    for a, b in zip(before, jax.tree.leaves((out.params, out.opt_state.inner))):
        np.testing.assert_array_equal(a, b)
    # a non-finite loss with a finite gradient is skipped as well
    out = prec.step(ps, lambda p, dt: (jnp.sum(p["w"] ** 2) + jnp.nan, ()), params, opt, tx)
    assert float(out.stats["update_skipped"]) == 1.0 and np.isnan(float(out.loss))
    for a, b in zip(before, jax.tree.leaves((out.params, out.opt_state.inner))):
        np.testing.assert_array_equal(a, b)


def test_gradients_are_clipped_to_the_threshold_in_force():
    prec, ps, params, opt, tx = toy(clip_decay_to=0.25)
    clip = prec.clip_threshold(0.4, jnp.float32(1.0))  # the end of training: 0.4 × 0.25
    assert float(clip) == pytest.approx(0.1)
    assert float(prec.clip_threshold(0.4, jnp.float32(0.5))) == pytest.approx(0.25)
    ps, new, _, stats = step(prec, ps, params, opt, tx, clip=clip)
    assert float(stats["grad_norm"]) == pytest.approx(2 * np.sqrt(3))  # reported before clipping
    moved = np.linalg.norm(np.asarray(new["w"] - params["w"]))
    assert moved == pytest.approx(0.1 * 0.1, rel=1e-5)  # lr × clip


def test_escalation_after_consecutive_overflows_lasts_for_the_rest_of_the_run():
    prec, ps, params, opt, tx = toy(compute="bf16", escalate_after_consecutive=3)
    bits = []
    for bad in [True, True, False, True, True, True, True, True]:
        ps, params, opt, _ = step(prec, ps, params, opt, tx, bad, bad_only_in_low=True)
        bits.append(float(prec.bits(ps)))
    # a finite update resets the streak; the third overflow in a row switches to fp32, where the
    # same computation is finite, and it stays there (no cooldown)
    assert bits == [16, 16, 16, 16, 16, 32, 32, 32]
    assert int(ps.escalations) == 1 and int(ps.skipped) == 5


def test_escalation_after_total_overflows_returns_to_low_precision_after_the_cooldown():
    prec, ps, params, opt, tx = toy(compute="fp16", escalate_after_total=2, escalate_cooldown=3)
    bits, scales = [], []
    for bad in [True, False, True, False, False, False, False]:
        ps, params, opt, _ = step(prec, ps, params, opt, tx, bad, bad_only_in_low=True)
        bits.append(float(prec.bits(ps)))
        scales.append(float(prec.loss_scale(ps)))
    assert bits == [16, 16, 32, 32, 32, 16, 16]
    assert scales == [2**14, 2**14, 1, 1, 1, 2**13, 2**13]  # no scaling in fp32; two halvings kept
    assert int(ps.escalations) == 1


# -- whole agents with corrupted data -----------------------------------------------------------
def inject(agent, what: str, rate: float, value: float):
    """Make a share `rate` of the env's rewards or observations `value` (NaN or inf)."""
    original = agent.env.step

    def step(key, state, action, **kw):
        obs, state, reward, term, trunc, info = original(key, state, action, **kw)
        hit = jax.random.uniform(jax.random.fold_in(key, 77), reward.shape) < rate
        if what == "reward":
            reward = jnp.where(hit, value, reward)
        else:
            bad = hit.reshape(hit.shape + (1,) * (obs.ndim - 1))
            obs = jnp.where(bad, value, obs)
            info = {**info, "final_obs": jnp.where(bad, value, info["final_obs"])}
        return obs, state, reward, term, trunc, info

    agent.env.step = step
    return agent


def run(agent, iterations):
    state, metrics = jax.jit(lambda s: jax.lax.scan(agent.step, s, jnp.arange(iterations)))(agent.init(jax.random.key(0)))
    return jax.device_get(state), jax.device_get(metrics)


def all_finite(tree):
    return all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree.leaves(tree))


def test_nan_rewards_never_reach_rmt_params_and_bf16_escalates_in_the_loop():
    cfg = rmtjax.make_config("rmt", "CartPole-v1", {
        "train.total_steps": 2000, "agent.hidden": [16, 16], "agent.buffer_size": 2000, "agent.batch_size": 8,
        "agent.learning_starts": 0, "precision.compute": "bf16", "precision.escalate_after_total": 10})
    agent = inject(build_agent(cfg), "reward", 0.05, jnp.nan)
    state, m = run(agent, 30)
    assert all_finite(state.params) and all_finite(state.target_params) and all_finite(state.opt_state)
    skipped = m["skipped_updates"]
    assert skipped[-1] > 10
    assert np.all(np.isfinite(m["td_error_ema"])) and np.all(np.isfinite(m["temperature"]))
    # bf16 until the tenth skipped update, fp32 from then on
    bits = m["precision_bits"]
    np.testing.assert_array_equal(bits, np.where(skipped >= 10, 32, 16))
    assert bits[0] == 16 and bits[-1] == 32
    assert m["precision_escalations"][-1] == 1
    # learning went on: most updates after the switch were accepted
    assert m["skipped_frac"][bits == 32].mean() < 0.5 and m["loss"][-1] > 0


def test_nan_observations_never_reach_ppo_params():
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {"train.total_steps": 2048, "agent.rollout_len": 32,
                                                    "agent.hidden": [16, 16]})
    agent = inject(build_agent(cfg), "obs", 0.01, jnp.nan)
    state, m = run(agent, 8)
    assert all_finite(state.params) and all_finite(state.opt_state)
    assert m["skipped_updates"][-1] > 0 and m["skipped_frac"].max() > 0
    assert np.all(np.isfinite(m["grad_norm"])) and np.all(np.isfinite(m["value_loss_ema"]))
    assert np.all(m["precision_bits"] == 32) and np.all(m["loss_scale"] == 1)


def test_inf_rewards_never_reach_sac_params_in_fp16():
    cfg = rmtjax.make_config("sac", "Pendulum-v1", {
        "env.num_envs": 2, "train.total_steps": 1000, "agent.learning_starts": 4, "agent.batch_size": 8,
        "agent.buffer_size": 64, "agent.hidden": [16, 16], "precision.compute": "fp16",
        "precision.escalate_after_consecutive": 0})
    agent = inject(build_agent(cfg), "reward", 0.1, jnp.inf)
    state, m = run(agent, 20)
    assert all_finite(state.params) and all_finite(state.target_critic) and all_finite(state.log_alpha)
    assert m["skipped_updates"][-1] > 0
    assert np.all(m["precision_bits"] == 16) and m["loss_scale"][-1] < 2**15  # overflows halved the scale


# -- the compute dtype ----------------------------------------------------------------------------
def dot_dtypes(jaxpr) -> set:
    """Input dtypes of every dot_general in a jaxpr, sub-jaxprs (scan, cond, ...) included."""
    found = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found |= {str(v.aval.dtype) for v in eqn.invars}
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    found |= dot_dtypes(sub)
    return found


@pytest.mark.parametrize("algo,env", [("rmt", "CartPole-v1"), ("ppo", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_bf16_computes_in_bfloat16_with_float32_parameters(algo, env):
    cfg = rmtjax.make_config(algo, env, {"train.total_steps": 2000, "agent.hidden": [16, 16],
                                         "precision.compute": "bf16", "precision.escalate_after_consecutive": 0})
    agent = build_agent(cfg)
    state = agent.init(jax.random.key(0))
    assert dot_dtypes(jax.make_jaxpr(agent.step)(state, 0).jaxpr) == {"bfloat16"}
    assert {str(x.dtype) for x in jax.tree.leaves((state.params, state.opt_state)) if x.dtype.kind == "f"} == {"float32"}
    new_state, metrics = jax.eval_shape(agent.step, state, 0)
    assert {str(x.dtype) for x in jax.tree.leaves(new_state.params)} == {"float32"}
    loss = "loss" if algo == "rmt" else ("value_loss" if algo == "ppo" else "critic_loss")
    assert str(metrics[loss].dtype) == "float32"
    # with escalation on, the fp32 path is traced too; with fp32 only it is
    both = build_agent(cfg.override({"precision.escalate_after_consecutive": 10}))
    assert dot_dtypes(jax.make_jaxpr(both.step)(both.init(jax.random.key(0)), 0).jaxpr) == {"bfloat16", "float32"}
    fp32 = build_agent(cfg.override({"precision.compute": "fp32", "precision.escalate_after_consecutive": 0}))
    assert dot_dtypes(jax.make_jaxpr(fp32.step)(fp32.init(jax.random.key(0)), 0).jaxpr) == {"float32"}


# -- config ----------------------------------------------------------------------------------------
def test_precision_section_round_trips_through_yaml_and_overrides(tmp_path):
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {"precision.compute": "fp16", "precision.loss_scale_init": 1024,
                                                    "precision.clip_decay_to": 0.1})
    assert cfg.precision.compute == "fp16" and cfg.precision.loss_scale_init == 1024.0
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert yaml.safe_load(path.read_text())["precision"]["compute"] == "fp16"
    assert rmtjax.load_config(path) == cfg
    assert Config.from_dict(cfg.to_dict()) == cfg
    # a config without the section gets the defaults: fp32
    data = cfg.to_dict()
    del data["precision"]
    assert Config.from_dict(data).precision == PrecisionConfig()


@pytest.mark.parametrize("overrides,message", [
    ({"precision.compute": "fp8"}, r"precision\.compute: 'fp8' is not one of \['fp32', 'bf16', 'fp16'\]"),
    ({"precision.compute": "fp16", "precision.loss_scale_init": 4.0, "precision.loss_scale_min": 8.0},
     r"precision\.loss_scale_init: 4\.0 must lie within .*\[8\.0, 16777216\.0\]"),
    ({"precision.compute": "bf16", "precision.loss_scale_init": 1024},
     r"precision\.loss_scale_init: loss scaling applies only with precision\.compute: fp16"),
    ({"precision.escalate_after_total": 5},
     r"precision\.escalate_after_total: escalation to fp32 applies only with precision\.compute bf16 or fp16"),
    ({"precision.loss_scale_growth_interval": 0}, r"precision\.loss_scale_growth_interval: 0 is out of range"),
    ({"precision.clip_decay_to": 1.5}, r"precision\.clip_decay_to: 1\.5 is out of range; allowed \[0\.0, 1\.0\]"),
    ({"precision.loss_scale": 2}, r"unknown key precision\.loss_scale\. Did you mean: loss_scale_"),
])
def test_precision_config_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        rmtjax.make_config("ppo", "CartPole-v1", overrides)


def test_precision_section_must_be_a_mapping():
    data = rmtjax.make_config("ppo", "CartPole-v1").to_dict()
    data["precision"] = "bf16"
    with pytest.raises(ConfigError, match=r"precision: expected a mapping of settings, got 'bf16'"):
        Config.from_dict(data)
