import jax
import numpy as np
import pytest

import rmtjax
from rmtjax.cli import main


def small_ppo(**extra):
    overrides = {"train.total_steps": 4096, "train.num_seeds": 2, "train.progress": False,
                 "agent.rollout_len": 64, **extra}
    return rmtjax.make_config("ppo", "CartPole-v1", overrides)


def test_metrics_are_seeds_by_iterations_and_include_hparams():
    cfg = small_ppo()
    result = rmtjax.train(cfg, jax.random.key(0))
    n_iter = 4096 // (4 * 64)
    for name in ("env_steps", "episode_return", "episode_count", "policy_loss", "value_loss", "lr", "gamma",
                 "clip_eps", "ent_coef"):
        assert result.metrics[name].shape == (2, n_iter), name
    np.testing.assert_array_equal(result.metrics["env_steps"][0], 256 * np.arange(1, n_iter + 1))
    assert result.final_return.shape == (2,)
    assert np.all(np.isfinite(result.metrics["episode_return"]))
    assert np.all(result.metrics["gamma"] == np.float32(0.99))


def test_chunking_does_not_change_the_run():
    one = rmtjax.train(small_ppo(**{"train.num_chunks": 1}), jax.random.key(3))
    three = rmtjax.train(small_ppo(**{"train.num_chunks": 3}), jax.random.key(3))  # 16 iterations: 6, 6, 4
    for k in one.metrics:
        np.testing.assert_allclose(one.metrics[k], three.metrics[k], rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(one.final_return, three.final_return)


def test_make_train_matches_train_and_vmaps_over_hparams():
    cfg = small_ppo()
    state, metrics = jax.jit(rmtjax.make_train(cfg))(jax.random.key(3))
    ref = rmtjax.train(cfg, jax.random.key(3))
    np.testing.assert_allclose(np.asarray(metrics["policy_loss"]), ref.metrics["policy_loss"], rtol=1e-4, atol=1e-6)

    grid = jax.numpy.array([1e-4, 1e-3])
    _, swept = jax.jit(jax.vmap(rmtjax.make_train(cfg), in_axes=(None, 0)))(jax.random.key(3), {"lr": grid})
    assert swept["lr"].shape == (2, 2, 16)
    np.testing.assert_allclose(np.asarray(swept["lr"][:, 0, 0]), [1e-4, 1e-3], rtol=1e-6)


def test_the_chunk_is_compiled_with_options_xla_accepts():
    from rmtjax import driver

    options = driver.chunk_compiler_options()
    assert options == (driver.CPU_CHUNK_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None)
    # an option name XLA does not know raises here, so a jaxlib that renames one fails this test
    double = jax.jit(lambda x: x * 2.0).lower(np.arange(3.0)).compile(options)
    np.testing.assert_array_equal(double(np.arange(3.0)), [0.0, 2.0, 4.0])
    with pytest.raises(Exception, match="no_such_option"):
        jax.jit(lambda x: x * 2.0).lower(np.arange(3.0)).compile({"xla_no_such_option": 1})


def test_runs_and_probes_compile_the_chunk_through_one_method(monkeypatch):
    from rmtjax import driver

    program = driver.Program(small_ppo())
    state = program.initial_state(driver.seed_keys(jax.random.key(0), 2))
    chunk = program.compile_chunk(state, 2)
    _, packed = chunk(jax.tree.map(lambda x: x.copy(), state), np.int32(0), np.int32(2))  # donated
    assert packed.unpack()["env_steps"].shape == (2, 2)
    # the options come from chunk_compiler_options() at call time, for `train` as for a probe
    monkeypatch.setattr(driver, "chunk_compiler_options", lambda: {"xla_no_such_option": 1})
    with pytest.raises(Exception, match="no_such_option"):
        program.compile_chunk(state, 2)
    with pytest.raises(Exception, match="no_such_option"):
        rmtjax.train(small_ppo(), jax.random.key(0))
    program.compile_chunk(state, 2, None)  # XLA's defaults, asked for by name


def test_unknown_hparam_override_is_a_config_error():
    with pytest.raises(rmtjax.ConfigError, match="'lrate' is not a hyperparameter of ppo"):
        rmtjax.make_train(small_ppo())(jax.random.key(0), {"lrate": 1.0})


def test_cli_trains_and_reports(capsys):
    code = main(["train", "--quiet", "--set", "train.total_steps=2048", "--set", "agent.rollout_len=64"])
    out = capsys.readouterr().out
    assert code == 0
    assert "ppo on CartPole-v1: 2,048 env steps" in out and "final return per seed" in out


def test_cli_reads_a_config_file(tmp_path, capsys):
    import yaml

    data = small_ppo().to_dict()
    data["env"]["id"] = "Acrobot-v1"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    assert rmtjax.load_config(path).env.id == "Acrobot-v1"
    # --env replaces the file's env id and nothing else: this is small_ppo(), whose program is compiled above
    assert main(["train", str(path), "--quiet", "--env", "CartPole-v1"]) == 0
    assert "ppo on CartPole-v1: 4,096 env steps" in capsys.readouterr().out


def test_cli_config_error_exits_2_with_a_message(capsys):
    assert main(["train", "--set", "agent.lrr=1"]) == 2
    assert "unknown key agent.lrr" in capsys.readouterr().err
