"""PPO as a JAX user writes it, with multicritic's critic as the value function.

The actor is a pure MLP over a parameter pytree; the critic is a `CriticNetwork`
used through its pure functions (`critic.stateless_call`, `critic.compute_ema`),
trained by the user's own `jax.jit`-ted step with optax on `multicritic.critic_loss`
(the recipe of docs/frameworks/jax.md). Hyperparameters, rollouts and GAE are
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
from keras_agent import (
    HYPERPARAMETERS,
    Phases,
    critic_fit,
    env_step,
    main,
    minibatches,
    report,
    rollout_buffer,
    rollout_targets,  # noqa: E402
    start_run,
    value_network,
)


def actor_init(key, sizes):
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


def train(env_id, head, reward_scale, steps, seed, json_path=None, log=print):
    hp = HYPERPARAMETERS
    rng = np.random.default_rng(seed)
    envs, obs, obs_size, actions, record = start_run(env_id, head, reward_scale, steps, seed, "jax (its own jit)")
    actor = actor_init(jax.random.PRNGKey(seed), [obs_size, hp["units"], hp["units"], actions])
    actor_tx = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(hp["actor_lr"], eps=1e-5))
    actor_state = actor_tx.init(actor)
    critic = value_network(obs_size, head, hp["units"])
    fast = [v.value for v in critic.trainable_variables]
    ema = [v.value for v in critic.non_trainable_variables]
    critic_tx = optax.chain(optax.clip_by_global_norm(hp["critic_clip"]), optax.adam(hp["critic_lr"], eps=1e-5))
    critic_state = critic_tx.init(fast)
    options = critic.loss_options()

    @jax.jit
    def values(fast, ema, obs):
        (value, _), _ = critic.stateless_call(fast, ema, obs, jnp.ones((obs.shape[0], 1, 1)))
        return inverse_symlog(value)

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
            z = jnp.ones((obs.shape[0], 1, 1))
            (_, logits), _ = critic.stateless_call(fast, ema, obs, z)
            (ema_value, _), _ = critic.stateless_call(fast, ema, obs, z, use_ema=True)
            return critic_loss(logits, ret, ema_value, jnp.ones_like(ret), **options)["total"]

        grads = jax.grad(actor_loss)(actor)
        updates, actor_state = actor_tx.update(grads, actor_state, actor)
        actor = optax.apply_updates(actor, updates)
        grads = jax.grad(value_loss)(fast)
        updates, critic_state = critic_tx.update(grads, critic_state, fast)
        fast = optax.apply_updates(fast, updates)
        return actor, actor_state, fast, critic.compute_ema(fast, ema), critic_state

    sample = jax.jit(lambda actor, obs, key: jax.random.categorical(key, actor_logits(actor, obs)))
    log_probs = jax.jit(lambda actor, obs: jax.nn.log_softmax(actor_logits(actor, obs)))
    key = jax.random.PRNGKey(seed + 1)
    phases = Phases()
    start, step, T, E = time.perf_counter(), 0, hp["rollout"], hp["envs"]
    while step < steps:
        buf = rollout_buffer(T, E, obs_size, "int32")
        for t in range(T):
            with phases("act"):
                key, sub = jax.random.split(key)
                o = jnp.asarray(obs, jnp.float32)
                action = np.asarray(sample(actor, o, sub))
                buf["obs"][t], buf["action"][t] = obs, action
                buf["logp"][t] = np.asarray(log_probs(actor, o))[np.arange(E), action]
            with phases("value"):
                buf["value"][t] = np.asarray(values(fast, ema, o))
            with phases("env"):
                obs, step = env_step(envs, action, buf, t, reward_scale, record, step)
        with phases("other"):
            flat, adv, ret, returns = rollout_targets(buf, np.asarray(values(fast, ema, jnp.asarray(obs, jnp.float32))))
        with phases("update"):
            for idx, a in minibatches(adv, rng):
                a = a.astype("float32")
                actor, actor_state, fast, ema, critic_state = update(
                    actor,
                    actor_state,
                    fast,
                    ema,
                    critic_state,
                    flat["obs"][idx],
                    flat["action"][idx],
                    flat["logp"][idx],
                    a,
                    ret[idx],
                )
            jax.block_until_ready(fast)  # the update's last step done (it runs async)
        with phases("other"):
            report(record, step, start, json_path, log, critic_fit(buf["value"], returns), phases)
    envs.close()
    return record


if __name__ == "__main__":
    main(train=train, doc=__doc__)
