"""PPO as a TensorFlow user writes it, with multicritic's critic as the value function.

The actor is a pure MLP over `tf.Variable`s; the critic is a `CriticNetwork`
called inside the user's own `tf.function`s (the recipe of
docs/frameworks/tensorflow.md): one function per environment step (the
action, its log-probability and the critic's value) and one per update (both
losses under `tf.GradientTape`, Keras's Adam, the global-norm clips and
`critic.update_ema()`). Plain graphs: with `jit_compile=True` XLA's
compilation did not pay back over a 25,000-step CartPole run (13.3 s against
11.7 s, one core). Hyperparameters, rollouts and GAE are `keras_agent.py`'s
(the same experiment, another framework's idiom).

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
    """`[(w, b), ...]` as `tf.Variable`s: orthogonal kernels (gain sqrt(2), the last 0.01), zero biases."""
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


def train(env_id, head, reward_scale, steps, seed, json_path=None, log=print):
    hp = HYPERPARAMETERS
    tf.random.set_seed(seed)
    rng = np.random.default_rng(seed)
    envs, obs, obs_size, actions, record = start_run(
        env_id, head, reward_scale, steps, seed, "tensorflow (its own tf.function)"
    )
    actor = actor_init(seed, [obs_size, hp["units"], hp["units"], actions])
    actor_vars = [v for pair in actor for v in pair]
    actor_opt = keras.optimizers.Adam(hp["actor_lr"], epsilon=1e-5)
    critic = value_network(obs_size, head, hp["units"])
    critic_opt = keras.optimizers.Adam(hp["critic_lr"], epsilon=1e-5)
    options = critic.loss_options()

    @tf.function
    def act(obs, seed):
        logp_all = tf.nn.log_softmax(actor_logits(actor, obs))
        # A categorical draw by the Gumbel-max trick (one stateless op per call, under XLA as in a plain graph).
        uniform = tf.random.stateless_uniform(tf.shape(logp_all), seed, minval=1e-20, maxval=1.0)
        action = tf.argmax(logp_all - tf.math.log(-tf.math.log(uniform)), -1, output_type=tf.int32)
        value, _ = critic(obs, tf.ones((tf.shape(obs)[0], 1, 1)))
        return action, tf.gather(logp_all, action, batch_dims=1), inverse_symlog(value)

    @tf.function
    def values(obs):
        value, _ = critic(obs, tf.ones((tf.shape(obs)[0], 1, 1)))
        return inverse_symlog(value)

    @tf.function
    def update(obs, action, old_logp, adv, ret):
        with tf.GradientTape() as tape:
            logp_all = tf.nn.log_softmax(actor_logits(actor, obs))
            ratio = tf.exp(tf.gather(logp_all, action, batch_dims=1) - old_logp)
            surrogate = tf.minimum(ratio * adv, tf.clip_by_value(ratio, 1 - hp["clip"], 1 + hp["clip"]) * adv)
            entropy = -tf.reduce_sum(tf.exp(logp_all) * logp_all, -1)
            actor_loss = -tf.reduce_mean(surrogate) - hp["entropy"] * tf.reduce_mean(entropy)
        grads, _ = tf.clip_by_global_norm(tape.gradient(actor_loss, actor_vars), 0.5)
        actor_opt.apply_gradients(zip(grads, actor_vars))
        z = tf.ones((tf.shape(obs)[0], 1, 1))
        ema_value, _ = critic(obs, z, use_ema=True)
        fast = critic.trainable_variables
        with tf.GradientTape() as tape:
            _, logits = critic(obs, z)
            loss = critic_loss(logits, ret, ema_value, tf.ones_like(ret), **options)["total"]
        grads, _ = tf.clip_by_global_norm(tape.gradient(loss, fast), hp["critic_clip"])
        critic_opt.apply_gradients(zip(grads, fast))
        critic.update_ema()
        return loss

    phases = Phases()
    start, step, T, E = time.perf_counter(), 0, hp["rollout"], hp["envs"]
    while step < steps:
        buf = rollout_buffer(T, E, obs_size, "int32")
        for t in range(T):
            # The action, its log-probability and the value in one compiled call (the value's share is not
            # timed apart from the actor's: `act` holds both).
            with phases("act"):
                action, logp, value = act(tf.constant(obs, tf.float32), rng.integers(0, 2**31, size=2))
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
