"""Speed-of-light references: a minimal DQN and a minimal PPO, each one fused XLA program.

Hand-written, with nothing of rmtjax's machinery (a gymnax env, an inline ring buffer, a flax
MLP, optax), so that rmtjax's own agents can be timed against the fastest loop a careful
person would write for the same algorithm and settings. Both handle episode ends as rmtjax
does: bootstrap through time-limit truncation from the pre-reset observation, never through
termination.

    python -m benchmarks reference --algo dqn|ppo [--steps N] [--seeds S]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rmtjax.networks.init import orthogonal


# -- shared pieces ----------------------------------------------------------------------------

class MLP(nn.Module):
    """[..., in] -> [..., out]: Dense+`act` per hidden width, then a linear head.

    `head_scale=None` keeps flax's default initialisation; a float switches to orthogonal
    kernels (gain √2 on hidden layers, `head_scale` on the head) and zero biases."""
    hidden: Sequence[int]
    out: int
    act: Callable = nn.relu
    head_scale: float | None = None

    @nn.compact
    def __call__(self, x):
        def dense(width, gain):
            if self.head_scale is None:
                return nn.Dense(width)
            # rmtjax's LAPACK-free orthogonal init: the same matrices as flax's, without jaxlib
            # 0.10's batched-QR deadlock under vmap (see rmtjax/networks/init.py)
            return nn.Dense(width, kernel_init=orthogonal(gain), bias_init=nn.initializers.zeros)

        for width in self.hidden:
            x = self.act(dense(width, np.sqrt(2.0))(x))
        return dense(self.out, self.head_scale)(x)


def env_step(env, env_params, key, env_state, action):
    """One auto-resetting step of N envs: action [N] ->
    (obs [N, *O], env_state, reward [N] f32, terminated [N] bool, done [N] bool, final_obs [N, *O]).

    `obs` is after any reset, `final_obs` the observation the step ended in (before the reset),
    `done` is terminated or truncated by the time limit."""
    keys = jax.random.split(key, action.shape[0])
    obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
        keys, env_state, action, env_params)
    return (obs, env_state, reward.astype(jnp.float32), terminated, terminated | truncated,
            info["final_observation"])


class Episodes(NamedTuple):
    """Raw-reward episode bookkeeping of N envs, each [N]."""
    running: jax.Array  # return of the episode in progress
    last: jax.Array  # return of the most recently completed episode (0 before one completes)
    seen: jax.Array  # bool: has completed an episode


def episodes_init(n: int) -> Episodes:
    return Episodes(jnp.zeros(n), jnp.zeros(n), jnp.zeros(n, bool))


def episodes_update(ep: Episodes, reward, done) -> Episodes:
    running = ep.running + reward
    return Episodes(jnp.where(done, 0.0, running), jnp.where(done, running, ep.last), ep.seen | done)


def mean_last_return(ep: Episodes) -> jax.Array:
    """Scalar: mean over the envs that completed an episode of their last return; 0 if none has."""
    return ep.last.sum() / jnp.maximum(ep.seen.sum(), 1)


def ring_write(buf: dict, t, rows: dict) -> dict:
    """Write the N rows of `rows` (each [N, ...]) into `buf` (each [size, ...]) at slots
    (t*N + i) % size: iteration t's transitions, in a ring."""
    n = next(iter(rows.values())).shape[0]
    size = next(iter(buf.values())).shape[0]
    idx = (t * n + jnp.arange(n)) % size
    # in place inside the scan carry; N <= size, so the slots are distinct
    return {k: buf[k].at[idx].set(rows[k], unique_indices=True) for k in buf}


def ring_sample(buf: dict, key, t, n: int, batch_size: int) -> dict:
    """A uniform minibatch (each [batch_size, ...]) over the slots written by iterations
    0..t of N rows each."""
    size = next(iter(buf.values())).shape[0]
    idx = jax.random.randint(key, (batch_size,), 0, jnp.minimum((t + 1) * n, size))
    return {k: v.at[idx].get(mode="promise_in_bounds") for k, v in buf.items()}


# -- DQN --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DQNSettings:
    """CleanRL's / PureJaxRL's DQN on CartPole-v1; step counts are env steps, all envs together."""
    env_id: str = "CartPole-v1"
    num_envs: int = 10
    total_steps: int = 500_000
    buffer_size: int = 10_000
    batch_size: int = 128
    learning_starts: int = 10_000
    lr: float = 2.5e-4
    gamma: float = 0.99
    target_update_every: int = 500  # hard copy
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_frac: float = 0.5  # of total_steps, linear
    hidden: tuple[int, ...] = (120, 84)


class DQNState(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    buffer: dict  # obs, action, reward, next_obs (pre-reset), terminated; each [buffer_size, ...]
    env_state: Any
    obs: jax.Array  # [num_envs, *O]
    episodes: Episodes
    key: jax.Array


def td_targets(q_next, reward, terminated, gamma):
    """[B] one-step targets r + γ max_a Q'(s', a), not bootstrapped where s' is terminal;
    q_next [B, A] is the target net on the pre-reset next observations."""
    return reward + gamma * (1.0 - terminated) * q_next.max(-1)


def make_dqn(s: DQNSettings = DQNSettings()):
    """-> train(key) -> (DQNState, metrics), metrics each [total_steps // num_envs]:
    env_steps, episode_return, loss (0 before learning starts)."""
    env, env_params = gymnax.make(s.env_id)
    num_actions = env.action_space(env_params).n
    n = s.num_envs
    num_iters = s.total_steps // n
    # first iteration that learns: the first whose env steps exceed learning_starts
    start = s.learning_starts // n
    eps_iters = s.eps_decay_frac * s.total_steps / n
    net = MLP(s.hidden, num_actions)
    tx = optax.adam(s.lr)

    def loss_fn(params, target_params, batch):
        target = td_targets(net.apply(target_params, batch["next_obs"]), batch["reward"],
                            batch["terminated"], s.gamma)
        q = jnp.take_along_axis(net.apply(params, batch["obs"]), batch["action"][:, None], -1)[:, 0]
        return jnp.mean((q - target) ** 2)

    def iteration(st: DQNState, t):
        key, k_explore, k_random, k_env, k_batch = jax.random.split(st.key, 5)

        eps = jnp.maximum(s.eps_end, s.eps_start + (s.eps_end - s.eps_start) * t / eps_iters)
        greedy = net.apply(st.params, st.obs).argmax(-1)
        action = jnp.where(jax.random.uniform(k_explore, (n,)) < eps,
                           jax.random.randint(k_random, (n,), 0, num_actions), greedy)
        obs, env_state, reward, terminated, done, final_obs = env_step(env, env_params, k_env, st.env_state, action)

        # written before the minibatch is read: XLA (CPU, jax 0.10) copies the whole buffer every
        # iteration when a gather from it precedes the in-place scatter, and not in this order
        buffer = ring_write(st.buffer, t, dict(obs=st.obs, action=action, reward=reward, next_obs=final_obs,
                                               terminated=terminated.astype(jnp.float32)))

        def learn(params, opt_state):
            batch = ring_sample(buffer, k_batch, t, n, s.batch_size)
            loss, grads = jax.value_and_grad(loss_fn)(params, st.target_params, batch)
            updates, opt_state = tx.update(grads, opt_state)
            return optax.apply_updates(params, updates), opt_state, loss

        learning = t >= start
        params, opt_state, loss = jax.lax.cond(
            learning, learn, lambda p, o: (p, o, jnp.zeros((), jnp.float32)), st.params, st.opt_state)

        # due when this iteration's env steps cross a multiple of target_update_every
        due = learning & ((t + 1) * n // s.target_update_every > t * n // s.target_update_every)
        target_params = jax.lax.cond(due, lambda: params, lambda: st.target_params)

        episodes = episodes_update(st.episodes, reward, done)
        metrics = dict(env_steps=(t + 1) * n, episode_return=mean_last_return(episodes), loss=loss)
        return DQNState(params, target_params, opt_state, buffer, env_state, obs, episodes, key), metrics

    def train(key):
        k_env, k_net, key = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, n), env_params)
        params = net.init(k_net, obs)
        size = s.buffer_size
        buffer = dict(obs=jnp.zeros((size,) + obs.shape[1:], obs.dtype), action=jnp.zeros(size, jnp.int32),
                      reward=jnp.zeros(size), next_obs=jnp.zeros((size,) + obs.shape[1:], obs.dtype),
                      terminated=jnp.zeros(size))
        state = DQNState(params, params, tx.init(params), buffer, env_state, obs, episodes_init(n), key)
        # the iteration index is scanned, not carried, so it stays unbatched under vmap over
        # seeds and the lax.conds on it stay real branches
        return jax.lax.scan(iteration, state, jnp.arange(num_iters))

    return train


# -- PPO --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PPOSettings:
    """rmtjax's PPO CartPole-v1 preset (rmtjax/configs/ppo_CartPole-v1.yaml)."""
    env_id: str = "CartPole-v1"
    num_envs: int = 4
    rollout_len: int = 128
    num_epochs: int = 4
    num_minibatches: int = 4
    lr: float = 2.5e-4  # annealed linearly to 0 over training
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: tuple[int, ...] = (64, 64)
    total_steps: int = 500_000


class PPOState(NamedTuple):
    params: Any  # {"actor": ..., "critic": ...}
    opt_state: Any
    env_state: Any
    obs: jax.Array  # [num_envs, *O]
    episodes: Episodes
    key: jax.Array


def gae(reward, value, next_value, terminated, done, gamma, lam):
    """[T, N] generalised advantage estimates; all inputs [T, N].

    `value[t]` is V(obs_t), `next_value[t]` V of the pre-reset observation step t ended in:
    bootstrapped unless `terminated[t]`; `done[t]` (terminated or truncated) stops the
    advantage from flowing back across the episode boundary."""
    delta = reward + gamma * (1.0 - terminated.astype(jnp.float32)) * next_value - value
    keep = gamma * lam * (1.0 - done.astype(jnp.float32))

    def back(adv_next, x):
        d, k = x
        adv = d + k * adv_next
        return adv, adv

    return jax.lax.scan(back, jnp.zeros_like(delta[0]), (delta, keep), reverse=True)[1]


def make_ppo(s: PPOSettings = PPOSettings()):
    """-> train(key) -> (PPOState, metrics), metrics each [total_steps // (num_envs * rollout_len)]:
    env_steps, episode_return, loss (mean over the iteration's minibatch updates)."""
    env, env_params = gymnax.make(s.env_id)
    num_actions = env.action_space(env_params).n
    n, T = s.num_envs, s.rollout_len
    num_iters = s.total_steps // (n * T)
    assert (n * T) % s.num_minibatches == 0, "num_minibatches must divide num_envs * rollout_len"
    actor = MLP(s.hidden, num_actions, nn.tanh, head_scale=0.01)
    critic = MLP(s.hidden, 1, nn.tanh, head_scale=1.0)
    # Adam without its learning rate: the annealed rate is applied per iteration
    tx = optax.chain(optax.clip_by_global_norm(s.max_grad_norm), optax.scale_by_adam(eps=1e-5))

    def value_fn(params, obs):
        return critic.apply(params["critic"], obs)[..., 0]

    def loss_fn(params, mb):
        logp_all = jax.nn.log_softmax(actor.apply(params["actor"], mb["obs"]))
        logp = jnp.take_along_axis(logp_all, mb["action"][:, None], -1)[:, 0]
        entropy = -(jnp.exp(logp_all) * logp_all).sum(-1).mean()
        adv = (mb["adv"] - mb["adv"].mean()) / (mb["adv"].std() + 1e-8)
        ratio = jnp.exp(logp - mb["logp"])
        pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - s.clip_eps, 1 + s.clip_eps) * adv).mean()
        value = value_fn(params, mb["obs"])
        v_clipped = mb["value"] + jnp.clip(value - mb["value"], -s.clip_eps, s.clip_eps)
        v_loss = 0.5 * jnp.maximum((value - mb["ret"]) ** 2, (v_clipped - mb["ret"]) ** 2).mean()
        return pg + s.vf_coef * v_loss - s.ent_coef * entropy

    def iteration(st: PPOState, t):
        def rollout_step(carry, _):
            env_state, obs, episodes, key = carry
            key, k_act, k_env = jax.random.split(key, 3)
            logits = actor.apply(st.params["actor"], obs)
            action = jax.random.categorical(k_act, logits)
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], -1)[:, 0]
            value = value_fn(st.params, obs)
            next_obs, env_state, reward, terminated, done, final_obs = env_step(
                env, env_params, k_env, env_state, action)
            episodes = episodes_update(episodes, reward, done)
            step = dict(obs=obs, action=action, logp=logp, value=value, reward=reward, terminated=terminated,
                        done=done, final_obs=final_obs)
            return (env_state, next_obs, episodes, key), step

        (env_state, obs, episodes, key), traj = jax.lax.scan(
            rollout_step, (st.env_state, st.obs, st.episodes, st.key), None, T)

        # one batched critic pass on the pre-reset observations: it takes the place of the usual
        # last-observation value and also gives truncated steps their bootstrap value
        next_value = value_fn(st.params, traj["final_obs"])
        adv = gae(traj["reward"], traj["value"], next_value, traj["terminated"], traj["done"], s.gamma,
                  s.gae_lambda)
        batch = {k: traj[k].reshape((n * T,) + traj[k].shape[2:]) for k in ("obs", "action", "logp", "value")}
        batch["adv"] = adv.reshape(-1)
        batch["ret"] = (adv + traj["value"]).reshape(-1)

        lr = s.lr * (1.0 - t / num_iters)

        def update(carry, mb):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, mb)
            updates, opt_state = tx.update(grads, opt_state)
            params = jax.tree.map(lambda p, u: p - lr * u, params, updates)
            return (params, opt_state), loss

        def epoch(carry, k):
            perm = jax.random.permutation(k, n * T)
            mbs = jax.tree.map(lambda x: x[perm].reshape((s.num_minibatches, -1) + x.shape[1:]), batch)
            return jax.lax.scan(update, carry, mbs)

        key, k_epochs = jax.random.split(key)
        (params, opt_state), losses = jax.lax.scan(
            epoch, (st.params, st.opt_state), jax.random.split(k_epochs, s.num_epochs))

        metrics = dict(env_steps=(t + 1) * n * T, episode_return=mean_last_return(episodes), loss=losses.mean())
        return PPOState(params, opt_state, env_state, obs, episodes, key), metrics

    def train(key):
        k_env, k_actor, k_critic, key = jax.random.split(key, 4)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, n), env_params)
        params = {"actor": actor.init(k_actor, obs), "critic": critic.init(k_critic, obs)}
        state = PPOState(params, tx.init(params), env_state, obs, episodes_init(n), key)
        # scanned iteration index: unbatched under vmap over seeds
        return jax.lax.scan(iteration, state, jnp.arange(num_iters))

    return train
