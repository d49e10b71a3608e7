"""Whole-loop training throughput of rmtjax and of its peers at matched settings, one seed each.

Peers: rejax (JAX, gymnax envs, one jitted `train`) and stable-baselines3 (PyTorch on the CPU,
gymnasium envs). Every timer returns a dict: `compile` (seconds; JAX only), `run` (seconds),
`sps` (env steps per second of the run) and `note` (why a peer is missing, or what differs).
A peer that is not installed or fails is reported through `note`, not raised: one missing
peer must not stop the suite.
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

import rmtjax
from benchmarks.lib.runner import compile_and_time

THROUGHPUT_ENV = {"ppo": "CartPole-v1", "dqn": "CartPole-v1", "rmt": "CartPole-v1", "sac": "Pendulum-v1"}

# SAC settings of the sac_throughput experiment, shared by all three trainers
SAC = dict(batch_size=256, buffer_size=100_000, learning_starts=1_000, lr=3e-4, tau=0.005, hidden=[64, 64])

SETTINGS_NOTE = (
    "Matched settings. **PPO** (CartPole-v1): 4 envs × 128 steps, 4 epochs × 4 minibatches, lr 2.5e-4, γ 0.99, "
    "GAE λ 0.95, clip 0.2, entropy 0.01, 64-64 tanh actor and critic (rmtjax's preset). **DQN** (CartPole-v1): "
    "RMT's CartPole settings (DQN's preset until this round) — 4 envs, one gradient step (batch 128) per 4 env steps, buffer 50,000, learning from "
    "2,000 steps, lr 5e-4, hard target update every 500 gradient steps (2,000 env steps) — with a 64-64 MLP "
    "(the preset's is 128-128) because rejax 0.1.3 fixes its DQN network at 64-64; rejax DQN and SB3 DQN with the "
    "same numbers (SB3: `train_freq=1` vector step of 4 envs, `gradient_steps=1`). "
    "**SAC** (Pendulum-v1): 1 env, one gradient step per env step, batch 256, buffer 100,000, 1,000 warm-up "
    "steps, lr 3e-4, τ 0.005, 64-64 ReLU (as `benchmarks/experiments/sac_throughput.py`). **RMT** (its CartPole "
    "preset) has no peer implementation; its peers' columns are their DQN at the settings RMT shares with the "
    "DQN row (4 envs, batch 128 per 4 env steps, buffer 50,000, 2,000 warm-up steps, lr 5e-4). rejax 0.1.3 "
    "sees gymnax 1.0.1's envs through a "
    "5-value `step` adapter (done = terminated or truncated), its evaluation switched off; SB3 runs "
    "`DummyVecEnv` gymnasium envs in this process, `device='cpu'`, torch limited to one intra-op thread (faster "
    "than its default for networks this small), JAX with its defaults.")


# RMT has no peer implementation: its peer row is the peer's DQN at the settings RMT's CartPole preset
# shares with it (4 envs, a gradient step of batch 128 per 4 env steps, buffer 50,000, learning
# from 2,000 steps, lr 5e-4): what a user would otherwise run. RMT does more per update.
RMT_PEER_NOTE = ("{peer} column: {peer}'s DQN at RMT's shared settings (no {peer} RMT); RMT also runs its "
                 "preset's torso with LayerNorm, a dueling head, tiered replay, n-step targets, Boltzmann exploration")


def _sac_args(steps: int):
    return argparse.Namespace(steps=steps, **SAC)


def rmtjax_config(algo: str, steps: int) -> rmtjax.Config:
    if algo == "sac":
        return sac_config(_sac_args(steps))
    sets = {"train.total_steps": steps, "train.num_seeds": 1, "train.progress": False}
    if algo == "dqn":
        # the settings of SETTINGS_NOTE (DQN's preset was these until it became CleanRL's configuration)
        sets.update({"env.num_envs": 4, "agent.rollout_len": 4, "agent.updates_per_step": 0.25,
                     "agent.buffer_size": 50_000, "agent.learning_starts": 2_000, "agent.lr": 5e-4,
                     "agent.target_update_every": 500})
        sets["agent.hidden"] = [64, 64]  # rejax 0.1.3 builds DQN's Q-network 64-64 whatever it is given
    return rmtjax.make_config(algo, THROUGHPUT_ENV[algo], sets)


def time_rmtjax(algo: str, steps: int) -> dict:
    """`rmtjax.make_train`, jitted whole like rejax's `train`: compile, then one run."""
    cfg = rmtjax_config(algo, steps)
    c, r, (_, metrics) = compile_and_time(rmtjax.make_train(cfg), jax.random.key(0))
    done = int(np.asarray(metrics["env_steps"])[0, -1])
    return {"compile": c, "run": r, "sps": done / r, "note": ""}


def time_rejax(algo: str, steps: int) -> dict:
    try:
        import rejax  # noqa: F401
    except ImportError:
        return {"note": "rejax not installed (pip install 'rmtjax[bench]')"}
    try:
        if algo == "ppo":
            fn = rejax_train_fn(steps)
        elif algo == "sac":
            fn = rejax_sac(_sac_args(steps), env=None).train
        elif algo in ("dqn", "rmt"):
            fn = _rejax_dqn(steps).train
        else:
            return {"note": f"no rejax {algo}"}
        c, r, _ = compile_and_time(fn, jax.random.key(0))
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {"note": f"rejax failed: {type(e).__name__}: {str(e)[:120]}"}
    return {"compile": c, "run": r, "sps": steps / r, "note": RMT_PEER_NOTE.format(peer="rejax") if algo == "rmt"
            else ""}


def _rejax_dqn(steps: int):
    import gymnax
    from rejax import DQN

    env, params = gymnax.make("CartPole-v1")
    algo = DQN.create(env=FiveValueStep(env), env_params=params, num_envs=4, num_epochs=1, batch_size=128,
                      buffer_size=50_000, fill_buffer=2_000, learning_rate=5e-4, gamma=0.99, max_grad_norm=10.0,
                      target_update_freq=2_000, polyak=0.0, eps_start=1.0, eps_end=0.05, exploration_fraction=0.5,
                      total_timesteps=steps, eval_freq=steps * 10, skip_initial_evaluation=True, ddqn=False,
                      agent_kwargs={"activation": "relu"})  # rejax 0.1.3 fixes DQN's hidden layers at 64-64
    return algo


def time_sb3(algo: str, steps: int) -> dict:
    try:
        import stable_baselines3 as sb3
        import torch
    except ImportError as e:
        return {"note": f"stable-baselines3/torch not installed ({e.name}; pip install 'rmtjax[bench]')"}
    try:
        from stable_baselines3.common.env_util import make_vec_env

        # one intra-op thread: for networks this small more threads only add synchronisation (and
        # on a shared 2-core machine they spin against the other jobs)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        if algo == "ppo":
            model = sb3.PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=0), n_steps=128, batch_size=128,
                            n_epochs=4, learning_rate=2.5e-4, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
                            ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, device="cpu", seed=0,
                            policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.Tanh})
        elif algo in ("dqn", "rmt"):
            model = sb3.DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=0), learning_rate=5e-4,
                            buffer_size=50_000, learning_starts=2_000, batch_size=128, gamma=0.99, train_freq=1,
                            gradient_steps=1, target_update_interval=2_000, exploration_fraction=0.5,
                            device="cpu", seed=0, policy_kwargs={"net_arch": [64, 64]})
        elif algo == "sac":
            model = sb3.SAC("MlpPolicy", "Pendulum-v1", learning_rate=SAC["lr"], buffer_size=SAC["buffer_size"],
                            learning_starts=SAC["learning_starts"], batch_size=SAC["batch_size"], tau=SAC["tau"],
                            gamma=0.99, train_freq=1, gradient_steps=1, device="cpu", seed=0,
                            policy_kwargs={"net_arch": SAC["hidden"]})
        else:
            return {"note": f"no SB3 {algo}"}
        setup = time.perf_counter() - t0
        t1 = time.perf_counter()
        model.learn(total_timesteps=steps)
        run = time.perf_counter() - t1
        done = int(model.num_timesteps)
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {"note": f"SB3 failed: {type(e).__name__}: {str(e)[:120]}"}
    finally:
        torch.set_num_threads(threads)
    note = {"ppo": f"SB3 {sb3.__version__}, torch {torch.__version__}", "rmt": RMT_PEER_NOTE.format(peer="SB3")}
    return {"setup": setup, "run": run, "sps": done / run, "note": note.get(algo, "")}


THROUGHPUT_HEADER = ["agent", "env", "env steps", "rmtjax compile s", "rmtjax env-steps/s", "rejax compile s",
                     "rejax env-steps/s", "SB3 env-steps/s", "rmtjax ÷ rejax", "rmtjax ÷ SB3", "notes"]


def _num(x, digits: int = 0) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:,.{digits}f}"


def _ratio(a, b) -> str:
    return "—" if b is None or not math.isfinite(b) or b <= 0 else f"**{a / b:.2f}×**"


def throughput_row(algo: str, steps: int) -> tuple[list[str], dict]:
    """One row of `THROUGHPUT_HEADER` (rmtjax, rejax, SB3 timed one after the other) and the
    timings behind it: {"rmtjax": ..., "rejax": ..., "sb3": ...}."""
    ours, rj, sb = time_rmtjax(algo, steps), time_rejax(algo, steps), time_sb3(algo, steps)
    row = [algo, THROUGHPUT_ENV[algo], f"{steps:,}", _num(ours["compile"], 1), _num(ours["sps"]),
           _num(rj.get("compile"), 1), _num(rj.get("sps")), _num(sb.get("sps")),
           _ratio(ours["sps"], rj.get("sps")), _ratio(ours["sps"], sb.get("sps")),
           "; ".join(x["note"] for x in (rj, sb) if x.get("note"))]
    return row, {"rmtjax": ours, "rejax": rj, "sb3": sb}


# --- rejax's PPO and SAC (the throughput and sac_throughput experiments, the suite) ---------------

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


SAC_ENV = "Pendulum-v1"


class OldStepAPI:
    """A gymnax env whose `step` returns (obs, state, reward, done, info), done = terminated | truncated."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        if name == "_env":  # not set yet (rejax deep-copies its config): no recursion
            raise AttributeError(name)
        return getattr(self._env, name)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


def rejax_sac(args, env=SAC_ENV):
    from rejax import SAC

    import gymnax

    kwargs = dict(num_envs=1, num_epochs=1, batch_size=args.batch_size, buffer_size=args.buffer_size,
                  fill_buffer=args.learning_starts, learning_rate=args.lr, gamma=0.99, polyak=1.0 - args.tau,
                  total_timesteps=args.steps, eval_freq=args.steps, skip_initial_evaluation=True,
                  hidden_layer_sizes=tuple(args.hidden), agent_kwargs={"activation": "relu"})
    if env is None:  # the adapted env
        gym_env, params = gymnax.make(SAC_ENV)
        algo = SAC.create(env=OldStepAPI(gym_env), env_params=params, **kwargs)
    else:
        algo = SAC.create(env=env, **kwargs)
    # evaluation off: the final (only) evaluation callback returns a constant
    return algo.replace(eval_callback=lambda algo, ts, rng: jnp.zeros(()))


def sac_config(args):
    return rmtjax.make_config("sac", SAC_ENV, {
        "env.num_envs": 1, "train.total_steps": args.steps, "train.num_seeds": 1, "train.progress": False,
        "agent.updates_per_step": 1, "agent.batch_size": args.batch_size, "agent.buffer_size": args.buffer_size,
        "agent.learning_starts": args.learning_starts, "agent.actor_lr": args.lr, "agent.critic_lr": args.lr,
        "agent.alpha_lr": args.lr, "agent.tau": args.tau, "agent.hidden": list(args.hidden),
        "agent.activation": "relu"})
