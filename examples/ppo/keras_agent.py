"""PPO on a Gymnasium task with multicritic's critic as the value function: one Keras program, every backend.

Proximal Policy Optimization (Schulman et al. 2017), in the recipe of
CleanRL's `ppo.py` (vectorised environments, GAE, clipped surrogate,
advantages normalised per minibatch, entropy bonus), with the value function
replaced by a `CriticNetwork` trained by `CriticTrainer` on the GAE returns
(its slow-critic regulariser included): the setting of Sullivan et al.,
"Reward Scale Robustness for Proximal Policy Optimization via DreamerV3
Tricks" (NeurIPS 2023). Rewards are multiplied by `--reward-scale` and never
normalised: a symlog two-hot critic should learn the same at 1, 1e3 and 1e6.
The critic takes the observation itself: a features critic
(`CriticNetwork(input_size=...)`), called with one input `x`.

The actor is a Keras model trained with `train_on_batch` (its PPO loss in
`keras.ops`), the critic a multicritic trainer step: the same program runs
on TensorFlow, PyTorch and JAX (`KERAS_BACKEND`). Per environment step it
makes one call: the actor and the critic as one Keras model with two
outputs (`acting_model`), called through `multicritic.CompiledForward`,
which compiles it per input signature (`jax.jit` on JAX, a concrete
function on TensorFlow, a replayed ATen graph on PyTorch) where calling a
Keras model eagerly, or through `predict_on_batch`, runs its layers one by
one from Python.

    KERAS_BACKEND=jax python examples/ppo/keras_agent.py --env CartPole-v1 --head two_hot \\
        --reward-scale 1000 --steps 100000 --seed 1 --json run.json

Prints the episodes' returns (in the environment's own units) as it goes;
`--json` gets the whole curve (rewritten every update). `--trunk` picks the
critic's trunk (`mlp`, the default, or another of `multicritic.trunks`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import time

import gymnasium as gym
import keras
import numpy as np
from keras import ops

from multicritic import CompiledForward, CriticNetwork, CriticTrainer
from multicritic.heads import SUPPORT

# One set of hyperparameters for every task, scale and head: CleanRL's PPO for classic control, but the
# critic's learning rate 4x the actor's. A two-hot critic starts from uniform bucket probabilities and decodes
# the mean in symlog space, so the mass it has not yet moved pulls its value towards symlog 0 in proportion to
# the return's symlog: the same fraction is a 2x error at returns near 50 and a 1000x one near 5e7. At 2.5e-4
# that transient outlasted 50,000 CartPole steps at reward scale 1e6 (docs/real-agents.md).
HYPERPARAMETERS = dict(
    envs=4,
    rollout=128,
    epochs=4,
    minibatches=4,
    gamma=0.99,
    gae_lambda=0.95,
    clip=0.2,
    entropy=0.01,
    actor_lr=2.5e-4,
    critic_lr=1e-3,
    actor_clip=0.5,
    critic_clip=50.0,
    adam_epsilon=1e-5,
    units=64,
)


class Phases:
    """Wall seconds a run spends in each phase (`with phases("env"): ...`), for the agents' cost breakdown
    (`benchmarks/agents/ppo_cost.py`). Each agent's phases end where its values are on the host, so no
    asynchronous work is counted in the phase after it."""

    NAMES = ("act", "value", "env", "update", "other")

    def __init__(self):
        self.seconds = dict.fromkeys(self.NAMES, 0.0)

    @contextlib.contextmanager
    def __call__(self, name):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start


def ppo_loss(y_true, logits):
    """The clipped surrogate with an entropy bonus; `y_true` packs `[action, advantage, old log-prob]`."""
    action = ops.cast(y_true[:, 0], "int32")
    advantage, old_logp = y_true[:, 1], y_true[:, 2]
    logp_all = ops.log_softmax(logits)
    logp = ops.take_along_axis(logp_all, action[:, None], axis=1)[:, 0]
    ratio = ops.exp(logp - old_logp)
    clipped = ops.clip(ratio, 1.0 - HYPERPARAMETERS["clip"], 1.0 + HYPERPARAMETERS["clip"])
    surrogate = ops.minimum(ratio * advantage, clipped * advantage)
    entropy = -ops.sum(ops.exp(logp_all) * logp_all, axis=-1)
    return -ops.mean(surrogate) - HYPERPARAMETERS["entropy"] * ops.mean(entropy)


def make_actor(obs_size, actions, units):
    """The actor as CleanRL's PPO builds it: orthogonal kernels (gain sqrt(2), the last layer's 0.01: near-uniform
    first policies), zero biases, Adam after a clip of the gradients' global norm (Keras's `clipnorm` would clip
    each weight's gradient on its own)."""
    hp = HYPERPARAMETERS
    inputs = keras.Input((obs_size,))
    x = inputs
    for _ in range(2):
        x = keras.layers.Dense(units, "tanh", kernel_initializer=keras.initializers.Orthogonal(np.sqrt(2)))(x)
    actor = keras.Model(inputs, keras.layers.Dense(actions, kernel_initializer=keras.initializers.Orthogonal(0.01))(x))
    optimizer = keras.optimizers.Adam(hp["actor_lr"], epsilon=hp["adam_epsilon"], global_clipnorm=hp["actor_clip"])
    actor.compile(optimizer=optimizer, loss=ppo_loss)
    return actor


def head_spec(text):
    """A head given on the command line: a registered name, or `name:option=value,...` for its own options
    (`mse:symlog=False`, PPO's raw regression), as the spec the critic takes."""
    name, _, options = text.partition(":")
    if not options:
        return name
    config = {}
    for item in options.split(","):
        key, _, value = item.partition("=")
        config[key] = ast.literal_eval(value)
    return {"class_name": name, "config": config}


# More `CriticNetwork` options for every run (`benchmarks/agents/critic_transient.py` tries `bin_scheme`).
CRITIC_OPTIONS = {}


def value_network(obs_size, head, units):
    """The built critic of `obs_size` observations (a features critic: its one input is the observation). The
    value support a head is given on the command line with (`two_hot:bin_scheme='symexp'`) is the critic's."""
    spec = head_spec(head)
    support = {}
    if isinstance(spec, dict):
        support = {key: spec["config"].pop(key) for key in SUPPORT if key in spec["config"]}
    return CriticNetwork(
        **CRITIC_OPTIONS,
        **support,
        model_size=None,
        input_size=obs_size,
        num_dense_layers=2,
        dense_hidden_units=units,
        head=spec,
    )


def make_critic(obs_size, head, units, seed):
    critic = value_network(obs_size, head, units)
    trainer = CriticTrainer(
        critic,
        learning_rate=HYPERPARAMETERS["critic_lr"],
        epsilon=HYPERPARAMETERS["adam_epsilon"],
        grad_clip=HYPERPARAMETERS["critic_clip"],  # of the gradients' global norm
        seed=seed,
        metrics="core",
    )
    return critic, trainer


def sample(logp, rng):
    """One action per row of log-probabilities `[N, actions]`: what `rng.choice(actions, p=row)` gives row by
    row (the same uniform draws, inverted through each row's normalised CDF), in one vectorised pass."""
    cdf = np.cumsum(np.exp(logp), -1)
    cdf /= cdf[:, -1:]
    return (cdf <= rng.random(len(logp))[:, None]).sum(-1)


def real_values(value_symlog):
    """Real-space values from the critic's symlog ones (symexp on the host, in float64: the values are needed
    there)."""
    value_symlog = np.asarray(keras.ops.convert_to_numpy(value_symlog), "float64")
    return np.sign(value_symlog) * np.expm1(np.abs(value_symlog))


def values(critic, obs):
    """The critic's real-space values of observations `[N, obs]`."""
    value_symlog, _ = critic(obs)
    return real_values(value_symlog)


def acting_model(actor, critic, obs_size):
    """The actor and the critic as one Keras model, `obs [N, obs] -> (logits [N, actions], symlog value
    [N])`, as Keras's own actor-critic example builds its agent: called through `CompiledForward`, each
    environment step is one compiled call where two models were two (on TensorFlow a call costs about 0.3
    ms whatever it computes)."""
    obs = keras.Input((obs_size,))
    value_symlog, _ = critic(obs)
    return keras.Model(obs, (actor(obs), value_symlog))


def start_run(env_id, head, reward_scale, steps, seed, backend):
    """`(envs, observations, observation size, actions, record)`: `HYPERPARAMETERS["envs"]` environments
    (episode statistics recorded, reset with `seed`) and the run's record (its curve goes in `episodes`)."""
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(HYPERPARAMETERS["envs"])],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    obs, _ = envs.reset(seed=seed)
    record = {
        "env": env_id,
        "head": head,
        "reward_scale": reward_scale,
        "seed": seed,
        "steps": steps,
        "backend": backend,
        "hyperparameters": HYPERPARAMETERS,
        "critic_options": dict(CRITIC_OPTIONS),
        "episodes": [],
    }
    return envs, obs, int(envs.single_observation_space.shape[0]), int(envs.single_action_space.n), record


def rollout_buffer(steps, envs, obs_size, action_dtype):
    """Zeroed `[steps, envs, ...]` arrays of a rollout: observations, actions, their log-probabilities, the
    (scaled) rewards, episode ends and the critic's values."""
    shapes = {
        "obs": ((obs_size,), "float32"),
        "action": ((), action_dtype),
        "logp": ((), "float32"),
        "reward": ((), "float64"),
        "done": ((), "float64"),
        "value": ((), "float64"),
    }
    return {k: np.zeros((steps, envs) + shape, dtype) for k, (shape, dtype) in shapes.items()}


def env_step(envs, action, buf, t, reward_scale, record, step):
    """Steps the environments: the scaled rewards and episode ends into `buf[t]`, each finished episode's return
    (unscaled) into `record`; returns `(observations, environment steps so far)`."""
    obs, reward, terminated, truncated, info = envs.step(action)
    # A truncated episode counts as an end, as in CleanRL's PPO (no bootstrap from its last observation).
    buf["reward"][t], buf["done"][t] = reward * reward_scale, np.logical_or(terminated, truncated)
    step += len(action)
    if "episode" in info:
        for i in np.flatnonzero(info["_episode"]):
            record["episodes"].append([step, float(info["episode"]["r"][i])])
    return obs, step


def gae(rewards, dones, value, last_value, gamma, lam):
    """Generalised advantage estimates `[T, E]` and the returns they imply (advantage + value)."""
    advantages = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[1])
    for t in reversed(range(len(rewards))):
        next_value = last_value if t == len(rewards) - 1 else value[t + 1]
        live = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * live - value[t]
        running = delta + gamma * lam * live * running
        advantages[t] = running
    return advantages, advantages + value


def rollout_targets(buf, last_value):
    """An update's data from a rollout `buf` (`rollout_buffer`) and the critic's values of the observations
    after it: `(flat, advantages, returns)`, with `flat` the rollout's arrays as `[T * E, ...]`, the GAE
    advantages `[T * E]` and the returns `[T * E]` (float32: the critic's targets), and the returns `[T, E]`."""
    hp = HYPERPARAMETERS
    advantages, returns = gae(buf["reward"], buf["done"], buf["value"], last_value, hp["gamma"], hp["gae_lambda"])
    rows = advantages.size
    flat = {k: v.reshape((rows,) + v.shape[2:]) for k, v in buf.items()}
    return flat, advantages.reshape(-1), returns.reshape(-1).astype("float32"), returns


def minibatches(advantages, rng):
    """An update's minibatches, `HYPERPARAMETERS["epochs"]` shuffled passes of `["minibatches"]` each:
    `(indices, advantages normalised over the minibatch)`."""
    hp = HYPERPARAMETERS
    size = len(advantages) // hp["minibatches"]
    for _ in range(hp["epochs"]):
        order = rng.permutation(len(advantages))
        for i in range(hp["minibatches"]):
            idx = order[i * size : (i + 1) * size]
            a = advantages[idx]
            yield idx, (a - a.mean()) / (a.std() + 1e-8)


def update(actor, trainer, obs, action, old_logp, advantages, returns):
    """One minibatch's update: the actor's PPO step, then the critic's on the returns; the critic's metrics."""
    y = np.stack([action, advantages, old_logp], -1).astype("float32")
    actor.train_on_batch(obs, y)
    return trainer.train_step(obs, returns, np.ones(len(returns), "float32"))


def train(env_id, head, reward_scale, steps, seed, json_path=None, log=print):
    """Runs PPO; returns `{"episodes": [[env step, return], ...], "seconds": ...}` (returns unscaled)."""
    hp = HYPERPARAMETERS
    keras.utils.set_random_seed(seed)
    envs, obs, obs_size, actions, record = start_run(env_id, head, reward_scale, steps, seed, keras.backend.backend())
    actor = make_actor(obs_size, actions, hp["units"])
    critic, trainer = make_critic(obs_size, head, hp["units"], seed)
    act = CompiledForward(acting_model(actor, critic, obs_size))  # compiled, as the critic's own calls are
    rng = np.random.default_rng(seed)
    phases = Phases()
    start, step = time.perf_counter(), 0
    T, E = hp["rollout"], hp["envs"]
    while step < steps:
        buf = rollout_buffer(T, E, obs_size, "int64")
        for t in range(T):
            with phases("act"):  # the actor's logits and the critic's value, in one call
                logits, value_symlog = act(obs.astype("float32"))
                logits = np.asarray(ops.convert_to_numpy(logits), "float64")
                logp_all = (
                    logits
                    - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
                    - logits.max(-1, keepdims=True)
                )
                action = sample(logp_all, rng)
                buf["obs"][t], buf["action"][t] = obs, action
                buf["logp"][t] = logp_all[np.arange(E), action]
                buf["value"][t] = real_values(value_symlog)
            with phases("env"):
                obs, step = env_step(envs, action, buf, t, reward_scale, record, step)
        with phases("other"):
            flat, adv, ret, returns = rollout_targets(buf, values(critic, obs.astype("float32")))
        with phases("update"):
            for idx, a in minibatches(adv, rng):
                metrics = update(actor, trainer, flat["obs"][idx], flat["action"][idx], flat["logp"][idx], a, ret[idx])
            keras.ops.convert_to_numpy(metrics["total"])  # the update's last step done (JAX runs it async)
        with phases("other"):
            report(record, step, start, json_path, log, critic_fit(buf["value"], returns), phases)
    envs.close()
    return record


def critic_fit(values, returns):
    """The critic's fit to an update's GAE returns (both `[T, E]`, real space): `[explained variance, mean
    |symlog(value) - symlog(return)|, relative bias sum(value - return) / sum(|return|)]`; the first as
    CleanRL logs it, the second in the critic's own units, the third scale-free."""
    symlog = lambda x: np.sign(x) * np.log1p(np.abs(x))  # noqa: E731
    spread, size = np.var(returns), np.sum(np.abs(returns))
    explained = 1.0 - np.var(returns - values) / spread if spread > 0 else float("nan")
    bias = np.sum(values - returns) / size if size > 0 else float("nan")
    return [float(explained), float(np.mean(np.abs(symlog(values) - symlog(returns)))), float(bias)]


def report(record, step, start, json_path, log, fit=None, phases=None):
    """After an update: the last 20 episodes' mean return on the log, the critic's `fit` (`critic_fit`) to
    `record["critic"]`, the seconds per phase so far (`Phases`) to `record["phases"]`, the record to
    `json_path`."""
    if fit is not None:
        record.setdefault("critic", []).append([step, *fit])
    if phases is not None:
        record["phases"] = dict(phases.seconds)
    recent = [r for _, r in record["episodes"][-20:]]
    log(
        f"{record['env']} {record['head']} x{record['reward_scale']:g} seed {record['seed']} [{record['backend']}]: "
        f"step {step}, return {np.mean(recent) if recent else float('nan'):.1f} (last 20 episodes)"
    )
    record["seconds"] = time.perf_counter() - start
    if json_path:
        with open(json_path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(json_path + ".tmp", json_path)


def main(argv=None, train=train, doc=__doc__):
    """The agents' command line: `train(env, head, reward_scale, steps, seed, json)`; `--trunk` other than
    `mlp` goes to the critic through `CRITIC_OPTIONS` (the run's record keeps it there)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--head", default="two_hot", help="the critic's head")
    parser.add_argument("--trunk", default="mlp", help="the critic's trunk (a registered name: multicritic.trunks)")
    parser.add_argument("--reward-scale", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=100_000, help="environment steps")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.trunk != "mlp":  # the default run builds its critic as it always did
        CRITIC_OPTIONS["trunk"] = args.trunk
    return train(args.env, args.head, args.reward_scale, args.steps, args.seed, args.json)


if __name__ == "__main__":
    main()
