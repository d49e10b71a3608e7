"""Shared by the tests of the pure-JAX suite adapters (rmtjax.envs.functional.SuiteEnv): a
jitted rollout through the adapter, and the same episodes replayed through the suite's own
reset and step functions with the keys the adapter hands out."""

import jax
import jax.numpy as jnp
import numpy as np


def rollout(env, steps, key, action_key=jax.random.key(1), after_reset=None):
    """Reset from `key`, then `steps` random actions in one jitted scan. Returns the first
    observation, the numpy trajectory (with each step's key) and the last state.
    `after_reset(inner) -> inner` may change the batch of suite states after the reset."""

    def body(carry, k):
        obs, state = carry
        if env.spec.discrete:
            action = jax.random.randint(k, (env.num_envs,), 0, env.spec.num_actions)
        else:
            action = jax.random.uniform(k, (env.num_envs,) + env.spec.action_shape, minval=-1.0, maxval=1.0)
        nobs, state, r, term, trunc, info = env.step(k, state, action)
        return (nobs, state), dict(key=jax.random.key_data(k), action=action, next_obs=nobs, reward=r, term=term,
                                   trunc=trunc, **info)

    @jax.jit
    def run(key):
        obs, state = env.reset(key)
        if after_reset is not None:
            state = state.replace(inner=after_reset(state.inner))
        (_, state), traj = jax.lax.scan(body, (obs, state), jax.random.split(action_key, steps))
        return obs, traj, state

    obs0, traj, state = run(key)
    return np.asarray(obs0), jax.device_get(traj), state


def assert_steps_match(traj, ref, **tolerance):
    """The adapter's observations (after a step and at an episode's end) and raw rewards equal the
    suite's own, within `tolerance` (keywords of `np.testing.assert_allclose`)."""
    for k in ("next_obs", "final_obs", "raw_reward"):
        np.testing.assert_allclose(traj[k], ref[k], err_msg=k, **tolerance)


def assert_ends_match(traj, ref):
    """Terminations and truncations equal the suite's own, each flagged on its own step."""
    np.testing.assert_array_equal(traj["term"], ref["term"])
    np.testing.assert_array_equal(traj["trunc"], ref["trunc"])


def replay(key, num_envs, traj, reset, step, after_reset=None):
    """The rollout's episodes through the suite's own functions, one env at a time.

    `reset(key) -> (obs, suite_state)` and `step(key, suite_state, action) -> (obs, suite_state,
    reward, terminated, truncated)` are the suite's own calls (jitted by the caller). The keys
    are the adapter's: env `e` resets from `split(key, N)[e]`; at step `t` it steps with the first
    and resets with the second half of `split(split(step_key_t, N)[e])`. `after_reset(e, s) -> s`
    changes env `e`'s first state as the rollout's `after_reset` changed it.
    """
    out = {k: np.zeros_like(traj[k]) for k in ("next_obs", "final_obs", "raw_reward", "term", "trunc")}
    first = []
    for e in range(num_envs):
        obs, s = reset(jax.random.split(key, num_envs)[e])
        if after_reset is not None:
            s = after_reset(e, s)
        first.append(np.asarray(obs))
        for t in range(traj["action"].shape[0]):
            k_step, k_reset = jax.random.split(jax.random.split(jax.random.wrap_key_data(traj["key"][t]), num_envs)[e])
            obs, s, r, term, trunc = step(k_step, s, jnp.asarray(traj["action"][t, e]))
            term, trunc = bool(term), bool(trunc) and not bool(term)
            out["final_obs"][t, e], out["raw_reward"][t, e] = np.asarray(obs), float(r)
            out["term"][t, e], out["trunc"][t, e] = term, trunc
            if term or trunc:
                obs, s = reset(k_reset)
            out["next_obs"][t, e] = np.asarray(obs)
    return np.stack(first), out


def episode_recount(traj, state, num_envs):
    """Check the adapter's episode statistics against a recount of the trajectory's raw rewards."""
    for e in range(num_envs):
        ret, length, last, last_len, n = 0.0, 0, None, None, 0
        for t in range(traj["raw_reward"].shape[0]):
            ret += float(traj["raw_reward"][t, e])
            length += 1
            if traj["done"][t, e]:
                last, last_len, ret, length, n = ret, length, 0.0, 0, n + 1
        assert int(state.episodes_done[e]) == n
        if n:
            np.testing.assert_allclose(float(state.last_return[e]), last, rtol=1e-5, atol=1e-6)
            assert int(state.last_length[e]) == last_len
