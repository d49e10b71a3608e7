import types

import numpy as np
import pytest

from benchmarks.experiments.choose import steps_to_threshold, time_to_threshold


def test_time_to_threshold_counts_compile_and_the_share_of_the_run_until_the_first_evaluation_at_it():
    ret = np.array([[10.0, 480.0, 500.0], [10.0, 20.0, 30.0], [475.0, 400.0, 490.0]])
    result = types.SimpleNamespace(eval_iterations=np.array([10, 20, 40]), eval_return=ret,
                                   metrics={"env_steps": np.zeros((3, 40))}, compile_seconds=5.0, run_seconds=8.0)
    t = time_to_threshold(result, 475.0)
    np.testing.assert_allclose(t[[0, 2]], [5.0 + 8.0 * 20 / 40, 5.0 + 8.0 * 10 / 40])
    assert np.isinf(t[1])  # never reached
    result.metrics["env_steps"] = np.arange(1, 41)[None, :] * np.array([[100], [100], [300]])  # [seeds, iterations]
    steps = steps_to_threshold(result, 475.0)
    np.testing.assert_array_equal(steps[[0, 2]], [20 * 100, 10 * 300])  # after iterations 20 and 10
    assert np.isinf(steps[1])


def test_the_minatar_aggregate_divides_each_games_iqm_by_the_best_and_resamples_seeds():
    from benchmarks.experiments.minatar_budget import aggregate

    scores = {"a": {"g1": np.array([1.0, 2.0, 3.0, 4.0]), "g2": np.array([10.0, 10.0, 10.0, 10.0])},
              "b": {"g1": np.array([4.0, 4.0, 4.0, 4.0]), "g2": np.array([5.0, 5.0, 5.0, 5.0])}}
    out = aggregate(scores, draws=300)
    # a: g1's IQM 2.5 of the best 4 (b), g2 the best itself; b: 1 on g1, 5/10 on g2
    assert out["a"][0] == 0.5 * (2.5 / 4 + 1.0)
    assert out["b"] == (0.75, 0.75, 0.75)  # constant seeds: no spread
    assert out["a"][1] < out["a"][0] <= out["a"][2]


def test_set_overrides_go_to_their_agent_or_to_all_and_a_preset_run_takes_them_and_its_key():
    from benchmarks.experiments.choose import train_preset
    from benchmarks.lib.runner import sets_per_algo

    sets = sets_per_algo(["rmt:agent.batch_size=64", "train.num_chunks=2", "dqn:agent.lr=1e-3"], ["rmt", "dqn", "pqn"])
    assert sets == {"rmt": ["agent.batch_size=64", "train.num_chunks=2"],
                    "dqn": ["train.num_chunks=2", "agent.lr=1e-3"], "pqn": ["train.num_chunks=2"]}
    from benchmarks.lib.cli import UsageError
    with pytest.raises(UsageError, match="'rmtt' is not one of the agents run"):  # a typo is not dropped silently
        sets_per_algo(["rmtt:agent.lr=1e-3"], ["rmt", "dqn"])
    tiny = ["train.total_steps=2000", "agent.learning_starts=500", "agent.buffer_size=1000"]
    a = train_preset("dqn", "CartPole-v1", seeds=2, evals=2, sets=tiny, seed=3)
    assert (a.config.train.total_steps, a.config.agent.learning_starts, a.config.env.num_envs) == (2000, 500, 10)
    assert np.asarray(a.eval_return).shape == (2, 2)  # 2 seeds × 2 evaluations
    b = train_preset("dqn", "CartPole-v1", seeds=2, evals=2, sets=tiny, seed=4)
    assert not np.array_equal(np.asarray(a.metrics["episode_return"]), np.asarray(b.metrics["episode_return"]))
