import numpy as np

from benchmarks.curves import grid_points


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
