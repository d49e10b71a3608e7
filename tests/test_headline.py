"""benchmarks/headline.py: every row of the headline table (CPU and --gpu) is a valid config.
(`python -m benchmarks.headline --smoke` trains three of them for real; about a minute.)"""

import argparse

import pytest

pytest.importorskip("Box2D", reason="the headline table's Box2D rows need the box2d extra")
pytest.importorskip("ale_py", reason="the headline table's Atari rows need the atari extra")
pytest.importorskip("cv2", reason="the headline table's Atari rows need the atari extra")

from benchmarks import headline  # noqa: E402


def args(**kw):
    base = dict(smoke=False, gpu=False, steps=1_000_000, atari_steps=200_000, envs=None, algos=None)
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
            assert source == ("defaults (no preset)" if algo == "pqn" else "preset")


def test_the_gpu_table_adds_10m_step_atari_and_minatar_rows():
    rows = headline.rows_to_run(args(gpu=True))
    atari = [s for e, _, s in rows if e == "atari:Breakout"]
    assert atari == [10_000_000] * 4
    minatar = [(e, a) for e, a, _ in rows if e.endswith("-MinAtar")]
    assert len(minatar) == 5 * 3
    for env, algo in minatar:
        headline.config_for(env, algo, 10_000_000, 5, smoke=False)
