"""The headline table (benchmarks/reports/headline_table.py, run by benchmarks/experiments/headline.py):
every row (CPU and --gpu) is a valid config; pieces run apart add up to one table.
(`python -m benchmarks headline --smoke` trains three of them for real; about a minute.)"""

import argparse

import numpy as np

import pytest

pytest.importorskip("Box2D", reason="the headline table's Box2D rows need the box2d extra")
pytest.importorskip("ale_py", reason="the headline table's Atari rows need the atari extra")
pytest.importorskip("cv2", reason="the headline table's Atari rows need the atari extra")

from benchmarks.__main__ import main as bench  # noqa: E402
from benchmarks.experiments import headline as experiment  # noqa: E402
from benchmarks.reports import headline_table as headline  # noqa: E402


def args(**kw):
    base = dict(smoke=False, gpu=False, repro=False, steps=1_000_000, atari_steps=200_000, envs=None, algos=None)
    return argparse.Namespace(**{**base, **kw})


def test_the_cpu_table_has_every_row_of_the_issue_and_each_builds():
    rows = headline.rows_to_run(args())
    assert {(e, a) for e, a, _ in rows} == {
        ("gymnasium:LunarLander-v3", a) for a in ("rmt", "ppo", "dqn", "pqn")} | {
        (e, a) for e in ("gymnasium:LunarLanderContinuous-v3", "gymnasium:BipedalWalker-v3") for a in ("rmt", "ppo", "sac")
    } | {("atari:Breakout", a) for a in ("rmt", "dqn", "pqn", "ppo")}
    for env, algo, steps in rows:
        cfg, source = headline.config_for(env, algo, steps, 5, smoke=False)
        assert cfg.train.num_seeds == 5 and cfg.train.total_steps <= steps
        assert cfg.train.total_steps > 0.99 * steps  # whole iterations, within 1% of the budget
        if env == "atari:Breakout":
            assert cfg.agent.torso == "nature_cnn" and cfg.env.frame_stack == 4 and cfg.env.reward_clip == 1.0
        else:
            assert source == ("defaults (no preset)" if algo == "pqn" else headline.PRESET_SOURCE[algo])


def test_the_reproduction_rows_run_the_published_config_at_its_budget():
    rows = headline.rows_to_run(args(repro=True))
    assert rows == [("gymnasium:LunarLander-v3", "dqn", 100_000), ("gymnasium:LunarLanderContinuous-v3", "sac", 500_000),
                    ("gymnasium:BipedalWalker-v3", "sac", 500_000)]
    assert headline.rows_to_run(args(repro=True, algos=["dqn"])) == rows[:1]
    for env, algo, steps in rows[1:]:
        cfg, _ = headline.config_for(env, algo, steps, 5, smoke=False, repro=True)
        assert cfg.agent.hidden == (400, 300) and cfg.agent.updates_per_step == 1.0 and cfg.train.total_steps == 500_000
    cfg, source = headline.config_for("gymnasium:LunarLander-v3", "dqn", 100_000, 5, smoke=False, repro=True)
    a = cfg.agent
    assert "rl-baselines3-zoo" in source and cfg.train.total_steps == 100_000 and cfg.env.num_envs == 1
    assert (a.updates_per_step, a.batch_size, a.buffer_size, a.learning_starts, a.target_update_every) == (
        1.0, 128, 50_000, 0, 250)
    assert (a.lr, a.eps_end, a.eps_decay_frac, a.loss, tuple(a.hidden)) == (6.3e-4, 0.1, 0.12, "huber", (256, 256))


def test_the_gpu_table_adds_10m_step_atari_and_minatar_rows():
    rows = headline.rows_to_run(args(gpu=True))
    atari = [s for e, _, s in rows if e == "atari:Breakout"]
    assert atari == [10_000_000] * 4
    minatar = [(e, a) for e, a, _ in rows if e.endswith("-MinAtar")]
    assert len(minatar) == 5 * 3
    for env, algo in minatar:
        headline.config_for(env, algo, 10_000_000, 5, smoke=False)


def test_pieces_run_apart_add_up_to_one_table(tmp_path, monkeypatch):
    import benchmarks.lib.runner

    monkeypatch.setattr(benchmarks.lib.runner, "RESULTS", tmp_path)
    env = "gymnasium:LunarLander-v3"
    meta = {"env": env, "algo": "ppo", "source": "preset", "seeds": 2, "env_steps": 999_424, "run_seconds": 100.0,
            "compile_seconds": 5.0, "git": "abc1234", "date": "2026-12-04 00:00 UTC", "machine": "m", "load": "1.0",
            "note": ""}
    returns = np.full((2, 3000), np.nan)
    returns[:, 10:] = np.linspace(-200, 200, 2990)
    steps = np.arange(1, 3001) * 333
    for key, scores in ((0, [100.0, 120.0]), (1, [140.0, 160.0])):
        headline.save_piece(headline.piece_path("headline", env, "ppo", key), scores=scores, returns=returns,
                            env_steps=steps, meta={**meta, "key": key})
    stored = headline.load_pieces("headline")[(env, "ppo")]
    assert [p["key"] for p in stored] == [0, 1]
    assert stored[0]["curve"].shape == (2, headline.CURVE_POINTS)  # binned
    assert stored[0]["curve_env_steps"][-1] == steps[-1] and np.isnan(stored[0]["curve"][0, 0])

    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "claims.md").write_text("# Claims\n\n| claim | measured | reading | command |\n|---|---|---|---|\n"
                                        "| other | x | y | z |\n\nnotes\n")
    ran = []
    monkeypatch.setattr(experiment, "run_piece", lambda name, e, a, s, args: ran.append((e, a, args.seed)))
    monkeypatch.setattr(headline, "_plot", lambda *a: None)
    bench(["headline", "--envs", env, "--algos", "ppo", "dqn", "--seed", "1"])
    assert ran == [(env, "dqn", 1)]  # the stored piece (ppo, key 1) is not run again
    text = (tmp_path / "headline" / "headline.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith(f"| {env} | ppo |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "4" and cells[6] == "100.0 120.0 140.0 160.0" and cells[11] == "210"
    assert cells[8] == "—" and cells[10] == headline.PUBLISHED[(env, "ppo")]  # no evaluation stored in these pieces
    # the mean over training: -200 .. 200 linearly; the first bin, before any episode, counts as the first value
    curve = stored[0]["curve"]
    expected = headline.training_mean(curve)
    assert np.isnan(curve[0, 0]) and not np.isnan(curve[0, 1:]).any()
    assert np.allclose(expected, np.mean(np.where(np.isnan(curve), curve[:, 1:2], curve), axis=1))
    assert -5 < expected[0] < 5 and cells[7].startswith(f"{headline.iqm_ci(np.tile(expected, 2))[0]:.1f} [")
    m, lo, hi = headline.iqm_ci(np.array([100.0, 120.0, 140.0, 160.0]))
    assert cells[5] == f"{m:.1f} [{lo:.1f}, {hi:.1f}]" and m == 130.0
    assert f"| {env} | dqn | {headline.PRESET_SOURCE['dqn']} | 1,000,000 | 0 | not run yet |" in text  # every planned row is listed
    assert text.count("| abc1234 |") == 2  # each piece's provenance
    # the design's claim beside the measured row in claims.md, added once and then kept current
    claims = (tmp_path / "claims" / "claims.md").read_text().splitlines()
    assert claims[5].startswith("| RMT beats PPO and SAC at 1M env steps") and claims[4] == "| other | x | y | z |"
    assert "ppo 130.0 [" in claims[5] and "(claimed 198), 4 seeds" in claims[5] and "rmt not run yet" in claims[5]
    bench(["headline", "--table"])
    assert (tmp_path / "claims" / "claims.md").read_text().count("| RMT beats PPO") == 1


def test_the_claims_row_reads_the_greedy_evaluation_apart_from_the_training_return(tmp_path, monkeypatch):
    from benchmarks.reports.claims import headline_row

    import benchmarks.lib.runner

    monkeypatch.setattr(benchmarks.lib.runner, "RESULTS", tmp_path)  # the pieces go to tmp_path, not the stored results

    env = "gymnasium:LunarLanderContinuous-v3"
    returns, steps = np.zeros((5, 10)), np.arange(1, 11) * 100_000
    # training returns far apart (PPO's stochastic policy explores), greedy returns overlapping
    for algo, scores, evals in (("rmt", [270.0, 272, 274, 276, 278], [240.0, 260, 280, 250, 270]),
                                ("ppo", [120.0, 125, 130, 135, 140], [230.0, 250, 270, 245, 260])):
        meta = {"env": env, "algo": algo, "key": 0, "seeds": 5}
        headline.save_piece(headline.piece_path("headline", env, algo, 0), scores=scores, eval_scores=evals,
                            returns=returns, env_steps=steps, meta=meta)
    _, measured, reading, _ = headline_row(tmp_path)
    m, lo, hi = headline.iqm_ci(np.array([240.0, 260, 280, 250, 270]))
    assert "rmt 274.0 [" in measured and f"greedy {m:.1f} [{lo:.1f}, {hi:.1f}]" in measured
    assert "LunarLanderContinuous-v3: RMT above ppo, below none (95% intervals apart)" in reading
    assert "LunarLanderContinuous-v3: greedy evaluation: RMT above none, below none (of ppo)" in reading
    assert "not run yet: LunarLander-v3 rmt" in reading  # and the rows without pieces are named
