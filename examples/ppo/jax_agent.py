"""PPO as a JAX user writes it, with multicritic's critic as the value function.

The actor is a pure MLP over a parameter pytree; the critic is a `CriticNetwork`
used through its pure functions (`critic.stateless_call`, `critic.compute_ema`),
trained by the user's own `jax.jit`-ted step with optax on `multicritic.critic_loss`
(the recipe of docs/frameworks/jax.md). As CleanRL's JAX PPO, each environment
step is one jitted call (`make_act`: the actor once, the categorical draw, the
log-probability and the critic's value, the next PRNG key) and each minibatch
one jitted update (`make_update`). Hyperparameters, rollouts and GAE are
`keras_agent.py`'s (the same experiment, another framework's idiom).

    KERAS_BACKEND=jax python examples/ppo/jax_agent.py --env CartPole-v1 --head two_hot \\
        --reward-scale 1000 --steps 100000 --seed 1 --json run.json
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

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


def actor_init(key, sizes):
    """`[(kernel [in, out], bias [out]), ...]` (a Keras `Dense` layer's layout): orthogonal kernels (gain
    sqrt(2), the last layer's 0.01), zero biases."""
    params = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, sub = jax.random.split(key)
        scale = 0.01 if i == len(sizes) - 2 else np.sqrt(2.0)
        params.append((jax.nn.initializers.orthogonal(scale)(sub, (n_in, n_out)), jnp.zeros(n_out)))
    return params


def actor_logits(params, obs):
    x = obs
    for w, b in params[:-1]:
        x = jnp.tanh(x @ w + b)
    return x @ params[-1][0] + params[-1][1]


def adam(learning_rate):
    """optax's Adam with Keras's epsilon (the Keras agent's and `CriticTrainer`'s Adam): Keras adds epsilon to
    `sqrt(v)` before the bias correction, optax after it, so optax's epsilon at step t is `eps / sqrt(1 - b2^t)`.
    With the same number in both, the early updates of small gradients would differ."""
    eps, b2 = HYPERPARAMETERS["adam_epsilon"], 0.999
    return optax.inject_hyperparams(optax.adam)(
        learning_rate, b2=b2, eps=lambda count: eps / jnp.sqrt(1.0 - b2 ** (count + 1.0))
    )


def optimizers():
    """`(actor's, critic's)` optax transformations: Adam after a clip of the gradients' global norm."""
    hp = HYPERPARAMETERS
    actor_tx = optax.chain(optax.clip_by_global_norm(hp["actor_clip"]), adam(hp["actor_lr"]))
    critic_tx = optax.chain(optax.clip_by_global_norm(hp["critic_clip"]), adam(hp["critic_lr"]))
    return actor_tx, critic_tx


def critic_params(critic):
    """`(fast, ema)`: the critic's trainable and non-trainable (its EMA copy's) values, `stateless_call`'s."""
    return [v.value for v in critic.trainable_variables], [v.value for v in critic.non_trainable_variables]


def make_act(critic):
    """The jitted step `(key, actor, fast, ema, obs [N, obs]) -> (next key, action [N], its log-probability
    [N], real-space value [N])`: one dispatch per environment step."""

    @jax.jit
    def act(key, actor, fast, ema, obs):
        key, sub = jax.random.split(key)
        logp_all = jax.nn.log_softmax(actor_logits(actor, obs))
        action = jax.random.categorical(sub, logp_all)
        (value, _), _ = critic.stateless_call(fast, ema, obs)  # the critic's one input is the observation
        return key, action, jnp.take_along_axis(logp_all, action[:, None], 1)[:, 0], inverse_symlog(value)

    return act


def make_update(critic, actor_tx, critic_tx):
    """The jitted minibatch update `(actor, actor_state, fast, ema, critic_state, obs, action, old_logp,
    advantages, returns) -> (actor, actor_state, fast, ema, critic_state)`: the actor's PPO step, then the
    critic's on the returns and its EMA copy's."""
    hp = HYPERPARAMETERS
    options = critic.loss_options()

    @jax.jit
    def update(actor, actor_state, fast, ema, critic_state, obs, action, old_logp, adv, ret):
        def actor_loss(actor):
            logp_all = jax.nn.log_softmax(actor_logits(actor, obs))
            logp = jnp.take_along_axis(logp_all, action[:, None], 1)[:, 0]
            ratio = jnp.exp(logp - old_logp)
            surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - hp["clip"], 1 + hp["clip"]) * adv)
            entropy = -(jnp.exp(logp_all) * logp_all).sum(-1)
            return -surrogate.mean() - hp["entropy"] * entropy.mean()

        def value_loss(fast):
            (_, logits), _ = critic.stateless_call(fast, ema, obs)
            (ema_value, _), _ = critic.stateless_call(fast, ema, obs, use_ema=True)
            return critic_loss(logits, ret, ema_value, jnp.ones_like(ret), **options)["total"]

        grads = jax.grad(actor_loss)(actor)
        updates, actor_state = actor_tx.update(grads, actor_state, actor)
        actor = optax.apply_updates(actor, updates)
        grads = jax.grad(value_loss)(fast)
        updates, critic_state = critic_tx.update(grads, critic_state, fast)
        fast = optax.apply_updates(fast, updates)
        return actor, actor_state, fast, critic.compute_ema(fast, ema), critic_state

    return update


def train(env_id, head, reward_scale, steps, seed, json_path=None, log=print):
    hp = HYPERPARAMETERS
    rng = np.random.default_rng(seed)
    envs, obs, obs_size, actions, record = start_run(env_id, head, reward_scale, steps, seed, "jax (its own jit)")
    actor = actor_init(jax.random.PRNGKey(seed), [obs_size, hp["units"], hp["units"], actions])
    critic = value_network(obs_size, head, hp["units"])
    fast, ema = critic_params(critic)
    actor_tx, critic_tx = optimizers()
    actor_state, critic_state = actor_tx.init(actor), critic_tx.init(fast)
    act, update = make_act(critic), make_update(critic, actor_tx, critic_tx)

    @jax.jit
    def values(fast, ema, obs):
        (value, _), _ = critic.stateless_call(fast, ema, obs)
        return inverse_symlog(value)

    key = jax.random.PRNGKey(seed + 1)
    phases = Phases()
    start, step, T, E = time.perf_counter(), 0, hp["rollout"], hp["envs"]
    while step < steps:
        buf = rollout_buffer(T, E, obs_size, "int32")
        for t in range(T):
            # The actor's and the critic's share are one call: timed together (no "value" phase).
            with phases("act"):
                key, action, logp, value = act(key, actor, fast, ema, obs)
                action, buf["logp"][t], buf["value"][t] = jax.device_get((action, logp, value))
                buf["obs"][t], buf["action"][t] = obs, action
            with phases("env"):
                obs, step = env_step(envs, action, buf, t, reward_scale, record, step)
        with phases("other"):
            flat, adv, ret, returns = rollout_targets(buf, np.asarray(values(fast, ema, obs)))
        with phases("update"):
            for idx, a in minibatches(adv, rng):
                actor, actor_state, fast, ema, critic_state = update(
                    actor,
                    actor_state,
                    fast,
                    ema,
                    critic_state,
                    flat["obs"][idx],
                    flat["action"][idx],
                    flat["logp"][idx],
                    a.astype("float32"),
                    ret[idx],
                )
            jax.block_until_ready(fast)  # the update's last step done (it runs async)
        with phases("other"):
            report(record, step, start, json_path, log, critic_fit(buf["value"], returns), phases)
    envs.close()
    return record


if __name__ == "__main__":
    main(train=train, doc=__doc__)
