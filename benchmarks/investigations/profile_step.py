"""Where a value-based agent's (RMT, DQN) iteration spends its time, phase by phase.

    python -m benchmarks profile_step --algo rmt --env CartPole-v1 --seeds 1 \
        --set env.num_envs=10 --set agent.rollout_len=1 ... [--name profile_rmt]

The agent is warmed up with the real compiled chunk until learning has started and the replay
is full. Then, from that state, the script times

- the whole iteration, as the driver runs it (`vmap` over seeds, scan, metrics);
- each phase alone, compiled as a scan of the agent's own phase function over the same
  `vmap`ped state: `act` (the rollout: forward passes, exploration, env steps, n-step
  window), `store` (TD errors at insertion where the replay needs them, and the write),
  `learn` (the iteration's gradient updates), and inside `learn` one `sample`, one
  `grad_step` (forward, backward, guard, optimiser) and one `write_back`, plus the top-TD-share
  diagnostic (`key_share`, run every `agent.diagnostics_every` iterations: its cost per call
  is divided by that);
- `rest`: the whole iteration minus `act`, `store` and `learn` (schedules, metrics, the
  driver's scan and masking, and what XLA fuses differently when the phases run together).

Each timing is the best of `--reps` runs of `--iters` iterations (a scan, so dispatch is
amortised); read the shares, and ratios between rows of one run: absolute µs move with the
load of the machine. The phases carry the `jax.named_scope("phase/<name>")` names they have in
the agents' code, so the same phases show up in a TensorBoard profile.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import rmtjax
from benchmarks.lib.tables import write_table
from rmtjax.config import parse_override


def _best(fn, args, reps: int) -> float:
    """Best wall seconds of `reps` calls of the compiled `fn(*args)` (after one warm call)."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def _checksum(tree):
    """A scalar that depends on every leaf, so XLA cannot drop the work that produced them."""
    return sum(jnp.sum(jnp.asarray(x, jnp.float32)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.number))


def profile(cfg: rmtjax.Config, iters: int = 500, reps: int = 3, seed: int = 0) -> dict:
    """{phase: µs per iteration} and the facts of the run (see the module docstring)."""
    from rmtjax.driver import Program, _masked_chunk

    program = Program(cfg)
    agent, init, vstep = program.agent, program.init, program.step
    if not hasattr(agent, "_learn"):
        raise SystemExit(f"profile_step profiles the value-based agents (rmt, dqn); {cfg.algo} has no phase functions")
    keys = jax.random.split(jax.random.key(seed), cfg.train.num_seeds)
    state = jax.jit(lambda k: init(k, None))(keys)

    # warm up: past learning_starts and until the replay is full
    fill = -(-agent.cfg.buffer_size // agent.steps_per_iteration)
    warm = max(agent.first_learning_iteration + 1, fill, iters)
    t0 = time.perf_counter()
    chunk = jax.jit(_masked_chunk(vstep, warm), donate_argnums=0).lower(state, np.int32(0), np.int32(warm)).compile()
    compile_s = time.perf_counter() - t0
    state, _ = chunk(state, np.int32(0), np.int32(warm))
    state = jax.block_until_ready(state)
    t = np.int32(warm)

    out = {}
    run = jax.jit(lambda s: _checksum(_masked_chunk(vstep, iters)(s, t, np.int32(iters))))
    out["iteration"] = _best(run, (state,), reps) / iters

    vmap = lambda f: jax.vmap(f)  # noqa: E731  (every phase runs batched over seeds, as in training)
    sched = jax.vmap(lambda hp: agent.schedule(hp, t))(state.hparams)
    k = jax.random.key(1)

    def repeat(body, carry):
        """Scan `body(carry, key) -> (carry, x)` `iters` times; returns a checksum of the final
        carry and of every output (so nothing can be left out as unused)."""
        def step(c, key):
            c, x = body(c, key)
            return c, _checksum(x)

        carry, sums = jax.lax.scan(step, carry, jax.random.split(k, iters))
        return sums.sum() + _checksum(carry)

    def act(s, key):
        (obs, env_state, window, log_temp, hold), new, info = vmap(agent._act)(
            s, sched, jax.random.split(key, cfg.train.num_seeds))
        return s.replace(obs=obs, env_state=env_state, window=window, log_temperature=log_temp, hold=hold), new

    out["act"] = _best(jax.jit(lambda s: repeat(act, s)), (state,), reps) / iters
    _, new = jax.jit(act)(state, k)

    def store(s, key):
        replay = vmap(agent.replay.add)(s.replay, new)  # no forward pass at insertion
        return s.replace(replay=replay), jnp.zeros(())

    out["store"] = _best(jax.jit(lambda s: repeat(store, s)), (state,), reps) / iters

    opt = state.opt_state
    learner = (state.params, state.target_params, opt, state.replay, state.precision)

    # an iteration without the top-TD-share diagnostic (timed apart below)
    t_learn = t + 1 if (t + 1) % agent.cfg.diagnostics_every else t + 2

    def learn(lr, key):
        return vmap(lambda l, s_, hp, ks, kk: agent._learn(l, t_learn, kk, s_, hp, ks))(
            lr, sched, state.hparams, state.key_share, jax.random.split(key, cfg.train.num_seeds))

    out["learn"] = _best(jax.jit(lambda l: repeat(learn, l)), (learner,), reps) / iters

    # inside `learn`, per update
    replay_fn, batch_size = agent.replay, agent.local_batch

    def sample(r, key):
        return r, vmap(lambda r_, b, kk: replay_fn.sample(r_, kk, batch_size, b))(
            r, sched.beta, jax.random.split(key, cfg.train.num_seeds))

    per_update = {"sample": _best(jax.jit(lambda r: repeat(sample, r)), (state.replay,), reps) / iters}
    batch, info = jax.jit(lambda r: sample(r, k)[1])(state.replay)

    def grad(lr, key):
        params, opt_state, prec = lr

        def one(p, target, o, ps, b, w, hp, s_):
            return agent.gradient_step(p, target, o, ps, b, w, hp.gamma, s_.clip)

        out = vmap(one)(params, state.target_params, opt_state, prec, batch, info.weight, state.hparams, sched)
        return (out.params, out.opt_state, out.precision), (out.loss, out.aux, out.stats)

    per_update["grad_step"] = _best(jax.jit(lambda l: repeat(grad, l)),
                                    ((state.params, opt, state.precision),), reps) / iters
    td = jnp.abs(jax.random.normal(k, info.weight.shape))

    def write_back(r, key):
        return vmap(replay_fn.update)(r, info, td), ()

    per_update["write_back"] = _best(jax.jit(lambda r: repeat(write_back, r)), (state.replay,), reps) / iters

    def key_share(r, key):
        return r, vmap(replay_fn.key_share)(r, info, jax.random.split(key, cfg.train.num_seeds))

    share = _best(jax.jit(lambda r: repeat(key_share, r)), (state.replay,), reps) / iters
    out.update({f"learn: {name}": v * agent.num_updates for name, v in per_update.items()})
    out["learn: key_share"] = share / agent.cfg.diagnostics_every
    out["rest"] = out["iteration"] - out["act"] - out["store"] - out["learn"]
    facts = {"compile_s": compile_s, "num_updates": agent.num_updates, "steps_per_iteration": agent.steps_per_iteration,
             "seeds": cfg.train.num_seeds, "key_share_per_call": share, "warm": warm}
    return {"us": {name: 1e6 * v for name, v in out.items()}, **facts}


def table_rows(result: dict) -> list[list[str]]:
    us = result["us"]
    total = us["iteration"]
    order = ["act", "store", "learn", "learn: sample", "learn: grad_step", "learn: write_back", "learn: key_share",
             "rest"]
    rows = [[name, f"{us[name]:,.1f}", f"{100 * us[name] / total:.0f}%"] for name in order]
    rows.append(["**iteration**", f"{total:,.1f}", "100%"])
    return rows


def add_arguments(ap) -> None:
    ap.add_argument("--algo", default="rmt")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--iters", type=int, default=500, help="iterations per timed run")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per phase; the best is kept")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--name", default=None, help="results/profile_step/NAME.md (default: print only)")


def run(args):
    overrides = dict(parse_override(s) for s in args.set)
    overrides.update({"train.num_seeds": args.seeds, "train.progress": False})
    overrides.setdefault("train.total_steps", 10**8)
    cfg = rmtjax.make_config(args.algo, args.env, overrides)
    result = profile(cfg, args.iters, args.reps)
    sps = result["steps_per_iteration"] * result["seeds"] / (result["us"]["iteration"] * 1e-6)
    notes = (f"{args.algo} on {args.env}, {args.seeds} seed(s) vmapped; overrides: {' '.join(args.set) or 'none'}; "
             f"{result['num_updates']} gradient update(s) and {result['steps_per_iteration']} env steps per iteration "
             f"and seed: {sps:,.0f} env-steps/s (all seeds). µs per iteration, best of {args.reps} runs of "
             f"{args.iters} iterations after {result['warm']} warm-up iterations; the `learn:` rows are parts of "
             f"`learn` (one update's cost × updates per iteration; `key_share` is "
             f"{result['key_share_per_call']*1e6:,.0f} µs per call, run every agent.diagnostics_every iterations).")
    title = f"Per-phase profile: {args.algo} on {args.env}"
    rows = table_rows(result)
    if args.name:
        write_table("profile_step", args.name, title, ["phase", "µs / iteration", "share"], rows, notes)
    else:
        print("| phase | µs / iteration | share |\n|---|---|---|")
        print("\n".join("| " + " | ".join(r) + " |" for r in rows))
        print(notes)
