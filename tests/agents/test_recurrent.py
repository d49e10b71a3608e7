"""Recurrent torsos (agent.torso: lstm | gru): the hidden state's resets, BPTT, the agents end to end
through `rmtjax.train`, acting, evaluation, policies and checkpoints with a carry, the errors, and the
memory task CartPole-masked-v1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rmtjax
from rmtjax.agents import build_agent
from rmtjax.agents.r2d2 import RecurrentDQN
from rmtjax.agents.recurrent import RecurrentPPO, RecurrentPQN
from rmtjax.config import ConfigError
from rmtjax.driver import Program, RecurrentPolicy
from rmtjax.networks.recurrent import RecurrentNet, RecurrentTorso, ValueHead, initial_carry

ENV = {"env.params": {"memory_length": 3}, "env.num_envs": 4, "train.num_seeds": 2, "train.progress": False}
# one minibatch, one epoch: each iteration's only update reads the rollout under the parameters that acted
PPO = {**ENV, "agent.torso": "gru", "agent.rnn_width": 8, "agent.hidden": [8], "agent.rollout_len": 8,
       "agent.num_minibatches": 1, "agent.num_epochs": 1, "agent.lr": 1e-2, "train.total_steps": 64,
       "train.num_chunks": 2}


class _Net:
    """A small recurrent value network with its `init` and `apply` jitted (an eager scan is slow)."""

    def __init__(self, kind):
        net = RecurrentNet(RecurrentTorso(kind, 6, (5,), "tanh"), ValueHead())
        self.init, self.apply = jax.jit(net.init), jax.jit(net.apply)



def _carry(kind, key, batch):
    """A random (nonzero) hidden state."""
    return jax.tree.map(lambda z: jax.random.normal(key, z.shape), initial_carry(kind, 6, batch))


T, B = 8, 3  # one sequence shape for every network test, so each network's apply compiles once


def test_the_hidden_state_is_zeroed_where_an_episode_begins():
    net = _Net("lstm")  # the LSTM's carry is a pair (c, h): both are zeroed
    obs = jax.random.normal(jax.random.key(0), (T, B, 4))
    carry = _carry("lstm", jax.random.key(1), B)
    params = net.init(jax.random.key(2), carry, obs, jnp.zeros((T, B), bool))
    reset = jnp.zeros((T, B), bool).at[3, 0].set(True)  # env 0 begins an episode at t = 3
    _, out, _ = net.apply(params, carry, obs, reset)
    # from t = 3 env 0 is what a fresh unroll from zeros over obs[3:] gives, whatever came before
    shifted = jnp.concatenate([obs[3:], obs[:3]])
    _, fresh, _ = net.apply(params, initial_carry("lstm", 6, B), shifted, jnp.zeros((T, B), bool))
    np.testing.assert_allclose(np.asarray(out[3:, 0]), np.asarray(fresh[:T - 3, 0]), rtol=1e-6, atol=1e-6)
    # ... and without the reset it is not (the memory of t < 3 and of the initial carry is there)
    _, kept, _ = net.apply(params, carry, obs, jnp.zeros((T, B), bool))
    assert np.abs(np.asarray(kept[3:, 0] - fresh[:T - 3, 0])).max() > 1e-3
    # the other envs are untouched by env 0's reset
    np.testing.assert_array_equal(np.asarray(out[:, 1:]), np.asarray(kept[:, 1:]))
    # a reset at t = 0 ignores the carry handed in
    _, first, _ = net.apply(params, carry, obs, reset.at[0].set(True))
    _, zero, _ = net.apply(params, initial_carry("lstm", 6, B), obs, jnp.zeros((T, B), bool))
    np.testing.assert_allclose(np.asarray(first[:3]), np.asarray(zero[:3]), rtol=1e-6, atol=1e-6)


def test_the_bptt_gradient_of_the_last_step_reaches_the_first_input():
    net = RecurrentNet(RecurrentTorso("gru", 6, (5,), "tanh"), ValueHead())
    obs = jax.random.normal(jax.random.key(0), (T, B, 4))
    carry = initial_carry("gru", 6, B)
    params = net.init(jax.random.key(2), carry, obs, jnp.zeros((T, B), bool))

    @jax.jit
    @jax.grad
    def grad_of_last(x, reset):
        return net.apply(params, carry, x, reset)[1][-1].sum()  # the last step's output only

    grad = grad_of_last(obs, jnp.zeros((T, B), bool))
    assert np.abs(np.asarray(grad[0])).min() > 1e-7  # every feature of the first step, every sequence
    # a reset in between cuts it: exactly zero for the steps before it, nonzero from it on
    grad = grad_of_last(obs, jnp.zeros((T, B), bool).at[4].set(True))
    assert np.all(np.asarray(grad[:4]) == 0.0)
    assert np.abs(np.asarray(grad[4])).min() > 1e-7


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """A recurrent PPO trained through `rmtjax.train` into a run directory (2 chunks, checkpointed)."""
    path = tmp_path_factory.mktemp("rppo") / "run"
    cfg = rmtjax.make_config("ppo", "MemoryChain-bsuite", PPO)
    return cfg, rmtjax.train(cfg, jax.random.key(0), run_dir=path), path


def test_recurrent_ppo_trains_end_to_end(ppo_run):
    cfg, result, _ = ppo_run
    agent = build_agent(cfg)
    assert isinstance(agent, RecurrentPPO) and agent.recurrent
    assert result.metrics["env_steps"][0, -1] == 64
    for name in ("policy_loss", "value_loss", "entropy"):
        assert np.isfinite(result.metrics[name]).all(), name
    assert result.metrics["skipped_frac"].max() == 0.0
    # the learner's unroll from the stored hidden state, with the rollout's resets, gives back the
    # acting policy's probabilities: ratio 1, so no KL and no clipping (measured: 0.0; with the
    # learner's resets dropped it was 4.6e-5)
    assert result.metrics["approx_kl"].max() < 1e-9 and result.metrics["clip_frac"].max() == 0.0
    # the carry is in the state, one per seed and env: the actor's and the critic's GRU state
    assert result.state.carry["actor"].shape == (2, 4, 8) and result.state.carry["critic"].shape == (2, 4, 8)
    assert np.abs(np.asarray(result.state.carry["actor"])).max() > 0.0
    # MemoryChain with memory_length 3 ends every 4 steps: after 8-step rollouts every env starts an episode
    assert np.asarray(result.state.reset).all()
    # the parameters moved from the driver's initial state, the cell's recurrent kernel included
    first = Program(cfg).initial_state(jax.random.split(jax.random.key(0), 2))
    cell = lambda p: np.asarray(p["actor"]["params"]["torso"]["cell"]["GRUCell_0"]["hn"]["kernel"])  # noqa: E731
    assert cell(first.params).shape == cell(result.state.params).shape == (2, 8, 8)
    assert (np.abs(cell(first.params) - cell(result.state.params)).reshape(2, -1).max(1) > 0).all()


def test_the_checkpoint_holds_the_carry_and_a_resumed_run_ends_the_same(ppo_run, tmp_path):
    cfg, result, path = ppo_run
    loaded = rmtjax.load_run(path)
    for a, b in zip(jax.tree.leaves(loaded.state.carry), jax.tree.leaves(result.state.carry)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(loaded.state.reset), np.asarray(result.state.reset))

    class Stop(Exception):
        pass

    def stop(state, metrics, iteration):
        raise Stop

    again = tmp_path / "again"
    with pytest.raises(Stop):  # interrupted after the first chunk (and its checkpoint)
        rmtjax.train(cfg, jax.random.key(0), run_dir=again, on_chunk=stop)
    resumed = rmtjax.train(None, resume=again)
    for a, b in zip(jax.tree.leaves((resumed.state.params, resumed.state.carry)),
                    jax.tree.leaves((result.state.params, result.state.carry))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_act_step_evaluate_and_load_policy_carry_the_memory(ppo_run):
    cfg, result, path = ppo_run
    agent = build_agent(cfg)
    params = jax.tree.map(lambda x: x[0], result.state.params)
    with pytest.raises(TypeError, match="act_step"):
        agent.act(params, jnp.zeros((1, 3)))
    # a policy with memory: the same observation after different histories gets different carries
    obs = jnp.array([[1.0, 0.0, 1.0], [1.0, 0.0, -1.0]])
    _, carry = agent.act_step(params, agent.initial_carry(2), obs, jnp.ones(2, bool))
    assert np.abs(np.asarray(carry[0] - carry[1])).max() > 0
    later = jnp.array([[0.5, 0.0, 0.0], [0.5, 0.0, 0.0]])
    _, after = agent.act_step(params, carry, later, jnp.zeros(2, bool))
    assert np.abs(np.asarray(after[0] - after[1])).max() > 0
    # ... and a reset forgets the history
    _, forgot = agent.act_step(params, carry, later, jnp.ones(2, bool))
    np.testing.assert_array_equal(np.asarray(forgot[0]), np.asarray(forgot[1]))

    policy = rmtjax.load_policy(path, seed=0)
    assert isinstance(policy, RecurrentPolicy)
    want, want_carry = agent.act_step(params, agent.initial_carry(2), obs, jnp.ones(2, bool))
    got, got_carry = policy(obs)  # carry None: the start of an episode
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_allclose(np.asarray(got_carry), np.asarray(want_carry), rtol=1e-6, atol=1e-6)
    single, one_carry = policy(obs[1])
    assert single.shape == () and int(single) == int(want[1]) and one_carry.shape == (1, 8)
    _, next_carry = policy(later, got_carry)
    np.testing.assert_allclose(np.asarray(next_carry), np.asarray(after), rtol=1e-6, atol=1e-6)

    ev = rmtjax.evaluate(path, episodes=3)
    assert ev.returns.shape == (2, 3) and ev.finished.all()
    assert set(np.unique(ev.returns)) <= {-1.0, 1.0}  # MemoryChain: one reward of ±1 per episode
    np.testing.assert_array_equal(ev.lengths, 4)


def test_recurrent_pqn_and_dqn_train_end_to_end():
    pqn = rmtjax.make_config("pqn", "MemoryChain-bsuite", {**ENV, "agent.torso": "lstm", "agent.rnn_width": 8,
                                                           "agent.hidden": [8], "agent.rollout_len": 8,
                                                           "agent.num_minibatches": 2, "train.total_steps": 64})
    dqn = rmtjax.make_config("dqn", "MemoryChain-bsuite", {**ENV, "agent.torso": "gru", "agent.rnn_width": 8,
                                                           "agent.hidden": [8], "agent.rollout_len": 4,
                                                           "agent.seq_len": 8, "agent.burn_in": 2,
                                                           "agent.batch_size": 4,
                                                           "agent.buffer_size": 256, "agent.learning_starts": 48,
                                                           "agent.updates_per_step": 0.125, "train.total_steps": 64})
    assert isinstance(build_agent(pqn), RecurrentPQN) and isinstance(build_agent(dqn), RecurrentDQN)
    r = rmtjax.train(pqn, jax.random.key(1))
    assert np.isfinite(r.metrics["loss"]).all() and r.metrics["loss"].max() > 0
    assert jax.tree.leaves(r.state.carry)[0].shape == (2, 4, 8)
    r = rmtjax.train(dqn, jax.random.key(2))
    learned = r.metrics["loss"][:, 2:]  # 16 steps an iteration: learning starts once 48 are done, after iteration 2
    assert np.isfinite(learned).all() and learned.min() > 0 and (r.metrics["loss"][:, :2] == 0).all()
    assert (r.metrics["replay_size"][:, -1] == 4 * 4).all()  # one sequence per env per iteration
    # the stored sequences hold the hidden state at their start: nonzero once an env has stepped
    start = np.asarray(r.state.replay.data["item"]["start"])
    assert np.abs(start[:, :16]).max() > 0 and start.shape[-1] == 8


def test_unsupported_combinations_are_refused():
    with pytest.raises(ConfigError, match=r"agent.replay: 'tiered' with agent.torso: lstm .*replay: uniform"):
        rmtjax.make_config("rmt", "CartPole-v1", {"agent.torso": "lstm"})
    with pytest.raises(ConfigError, match=r"agent.n_step: 3 with agent.torso: gru"):
        rmtjax.make_config("rmt", "CartPole-v1", {"agent.torso": "gru", "agent.replay": "uniform"})
    with pytest.raises(ConfigError, match=r"agent.burn_in: 16 leaves no step of agent.seq_len 16"):
        rmtjax.make_config("dqn", "CartPole-v1", {"agent.torso": "gru", "agent.burn_in": 16})
    with pytest.raises(ConfigError, match=r"num_minibatches: 4 must divide env.num_envs = 2 with torso: lstm"):
        rmtjax.make_config("ppo", "CartPole-v1", {"agent.torso": "lstm", "env.num_envs": 2})
    with pytest.raises(ConfigError, match=r"agent.torso"):
        rmtjax.make_config("sac", "Pendulum-v1", {"agent.torso": "lstm"})
    # the feed-forward agents keep act, an empty carry and act_step = act
    agent = build_agent(rmtjax.make_config("ppo", "CartPole-v1"))
    assert not agent.recurrent and agent.initial_carry(3) == ()


def test_masked_cartpole_is_cartpole_without_the_velocities():
    from rmtjax.config import EnvConfig
    from rmtjax.envs import available_envs, make_env

    assert "CartPole-masked-v1" in available_envs(adapters=False)
    masked, full = (make_env(EnvConfig(id=i, num_envs=3)) for i in ("CartPole-masked-v1", "CartPole-v1"))
    assert masked.spec.obs_shape == (2,) and masked.spec.num_actions == 2

    @jax.jit
    def run(key):
        def both(carry, k):
            (mo, ms), (fo, fs) = carry
            k_a, k_e = jax.random.split(k)
            a = jax.random.randint(k_a, (3,), 0, 2)
            m, f = masked.step(k_e, ms, a), full.step(k_e, fs, a)
            return ((m[0], m[1]), (f[0], f[1])), (mo, fo, m[2], f[2], m[3], f[3], m[4], f[4])

        return jax.lax.scan(both, (masked.reset(key), full.reset(key)), jax.random.split(key, 200))[1]

    mo, fo, mr, fr, mterm, fterm, mtrunc, ftrunc = run(jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(mo), np.asarray(fo)[..., [0, 2]])  # position and angle, as CartPole's
    for a, b in ((mr, fr), (mterm, fterm), (mtrunc, ftrunc)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.asarray(fterm).sum() > 0  # episodes ended (and reset) on the way
