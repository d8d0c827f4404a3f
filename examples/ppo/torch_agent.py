"""PPO as a PyTorch user writes it, with multicritic's critic as the value function.

The actor is an `nn.Sequential`; the critic is a `CriticNetwork` used through its
PyTorch views (`fast_module`, `ema_module`: `nn.Module`s over the critic's own
tensors), trained by the user's own `torch.optim.Adam` loop on
`multicritic.critic_loss` (two-hot NLL plus the slow-critic regulariser), with
`critic.update_ema()` after each step. Eager, as CleanRL's PPO: one call per
environment step under `torch.no_grad()` (`act`: the actor once, the critic's
value in the same call) and one per minibatch (`update`); over a CPU run
`torch.compile`'s compilation does not pay back. Hyperparameters, rollouts and
GAE are `keras_agent.py`'s (the same experiment, another framework's idiom).

    KERAS_BACKEND=torch python examples/ppo/torch_agent.py --env CartPole-v1 --head two_hot \\
        --reward-scale 1000 --steps 100000 --seed 1 --json run.json
"""

from __future__ import annotations

import math
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

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


def make_actor(obs_size, actions, units):
    """CleanRL's actor: orthogonal weights (gain sqrt(2), the last layer's 0.01), zero biases. `nn.Linear`
    holds its weight as `[out, in]`, a Keras `Dense` kernel transposed."""
    actor = nn.Sequential(
        nn.Linear(obs_size, units), nn.Tanh(), nn.Linear(units, units), nn.Tanh(), nn.Linear(units, actions)
    )
    for layer, gain in zip(actor[::2], (np.sqrt(2.0), np.sqrt(2.0), 0.01)):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return actor


class Adam(torch.optim.Adam):
    """`torch.optim.Adam` with Keras's epsilon (the Keras agent's and `CriticTrainer`'s Adam): Keras adds epsilon
    to `sqrt(v)` before the bias correction, torch after it, so torch's epsilon at step t is
    `eps / sqrt(1 - b2^t)`. With the same number in both, the early updates of small gradients would differ."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr, eps=HYPERPARAMETERS["adam_epsilon"])
        self.steps = 0

    def step(self, closure=None):
        self.steps += 1
        for group in self.param_groups:
            group["eps"] = HYPERPARAMETERS["adam_epsilon"] / math.sqrt(1.0 - group["betas"][1] ** self.steps)
        return super().step(closure)


def optimizers(actor, fast):
    """`(actor's, critic's)` Adam, over the actor's and the critic's fast view's parameters."""
    hp = HYPERPARAMETERS
    return Adam(actor.parameters(), hp["actor_lr"]), Adam(fast.parameters(), hp["critic_lr"])


@torch.no_grad()
def act(actor, fast, obs):
    """`(action [N], its log-probability [N], real-space value [N])` of observations `[N, obs]`, as numpy."""
    obs = torch.as_tensor(obs, dtype=torch.float32)
    logp_all = torch.log_softmax(actor(obs), -1)
    action = torch.multinomial(logp_all.exp(), 1)  # a categorical draw, as `Categorical(logits=...).sample()`
    value, _ = fast(obs)  # the critic's one input is the observation
    logp = logp_all.gather(1, action)[:, 0]
    return action[:, 0].numpy(), logp.numpy(), inverse_symlog(value).double().numpy()


@torch.no_grad()
def values(fast, obs):
    return inverse_symlog(fast(torch.as_tensor(obs, dtype=torch.float32))[0]).double().numpy()


def update(actor, actor_opt, critic, fast, slow, critic_opt, obs, action, old_logp, adv, ret):
    """One minibatch's update (numpy arrays): the actor's PPO step, then the critic's on the returns and its EMA
    copy's; the critic's loss."""
    hp = HYPERPARAMETERS
    obs, action, old_logp, adv, ret = (torch.as_tensor(x) for x in (obs, action, old_logp, adv, ret))
    logp_all = torch.log_softmax(actor(obs), -1)
    ratio = torch.exp(logp_all.gather(1, action[:, None])[:, 0] - old_logp)
    surrogate = torch.min(ratio * adv, ratio.clamp(1 - hp["clip"], 1 + hp["clip"]) * adv)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    actor_loss = -surrogate.mean() - hp["entropy"] * entropy.mean()
    actor_opt.zero_grad()
    actor_loss.backward()
    nn.utils.clip_grad_norm_(actor.parameters(), hp["actor_clip"])
    actor_opt.step()
    _, logits = fast(obs)
    with torch.no_grad():
        ema_value, _ = slow(obs)
    loss = critic_loss(logits, ret, ema_value, torch.ones_like(ret), **critic.loss_options())["total"]
    critic_opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(fast.parameters(), hp["critic_clip"])
    critic_opt.step()
    critic.update_ema()
    return loss


def train(env_id, head, reward_scale, steps, seed, json_path=None, log=print):
    hp = HYPERPARAMETERS
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    envs, obs, obs_size, actions, record = start_run(env_id, head, reward_scale, steps, seed, "torch (its own loop)")
    actor = make_actor(obs_size, actions, hp["units"])
    critic = value_network(obs_size, head, hp["units"])
    fast, slow = critic.fast_module(outputs="both"), critic.ema_module(outputs="both")
    actor_opt, critic_opt = optimizers(actor, fast)
    phases = Phases()
    start, step, T, E = time.perf_counter(), 0, hp["rollout"], hp["envs"]
    while step < steps:
        buf = rollout_buffer(T, E, obs_size, "int64")
        for t in range(T):
            # The actor's and the critic's share are one call: timed together (no "value" phase).
            with phases("act"):
                action, buf["logp"][t], buf["value"][t] = act(actor, fast, obs)
                buf["obs"][t], buf["action"][t] = obs, action
            with phases("env"):
                obs, step = env_step(envs, action, buf, t, reward_scale, record, step)
        with phases("other"):
            flat, adv, ret, returns = rollout_targets(buf, values(fast, obs))
        with phases("update"):
            for idx, a in minibatches(adv, rng):
                batch = (flat["obs"][idx], flat["action"][idx], flat["logp"][idx], a.astype("float32"), ret[idx])
                update(actor, actor_opt, critic, fast, slow, critic_opt, *batch)
        with phases("other"):
            report(record, step, start, json_path, log, critic_fit(buf["value"], returns), phases)
    envs.close()
    return record


if __name__ == "__main__":
    main(train=train, doc=__doc__)
