"""PPO as a TensorFlow user writes it, with multicritic's critic as the value function.

The actor is a pure MLP over `tf.Variable`s; the critic is a `CriticNetwork`
called inside the user's own `tf.function`s (the recipe of
docs/frameworks/tensorflow.md): one call per environment step (`make_act`:
the action, its log-probability and the critic's value) and one per
minibatch (`make_update`: both losses under `tf.GradientTape`, Keras's Adam,
the global-norm clips and `critic.update_ema()`). Acting goes through the
function's concrete function, called directly: a `tf.function` call first
matches its arguments against its traces, a cost paid at every one of the
rollout's many small calls. Plain graphs: with `jit_compile=True` XLA's
compilation did not pay back over a 25,000-step CartPole run.
Hyperparameters, rollouts and GAE are `keras_agent.py`'s (the same
experiment, another framework's idiom).

    KERAS_BACKEND=tensorflow python examples/ppo/tf_agent.py --env CartPole-v1 --head two_hot \\
        --reward-scale 1000 --steps 100000 --seed 1 --json run.json
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from multicritic import critic_loss, inverse_symlog  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from keras_agent import (  # noqa: E402
    HYPERPARAMETERS,
    Phases,
    critic_fit,
    env_step,
    main,
    minibatches,
    report,
    rollout_buffer,
    rollout_targets,
    start_run,
    value_network,
)


def actor_init(seed, sizes):
    """`[(kernel [in, out], bias [out]), ...]` as `tf.Variable`s (a Keras `Dense` layer's layout): orthogonal
    kernels (gain sqrt(2), the last layer's 0.01), zero biases."""
    params = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        gain = 0.01 if i == len(sizes) - 2 else np.sqrt(2.0)
        w = tf.keras.initializers.Orthogonal(gain, seed=seed + i)((n_in, n_out))
        params.append((tf.Variable(w), tf.Variable(tf.zeros(n_out))))
    return params


def actor_logits(params, obs):
    x = obs
    for w, b in params[:-1]:
        x = tf.tanh(x @ w + b)
    return x @ params[-1][0] + params[-1][1]


def optimizers():
    """`(actor's, critic's)` Adam (Keras's: the one the Keras agent and `CriticTrainer` use)."""
    hp = HYPERPARAMETERS
    return (
        keras.optimizers.Adam(hp["actor_lr"], epsilon=hp["adam_epsilon"]),
        keras.optimizers.Adam(hp["critic_lr"], epsilon=hp["adam_epsilon"]),
    )


def make_act(actor, critic, obs_size):
    """The concrete function `obs [N, obs] -> (action [N], its log-probability [N], real-space value [N])`,
    called directly (no dispatch over traces); the categorical draw is a stateful op, seeded by
    `tf.random.set_seed` before this is traced."""

    def act(obs):
        logits = actor_logits(actor, obs)
        action = tf.random.categorical(logits, 1, dtype=tf.int32)[:, 0]
        value, _ = critic(obs)  # the critic's one input is the observation
        return action, tf.gather(tf.nn.log_softmax(logits), action, batch_dims=1), inverse_symlog(value)

    return tf.function(act).get_concrete_function(tf.TensorSpec([None, obs_size], tf.float32))


def make_update(actor, critic, actor_opt, critic_opt):
    """The minibatch update `(obs, action, old_logp, advantages, returns) -> critic loss` as a `tf.function`:
    the actor's PPO step, then the critic's on the returns and its EMA copy's."""
    hp = HYPERPARAMETERS
    actor_vars = [v for pair in actor for v in pair]
    options = critic.loss_options()

    @tf.function
    def update(obs, action, old_logp, adv, ret):
        with tf.GradientTape() as tape:
            logp_all = tf.nn.log_softmax(actor_logits(actor, obs))
            ratio = tf.exp(tf.gather(logp_all, action, batch_dims=1) - old_logp)
            surrogate = tf.minimum(ratio * adv, tf.clip_by_value(ratio, 1 - hp["clip"], 1 + hp["clip"]) * adv)
            entropy = -tf.reduce_sum(tf.exp(logp_all) * logp_all, -1)
            actor_loss = -tf.reduce_mean(surrogate) - hp["entropy"] * tf.reduce_mean(entropy)
        grads, _ = tf.clip_by_global_norm(tape.gradient(actor_loss, actor_vars), hp["actor_clip"])
        actor_opt.apply_gradients(zip(grads, actor_vars))
        ema_value, _ = critic(obs, use_ema=True)
        fast = critic.trainable_variables
        with tf.GradientTape() as tape:
            _, logits = critic(obs)
            loss = critic_loss(logits, ret, ema_value, tf.ones_like(ret), **options)["total"]
        grads, _ = tf.clip_by_global_norm(tape.gradient(loss, fast), hp["critic_clip"])
        critic_opt.apply_gradients(zip(grads, fast))
        critic.update_ema()
        return loss

    return update


def train(env_id, head, reward_scale, steps, seed, json_path=None, log=print):
    hp = HYPERPARAMETERS
    tf.random.set_seed(seed)
    rng = np.random.default_rng(seed)
    envs, obs, obs_size, actions, record = start_run(
        env_id, head, reward_scale, steps, seed, "tensorflow (its own tf.function)"
    )
    actor = actor_init(seed, [obs_size, hp["units"], hp["units"], actions])
    critic = value_network(obs_size, head, hp["units"])
    act = make_act(actor, critic, obs_size)
    update = make_update(actor, critic, *optimizers())

    @tf.function
    def values(obs):
        value, _ = critic(obs)
        return inverse_symlog(value)

    phases = Phases()
    start, step, T, E = time.perf_counter(), 0, hp["rollout"], hp["envs"]
    while step < steps:
        buf = rollout_buffer(T, E, obs_size, "int32")
        for t in range(T):
            # The actor's and the critic's share are one call: timed together (no "value" phase).
            with phases("act"):
                action, logp, value = act(obs)
                action = action.numpy()
                buf["obs"][t], buf["action"][t], buf["logp"][t] = obs, action, logp.numpy()
                buf["value"][t] = value.numpy()
            with phases("env"):
                obs, step = env_step(envs, action, buf, t, reward_scale, record, step)
        with phases("other"):
            flat, adv, ret, returns = rollout_targets(buf, values(tf.constant(obs, tf.float32)).numpy())
        with phases("update"):
            for idx, a in minibatches(adv, rng):
                a = a.astype("float32")
                loss = update(flat["obs"][idx], flat["action"][idx], flat["logp"][idx], a, ret[idx])
            loss.numpy()
        with phases("other"):
            report(record, step, start, json_path, log, critic_fit(buf["value"], returns), phases)
    envs.close()
    return record


if __name__ == "__main__":
    main(train=train, doc=__doc__)
