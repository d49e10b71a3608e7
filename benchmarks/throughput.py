"""Whole-run throughput of rmtjax's PPO against rejax's PPO at the same settings, side by side.

PPO on CartPole-v1, 4 envs × 128 steps, 4 epochs × 4 minibatches, 64-64 tanh networks,
500k env steps; for 1 seed and for 8 seeds vmapped in one program. Compile time is measured
apart from run time. rejax 0.1.3 expects gymnax's older 5-value `step`; a thin adapter folds
gymnax 1.0.1's `terminated`/`truncated` into its `done` (no other change to rejax). rejax's
periodic evaluation is switched off so both programs only train.

    python -m benchmarks.throughput [--steps 500000]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import rmtjax
from benchmarks.common import compile_and_time, write_table


class FiveValueStep:
    """gymnax 1.0.1 env seen through the 5-value `step` rejax 0.1.3 was written for."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        if name == "_env":  # not set yet (copy/deepcopy build the object without __init__)
            raise AttributeError(name)
        return getattr(self._env, name)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        return obs, state, reward, terminated | truncated, info


def rejax_train_fn(steps: int):
    import gymnax
    import rejax

    env, params = gymnax.make("CartPole-v1")
    algo = rejax.PPO.create(
        env=FiveValueStep(env), env_params=params, num_envs=4, num_steps=128, num_epochs=4, num_minibatches=4,
        learning_rate=2.5e-4, max_grad_norm=0.5, gamma=0.99, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01,
        vf_coef=0.5, total_timesteps=steps, eval_freq=steps * 10, skip_initial_evaluation=True,
        agent_kwargs={"activation": "tanh", "hidden_layer_sizes": (64, 64)})
    return algo.train


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500_000)
    args = ap.parse_args()
    rows = []
    for seeds in (1, 8):
        cfg = rmtjax.make_config("ppo", "CartPole-v1", {"train.total_steps": args.steps, "train.num_seeds": seeds})
        ours = rmtjax.make_train(cfg)
        theirs = rejax_train_fn(args.steps)
        key = jax.random.key(0)
        rj = (lambda k: jax.vmap(theirs)(jax.random.split(k, seeds))) if seeds > 1 else theirs
        c_ours, r_ours, (_, metrics) = compile_and_time(ours, key)
        c_rj, r_rj, _ = compile_and_time(rj, key)
        ret = float(np.mean(np.asarray(metrics["episode_return"])[:, -1]))
        total = args.steps * seeds
        rows.append(["rmtjax ppo", seeds, f"{c_ours:.1f}", f"{r_ours:.1f}", f"{total / r_ours:,.0f}", f"{ret:.0f}"])
        rows.append(["rejax ppo", seeds, f"{c_rj:.1f}", f"{r_rj:.1f}", f"{total / r_rj:,.0f}", "-"])
        rows.append(["ratio rmtjax/rejax (env-steps/s)", seeds, f"{c_ours / c_rj:.2f}× compile", "",
                     f"**{r_rj / r_ours:.2f}×**", ""])
        # written after each seed count, so a cut-short run still leaves what it measured
        write_table("throughput_ppo", "PPO whole-run throughput: rmtjax vs rejax (CartPole-v1)",
                    ["trainer", "seeds", "compile s", "run s", "env-steps/s", "final episode_return"], rows,
                    notes=f"{args.steps:,} env steps per seed, 4 envs × 128 steps, 4 epochs × 4 minibatches, 64-64 tanh. "
                          "Ratio > 1 means rmtjax is faster. Both run in the same process, one after the other.")



if __name__ == "__main__":
    main()
