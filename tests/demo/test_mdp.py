import numpy as np

from multicritic.demo.mdp import encode_states, random_mdp


def test_exact_values_agree_with_monte_carlo():
    mdp = random_mdp(np.random.default_rng(3), num_states=12, noise=0.3, terminal_fraction=0.3, gamma=0.9)
    exact = mdp.values()
    estimate = mdp.monte_carlo_values(np.random.default_rng(4), episodes=3000, max_steps=120)
    # 3000 episodes per state: standard errors ~0.03-0.05 on returns of std ~2.
    np.testing.assert_allclose(estimate, exact, atol=0.2)
    assert np.corrcoef(estimate, exact)[0, 1] > 0.99


def test_values_satisfy_the_bellman_equation():
    mdp = random_mdp(np.random.default_rng(0), num_states=20)
    v = mdp.values()
    np.testing.assert_allclose(v, mdp.transitions @ (mdp.rewards + mdp.gamma * mdp.continues * v), atol=1e-10)
    scaled = mdp.scaled(1e6)
    np.testing.assert_allclose(scaled.values(), 1e6 * v, rtol=1e-9)


def test_rollouts_follow_the_chain():
    mdp = random_mdp(np.random.default_rng(1), num_states=10, noise=0.0)
    states, rewards, continues = mdp.rollouts(np.random.default_rng(2), np.arange(10), horizon=6)
    assert states.shape == rewards.shape == continues.shape == (7, 10)
    main = mdp.transitions.argmax(1)
    np.testing.assert_array_equal(states[1:], main[states[:-1]])  # noise 0: deterministic
    np.testing.assert_array_equal(rewards[1:], mdp.rewards[states[1:]].astype(np.float32))
    assert np.all(rewards[0] == 0) and np.all(continues[0] == 1)


def test_state_codes_are_distinct_one_hots():
    h, z = encode_states(np.random.default_rng(0), 48, 64, 16, 16)
    assert h.shape == (48, 64) and z.shape == (48, 16, 16)
    np.testing.assert_array_equal(z.sum(-1), 1.0)
    assert len({zz.tobytes() for zz in z}) == 48
