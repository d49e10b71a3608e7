"""Property tests: malformed configs of every kind raise a ConfigError naming what is wrong,
never a raw KeyError/TypeError from deep inside."""

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmtjax.config import Config, ConfigError, load_config, make_config

VALID = make_config("ppo", "CartPole-v1").to_dict()
FIELDS = [(section, name) for section in ("env", "train", "agent") for name in VALID[section]]
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

junk = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.integers(), st.floats(),
    st.text(max_size=12), st.lists(st.one_of(st.integers(-5, 100), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.text(max_size=6), st.one_of(st.integers(), st.text(max_size=3)), max_size=2),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
anything = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=4)),
    max_leaves=20)


def build_or_config_error(data):
    """Config.from_dict(data): a Config, or the ConfigError it raised (anything else fails the test)."""
    try:
        return Config.from_dict(data)
    except ConfigError as e:
        assert str(e).strip()
        return e


@FUZZ
@given(st.sampled_from(FIELDS), junk)
def test_a_bad_value_is_reported_with_its_field(field, value):
    section, name = field
    data = copy.deepcopy(VALID)
    data[section][name] = value
    out = build_or_config_error(data)
    if isinstance(out, ConfigError):
        assert f"{section}.{name}" in str(out), (field, value, str(out))
    else:  # accepted: the value must have been stored as the field's own type
        stored = getattr(getattr(out, section), name)
        assert type(stored) is type(getattr(getattr(make_config("ppo", "CartPole-v1"), section), name))


@FUZZ
@given(st.sampled_from(["env", "train", "agent", None]), st.text(min_size=1, max_size=12), junk)
def test_an_unknown_key_is_reported_by_name(section, key, value):
    data = copy.deepcopy(VALID)
    if section is None:
        if key in data:
            return
        data[key] = value
        expected = f"unknown key {key}"
    else:
        if key in data[section]:
            return
        data[section][key] = value
        expected = f"unknown key {section}.{key}"
    with pytest.raises(ConfigError) as err:
        Config.from_dict(data)
    assert expected in str(err.value)


@FUZZ
@given(st.sampled_from(["algo", "env", "train", "agent"]), junk)
def test_a_section_that_is_not_a_mapping_is_reported(section, value):
    if value is None and section != "algo":
        return  # an absent section means the defaults
    if isinstance(value, dict) and section != "algo":
        return  # a mapping: covered by the field and key tests
    data = copy.deepcopy(VALID)
    data[section] = value
    out = build_or_config_error(data)
    if section == "algo" and value == "ppo":
        assert isinstance(out, Config)
    else:
        assert isinstance(out, ConfigError) and section in str(out)


@FUZZ
@given(anything)
def test_any_structure_is_a_config_or_a_config_error(data):
    build_or_config_error(data)


@FUZZ
@given(st.dictionaries(st.sampled_from(["algo", "env", "train", "agent"]), anything, max_size=4))
def test_any_sections_are_a_config_or_a_config_error(data):
    data = {"algo": "ppo", **data} if data.get("algo") is None else data
    build_or_config_error(data)


def _load_text(tmp_path, text):
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    try:
        return load_config(path)
    except ConfigError as e:
        assert str(e).strip()
        return e


VALID_YAML = yaml.safe_dump(VALID, sort_keys=False)


@FUZZ
@given(st.integers(0, len(VALID_YAML)), st.integers(0, 40), st.text(max_size=6))
def test_mangled_yaml_is_a_config_or_a_config_error(tmp_path_factory, at, cut, insert):
    text = VALID_YAML[:at] + insert + VALID_YAML[at + cut:]
    _load_text(tmp_path_factory.mktemp("y"), text)


@FUZZ
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_any_file_contents_are_a_config_or_a_config_error(tmp_path_factory, text):
    _load_text(tmp_path_factory.mktemp("y"), text)


def test_broken_yaml_names_the_file_and_the_place(tmp_path):
    out = _load_text(tmp_path, "algo: ppo\nagent:\n  lr: [0.1\n")
    assert isinstance(out, ConfigError) and "fuzz.yaml is not valid YAML" in str(out) and "line" in str(out)


def test_text_that_is_not_utf8_is_reported(tmp_path):
    out = _load_text(tmp_path, b"algo: ppo\n\xff\xfe")
    assert isinstance(out, ConfigError) and "not a text (UTF-8) file" in str(out)


def test_deeply_nested_yaml_is_reported(tmp_path):
    out = _load_text(tmp_path, "algo: ppo\nenv: " + "[" * 5000 + "]" * 5000 + "\n")
    assert isinstance(out, ConfigError) and ("nested too deeply" in str(out) or "env" in str(out))


def test_a_falsy_section_is_not_taken_for_the_defaults():
    data = copy.deepcopy(VALID)
    data["train"] = 0
    with pytest.raises(ConfigError, match=r"train: expected a mapping of settings, got 0"):
        Config.from_dict(data)


def test_integers_beyond_32_bits_are_out_of_range():
    with pytest.raises(ConfigError, match=r"train\.total_steps: 4294967296 is out of range; allowed \[1, 2147483647\]"):
        make_config("ppo", "CartPole-v1", {"train.total_steps": 2**32})


def test_env_params_are_type_checked_when_the_config_is_built():
    with pytest.raises(ConfigError, match=r"env\.params\.gravity: expected a number \(like the default 9\.8\), got 'x'"):
        make_config("ppo", "CartPole-v1", {"env.params.gravity": "x"})
    with pytest.raises(ConfigError, match=r"env\.params\.available_torque: expected a list of 3 values"):
        make_config("ppo", "Acrobot-v1", {"env.params.available_torque": [1.0]})
    params = make_config("ppo", "CartPole-v1", {"env.params.max_steps_in_episode": 2e2}).env.params
    assert params == {"max_steps_in_episode": 200} and isinstance(params["max_steps_in_episode"], int)


# -- issue 20: the command line's flags and the sizes a config asks for ------------------------
FLAG_VALUES = st.one_of(st.integers(-(2**70), 2**70).map(str), st.floats().map(str), st.text(max_size=10))


def _cli(argv):
    import contextlib
    import io

    from rmtjax.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip() and not ln.startswith("rmtjax: warning:")]
    return code, lines


def _flag_ok(text, lo, hi):
    try:
        value = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            return False
        if not (f == f and abs(f) != float("inf") and f.is_integer()):
            return False
        value = int(f)
    return lo <= value <= hi


@FUZZ
@given(st.sampled_from([("eval", "--seed", 0), ("eval", "--episodes", 1), ("eval", "--max-steps", 1),
                        ("train", "--seed", 0)]), FLAG_VALUES)
def test_any_flag_value_is_accepted_in_range_or_one_line_naming_the_flag(tmp_path_factory, which, text):
    command, flag, lo = which
    missing = str(tmp_path_factory.mktemp("cli") / "no-run")
    argv = ["eval", missing, f"{flag}={text}"] if command == "eval" else ["train", "--resume", missing, f"{flag}={text}"]
    code, lines = _cli(argv)
    assert code == 2 and len(lines) == 1, lines
    if _flag_ok(text, lo, 2**31 - 1):
        assert "no-run does not exist" in lines[0], lines  # the value passed; the missing run was next
    else:
        assert lines[0].startswith(f"rmtjax: config error: {flag}: expected an integer in [{lo}, 2,147,483,647]"), lines


@FUZZ
@given(st.text(max_size=12))
def test_any_run_directory_name_is_made_inside_or_refused_in_one_line(name):
    import os
    import tempfile
    from pathlib import Path

    import jax

    from rmtjax.cli import describe_os_error
    from rmtjax.rundir import RunDir, RunDirError

    cfg = make_config("ppo", "CartPole-v1", {"train.total_steps": 512, "agent.rollout_len": 64})
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            run = RunDir.create(f"sub/{name}", cfg, jax.random.key(0))
        except RunDirError as e:
            assert "\n" not in str(e)
        except OSError as e:
            assert "\n" not in describe_os_error(e)
        else:
            run.close()
            assert Path(run.path).resolve().is_relative_to(Path(tmp).resolve())
            assert (run.path / "config.yaml").is_file()
        finally:
            os.chdir(cwd)


SIZES = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SIZES
@given(st.sampled_from(["ppo", "dqn", "rmt"]), st.integers(1, 2**31 - 1), st.integers(1, 2**31 - 1),
       st.integers(16, 2**31 - 1), st.lists(st.integers(1, 2**20), min_size=1, max_size=3))
def test_any_sizes_are_refused_before_compiling_exactly_when_the_state_cannot_fit(algo, seeds, envs, buffer, hidden):
    import os
    import time

    from rmtjax import limits
    from rmtjax.driver import Program

    overrides = {"train.num_seeds": seeds, "env.num_envs": envs, "agent.hidden": hidden, "train.total_steps": 2**31 - 1}
    if algo != "ppo":
        overrides["agent.buffer_size"] = buffer
    try:
        cfg = make_config(algo, "CartPole-v1", overrides)
    except ConfigError as e:
        assert str(e).strip()
        return
    os.environ[limits.ENV_MEMORY_LIMIT] = "4e9"
    try:
        t0 = time.perf_counter()
        program = Program(cfg)
        agent, init = program.agent, program.init
        try:
            estimate = limits.check_train_fits(cfg, agent, init)
        except limits.MemoryLimitError as e:
            assert "there is 4.0 GB ($RMTJAX_MEMORY_LIMIT)" in str(e)
            parts = limits._parts(limits.state_shapes(cfg, init))
            need = sum(parts.values()) + limits._rollout_bytes(cfg, agent) + limits._activation_bytes(cfg)
            assert need > 4e9
        else:
            assert estimate <= 4e9
        assert time.perf_counter() - t0 < 5
    finally:
        del os.environ[limits.ENV_MEMORY_LIMIT]
