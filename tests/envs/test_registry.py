"""Env ids by prefix: which adapter builds an id, and the errors a user sees."""

import pytest

from rmtjax import envs
from rmtjax.config import ConfigError, EnvConfig


def test_split_id_keeps_gymnasium_module_syntax():
    assert envs.split_id("CartPole-v1") == (None, "CartPole-v1")
    assert envs.split_id("brax:ant") == ("brax", "ant")
    assert envs.split_id("gymnasium:ale_py:ALE/Pong-v5") == ("gymnasium", "ale_py:ALE/Pong-v5")


def test_a_missing_optional_package_says_how_to_install_it(monkeypatch):
    fake = envs.Adapter("rmtjax.envs.brax_env", "rmtjax_no_such_package", "pip install 'rmtjax[fake]'", False)
    monkeypatch.setitem(envs._ADAPTERS, "fake", fake)
    with pytest.raises(ConfigError, match=r"'fake:thing' needs the rmtjax_no_such_package package.*"
                                          r"pip install 'rmtjax\[fake\]'"):
        EnvConfig(id="fake:thing")


def test_available_envs_lists_gymnax_and_prefixed_ids():
    pytest.importorskip("gymnasium")
    ids = envs.available_envs()
    assert "CartPole-v1" in ids and "gymnasium:CartPole-v1" in ids and "gymnasium:LunarLander-v3" in ids
    assert "CartPole-v1" in envs.available_envs(adapters=False)
    assert not any(":" in i for i in envs.available_envs(adapters=False))


def test_host_envs_are_told_apart_from_jax_envs():
    assert envs.is_host_env("gymnasium:CartPole-v1")
    assert not envs.is_host_env("brax:ant") and not envs.is_host_env("CartPole-v1")


def test_config_checks_build_an_environment_once_per_distinct_env(monkeypatch):
    import rmtjax
    from rmtjax import envs

    built = []
    make = envs.make_env
    monkeypatch.setattr(envs, "_SPECS", {})
    monkeypatch.setattr(envs, "make_env", lambda cfg: built.append(cfg.id) or make(cfg))
    cfg = rmtjax.make_config("pqn", "CartPole-v1", {"train.total_steps": 10_000})
    cfg.override({"agent.lr": 1e-4}).override({"train.num_seeds": 2})
    rmtjax.make_config("pqn", "Acrobot-v1")
    assert built == ["CartPole-v1", "Acrobot-v1"]
    assert envs.env_spec(cfg.env).num_actions == 2
