"""The Craftax adapter (`craftax:<id>`), checked against craftax's own reset-free step on
Craftax-Classic (the full game compiles far longer and shares the adapter's code)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("craftax", reason="craftax: ids need the craftax extra: pip install 'rmtjax[craftax]'")

import rmtjax  # noqa: E402
from rmtjax.config import ConfigError, EnvConfig  # noqa: E402
from rmtjax.envs import make_env  # noqa: E402

from .suites import assert_steps_match, assert_ends_match, episode_recount, replay, rollout  # noqa: E402

ID = "Craftax-Classic-Symbolic-v1"
LIMIT = 12  # max_timesteps: episodes are cut by the clock ...


def kill_env_0(inner):
    """... and env 0 starts with no health, so its first step ends the game: a termination."""
    return inner.replace(player_health=inner.player_health.at[0].set(0))


@pytest.fixture(scope="module")
def classic():
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_env(EnvConfig(id=f"craftax:{ID}", num_envs=2, params={"max_timesteps": LIMIT}))
    key = jax.random.key(0)
    obs0, traj, state = rollout(env, 30, key, after_reset=kill_env_0)
    own = make_craftax_env_from_name(ID, auto_reset=False)
    params = own.default_params.replace(max_timesteps=LIMIT)
    reset = jax.jit(lambda k: own.reset(k, params))

    @jax.jit
    def step(k, s, a):
        obs, nxt, r, done, _ = own.step(k, s, a, params)  # craftax's own step: no reset
        died = nxt.player_health <= 0
        return obs, nxt, r, done & died, done & ~died & (nxt.timestep >= LIMIT)

    def after_reset(e, s):
        return s.replace(player_health=jnp.zeros_like(s.player_health)) if e == 0 else s

    ref_obs0, ref = replay(key, 2, traj, reset, step, after_reset)
    return env, obs0, traj, state, ref_obs0, ref


def test_steps_match_craftax_run_by_hand(classic):
    env, obs0, traj, _, ref_obs0, ref = classic
    assert env.spec.obs_shape == (1345,) and env.spec.num_actions == 17 and env.spec.max_episode_steps == LIMIT
    np.testing.assert_allclose(obs0, ref_obs0, rtol=1e-6)
    assert_steps_match(traj, ref, rtol=1e-5, atol=1e-6)


def test_death_terminates_and_the_clock_truncates(classic):
    _, _, traj, _, _, ref = classic
    assert_ends_match(traj, ref)
    assert traj["term"][0, 0] and not traj["trunc"][0, 0]  # env 0 died on its first step
    assert traj["trunc"][LIMIT - 1, 1] and not traj["term"][:, 1].any()  # env 1 ran out of time


def test_episode_statistics_recount_the_raw_rewards(classic):
    _, _, traj, state, _, _ = classic
    episode_recount(traj, state, 2)


def test_render_draws_the_game(classic):
    env, _, _, state, _, _ = classic
    frame = env.render(state, 1)
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3 and frame.shape[0] >= 100


def test_ppo_trains_on_craftax_classic():
    cfg = rmtjax.make_config("ppo", f"craftax:{ID}", {
        "env.params.max_timesteps": LIMIT, "env.num_envs": 2, "train.total_steps": 64, "train.num_chunks": 1,
        "train.progress": False, "agent.rollout_len": 16, "agent.num_minibatches": 2, "agent.hidden": [32]})
    m = rmtjax.train(cfg, jax.random.key(0)).metrics
    assert np.all(np.isfinite(m["value_loss"]))
    assert m["episode_count"].sum() == 2 * (32 // LIMIT)  # only the clock ends 12-step episodes
    assert np.all(m["episode_length"][:, -1] == LIMIT)


def test_unknown_id_and_parameter_are_config_errors():
    with pytest.raises(ConfigError, match=r"craftax has no environment 'Craftax-Classic-v1'"):
        EnvConfig(id="craftax:Craftax-Classic-v1")
    with pytest.raises(ConfigError, match=r"env\.params\.max_steps: .* has no parameter 'max_steps'"):
        make_env(EnvConfig(id=f"craftax:{ID}", params={"max_steps": 3}))
