"""Checks that need several devices or processes, run by tests/test_distributed.py in a
subprocess (the device count is fixed when JAX starts): each prints one JSON line.

    python tests/distributed_worker.py equivalence       # with 4 CPU devices
    python tests/distributed_worker.py learn FUSION STEPS
    python tests/distributed_worker.py learn_ppo STEPS
    python tests/distributed_worker.py multihost PORT PROCESS_ID
"""

import json
import sys

# the settings these checks were written for (DQN's CartPole preset is now CleanRL's, with 10 envs
# and one update per 10 env steps): 4 envs, so each of 4 devices steps one, and RMT's replay ratio
DQN_4_ENVS = {"env.num_envs": 4, "agent.rollout_len": 4, "agent.updates_per_step": 0.25, "agent.loss": "huber",
              "agent.max_grad_norm": 10.0}


def equivalence() -> dict:
    """Three fused `mean` steps on 4 devices, each with a quarter of a fixed global minibatch,
    against three steps on 1 device with the whole minibatch: max |Δ| of the parameters."""
    import jax
    import jax.numpy as jnp

    import rmtjax
    from rmtjax.agents import build_agent

    out = {"devices": jax.device_count()}
    for algo in ("rmt", "dqn"):
        base = {"train.total_steps": 2000, "train.progress": False, "agent.batch_size": 64, "agent.n_step": 3,
                "agent.buffer_size": 2048, "agent.hidden": [32, 32], "precision.clip_decay_to": 0.5}
        base = {**(DQN_4_ENVS if algo == "dqn" else {}), **base}
        one = build_agent(rmtjax.make_config(algo, "CartPole-v1", base))
        four = build_agent(rmtjax.make_config(algo, "CartPole-v1", {**base, "distributed.devices": 4}))
        state = one.init(jax.random.key(1))
        # a global minibatch of 64 distinct transitions with varied rewards, steps and terminals
        k = jax.random.split(jax.random.key(2), 6)
        B = 64
        batch = {"obs": jax.random.normal(k[0], (B, 4)), "action": jax.random.randint(k[1], (B,), 0, 2),
                 "rewards": jax.random.normal(k[2], (B, 3)), "steps": jax.random.randint(k[3], (B,), 1, 4),
                 "boot_obs": jax.random.normal(k[4], (B, 4)), "terminated": jax.random.bernoulli(k[5], 0.2, (B,))}
        weight = jnp.linspace(0.5, 1.0, B)
        gamma, clip = jnp.float32(0.99), jnp.float32(0.3)  # a clip that binds: the fused norm is clipped

        def steps(agent, opt, batch, weight):
            def one_step(carry):
                params, opt, prec = carry
                step = agent.gradient_step(params, state.target_params, opt, prec, batch, weight, gamma, clip)
                return (step.params, step.opt_state, step.precision), step.loss, step.stats["grad_norm"]

            carry, losses, norm = three_steps(one_step, (state.params, opt, state.precision))
            return carry[0], losses, norm

        # the 4-device optimiser state holds the fusion's (mean fusion: nothing to carry)
        out[algo] = compare(state.params, lambda b, w: steps(one, state.opt_state, b, w),
                            lambda b, w: steps(four, four.tx.init(state.params), b, w), four, (batch, weight))

    out["ppo"] = ppo_equivalence()
    out["sac"] = sac_equivalence()

    # a short whole run through make_train: the state comes back stacked over the devices
    cfg = rmtjax.make_config("dqn", "CartPole-v1", {**DQN_4_ENVS,
        "train.total_steps": 1024, "train.num_seeds": 2, "agent.learning_starts": 256, "agent.hidden": [16, 16],
        "distributed.devices": 4, "distributed.fusion": "int8"})
    state, metrics = jax.jit(rmtjax.make_train(cfg))(jax.random.key(0))
    params = jax.tree.leaves(state.params)
    out["make_train"] = {
        "param_shape": list(params[0].shape), "metric_shape": list(metrics["loss"].shape),
        "replicas_equal": all(bool(jnp.all(p == p[:1])) for p in params),
        "obs_differ": bool(jnp.any(state.obs[0] != state.obs[1])),
        "moved": bool(jnp.any(metrics["loss"][:, -1] > 0))}
    return out


def three_steps(one_step, carry):
    """Three updates `one_step(carry) -> (carry, loss, grad norm)` in a scan (one step's program
    compiled, not three unrolled): (the carry after them, losses [3], the last grad norm)."""
    import jax

    def body(c, _):
        c, loss, norm = one_step(c)
        return c, (loss, norm)

    carry, (losses, norms) = jax.lax.scan(body, carry, None, length=3)
    return carry, losses, norms[-1]


def compare(start, one_fn, four_fn, four, args) -> dict:
    """`one_fn(*args)` on 1 device against `four_fn` under shard_map over the 4 devices of
    `four`'s mesh, each with a quarter of every argument: both return (params, losses [3],
    grad norm); max |Δ| of the parameters, how far they moved from `start`, losses, norms."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from rmtjax import distributed

    ref = jax.jit(one_fn)(*args)
    mesh = distributed.make_mesh(four.config.distributed)
    fused = jax.jit(jax.shard_map(four_fn, mesh=mesh, in_specs=tuple(P("data") for _ in args), out_specs=P(),
                                  check_vma=False))(*args)
    diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), ref[0], fused[0])
    scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(ref[0]))
    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), ref[0], start)
    return {"max_param_diff": max(jax.tree.leaves(diff)), "param_scale": scale,
            "max_param_move": max(jax.tree.leaves(moved)),
            "loss_one": [float(x) for x in ref[1]], "loss_four": [float(x) for x in fused[1]],
            "grad_norm_one": float(ref[2]), "grad_norm_four": float(fused[2])}


def ppo_equivalence() -> dict:
    """PPO: three clipped-objective updates (`minibatch_step`) on a fixed global minibatch of 64,
    normalised advantages and a binding clip, 1 device against 4 with mean fusion."""
    import jax
    import jax.numpy as jnp

    import rmtjax
    from rmtjax.agents import build_agent

    base = {"train.total_steps": 2048, "env.num_envs": 4, "agent.rollout_len": 16, "agent.num_minibatches": 1,
            "agent.hidden": [32, 32]}
    one = build_agent(rmtjax.make_config("ppo", "CartPole-v1", base))
    four = build_agent(rmtjax.make_config("ppo", "CartPole-v1", {**base, "distributed.devices": 4}))
    state = one.init(jax.random.key(1))
    k = jax.random.split(jax.random.key(2), 6)
    B = 64
    mb = {"obs": jax.random.normal(k[0], (B, 4)), "action": jax.random.randint(k[1], (B,), 0, 2),
          "log_prob": jnp.log(0.5) + 0.2 * jax.random.normal(k[2], (B,)),
          "value": jax.random.normal(k[3], (B,)), "advantage": 0.5 + 2.0 * jax.random.normal(k[4], (B,)),
          "target": jax.random.normal(k[5], (B,))}
    hp, clip = state.hparams, jnp.float32(0.05)  # a clip that binds

    def steps(agent, opt, mb):
        def one_step(carry):
            step = agent.minibatch_step(*carry, mb, hp, clip)
            return (step.params, step.opt_state, step.precision), step.loss, step.stats["grad_norm"]

        carry, losses, norm = three_steps(one_step, (state.params, opt, state.precision))
        return carry[0], losses, norm

    return compare(state.params, lambda b: steps(one, state.opt_state, b),
                   lambda b: steps(four, four.tx.init(state.params), b), four, (mb,))


def sac_equivalence() -> dict:
    """SAC: three updates of critics, actor and temperature with the Polyak target
    (`update_on_batch`) on a fixed global minibatch of 64, 1 device against 4 with mean fusion."""
    import jax
    import jax.numpy as jnp

    import rmtjax
    from rmtjax.agents import build_agent

    base = {"train.total_steps": 2000, "env.num_envs": 4, "agent.batch_size": 64, "agent.buffer_size": 256,
            "agent.learning_starts": 100, "agent.hidden": [32, 32]}
    one = build_agent(rmtjax.make_config("sac", "Pendulum-v1", base))
    four = build_agent(rmtjax.make_config("sac", "Pendulum-v1", {**base, "distributed.devices": 4}))
    state = one.init(jax.random.key(1))
    k = jax.random.split(jax.random.key(2), 7)
    B = 64
    batch = {"obs": jax.random.normal(k[0], (B, 3)), "action": jax.random.uniform(k[1], (B, 1), minval=-1, maxval=1),
             "reward": jax.random.normal(k[2], (B,)), "next_obs": jax.random.normal(k[3], (B, 3)),
             "terminated": jax.random.bernoulli(k[4], 0.2, (B,)), "next_noise": jax.random.normal(k[5], (B, 1)),
             "pi_noise": jax.random.normal(k[6], (B, 1))}
    hp, clip = state.hparams, jnp.float32(0.5)  # binds on the critics' gradient

    def steps(agent, opt, batch):
        def one_step(learner):
            learner, m = agent.update_on_batch(learner, batch, hp, clip)
            return learner, m["critic_loss"], m["critic_grad_norm"]

        learner, losses, norm = three_steps(one_step, (state.params, state.target_critic, opt, state.log_alpha,
                                                       state.precision))
        params, target, _, log_alpha, _ = learner
        return {**params, "target": target, "log_alpha": log_alpha}, losses, norm

    opt4 = four._set_lrs({"actor": four.tx.init(state.params["actor"]), "critic": four.tx.init(state.params["critic"]),
                          "alpha": four.tx.init(state.log_alpha)}, hp)
    start = {**state.params, "target": state.target_critic, "log_alpha": state.log_alpha}
    return compare(start, lambda b: steps(one, state.opt_state, b), lambda b: steps(four, opt4, b), four, (batch,))


def learn_ppo(steps: int) -> dict:
    """PPO on CartPole-v1 with 4 devices (mean fusion), 2 seeds: final returns."""
    import jax

    import rmtjax

    cfg = rmtjax.make_config("ppo", "CartPole-v1", {
        "train.total_steps": steps, "train.num_seeds": 2, "train.progress": False, "train.num_chunks": 1,
        "env.num_envs": 8, "agent.rollout_len": 64, "distributed.devices": 4})
    r = rmtjax.train(cfg, jax.random.key(0))
    return {"final_return": r.final_return.tolist(), "env_steps": r.env_steps,
            "episode_count": r.metrics["episode_count"][:, -1].tolist(), "run_seconds": r.run_seconds,
            "compile_seconds": r.compile_seconds}


def learn(fusion: str, steps: int) -> dict:
    """DQN on CartPole-v1 with 4 devices and the given fusion (8 seeds): final returns."""
    import jax

    import rmtjax

    # the DQN preset with a smaller net and faster targets (as benchmarks/distributed.py), which
    # learns in a CI-sized budget
    small = {"agent.hidden": [64, 64], "agent.lr": 1e-3, "agent.target_update_every": 100,
             "agent.learning_starts": 500, "agent.batch_size": 64, "agent.buffer_size": 10_000,
             "agent.eps_decay_frac": 0.3}
    cfg = rmtjax.make_config("dqn", "CartPole-v1", {**DQN_4_ENVS,
        "train.total_steps": steps, "train.num_seeds": 8, "train.progress": False, "train.num_chunks": 1,
        "distributed.devices": 4, "distributed.fusion": fusion, **small})
    r = rmtjax.train(cfg, jax.random.key(0))
    late = r.metrics["episode_return"][:, -max(1, r.metrics["episode_return"].shape[1] // 10):]
    return {"final_return": r.final_return.tolist(), "env_steps": r.env_steps,
            "episode_return_last": r.metrics["episode_return"][:, -1].tolist(),
            "late_mean": late.mean(axis=1).tolist()}


def multihost(port: int, process_id: int) -> dict:
    """Process `process_id` of 2 on 127.0.0.1:`port`, 2 CPU devices each: a short DQN run on the
    4-device mesh that spans both; the parameters' checksum."""
    import rmtjax
    from rmtjax import distributed

    settings = {"devices": 4, "fusion": "topk", "coordinator_address": f"127.0.0.1:{port}", "num_processes": 2,
                "process_id": process_id}
    distributed.initialize(distributed.DistributedConfig(**settings))  # before anything else touches JAX
    cfg = rmtjax.make_config("dqn", "CartPole-v1", {**DQN_4_ENVS,
        "train.total_steps": 2048, "train.progress": False, "train.num_chunks": 2, "agent.learning_starts": 256,
        "agent.hidden": [32, 32], **{f"distributed.{k}": v for k, v in settings.items()}})
    import jax
    import numpy as np

    r = rmtjax.train(cfg, jax.random.key(0))
    leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(r.state.params)]
    return {"process_id": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count(),
            "local_devices": jax.local_device_count(), "checksum": float(sum(np.sum(x * (i + 1)) for i, x in
                                                                                 enumerate(leaves))),
            "abs_sum": float(sum(np.abs(x).sum() for x in leaves)), "env_steps": r.env_steps,
            "final_return": r.final_return.tolist()}


def toy_equivalence() -> dict:
    """The protocol's toy agent (tests/toy_agent.py): three guarded TD steps on a fixed batch of
    64 transitions, 1 device against 4 with mean fusion (no fusion code in the toy)."""
    import jax
    import jax.numpy as jnp

    import rmtjax
    import tests.toy_agent  # noqa: F401 (registers algo: toy)
    from rmtjax.agents import build_agent

    data = {"algo": "toy", "env": {"id": "CartPole-v1", "num_envs": 4}, "train": {"total_steps": 1000},
            "agent": {"clip": 0.5}}  # a clip that binds
    one = build_agent(rmtjax.Config.from_dict(data))
    four = build_agent(rmtjax.Config.from_dict({**data, "distributed": {"devices": 4}}))
    state = one.init(jax.random.key(1))
    k = jax.random.split(jax.random.key(2), 3)
    B = 64
    obs, action, target = (jax.random.normal(k[0], (B, 4)), jax.random.randint(k[1], (B,), 0, 2),
                           1.0 + jax.random.normal(k[2], (B,)))

    def steps(agent, opt, obs, action, target):
        def one_step(carry):
            up = agent.learn(*carry, obs, action, target, state.hparams)
            return (up.params, up.opt_state, up.precision), up.loss, up.stats["grad_norm"]

        carry, losses, norm = three_steps(one_step, (state.params, opt, state.precision))
        return carry[0], losses, norm

    return compare(state.params, lambda *b: steps(one, state.opt_state, *b),
                   lambda *b: steps(four, four.tx.init(state.params), *b), four, (obs, action, target))


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    if what == "equivalence":
        result = equivalence()
    elif what == "toy":
        result = toy_equivalence()
    elif what == "learn":
        result = learn(args[0], int(args[1]))
    elif what == "learn_ppo":
        result = learn_ppo(int(args[0]))
    elif what == "multihost":
        result = multihost(int(args[0]), int(args[1]))
    else:
        raise SystemExit(f"unknown check {what!r}")
    print("RESULT " + json.dumps(result), flush=True)
