"""PPO as a PyTorch user writes it, with multicritic's critic as the value function.

The actor is an `nn.Sequential`; the critic is a `CriticNetwork` used through its
PyTorch views (`fast_module`, `ema_module`: `nn.Module`s over the critic's own
tensors), trained by the user's own `torch.optim.Adam` loop on
`multicritic.critic_loss` (two-hot NLL plus the slow-critic regulariser), with
`critic.update_ema()` after each step. Hyperparameters, rollouts and GAE are
`keras_agent.py`'s (the same experiment, another framework's idiom).

    KERAS_BACKEND=torch python examples/ppo/torch_agent.py --env CartPole-v1 --head two_hot \\
        --reward-scale 1000 --steps 100000 --seed 1 --json run.json
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from multicritic import critic_loss, inverse_symlog  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from keras_agent import (
    HYPERPARAMETERS,
    Phases,
    critic_fit,
    env_step,
    gae,
    main,
    report,
    rollout_buffer,  # noqa: E402
    start_run,
    value_network,
)


def train(env_id, head, reward_scale, steps, seed, json_path=None, log=print):
    hp = HYPERPARAMETERS
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    envs, obs, obs_size, actions, record = start_run(env_id, head, reward_scale, steps, seed, "torch (its own loop)")
    actor = nn.Sequential(
        nn.Linear(obs_size, hp["units"]),
        nn.Tanh(),
        nn.Linear(hp["units"], hp["units"]),
        nn.Tanh(),
        nn.Linear(hp["units"], actions),
    )
    nn.init.orthogonal_(actor[-1].weight, 0.01)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=hp["actor_lr"], eps=1e-5)
    critic = value_network(obs_size, head, hp["units"])
    fast, slow = critic.fast_module(outputs="both"), critic.ema_module(outputs="both")
    critic_opt = torch.optim.Adam(fast.parameters(), lr=hp["critic_lr"], eps=1e-5)

    def latent(obs):  # the critic's input: h = the observation, z = one constant class
        obs = torch.as_tensor(obs, dtype=torch.float32)
        return torch.cat([obs, torch.ones(obs.shape[0], 1)], -1)

    def values(obs):
        with torch.no_grad():
            return inverse_symlog(fast(latent(obs))[0]).double().numpy()

    phases = Phases()
    start, step, T, E = time.perf_counter(), 0, hp["rollout"], hp["envs"]
    while step < steps:
        buf = rollout_buffer(T, E, obs_size, "int64")
        for t in range(T):
            with phases("act"):
                with torch.no_grad():
                    dist = torch.distributions.Categorical(logits=actor(torch.as_tensor(obs, dtype=torch.float32)))
                    action = dist.sample()
                buf["obs"][t], buf["action"][t], buf["logp"][t] = obs, action.numpy(), dist.log_prob(action).numpy()
            with phases("value"):
                buf["value"][t] = values(obs)
            with phases("env"):
                obs, step = env_step(envs, action.numpy(), buf, t, reward_scale, record, step)
        with phases("other"):
            last = values(obs)
            advantages, returns = gae(buf["reward"], buf["done"], buf["value"], last, hp["gamma"], hp["gae_lambda"])
            flat = {k: torch.as_tensor(v.reshape((T * E,) + v.shape[2:])) for k, v in buf.items()}
            adv = torch.as_tensor(advantages.reshape(-1), dtype=torch.float32)
            ret = torch.as_tensor(returns.reshape(-1), dtype=torch.float32)
            size = T * E // hp["minibatches"]
        with phases("update"):
            for _ in range(hp["epochs"]):
                order = torch.as_tensor(rng.permutation(T * E))
                for i in range(hp["minibatches"]):
                    idx = order[i * size : (i + 1) * size]
                    a = (adv[idx] - adv[idx].mean()) / (adv[idx].std() + 1e-8)
                    dist = torch.distributions.Categorical(logits=actor(flat["obs"][idx]))
                    ratio = torch.exp(dist.log_prob(flat["action"][idx]) - flat["logp"][idx])
                    surrogate = torch.min(ratio * a, ratio.clamp(1 - hp["clip"], 1 + hp["clip"]) * a)
                    actor_loss = -surrogate.mean() - hp["entropy"] * dist.entropy().mean()
                    actor_opt.zero_grad()
                    actor_loss.backward()
                    nn.utils.clip_grad_norm_(actor.parameters(), 0.5)
                    actor_opt.step()
                    x = latent(flat["obs"][idx])
                    _, logits = fast(x)
                    with torch.no_grad():
                        ema_value, _ = slow(x)
                    loss = critic_loss(logits, ret[idx], ema_value, torch.ones(size), **critic.loss_options())["total"]
                    critic_opt.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(fast.parameters(), hp["critic_clip"])
                    critic_opt.step()
                    critic.update_ema()
        with phases("other"):
            report(record, step, start, json_path, log, critic_fit(buf["value"], returns), phases)
    envs.close()
    return record


if __name__ == "__main__":
    main(train=train, doc=__doc__)
