import numpy as np

from benchmarks.lib.runner import command
from benchmarks.lib.curves import grid_points, late_mean, smooth


def test_grid_points_share_columns_across_agents_and_skip_seeds_without_episodes():
    # an agent with 5 iterations of 10k steps on a 50k budget: columns at 5k, 10k, ..., 50k
    returns = np.array([[0.0, -900.0, -500.0, -300.0, -200.0],
                        [0.0, 0.0, -700.0, -400.0, -100.0]])
    episodes = np.array([[0, 3, 3, 3, 3], [0, 0, 2, 2, 2]])
    steps = np.array([10_000, 20_000, 30_000, 40_000, 50_040])  # the last overshoots by 40
    grid, pts = grid_points(returns, steps, episodes, 50_000)
    np.testing.assert_allclose(grid, np.arange(1, 11) * 5_000)
    # 5k: no iteration yet; 10k: no episode finished; 20k: only seed 0 has one; 50k: 50,040 counts
    expected = [np.nan, np.nan, np.nan, -900.0, -900.0, -600.0, -600.0, -350.0, -350.0, -150.0]
    np.testing.assert_allclose(pts, expected)


def test_late_mean_averages_each_seeds_last_tenth_and_skips_pre_episode_iterations():
    steps = np.arange(1, 21) * 1_000  # 20 iterations of 1k steps on a 20k budget: the last tenth is 19k, 20k
    returns = np.zeros((3, 20))
    returns[0, 18:] = [10.0, 20.0]
    returns[1, 18:] = [0.0, 30.0]  # no episode at 19k: its 0 is not a return
    returns[2, :] = 5.0  # never finished an episode
    episodes = np.zeros((3, 20), int)
    episodes[0, 5] = 1
    episodes[1, 19] = 1
    late = late_mean(returns, steps, episodes, 20_000)
    np.testing.assert_allclose(late, [15.0, 30.0, np.nan])
    # a larger share reaches further back: seed 0's iterations from 15k hold 0 (a return, after its first episode)
    np.testing.assert_allclose(late_mean(returns, steps, episodes, 20_000, share=0.3)[0], 30.0 / 6)


def test_command_names_the_module_not_the_checkout_path():
    argv = ["/some/checkout/benchmarks/__main__.py", "curves", "--env", "Acrobot-v1"]
    assert command(argv) == "python -m benchmarks curves --env Acrobot-v1"
    assert command(["script.py", "--x"]) == "python script.py --x"


def test_smooth_is_a_trailing_mean_that_ignores_pre_episode_nans():
    values = np.array([[np.nan, np.nan, 2.0, 4.0, 6.0, 8.0]])
    np.testing.assert_allclose(smooth(values, share=0.5), [[np.nan, np.nan, 2.0, 3.0, 4.0, 6.0]])
    np.testing.assert_allclose(smooth(values, share=0.01), values)  # window 1: unchanged
