"""A random finite Markov reward process with exactly known state values.

The demo's ground truth: states of a fixed policy's Markov chain, a reward and
a continue flag that come with ENTERING a state (the convention of
`lambda_returns`), and values from one linear solve:
`V = P (r + gamma * c * V)`, i.e. `(I - gamma * P diag(c)) V = P r`.
Pure numpy: no Keras here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class MDP:
    transitions: np.ndarray  # [S, S], rows sum to 1
    rewards: np.ndarray  # [S], received on entering the state
    continues: np.ndarray  # [S], 0 for terminal states
    gamma: float

    @property
    def num_states(self) -> int:
        return len(self.rewards)

    def values(self) -> np.ndarray:
        """Exact state values, from one linear solve (float64)."""
        n = self.num_states
        p = self.transitions.astype(np.float64)
        lhs = np.eye(n) - self.gamma * p * self.continues[None, :].astype(np.float64)
        return np.linalg.solve(lhs, p @ self.rewards.astype(np.float64))

    def scaled(self, reward_scale: float) -> "MDP":
        return MDP(self.transitions, self.rewards * reward_scale, self.continues, self.gamma)

    def rollouts(self, rng: np.random.Generator, starts: np.ndarray, horizon: int):
        """Sampled trajectories `[horizon+1, B]` of states, rewards and continues.

        Like a world model's dream, the chain keeps running past a terminal
        state; the loss weights (products of continues) discount those steps
        away.
        """
        states = np.empty((horizon + 1, len(starts)), np.int64)
        states[0] = starts
        cumulative = np.cumsum(self.transitions, axis=1)
        for t in range(horizon):
            u = rng.random(len(starts))[:, None]
            states[t + 1] = np.minimum((u > cumulative[states[t]]).sum(axis=1), self.num_states - 1)
        rewards = self.rewards[states].astype(np.float32)
        continues = self.continues[states].astype(np.float32)
        rewards[0] = 0.0  # the start state's own entry is not part of its return
        continues[0] = 1.0
        return states, rewards, continues

    def monte_carlo_values(self, rng: np.random.Generator, episodes: int, max_steps: int) -> np.ndarray:
        """Monte-Carlo estimate of `values()` (for tests), `episodes` per state."""
        n = self.num_states
        starts = np.repeat(np.arange(n), episodes)
        states, rewards, continues = self.rollouts(rng, starts, max_steps)
        # r_k counts with gamma^(k-1) * c_1 ... c_(k-1): entering a terminal
        # state still pays its reward.
        alive = np.cumprod(np.concatenate([np.ones_like(continues[:1]), continues[1:-1]]), axis=0)
        discount = self.gamma ** np.arange(max_steps)[:, None] * alive
        returns = (discount * rewards[1:]).sum(axis=0)
        return returns.reshape(n, episodes).mean(axis=1)


def random_mdp(
    rng: np.random.Generator,
    num_states: int = 64,
    noise: float = 0.1,
    branching: int = 3,
    terminal_fraction: float = 0.1,
    gamma: float = 0.9,
) -> MDP:
    """A random chain: each state moves to one main successor with probability
    `1 - noise` and to one of `branching` other random states otherwise;
    rewards ~ N(0, 1) shifted by +-0.5; a `terminal_fraction` of states end
    the episode."""
    transitions = np.zeros((num_states, num_states))
    for s in range(num_states):
        main, *others = rng.choice(num_states, size=branching + 1, replace=False)
        transitions[s, main] = 1.0 - noise
        transitions[s, others] += noise / branching
    rewards = rng.normal(size=num_states) + 0.5 * rng.choice([-1.0, 1.0], size=num_states)
    continues = (rng.random(num_states) >= terminal_fraction).astype(np.float64)
    return MDP(transitions, rewards, continues, gamma)


def encode_states(rng: np.random.Generator, num_states: int, gru_units: int, num_categoricals: int, num_classes: int):
    """Critic inputs per state: `h`, fixed random features `[S, gru_units]`, and
    `z`, the state's index written in base `num_classes` as one-hot digits
    `[S, num_categoricals, num_classes]` (a categorical code as in DreamerV3)."""
    h = np.tanh(rng.normal(size=(num_states, gru_units))).astype(np.float32)
    digits = np.zeros((num_states, num_categoricals), np.int64)
    index = np.arange(num_states)
    for d in range(num_categoricals):
        digits[:, d] = index % num_classes
        index = index // num_classes
    if index.max() > 0:
        raise ValueError(
            f"num_states: got {num_states}, expected at most {num_classes**num_categoricals} "
            f"for a {num_categoricals}x{num_classes} categorical code."
        )
    z = np.eye(num_classes, dtype=np.float32)[digits]
    return h, z
