"""Periodic greedy evaluation inside the compiled loop (train.eval_every), best-by-evaluation
policies, single-file policies, `rmtjax compare`, progress (the compile line, the bar in pieces,
losses in the postfix) and the small habits of issue 35 (train's key, default envs, config
--env, notebooks, the total_steps rounding note). Small configs; one compiled run shared."""

import csv
import io
import json
import warnings
import zipfile

import jax
import numpy as np
import pytest

import rmtjax
from rmtjax import evaluation, limits, policyfile, stats
from rmtjax.cli import main
from rmtjax.config import ConfigError

EVAL = {"train.total_steps": 4096, "train.num_seeds": 2, "train.progress": False, "agent.rollout_len": 64,
        "train.eval_every": 5, "train.eval_episodes": 3, "env.normalize_obs": True, "train.num_chunks": 1}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """16 iterations of PPO, 2 seeds, evaluated after iterations 5, 10, 15 and 16; written to a run dir."""
    path = tmp_path_factory.mktemp("eval") / "run"
    cfg = rmtjax.make_config("ppo", "CartPole-v1", EVAL)
    result = rmtjax.train(cfg, run_dir=path)  # no key: train.seed's
    return {"config": cfg, "result": result, "path": path}


def test_evaluations_are_in_the_metrics_at_their_iterations(evaluated):
    r = evaluated["result"]
    ret = r.metrics["eval_return"]
    assert ret.shape == (2, 16) and r.metrics["eval_length"].shape == (2, 16)
    np.testing.assert_array_equal(r.eval_iterations, [5, 10, 15, 16])
    evaluated_at = np.isfinite(ret).all(axis=0)
    np.testing.assert_array_equal(np.flatnonzero(evaluated_at) + 1, [5, 10, 15, 16])
    assert np.isnan(ret[:, ~evaluated_at]).all() and np.isnan(r.metrics["eval_length"][:, ~evaluated_at]).all()
    # CartPole pays 1 a step: a greedy episode's return is its length
    np.testing.assert_allclose(ret[:, evaluated_at], r.metrics["eval_length"][:, evaluated_at])
    assert (ret[:, evaluated_at] >= 8).all()
    # the best evaluation of each seed, and when
    np.testing.assert_array_equal(np.asarray(r.state.best_return), r.eval_return.max(axis=1))
    np.testing.assert_array_equal(np.asarray(r.state.best_iteration), r.eval_iterations[r.eval_return.argmax(axis=1)])


def test_the_last_evaluation_is_the_greedy_runner_on_the_final_parameters(evaluated):
    r, cfg = evaluated["result"], evaluated["config"]
    from rmtjax.agents import build_agent
    from rmtjax.envs import make_env
    import dataclasses

    agent = build_agent(cfg)
    env = make_env(dataclasses.replace(cfg.env, num_envs=3))
    run = evaluation.greedy_runner(agent, env, 3, env.spec.max_episode_steps)
    keys = jax.vmap(lambda k: jax.random.fold_in(k, 15))(r.state.eval_key)  # after iteration 16: t = 15
    returns, lengths, finished = jax.jit(run)(r.state.params, r.state.env_state.obs_stats, keys)
    np.testing.assert_allclose(r.metrics["eval_return"][:, -1], np.asarray(returns).mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(r.metrics["eval_length"][:, -1], np.asarray(lengths).mean(axis=1), rtol=1e-6)


def test_the_run_directory_keeps_the_evaluations_and_the_best_parameters(evaluated):
    r, path = evaluated["result"], evaluated["path"]
    summary = json.loads((path / "summary.json").read_text())
    np.testing.assert_allclose(summary["best_eval_return"], np.asarray(r.state.best_return), rtol=1e-6)
    assert summary["best_eval_iteration"] == np.asarray(r.state.best_iteration).tolist()
    rows = list(csv.DictReader(io.StringIO((path / "metrics.csv").read_text())))
    by_iteration = {int(x["iteration"]): x for x in rows if x["seed"] == "1"}
    assert by_iteration[4]["eval_return"] == "nan"
    assert float(by_iteration[10]["eval_return"]) == pytest.approx(float(r.metrics["eval_return"][1, 9]))

    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32) * 0.3
    loaded = rmtjax.load_run(path)
    np.testing.assert_array_equal(np.asarray(loaded.state.best_return), np.asarray(r.state.best_return))
    for seed in (0, 1):
        best = rmtjax.load_policy(path, seed, which="best")
        # the best policy is make_policy on the seed's best parameters, which differ from its last ones
        direct = rmtjax.make_policy(r.config, evaluation.best_state(r.state), seed)
        np.testing.assert_array_equal(np.asarray(best(obs)), np.asarray(direct(obs)))
        np.testing.assert_array_equal(np.asarray(rmtjax.load_policy(path, seed)(obs)),
                                      np.asarray(r.policy(seed)(obs)))
    last_iteration = np.asarray(r.state.best_iteration) == 16
    same = jax.tree.leaves(jax.tree.map(lambda a, b: np.all(np.asarray(a) == np.asarray(b), axis=tuple(range(1, a.ndim))),
                                        r.state.best_params, r.state.params))
    np.testing.assert_array_equal(np.all(same, axis=0), last_iteration)
    with pytest.raises(ConfigError, match="which: expected 'last'"):
        rmtjax.load_policy(path, which="first")


def test_rmtjax_eval_plays_the_best_parameters(evaluated, capsys):
    path, r = evaluated["path"], evaluated["result"]
    assert main(["eval", str(path), "--episodes", "2", "--which", "best"]) == 0
    best = capsys.readouterr().out
    import dataclasses

    best_run = dataclasses.replace(rmtjax.load_run(path), state=evaluation.best_state(r.state))
    want = rmtjax.evaluate(best_run, episodes=2, key=jax.random.key(0))
    assert f"mean return {want.mean:.2f}" in best


def test_which_best_without_evaluation_is_refused():
    with pytest.raises(ConfigError, match=r"which='best': this run has no periodic evaluation \(train.eval_every: 0\)"):
        evaluation.best_state(object())


def test_a_policy_file_holds_one_seed_and_reads_back_without_code(evaluated, tmp_path, capsys):
    path = evaluated["path"]
    out = tmp_path / "agent.policy"
    assert main(["export", str(path), str(out), "--seed", "1", "--which", "best"]) == 0
    assert "one file" in capsys.readouterr().out
    obs = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32) * 0.3
    want = rmtjax.load_policy(path, 1, which="best")(obs)
    np.testing.assert_array_equal(np.asarray(rmtjax.load_policy(out)(obs)), np.asarray(want))
    config, params, stats_ = policyfile.read(out)
    assert config.train.num_seeds == 1 and config.algo == "ppo" and stats_ is not None

    # an object array (which would need pickle to read) is refused, not unpickled
    bad = tmp_path / "pickled.policy"
    buf = io.BytesIO()
    np.savez(buf, format=np.asarray(policyfile.FORMAT), evil=np.array([{"a": 1}], dtype=object))
    bad.write_bytes(buf.getvalue())
    with pytest.raises(policyfile.PolicyFileError, match="is not a policy file"):
        rmtjax.load_policy(bad)
    other = tmp_path / "other.policy"
    buf = io.BytesIO()
    np.savez(buf, format=np.asarray("something-else"))
    other.write_bytes(buf.getvalue())
    with pytest.raises(policyfile.PolicyFileError, match="is not a policy file of format rmtjax-policy-1"):
        rmtjax.load_policy(other)
    # a file whose arrays do not fit its config's agent
    with zipfile.ZipFile(out) as z:
        members = {n: z.read(n) for n in z.namelist()}
    cut = tmp_path / "cut.policy"
    with zipfile.ZipFile(cut, "w") as z:
        for n, data in members.items():
            if not n.startswith("params/") or n == sorted(m for m in members if m.startswith("params/"))[0]:
                z.writestr(n, data)
    with pytest.raises(policyfile.PolicyFileError, match=r"params/.* is missing"):
        rmtjax.load_policy(cut)


def test_train_takes_train_seed_or_an_integer_key(evaluated):
    cfg, ref = evaluated["config"], evaluated["result"]
    again = rmtjax.train(cfg, 0)  # train.seed is 0: the fixture's run; the program comes from the cache
    for k in ref.metrics:
        np.testing.assert_array_equal(again.metrics[k], ref.metrics[k], err_msg=k)
    with pytest.raises(ConfigError, match=r"key: an integer seed must be in \[0, 2147483647\], got -1"):
        rmtjax.train(cfg, -1)
    with pytest.raises(ConfigError, match="key: expected a PRNG key .* got str"):
        rmtjax.train(cfg, "0")


def test_the_bar_in_pieces_is_the_same_run_and_shows_losses(evaluated, capfd):
    cfg, ref = evaluated["config"], evaluated["result"]
    shown = rmtjax.train(cfg, 0, progress=True)  # one chunk of 16 iterations: the bar moves within it
    err = capfd.readouterr().err
    assert "compiling ppo on CartPole-v1 …" in err and "compiled ppo on CartPole-v1 in " in err
    assert "policy_loss=" in err and "value_loss=" in err and "eval=" in err
    for k in ref.metrics:
        np.testing.assert_array_equal(shown.metrics[k], ref.metrics[k], err_msg=k)


class _Bar:
    def __init__(self):
        self.n, self.seen = 0, []

    def update(self, k):
        self.n += k
        self.seen.append(self.n)


def _fake_chunk(max_length, overhead_seconds):
    """A compiled chunk's interface, in numpy: a call costs `overhead_seconds` beside its iterations."""
    import time

    from rmtjax.driver import PackedMetrics

    def chunk(state, start, length):
        start, length = int(start), int(length)
        time.sleep(overhead_seconds + 0.002 * length)
        rows = np.zeros((max_length, 1, 1), np.int64)
        rows[:length, 0, 0] = np.arange(start, start + length)
        return state + length, PackedMetrics({"int64": rows}, (("int64", ("t",)),))

    return chunk


def test_the_pacer_splits_a_chunk_only_where_it_costs_nothing_measurable():
    from rmtjax.driver import _Pacer

    pacer, bar = _Pacer(), _Bar()
    pacer.PIECE_SECONDS = 0.02
    state, metrics = pacer.run(_fake_chunk(64, 0.0), 0, 0, 64, bar, 1)
    assert state == 64
    np.testing.assert_array_equal(metrics["t"][:, 0], np.arange(64))  # the pieces make up the chunk, in order
    assert bar.seen and bar.seen[0] == 4 and bar.seen[-1] < 64  # first a sixteenth, then more pieces
    # a call's overhead above the first chunk's allowance: one call (after the probe)
    slow, bar = _Pacer(), _Bar()
    state, metrics = slow.run(_fake_chunk(64, 0.2), 0, 0, 64, bar, 1)
    assert state == 64 and bar.seen == [] and metrics["t"].shape == (64, 1)


@pytest.mark.filterwarnings("ignore:train.total_steps")
def test_compare_tables_the_greedy_evaluations_and_writes_its_outputs(tmp_path):
    out = tmp_path / "cmp"
    result = rmtjax.compare(["dqn", "pqn"], ["CartPole-v1"], seeds=2, overrides={"train.total_steps": 4096},
                            eval_episodes=2, eval_points=2, out_dir=out, progress=False)
    rows = result.table()
    assert [(r["algo"], r["env"], r["seeds"]) for r in rows] == [("dqn", "CartPole-v1", 2), ("pqn", "CartPole-v1", 2)]
    for entry, row in zip(result.entries, rows):
        assert entry.eval_return.shape == (2,) and not entry.stopped_by_budget
        mid, lo, hi = stats.iqm_ci(entry.eval_return)
        assert (row["eval_iqm"], row["eval_lo"], row["eval_hi"]) == (mid, lo, hi)
        assert lo <= mid <= hi and row["env_steps"] == entry.curve_steps[-1] > 0
        assert row["steps_per_second"] > 0 and row["wall_seconds"] >= row["compile_seconds"] > 0
        assert entry.eval_curve.shape == (2, 2) and entry.config.train.eval_every > 0
        np.testing.assert_array_equal(entry.eval_curve[:, -1], entry.eval_return)
    dqn = result.entries[0]  # 4 env steps an iteration: no episode has ended after the first
    assert np.isnan(dqn.curve_return[:, 0]).all() and np.isfinite(dqn.curve_return[:, -1]).all()
    table = (out / "compare.md").read_text()
    assert "| dqn | CartPole-v1 | 2 |" in table and "greedy eval IQM [95% CI]" in table
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "results.json").read_text())
    assert saved["entries"][1]["eval_return"] == pytest.approx(result.entries[1].eval_return.tolist())
    with pytest.raises(ConfigError, match="already holds a comparison"):
        rmtjax.compare(["dqn"], ["CartPole-v1"], out_dir=out)


def test_compare_with_a_budget_stops_each_agent_and_evaluates_it(tmp_path, capsys):
    code = main(["compare", "--algos", "pqn", "--envs", "CartPole-v1", "--seeds", "2", "--budget-seconds", "0.3",
                 "--total-steps", "2000000", "--eval-episodes", "2", "--out", str(tmp_path / "b"), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0 and "(budget)" in out and "trained for 0.3 s of wall-clock" in out
    saved = json.loads((tmp_path / "b" / "results.json").read_text())["entries"][0]
    assert saved["stopped_by_budget"] and 0 < saved["env_steps"] < 2_000_000
    assert len(saved["eval_return"]) == 2 and all(x >= 1 for x in saved["eval_return"])
    assert main(["compare", "--algos", "pqn", "--budget-seconds", "0", "--out", str(tmp_path / "c")]) == 2
    assert "--budget-seconds: expected a number of seconds > 0" in capsys.readouterr().err


def test_a_budget_stops_within_a_chunk_and_the_pieces_it_ran_are_the_uninterrupted_run():
    # one chunk of 2,000 iterations: the budget can only stop it by running the chunk in pieces
    cfg = rmtjax.make_config("dqn", "CartPole-v1", {
        "train.total_steps": 16_000, "train.num_chunks": 1, "train.progress": False, "train.num_seeds": 2,
        "env.num_envs": 8, "agent.hidden": [16], "agent.learning_starts": 64, "agent.batch_size": 32,
        "agent.buffer_size": 2_000})
    whole = rmtjax.train(cfg, 3)
    cut = rmtjax.train(cfg, 3, budget_seconds=0.05)
    n = cut.metrics["env_steps"].shape[1]
    assert 1 <= n < whole.metrics["env_steps"].shape[1] == 2_000
    assert cut.run_seconds < whole.run_seconds
    for name, rows in cut.metrics.items():
        np.testing.assert_array_equal(rows, whole.metrics[name][:, :n], err_msg=name)
    with pytest.raises(ConfigError, match="budget_seconds: expected a number of seconds > 0"):
        rmtjax.train(cfg, 3, budget_seconds=float("inf"))


def test_a_budget_is_refused_across_processes(monkeypatch):
    cfg = rmtjax.make_config("dqn", "CartPole-v1", {"train.total_steps": 1_000, "train.progress": False})
    monkeypatch.setattr(jax, "process_count", lambda: 2)  # as jax.distributed would say with two processes
    with pytest.raises(ConfigError, match="each process would time the budget on its own"):
        rmtjax.train(cfg, 0, budget_seconds=5)


def test_recurrent_agents_are_evaluated_with_their_memory():
    cfg = rmtjax.make_config("ppo", "MemoryChain-bsuite", {
        "env.params": {"memory_length": 3}, "env.num_envs": 4, "train.num_seeds": 2, "train.progress": False,
        "agent.torso": "gru", "agent.rnn_width": 8, "agent.hidden": [8], "agent.rollout_len": 8,
        "agent.num_minibatches": 1, "agent.num_epochs": 1, "train.total_steps": 128,
        "train.eval_every": 2, "train.eval_episodes": 3})
    r = rmtjax.train(cfg, 0)
    np.testing.assert_array_equal(r.eval_iterations, [2, 4])
    np.testing.assert_array_equal(r.metrics["eval_length"][:, [1, 3]], 4)  # MemoryChain: 4 steps an episode
    assert (np.abs(r.eval_return) <= 1).all()  # one reward of ±1 per episode
    policy = r.policy(1, which="best")
    from rmtjax.envs import make_env

    action, carry = policy(np.zeros(make_env(cfg.env).spec.obs_shape, np.float32))
    assert action.shape == () and jax.tree.leaves(carry)[0].shape == (1, 8)


def test_default_envs_and_preset_values_in_rmtjax_config(capsys):
    assert rmtjax.make_config("sac").env.id == "Pendulum-v1"
    assert rmtjax.make_config("ppo").env.id == "CartPole-v1"
    assert main(["train", "--algo", "sac", "--print-config"]) == 0
    assert "id: Pendulum-v1" in capsys.readouterr().out
    preset = rmtjax.make_config("sac", "Pendulum-v1")
    assert main(["config", "train", "--algo", "sac"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("train:") and "(values for sac on Pendulum-v1: preset sac_Pendulum-v1.yaml;" in out
    assert f"train.total_steps: int = {preset.train.total_steps} (default 500000)" in out
    assert main(["config", "agent", "--algo", "rmt", "--env", "CartPole-v1"]) == 0
    out = capsys.readouterr().out
    assert "preset rmt_CartPole-v1.yaml" in out and "agent (rmt):" in out
    lr = rmtjax.make_config("rmt", "CartPole-v1").agent.lr
    assert f"agent.lr: float = {lr!r}" in out


def test_notebooks_says_which_files_it_kept(tmp_path, capsys):
    assert main(["notebooks", str(tmp_path / "nb")]) == 0
    assert "kept" not in capsys.readouterr().out
    (tmp_path / "nb" / "02_sweeps.ipynb").write_text("mine")
    assert main(["notebooks", str(tmp_path / "nb")]) == 0
    out = capsys.readouterr().out
    assert "02_sweeps.ipynb (kept: a file of this name was already there; not overwritten)" in out
    assert "kept 3 existing file(s) unchanged" in out
    assert (tmp_path / "nb" / "02_sweeps.ipynb").read_text() == "mine"


def test_whole_iteration_rounding_names_the_callers_line():
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {"train.total_steps": 1000, "agent.rollout_len": 64,
                                                    "train.progress": False})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rmtjax.make_train(cfg)
    said = [w for w in seen if issubclass(w.category, limits.ConfigWarning)]
    assert len(said) == 1 and said[0].filename == __file__
    assert "the run trains 3 iteration(s) = 768 env steps per seed" in str(said[0].message)


def test_loggers_leave_out_iterations_without_an_evaluation():
    from rmtjax.loggers import scalars

    chunk = {"episode_return": np.array([[1.0, 2.0], [3.0, 4.0]]),
             "eval_return": np.array([[np.nan, np.nan], [5.0, 7.0]])}
    assert "eval_return/mean" not in scalars(chunk, 0)
    assert scalars(chunk, 1)["eval_return/mean"] == 6.0


def test_a_resumed_run_keeps_its_best_parameters(tmp_path):
    cfg = rmtjax.make_config("ppo", "CartPole-v1", {**EVAL, "train.num_chunks": 2})  # checkpoints at 8 and 16
    whole = rmtjax.train(cfg, 0)

    class Stop(Exception):
        pass

    def stop_after_first(state, chunks, done):
        raise Stop

    with pytest.raises(Stop):
        rmtjax.train(cfg, 0, run_dir=tmp_path / "r", on_chunk=stop_after_first)
    resumed = rmtjax.train(None, resume=tmp_path / "r")
    for k in whole.metrics:
        np.testing.assert_array_equal(resumed.metrics[k], whole.metrics[k], err_msg=k)
    for a, b in zip(jax.tree.leaves(resumed.state.best_params), jax.tree.leaves(whole.state.best_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(resumed.state.best_iteration), np.asarray(whole.state.best_iteration))


def test_an_agent_of_the_protocol_only_is_evaluated_under_the_meta_layer():
    import tests.toy_agent  # noqa: F401 (registers algo: toy)

    cfg = rmtjax.Config.from_dict({
        "algo": "toy", "env": {"id": "CartPole-v1", "num_envs": 8},
        "train": {"total_steps": 4000, "num_seeds": 2, "num_chunks": 2, "progress": False, "eval_every": 100,
                  "eval_episodes": 2},
        "agent": {}, "meta": {"mode": "rules", "warmup": 2, "interval": 2, "lr_max": 0.1}})
    r = rmtjax.train(cfg, 0)
    n = r.metrics["env_steps"].shape[1]
    np.testing.assert_array_equal(r.eval_iterations, [*range(100, n + 1, 100), *([n] if n % 100 else [])])
    assert "meta_explore" in r.metrics and (r.eval_return >= 8).all()  # CartPole: at least 8 steps an episode
    assert np.asarray(r.state.best_return).shape == (2,)


def test_configs_without_evaluation_are_written_as_before():
    # run directories written before train.eval_every existed hold no such keys; a resume compares key by key
    cfg = rmtjax.make_config("ppo")
    assert not {"eval_every", "eval_episodes"} & set(cfg.to_dict()["train"])
    assert rmtjax.Config.from_dict(cfg.to_dict()) == cfg
    on = cfg.override({"train.eval_every": 3})
    assert on.to_dict()["train"]["eval_every"] == 3 and rmtjax.Config.from_dict(on.to_dict()) == on
    assert on.differences(cfg) == [("train.eval_every", 3, "<unset>")]


def test_importing_the_compare_and_sweep_modules_keeps_the_functions_callable():
    import subprocess
    import sys

    code = ("import rmtjax.compare, rmtjax.sweep, rmtjax\n"
            "from rmtjax.compare import compare\n"
            "assert rmtjax.compare.compare is compare and rmtjax.compare.__call__\n"
            "try:\n    rmtjax.compare(seeds=0)\nexcept rmtjax.ConfigError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("refused: seeds: expected an integer")
