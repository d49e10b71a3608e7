from pathlib import Path

import pytest
import yaml

import rmtjax
from rmtjax.config import ConfigError, load_config, make_config, parse_override


def test_unknown_key_names_close_matches():
    with pytest.raises(ConfigError, match=r"unknown key agent\.lrr.*Did you mean: lr"):
        make_config("ppo", "CartPole-v1", {"agent.lrr": 1e-3})


def test_unknown_section_is_named():
    with pytest.raises(ConfigError, match=r"unknown key agnet\.lr.*agent"):
        make_config("ppo", "CartPole-v1", {"agnet.lr": 1e-3})


def test_out_of_range_names_field_and_range():
    with pytest.raises(ConfigError, match=r"agent\.gamma: 1\.5 is out of range; allowed \[0\.0, 1\.0\]"):
        make_config("ppo", "CartPole-v1", {"agent.gamma": 1.5})


def test_open_range_excludes_bound():
    with pytest.raises(ConfigError, match=r"agent\.lr: 0\.0 is out of range; allowed \(0\.0, 1\.0\]"):
        make_config("ppo", "CartPole-v1", {"agent.lr": 0.0})


def test_unknown_env_lists_available_ids():
    with pytest.raises(ConfigError, match=r"unknown environment 'CartPol-v1'.*CartPole-v1.*Available: .*Acrobot-v1"):
        make_config("ppo", "CartPol-v1")


def test_unknown_algo_names_close_matches():
    with pytest.raises(ConfigError, match=r"unknown algorithm 'ppp'.*ppo"):
        make_config("ppp", "CartPole-v1")


def test_wrong_types_are_reported():
    with pytest.raises(ConfigError, match=r"env\.num_envs: expected an integer, got 'four'"):
        make_config("ppo", "CartPole-v1", {"env.num_envs": "four"})
    with pytest.raises(ConfigError, match=r"agent\.anneal_lr: expected true or false"):
        make_config("ppo", "CartPole-v1", {"agent.anneal_lr": 1})
    with pytest.raises(ConfigError, match=r"env\.num_envs: expected an integer, got 2\.5"):
        make_config("ppo", "CartPole-v1", {"env.num_envs": 2.5})


def test_boolean_strings_are_accepted_for_bools():
    assert make_config("ppo", "CartPole-v1", {"agent.anneal_lr": "False"}).agent.anneal_lr is False
    assert make_config("ppo", "CartPole-v1", {"agent.anneal_lr": "true"}).agent.anneal_lr is True
    with pytest.raises(ConfigError, match=r"agent\.anneal_lr: expected true or false, got 'yes'"):
        make_config("ppo", "CartPole-v1", {"agent.anneal_lr": "yes"})


def test_non_finite_numbers_are_rejected():
    with pytest.raises(ConfigError, match=r"agent\.lr: expected a finite number"):
        make_config("ppo", "CartPole-v1", {"agent.lr": "nan"})
    with pytest.raises(ConfigError, match=r"train\.total_steps: expected a finite number"):
        make_config("ppo", "CartPole-v1", {"train.total_steps": float("inf")})


def test_integral_numbers_are_accepted_for_ints():
    cfg = make_config("ppo", "CartPole-v1", {"train.total_steps": "1e5", "env.num_envs": 8.0})
    assert cfg.train.total_steps == 100_000 and isinstance(cfg.train.total_steps, int)
    assert cfg.env.num_envs == 8


def test_cross_field_check_minibatches_divide_batch():
    with pytest.raises(ConfigError, match=r"num_minibatches: 3 must divide .* = 512"):
        make_config("ppo", "CartPole-v1", {"agent.num_minibatches": 3})


def test_choices_are_checked():
    with pytest.raises(ConfigError, match=r"agent\.activation: 'sigmoid' is not one of"):
        make_config("ppo", "CartPole-v1", {"agent.activation": "sigmoid"})


def test_override_returns_new_config_and_keeps_old():
    cfg = make_config("ppo", "CartPole-v1")
    new = cfg.override({"agent.lr": 3e-4, "train.num_seeds": 4, "agent.hidden": [32, 32, 32]})
    assert new.agent.lr == 3e-4 and new.train.num_seeds == 4 and new.agent.hidden == (32, 32, 32)
    assert cfg.agent.lr == 2.5e-4 and cfg.train.num_seeds == 1


def test_yaml_round_trip(tmp_path):
    cfg = make_config("ppo", "Acrobot-v1", {"agent.ent_coef": 0.02, "env.params.max_steps_in_episode": 200})
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    again = load_config(path)
    assert again == cfg
    assert again.env.params == {"max_steps_in_episode": 200}


def test_malformed_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("algo: ppo\nenv: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml is not valid YAML"):
        load_config(path)


def test_yaml_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(path)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_unknown_env_param_is_reported_when_the_config_is_built():
    with pytest.raises(ConfigError, match=r"env\.params\.gravty.*Did you mean: gravity"):
        make_config("ppo", "CartPole-v1", {"env.params.gravty": 3.0})


def test_parse_override_reads_yaml_values():
    assert parse_override("agent.lr=3e-4") == ("agent.lr", 3e-4)
    assert parse_override("agent.priority='1'") == ("agent.priority", "1")  # quoted: a string, as written
    assert parse_override("agent.priority=1") == ("agent.priority", 1)
    assert parse_override("agent.hidden=[32, 32]") == ("agent.hidden", [32, 32])
    assert parse_override("agent.anneal_lr=false") == ("agent.anneal_lr", False)
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override("agent.lr")


def test_config_errors_are_value_errors():
    assert issubclass(rmtjax.ConfigError, ValueError)


@pytest.mark.parametrize("preset", rmtjax.config.available_presets())
def test_every_bundled_preset_builds_and_declares_its_algo(preset):
    algo = preset.split("_", 1)[0]
    env = yaml.safe_load((Path(rmtjax.config.__file__).parent / "configs" / f"{preset}.yaml").read_text())["env"]["id"]
    if env.startswith(("gymnasium:LunarLander", "gymnasium:BipedalWalker")):
        pytest.importorskip("Box2D", reason="Box2D presets need the box2d extra: pip install 'rmtjax[box2d]'")
    cfg = rmtjax.make_config(algo, env)
    assert cfg.algo == algo and cfg.env.id == env
    agent = rmtjax.agents.build_agent(cfg)
    assert agent.num_iterations >= 1
    # whole iterations: a preset never earns the rounding warning `train` gives a user's config
    assert cfg.train.total_steps == agent.num_iterations * agent.steps_per_iteration
