"""The benchmark suite's bookkeeping: which agent runs where, learning-curve masking, AUC, steps to a threshold."""

from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.experiments.suite import FULL, QUICK, Run, fits, normalise, parse_args


def fake_run(returns, counts, env="CartPole-v1", num_envs=2, steps_per_iter=10):
    returns, counts = np.asarray(returns, float), np.asarray(counts)
    iters = returns.shape[1]
    metrics = {"episode_return": returns, "episode_count": counts,
               "env_steps": np.tile(np.arange(1, iters + 1) * steps_per_iter, (returns.shape[0], 1))}
    cfg = SimpleNamespace(env=SimpleNamespace(num_envs=num_envs), train=SimpleNamespace(num_seeds=returns.shape[0]))
    result = SimpleNamespace(metrics=metrics, config=cfg, final_return=returns[:, -1], env_steps=iters * steps_per_iter,
                             run_seconds=1.0, compile_seconds=0.0)
    return Run("ppo", env, [], result, 1.0)


def test_agents_run_only_where_their_action_space_fits():
    assert fits("dqn", "CartPole-v1") and not fits("dqn", "Pendulum-v1")
    assert fits("sac", "MountainCarContinuous-v0") and not fits("sac", "Breakout-MinAtar")
    assert fits("rmt", "Pendulum-v1") and fits("ppo", "Acrobot-v1")


def test_curve_leaves_out_iterations_before_the_envs_finished_episodes():
    # seed 0: both envs done by iteration 2; seed 1: only by iteration 4
    run = fake_run([[0, 50, 100, 200, 300, 400, 500, 500, 500, 500]] * 2,
                   [[0, 2, 0, 1, 0, 0, 0, 0, 0, 0], [0, 1, 0, 1, 0, 0, 0, 0, 0, 0]])
    c = run.curve()
    assert np.isnan(c[0, 0]) and c[0, 1] == 50
    assert np.isnan(c[1, :3]).all() and c[1, 3] == 200
    # AUC: the mean of the normalised points that remain (ten points, one per iteration here)
    lo, hi = 22.0, 500.0
    expect0 = np.mean((np.array([50, 100, 200, 300, 400, 500, 500, 500, 500]) - lo) / (hi - lo))
    assert run.auc()[0] == pytest.approx(expect0)
    assert run.auc()[1] == pytest.approx(np.mean((np.array([200, 300, 400] + [500] * 4) - lo) / (hi - lo)))
    np.testing.assert_array_equal(run.episodes, [3, 2])


def test_auc_is_nan_for_a_seed_that_never_finished_an_episode():
    run = fake_run([[0] * 10, [10] * 10], [[0] * 10, [1] * 10], num_envs=1)
    assert np.isnan(run.auc()[0]) and np.isfinite(run.auc()[1])


def test_steps_to_threshold_is_the_first_iteration_reaching_it_or_inf():
    run = fake_run([[-200, -200, -150, -200], [-200] * 4, [0, 0, 0, 0]], [[1] * 4, [1] * 4, [0] * 4], num_envs=1)
    s = run.steps_to(-199.5)
    assert s[0] == 30 and np.isinf(s[1])
    assert np.isinf(s[2])  # zeros before any finished episode are no success


def test_normalised_score_maps_the_reference_range_to_unit_interval():
    np.testing.assert_allclose(normalise("Acrobot-v1", [-500.0, -60.0]), [0.0, 1.0])


def test_quick_budget_gives_every_agent_equal_steps_on_an_env():
    args, budget = parse_args(["--quick"])
    assert budget is QUICK and args.sections == ["curves", "ablations", "throughput", "claims"]
    assert set(QUICK.steps) == set(FULL.steps) == set(args.envs)
    assert parse_args(["--full", "--sections", "claims", "curves"])[0].sections == ["curves", "claims"]


def test_claims_table_reads_every_claim_from_the_runs(monkeypatch):
    from benchmarks.experiments import suite as suite_module

    calls = []

    def run(algo, env, steps, sets, tag=""):
        calls.append((algo, env, list(sets)))
        r = fake_run([[-200, -150, -120, -100]] * 4 if env == "MountainCar-v0" else [[10, 120, 300, 480]] * 4,
                     [[4, 4, 4, 4]] * 4, env=env, num_envs=4)
        r.result.metrics["top_td_share"] = np.full((4, 4), 0.1 if "agent.replay=uniform" in sets else 0.6)
        if "agent.exploration=eps_greedy" in sets:  # finds the flag later
            r.result.metrics["episode_return"] = np.array([[-200, -200, -200, -150]] * 4, float)
        if "meta.mode=rules" in sets and env == "Pendulum-v1":
            r.result.final_return = np.full(4, -600.0)
        elif env == "Pendulum-v1":
            r.result.final_return = np.full(4, -1000.0)
        return r

    suite = SimpleNamespace(budget=QUICK, args=SimpleNamespace(mode="quick", ablation_envs=("CartPole-v1",)), run=run,
                            throughput={"ppo": {"rmtjax": {"sps": 30_000.0}, "sb3": {"sps": 1_000.0}}},
                            log=lambda msg: None, header=lambda title: ["# ", "", "- machine: test"])
    monkeypatch.setattr(suite_module, "env_step_times", lambda: {"gymnax_1": 2.0, "gymnax_64": 0.05, "gymnasium_1": 20.0,
                                                           "gymnasium_64": 0.5})
    text = suite_module.claims_table(suite)
    lines = text.splitlines()
    rows = lines[lines.index("|---|---|---|---|") + 1:][:6]
    assert all(row.count(" | ") == 3 for row in rows), "four cells, no stray pipes"
    assert len(rows) == 6
    assert "uniform 10.0% → tiered 60.0%" in rows[0] and "| supported |" in rows[0]
    assert "+40%" in rows[1]  # -1000 -> -600
    assert "ε only ÷ ε+Boltzmann = 2.00×" in rows[3]
    assert "10.0× at 1 env" in rows[4] and "PPO 30.0×" in rows[5]
    # the fractal-vs-residual claim names the fractal torso: RMT's default and CartPole preset are one dense layer
    torsos = [dict(x.split("=") for x in sets).get("agent.torso") for algo, env, sets in calls
              if env == "CartPole-v1" and "meta.mode=rules" not in sets]
    assert torsos == ["dense_fractal", "residual"]


def test_median_steps_lists_every_seed_sorted_with_never_for_a_miss():
    from benchmarks.experiments.suite import _median_steps

    text = _median_steps(np.array([120_000.0, np.inf, 98_500.0]))
    assert text == "120,000 (2/3 seeds reached; per seed, sorted: 98.5k, 120.0k, never)"
