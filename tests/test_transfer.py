"""Transfer (`rmtjax.transfer`): loading a source run's parameters, frozen and staged groups in the
update guard, the KL penalty to the source policy, shape errors and re-initialised heads, resume.

Tiny networks and runs, compiled once per module: a PPO source (2 seeds) in a run directory, one
PPO run transferred from it (8 iterations in 8 chunks, the state kept after each), an RMT source
and one RMT run transferred from it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import rmtjax
from rmtjax.agents import build_agent
from rmtjax.cli import main
from rmtjax.config import ConfigError
from rmtjax.driver import Program, resolve_source
from rmtjax.guard import with_anchor
from rmtjax.protocol import Categorical, Gaussian
from rmtjax.rundir import RunDirError
from rmtjax.transfer import kl
from tests.helpers import host

PPO_TINY = {"env.num_envs": 2, "agent.rollout_len": 16, "agent.num_minibatches": 2, "agent.num_epochs": 1,
            "agent.hidden": [8, 8], "train.total_steps": 256, "train.num_seeds": 2, "train.num_chunks": 8,
            "train.progress": False}  # 8 iterations of 32 steps, one per chunk
RMT_TINY = {"env.num_envs": 2, "agent.rollout_len": 4, "agent.batch_size": 16, "agent.buffer_size": 256,
            "agent.learning_starts": 16, "agent.hidden": [16, 16], "agent.target_update_every": 4,
            "agent.torso": "mlp", "agent.replay": "uniform",
            "train.total_steps": 96, "train.num_seeds": 1, "train.num_chunks": 1, "train.progress": False}
# the PPO target: a longer pole; the value head frozen for the run, the torso's first layer
# released halfway (iteration 4 of 8 is the first to train it), a KL penalty
PPO_TRANSFER = {"env.params.length": 2.0, "env.params.polemass_length": 0.2, "transfer.freeze": ["head/value"],
                "transfer.unfreeze": {"torso/Dense_0": 0.5}, "transfer.kl_coef": 0.5}


def leaves(tree) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.fixture(scope="module")
def ppo_source(tmp_path_factory):
    path = tmp_path_factory.mktemp("transfer") / "source"
    cfg = rmtjax.make_config("ppo", "CartPole-v1", PPO_TINY)
    result = rmtjax.train(cfg, jax.random.key(1), run_dir=path)
    return {"path": path, "result": result, "params": host(result.state.params)}


@pytest.fixture(scope="module")
def ppo_transferred(ppo_source, tmp_path_factory):
    """The PPO target trained from the source's run directory, with its params after every iteration."""
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**PPO_TINY, **PPO_TRANSFER})
    states = {}
    result = rmtjax.train(cfg, jax.random.key(2), init_from=ppo_source["path"],
                          on_chunk=lambda state, chunks, done: states.__setitem__(done, host(state.params)))
    return {"config": cfg, "result": result, "params": states}


@pytest.fixture(scope="module")
def rmt_pair():
    """(source: one seed's parameters, the RMT run transferred from them with its torso frozen)."""
    cfg = rmtjax.make_config("rmt", "CartPole-v1", RMT_TINY)
    init = jax.jit(build_agent(cfg).init)(jax.random.key(3)).params
    source = host(jax.tree.map(lambda x: 1.5 * x + 0.01, init))  # not the target's own initialisation
    target_cfg = cfg.override({"env.params.length": 2.0, "env.params.polemass_length": 0.2,
                               "transfer.freeze": ["torso"], "transfer.kl_coef": 0.2})
    target = rmtjax.train(target_cfg, jax.random.key(4), init_from=source)
    return source, target


# -- loading -------------------------------------------------------------------------------------
def test_init_from_a_run_dir_loads_exactly_the_source_params_seed_by_seed(ppo_source):
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**PPO_TINY, "env.params.length": 2.0})
    program = Program(cfg, resolve_source(cfg, ppo_source["path"]))
    state = host(program.initial_state(jax.random.split(jax.random.key(9), 2)))
    src = leaves(ppo_source["params"])
    got = leaves(state.params)
    assert got.keys() == src.keys()
    for k in src:
        np.testing.assert_array_equal(got[k], src[k], err_msg=k)  # seed k from source seed k, bit for bit
    assert not np.array_equal(src["['actor']['params']['Dense_0']['kernel']"][0],
                              src["['actor']['params']['Dense_0']['kernel']"][1])  # the two seeds differ

    one = cfg.override({"transfer.source_seed": 1, "train.num_seeds": 3})
    state = host(Program(one, resolve_source(one, ppo_source["path"])).initial_state(
        jax.random.split(jax.random.key(9), 3)))
    for k, v in leaves(state.params).items():
        for seed in range(3):
            np.testing.assert_array_equal(v[seed], src[k][1], err_msg=k)


def test_seed_counts_that_do_not_match_are_refused(ppo_source):
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**PPO_TINY, "train.num_seeds": 3})
    with pytest.raises(ConfigError, match=r"has 2 seeds and train.num_seeds is 3"):
        resolve_source(cfg, ppo_source["path"])
    with pytest.raises(ConfigError, match=r"transfer.source_seed: 5, but .* has 2 seed"):
        resolve_source(cfg.override({"transfer.source_seed": 5}), ppo_source["path"])


def test_rmt_starts_its_target_network_and_kl_anchor_at_the_source(rmt_pair):
    source, _ = rmt_pair
    cfg = rmtjax.make_config("rmt", "CartPole-v1", {**RMT_TINY, "transfer.kl_coef": 0.2})
    state = host(Program(cfg, resolve_source(cfg, source)).initial_state(jax.random.split(jax.random.key(0), 1)))
    src = leaves(source)
    for tree in (state.params, state.target_params, state.opt_state.inner.anchor):
        for k, v in leaves(tree).items():
            np.testing.assert_array_equal(v[0], src[k], err_msg=k)


# -- freezing and staged release -----------------------------------------------------------------
def test_frozen_parameters_stay_bit_identical_through_training(ppo_source, ppo_transferred, rmt_pair):
    src = leaves(ppo_source["params"])
    trained = {k for k in src if "critic" in k and "MLP_0" not in k}  # head/value: the critic's output layer
    assert trained == {"['critic']['params']['Dense_0']['bias']", "['critic']['params']['Dense_0']['kernel']"}
    for done, params in ppo_transferred["params"].items():
        for k in trained:
            np.testing.assert_array_equal(leaves(params)[k], src[k], err_msg=f"{k} after {done} iterations")
    final = leaves(ppo_transferred["params"][8])
    assert not np.array_equal(final["['actor']['params']['Dense_0']['kernel']"],
                              src["['actor']['params']['Dense_0']['kernel']"])  # the policy head trains

    source, target = rmt_pair
    src, got = leaves(source), {k: v[0] for k, v in leaves(host(target.state.params)).items()}
    torso = [k for k in src if "['torso']" in k]
    assert len(torso) == 8  # two dense layers with their LayerNorms
    for k in torso:
        np.testing.assert_array_equal(got[k], src[k], err_msg=k)
    for k in (k for k in src if "['head']" in k):
        assert not np.array_equal(got[k], src[k]), k  # the head learned (it has a gradient and took it)
    assert target.metrics["skipped_frac"].max() == 0.0


def test_progressive_unfreezing_releases_at_the_configured_share(ppo_source, ppo_transferred):
    first = "['actor']['params']['MLP_0']['Dense_0']['kernel']"  # torso/Dense_0/actor: released at 0.5
    second = "['actor']['params']['MLP_0']['Dense_1']['kernel']"  # torso/Dense_1/actor: trained from the start
    src = leaves(ppo_source["params"])
    params = {done: leaves(p) for done, p in ppo_transferred["params"].items()}
    # iteration t starts at t/8 of training: iterations 0-3 leave the layer alone, iteration 4 trains it
    unchanged = [done for done in range(1, 9) if np.array_equal(params[done][first], src[first])]
    assert unchanged == [1, 2, 3, 4]
    assert not np.array_equal(params[1][second], src[second])
    np.testing.assert_array_equal(ppo_transferred["result"].metrics["transfer_released"][0],
                                  [0, 0, 0, 0, 1, 1, 1, 1])


# -- the KL penalty ------------------------------------------------------------------------------
def test_kl_of_policies_matches_the_closed_forms():
    p = Categorical(jnp.log(jnp.array([[0.5, 0.5], [0.9, 0.1]])))
    q = Categorical(jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5]])))
    np.testing.assert_allclose(kl(p, q), [0.0, 0.9 * np.log(1.8) + 0.1 * np.log(0.2)], rtol=1e-6)
    # N(0, 1) to N(1, 2^2): log 2 + (1 + 1) / 8 - 1/2, per dimension, summed
    g1 = Gaussian(jnp.zeros((1, 2)), jnp.zeros((1, 2)))
    g2 = Gaussian(jnp.ones((1, 2)), jnp.full((1, 2), np.log(2.0)))
    np.testing.assert_allclose(kl(g1, g2), [2 * (np.log(2) + 0.25 - 0.5)], rtol=1e-6)
    np.testing.assert_array_equal(kl(g1, g1), [0.0])


def test_the_kl_term_is_zero_when_the_policies_are_equal_and_positive_when_they_differ():
    # PPO: the update's KL to the anchor (the source) is exactly 0 while the parameters are the source's
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**PPO_TINY, "transfer.kl_coef": 0.5})
    agent = build_agent(cfg)
    state = agent.init(jax.random.key(0))
    obs = jax.random.normal(jax.random.key(1), (16, 4))
    mb = {"obs": obs, "action": jnp.arange(16) % 2, "log_prob": jnp.full(16, -0.69), "value": jnp.zeros(16),
          "advantage": jnp.linspace(-1, 1, 16), "target": jnp.ones(16)}
    step = jax.jit(lambda opt: agent.minibatch_step(state.params, opt, state.precision, mb, state.hparams, 0.5))
    # zero up to the rounding of two separately fused log-softmaxes, and it pulls nowhere
    assert abs(float(step(state.opt_state).transfer_kl)) < 1e-7
    penalty = lambda opt: agent.transfer_penalty(opt, obs)  # noqa: E731
    grad = jax.grad(lambda p: penalty(state.opt_state)(p, jnp.float32)[0])(state.params)
    assert float(optax.tree.norm(grad)) < 1e-6
    other = jax.tree_util.tree_map_with_path(  # the first action's logit moved (the layer starts at scale 0.01)
        lambda path, x: x.at[..., 0].add(1.0) if "['actor']['params']['Dense_0']" in jax.tree_util.keystr(path) else x,
        state.params)
    out = step(with_anchor(state.opt_state, other))
    pol = lambda p: np.asarray(jax.nn.softmax(agent.actor.apply(p["actor"], obs)[0]))  # noqa: E731
    ps, pc = pol(other), pol(state.params)
    want = np.mean(np.sum(ps * (np.log(ps) - np.log(pc)), -1))
    assert want > 1e-4
    np.testing.assert_allclose(float(out.transfer_kl), want, rtol=1e-4)

    # RMT: softmax of Q at the temperature given
    cfg = rmtjax.make_config("rmt", "CartPole-v1", {**RMT_TINY, "transfer.kl_coef": 0.2})
    agent = build_agent(cfg)
    state = agent.init(jax.random.key(0))
    penalty = agent.transfer_penalty(state.opt_state, obs, 0.5)
    term, value = penalty(state.params, jnp.float32)
    assert abs(float(value)) < 1e-7 and abs(float(term)) < 1e-7
    other = jax.tree.map(lambda x: x * 1.5, state.params)
    term, value = agent.transfer_penalty(with_anchor(state.opt_state, other), obs, 0.5)(state.params, jnp.float32)
    qs, qc = (np.asarray(agent.q_values(p, obs)) / 0.5 for p in (other, state.params))
    ls = qs - np.log(np.exp(qs).sum(-1, keepdims=True))
    lc = qc - np.log(np.exp(qc).sum(-1, keepdims=True))
    want = np.mean(np.sum(np.exp(ls) * (ls - lc), -1))
    assert want > 1e-4
    np.testing.assert_allclose(float(value), want, rtol=1e-4)
    np.testing.assert_allclose(float(term), 0.2 * want, rtol=1e-4)
    assert agent.transfer_penalty(state.opt_state, obs) is not None
    assert build_agent(rmtjax.make_config("rmt", "CartPole-v1", RMT_TINY)).transfer_penalty(state.opt_state, obs) is None


def test_a_trained_run_reports_a_positive_finite_kl(ppo_transferred, rmt_pair):
    kl_ppo = ppo_transferred["result"].metrics["transfer_kl"]
    assert np.all(np.isfinite(kl_ppo)) and kl_ppo[:, -1].min() > 0
    kl_rmt = rmt_pair[1].metrics["transfer_kl"]  # 0 before learning starts (no update), then measured
    assert np.all(np.isfinite(kl_rmt)) and kl_rmt[:, 0] == 0 and kl_rmt[:, -1].min() > 0


# -- shapes -------------------------------------------------------------------------------------
def test_a_shape_mismatch_names_the_paths_and_shapes(ppo_source):
    cfg = rmtjax.make_config("ppo", "Acrobot-v1", PPO_TINY)  # 6 observations, 3 actions
    with pytest.raises(ConfigError) as e:
        Program(cfg, resolve_source(cfg, ppo_source["path"]))
    text = str(e.value)
    assert "params['actor']['params']['MLP_0']['Dense_0']['kernel']: source float32[4, 8], target float32[6, 8]" in text
    assert "params['actor']['params']['Dense_0']['kernel']: source float32[8, 2], target float32[8, 3]" in text
    assert "transfer.reinit: [head/policy, torso/Dense_0/actor, torso/Dense_0/critic]" in text


def test_reinit_of_the_head_and_input_layer_keeps_the_targets_fresh_initialisation(ppo_source):
    cfg = rmtjax.make_config("ppo", "Acrobot-v1", {**PPO_TINY, "transfer.reinit": ["head", "torso/Dense_0"]})
    keys = jax.random.split(jax.random.key(5), 2)
    state = host(Program(cfg, resolve_source(cfg, ppo_source["path"])).initial_state(keys))
    fresh = host(Program(rmtjax.make_config("ppo", "Acrobot-v1", PPO_TINY)).initial_state(keys))
    src, got, new = leaves(ppo_source["params"]), leaves(state.params), leaves(fresh.params)
    loaded = {k for k in got if "Dense_1" in k}  # torso/Dense_1 of both networks
    assert len(loaded) == 4
    for k in got:
        np.testing.assert_array_equal(got[k], src[k] if k in loaded else new[k], err_msg=k)


# -- run directories and resume -----------------------------------------------------------------
class Interrupt(Exception):
    pass


def test_resume_of_a_transferred_run_is_exact_without_the_source(ppo_source, ppo_transferred, tmp_path):
    import shutil

    source = tmp_path / "source"
    shutil.copytree(ppo_source["path"], source)
    path = tmp_path / "target"

    def stop(state, chunks, done):
        if done == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        rmtjax.train(ppo_transferred["config"], jax.random.key(2), init_from=source, run_dir=path, on_chunk=stop)
    shutil.rmtree(source)  # the run directory keeps what it needs
    assert (path / "transfer_source.npz").is_file()
    with pytest.raises(RunDirError, match="began from"):
        rmtjax.train(None, resume=path, init_from=tmp_path / "elsewhere")
    result = rmtjax.train(None, resume=path)
    for k, v in leaves(host(result.state.params)).items():
        np.testing.assert_array_equal(v, leaves(ppo_transferred["params"][8])[k], err_msg=k)
    np.testing.assert_array_equal(result.metrics["transfer_kl"], ppo_transferred["result"].metrics["transfer_kl"])
    assert rmtjax.load_run(path).config.transfer == ppo_transferred["config"].transfer


# -- config --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sets, message", [
    ({"transfer.freez": ["torso"]}, r"unknown key transfer.freez.*Did you mean: freeze"),
    ({"transfer.unfreeze": {"torso": 1.0}}, r"transfer.unfreeze.torso: 1.0 must be a share of training strictly"),
    ({"transfer.freeze": ["torso"], "transfer.unfreeze": {"torso": 0.5}}, r"in both transfer.freeze"),
    ({"transfer.freeze": ["torso//x"]}, r"not a group name"),
    ({"transfer.kl_coef": -1}, r"transfer.kl_coef: -1.0 is out of range"),
])
def test_bad_transfer_settings_are_config_errors(sets, message):
    with pytest.raises(ConfigError, match=message):
        rmtjax.make_config("ppo", "CartPole-v1", sets)


def test_names_of_no_group_transfer_without_a_source_and_unsupported_agents_are_refused(ppo_source):
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**PPO_TINY, "transfer.freeze": ["trunk"]})
    with pytest.raises(ConfigError, match=r"'trunk' names no parameter group of ppo here.*Its groups: head/policy, "
                                          r"head/value, torso/Dense_0/actor"):
        Program(cfg)
    with pytest.raises(ConfigError, match=r"give one: train\(config, key, init_from="):
        rmtjax.train(cfg.override({"transfer.freeze": ["torso"]}), jax.random.key(0))
    with pytest.raises(ConfigError, match=r"sac declares no parameter groups"):
        rmtjax.make_config("sac", "Pendulum-v1", {"transfer.freeze": ["torso"]})
    with pytest.raises(ConfigError, match=r"trained ppo, this run is rmt"):
        resolve_source(rmtjax.make_config("rmt", "CartPole-v1", RMT_TINY), ppo_source["path"])
    with pytest.raises(ConfigError, match=r"agent.torso: lstm: recurrent agents cannot be transferred"):
        rmtjax.make_config("ppo", "CartPole-v1", {**PPO_TINY, "agent.torso": "lstm", "transfer.kl_coef": 0.1})
    with pytest.raises(ConfigError, match=r"agent.torso: gru: recurrent agents cannot be transferred"):
        resolve_source(rmtjax.make_config("ppo", "CartPole-v1", {**PPO_TINY, "agent.torso": "gru"}), ppo_source["path"])


def test_the_transfer_section_is_listed_and_left_out_of_configs_that_do_not_use_it(capsys):
    assert main(["config", "transfer"]) == 0
    out = capsys.readouterr().out
    for field in ("transfer.freeze", "transfer.unfreeze", "transfer.kl_coef", "transfer.reinit",
                  "transfer.source_seed"):
        assert field in out
    cfg = rmtjax.make_config("ppo", "CartPole-v1")
    assert "transfer" not in cfg.to_dict()
    moved = cfg.override({"transfer.unfreeze.torso/Dense_0": 0.25})
    assert moved.to_dict()["transfer"]["unfreeze"] == {"torso/Dense_0": 0.25}
    assert rmtjax.Config.from_dict(moved.to_dict()) == moved
    assert dataclasses.replace(moved, transfer=cfg.transfer) == cfg
