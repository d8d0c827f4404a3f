"""The real agents' drivers run end to end (a few hundred steps): they write their curves as JSON."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytest.importorskip("gymnasium")


# The Keras agent on every backend; each framework's user's own agent in its framework's session.
OWN = {
    "torch-loop": ("torch", "torch (its own loop)"),
    "jax-jit": ("jax", "jax (its own jit)"),
    "tf-loop": ("tensorflow", "tensorflow (its own tf.function)"),
}


@pytest.mark.parametrize("agent", ["keras", *OWN])
def test_ppo_driver_writes_each_runs_curve(tmp_path, agent):
    if agent in OWN and OWN[agent][0] != BACKEND:
        pytest.skip(f"{agent} runs in the {OWN[agent][0]} session")
    backend = BACKEND if agent == "keras" else agent
    out = tmp_path / "ppo.json"
    command = [
        sys.executable,
        os.path.join(ROOT, "benchmarks", "agents", "ppo_scales.py"),
        "--backends",
        backend,
        "--envs",
        "CartPole-v1",
        "--heads",
        "two_hot",
        "--scales",
        "1000",
        "--seeds",
        "3",
        "--steps",
        "512",
        "--workers",
        "1",
        "--json",
        str(out),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    record = runs[f"{backend}/CartPole-v1/two_hot/1000/3"]
    assert (
        record["backend"] == (BACKEND if agent == "keras" else OWN[agent][1])
        and record["reward_scale"] == 1000.0
        and record["steps"] == 512
    )
    # CartPole's returns in its own units (1 a step, unscaled), at increasing environment steps.
    steps = [s for s, _ in record["episodes"]]
    assert record["episodes"] and steps == sorted(steps) and steps[-1] <= 512
    assert all(1.0 <= r <= 500.0 and r == int(r) for _, r in record["episodes"])
    assert "return" in result.stdout  # progress shown while it runs
    png = tmp_path / "ppo.png"
    plot = [sys.executable, os.path.join(ROOT, "benchmarks", "agents", "plot_curves.py"), "ppo", str(out), str(png)]
    assert subprocess.run(plot, capture_output=True, text=True, timeout=300, cwd=ROOT).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A second call finds the run done and leaves the file as it was.
    before = out.read_text()
    assert subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT).returncode == 0
    assert out.read_text() == before


EXAMPLES = os.path.join(ROOT, "examples", "ppo")


def _minibatch(actor, size, obs_size, actions):
    """One update's data, fixed: observations, actions, old log-probabilities off the actor's own by up to
    about +-0.5 (ratios both inside and outside the clip range), normalised advantages, real-space returns."""
    rng = np.random.default_rng(7)
    obs = rng.normal(size=(size, obs_size)).astype("float32")
    action = rng.integers(0, actions, size)
    logits = np.asarray(actor.predict_on_batch(obs), "float64")
    logp_all = logits - logits.max(-1, keepdims=True)
    logp_all -= np.log(np.exp(logp_all).sum(-1, keepdims=True))
    old_logp = (logp_all[np.arange(size), action] + rng.uniform(-0.5, 0.5, size)).astype("float32")
    advantages = rng.normal(size=size)
    advantages = ((advantages - advantages.mean()) / advantages.std()).astype("float32")
    returns = rng.uniform(-50.0, 500.0, size).astype("float32")
    return obs, action, old_logp, advantages, returns


def _pairs(weights):
    return list(zip(weights[::2], weights[1::2]))


def _jax_update(actor_weights, critic, batch):
    """The JAX user's update from these weights: `(actor's arrays, critic's fast then EMA arrays)`."""
    import jax.numpy as jnp
    import jax_agent

    actor = [(jnp.asarray(w), jnp.asarray(b)) for w, b in _pairs(actor_weights)]
    fast, ema = jax_agent.critic_params(critic)
    actor_tx, critic_tx = jax_agent.optimizers()
    update = jax_agent.make_update(critic, actor_tx, critic_tx)
    obs, action, old_logp, adv, ret = batch
    actor, _, fast, ema, _ = update(
        actor, actor_tx.init(actor), fast, ema, critic_tx.init(fast), obs, action.astype("int32"), old_logp, adv, ret
    )
    return [w for pair in actor for w in pair], [*fast, *ema]


def _tf_update(actor_weights, critic, batch):
    import tf_agent

    sizes = [actor_weights[0].shape[0]] + [b.shape[0] for b in actor_weights[1::2]]
    actor = tf_agent.actor_init(0, sizes)
    for variable, value in zip([v for pair in actor for v in pair], actor_weights):
        variable.assign(value)
    update = tf_agent.make_update(actor, critic, *tf_agent.optimizers())
    obs, action, old_logp, adv, ret = batch
    update(obs, action.astype("int32"), old_logp, adv, ret)
    return [v for pair in actor for v in pair], [*critic.trainable_variables, *critic.non_trainable_variables]


def _torch_update(actor_weights, critic, batch):
    import torch
    import torch_agent

    sizes = [actor_weights[0].shape[0]] + [b.shape[0] for b in actor_weights[1::2]]
    actor = torch_agent.make_actor(sizes[0], sizes[-1], sizes[1])
    with torch.no_grad():
        for layer, (w, b) in zip(actor[::2], _pairs(actor_weights)):  # nn.Linear's weight is the kernel transposed
            layer.weight.copy_(torch.as_tensor(w.T))
            layer.bias.copy_(torch.as_tensor(b))
    fast, slow = critic.fast_module(outputs="both"), critic.ema_module(outputs="both")
    actor_opt, critic_opt = torch_agent.optimizers(actor, fast)
    obs, action, old_logp, adv, ret = batch
    batch = (obs, action.astype("int64"), old_logp, adv, ret)
    torch_agent.update(actor, actor_opt, critic, fast, slow, critic_opt, *batch)
    actor_weights = [x.detach().numpy() for layer in actor[::2] for x in (layer.weight.T, layer.bias)]
    return actor_weights, [*critic.trainable_variables, *critic.non_trainable_variables]


LOOP_UPDATES = {"jax-jit": _jax_update, "tf-loop": _tf_update, "torch-loop": _torch_update}


@pytest.mark.parametrize("agent", list(OWN))
def test_first_update_is_the_same_in_every_agent(agent, monkeypatch):
    """The Keras agent and a framework's own loop are one agent: from the same weights, one minibatch's update
    (the actor's PPO step with its global-norm clip and Adam, the critic's step and its EMA copy's) leaves
    the same weights in both."""
    if OWN[agent][0] != BACKEND:
        pytest.skip(f"{agent} runs in the {OWN[agent][0]} session")
    import keras

    monkeypatch.syspath_prepend(EXAMPLES)
    import keras_agent

    # Clips below this batch's gradient norms, so that both clips act and a clip of each weight's gradient on
    # its own would show. Every agent reads them when it builds its update.
    monkeypatch.setitem(keras_agent.HYPERPARAMETERS, "actor_clip", 0.05)
    monkeypatch.setitem(keras_agent.HYPERPARAMETERS, "critic_clip", 0.5)
    obs_size, actions, units, size = 6, 3, keras_agent.HYPERPARAMETERS["units"], 128
    keras.utils.set_random_seed(0)
    actor = keras_agent.make_actor(obs_size, actions, units)
    critic, trainer = keras_agent.make_critic(obs_size, "two_hot", units, seed=0)
    # The critic's head starts at zero, so its first step would move the head alone: from weights off their
    # initial ones (the EMA copy apart from the fast), every layer's gradient and the regulariser count.
    rng = np.random.default_rng(0)
    critic.set_weights([w + rng.normal(0.0, 0.1, w.shape).astype(w.dtype) for w in critic.get_weights()])
    twin = keras_agent.value_network(obs_size, "two_hot", units)  # the loop's critic
    twin.set_weights(critic.get_weights())
    batch = _minibatch(actor, size, obs_size, actions)
    actor_before = actor.get_weights()
    critic_before = [np.array(v) for v in [*critic.trainable_variables, *critic.non_trainable_variables]]

    keras_agent.update(actor, trainer, *batch)
    loop_actor, loop_critic = LOOP_UPDATES[agent](actor_before, twin, batch)

    keras_actor = actor.get_weights()
    keras_critic = [np.array(v) for v in [*critic.trainable_variables, *critic.non_trainable_variables]]
    for name, before, want, got in (
        ("actor", actor_before, keras_actor, loop_actor),
        ("critic", critic_before, keras_critic, loop_critic),
    ):
        assert len(got) == len(want), name
        for i, (b, w, g) in enumerate(zip(before, want, got)):
            # Each array moved (the EMA copy towards the fast weights), far more than the tolerance.
            assert np.abs(w - b).max() > 1e-5, (name, i)
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6, err_msg=f"{name} array {i}")


@pytest.mark.interop
def test_sheeprl_driver_runs_both_halves_through_a_resume(tmp_path):
    pytest.importorskip("sheeprl")
    out = tmp_path / "sheeprl.json"
    command = [
        sys.executable,
        os.path.join(ROOT, "benchmarks", "agents", "sheeprl_dreamer.py"),
        "--variants",
        "stock",
        "swap",
        "swap-2024",
        "--seeds",
        "1",
        "--steps",
        "256",
        "--workers",
        "1",
        "--work",
        str(tmp_path / "work"),
        "--json",
        str(out),
        "algo.learning_starts=64",
        "algo.per_rank_batch_size=2",
        "algo.per_rank_sequence_length=8",
        "algo.horizon=5",
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=900, cwd=ROOT, env={**os.environ, "KERAS_BACKEND": "torch"}
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    for variant in ("stock", "swap", "swap-2024"):
        first, resumed = runs[f"{variant}/1"]
        assert (first["swapped"] is None) == (variant == "stock")
        # The swaps take the checkpoint's critic on the resume (the 2024 one in its own layout).
        assert variant == "stock" or (resumed["swapped"].endswith("(resumed)") and "resumed" not in first["swapped"])
        # The 2024 critic is read through its own distribution at every gradient step.
        assert (first["critic_reads"] > 0 and resumed["critic_reads"] > 0) == (variant == "swap-2024")
        # The second half resumes from the first's checkpoint: its episodes start past the first half's steps.
        assert first["episodes"] and resumed["episodes"]
        assert max(s for s, _ in first["episodes"]) <= 128 < min(s for s, _ in resumed["episodes"])
        assert max(s for s, _ in resumed["episodes"]) <= 256 and first["cpu_s"] > 0
    png = tmp_path / "sheeprl.png"
    plot = [sys.executable, os.path.join(ROOT, "benchmarks", "agents", "plot_curves.py"), "sheeprl", str(out), str(png)]
    assert subprocess.run(plot, capture_output=True, text=True, timeout=300, cwd=ROOT).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_final_returns_and_the_spread_check():
    from benchmarks.agents.plot_curves import final_return, ppo_finals, within_spread

    # Episodes ending in the last 10% of 1000 steps (after step 900) count; none there is NaN.
    assert final_return([[100, 1.0], [900, 5.0], [901, 10.0], [1000, 20.0]], 1000) == 15.0
    assert np.isnan(final_return([[100, 1.0]], 1000))
    run = {"env": "E", "head": "h", "backend": "b", "steps": 10}
    results = {
        "runs": {
            str(i): dict(run, reward_scale=s, episodes=[[10, r]])
            for i, (s, r) in enumerate([(1.0, 100.0), (1.0, 200.0), (1e3, 150.0), (1e3, 180.0)])
        }
    }
    assert ppo_finals(results) == {("E", "h", "b"): {1.0: [100.0, 200.0], 1e3: [150.0, 180.0]}}
    # Means 150 and 165: each inside the other's [min, max].
    assert within_spread({1.0: [100.0, 200.0], 1e3: [150.0, 180.0]})
    # Means 150 and 300: neither inside the other's range.
    assert not within_spread({1.0: [100.0, 200.0], 1e3: [290.0, 310.0]})
    # One direction failing is enough: 165 in [100, 200], but 150 not in [160, 170].
    assert not within_spread({1.0: [100.0, 200.0], 1e3: [160.0, 170.0]})


def test_run_returns_and_the_overlap_check():
    from benchmarks.agents.plot_curves import ppo_finals, ranges_overlap, run_return, within_spread

    # Two equal spans of 100 steps: returns 10 and 30 end in the first (mean 20), 60 in the second.
    assert run_return([[10, 10.0], [100, 30.0], [150, 60.0]], 200, bins=2) == 40.0
    # A span where no episode ended is left out, not counted as 0.
    assert run_return([[10, 10.0]], 200, bins=2) == 10.0
    run = {"env": "E", "head": "h", "backend": "b", "steps": 200, "reward_scale": 1.0}
    results = {"runs": {"a": dict(run, episodes=[[10, 10.0], [150, 60.0]])}}
    assert ppo_finals(results, lambda episodes, steps: run_return(episodes, steps, bins=2)) == {
        ("E", "h", "b"): {1.0: [35.0]}
    }
    # Seeds tied at a ceiling: [499, 499] holds no other mean, yet the ranges overlap.
    tied = {1.0: [499.0, 499.0, 499.0], 1e6: [474.0, 499.0, 499.0]}
    assert not within_spread(tied) and ranges_overlap(tied)
    assert not ranges_overlap({1.0: [100.0, 200.0], 1e3: [201.0, 310.0]})
    assert ranges_overlap({1.0: [100.0, 200.0], 1e3: [200.0, 310.0], 1e6: [150.0, 205.0]})
    assert not ranges_overlap({1.0: [100.0, 200.0], 1e3: [200.0, 310.0], 1e6: [150.0, 160.0]})


def test_a_run_learned_when_its_final_return_beats_its_start():
    from benchmarks.agents.plot_curves import learned

    floor = [[at, -499.0] for at in range(500, 50_001, 500)]
    assert not learned(floor, 50_000)
    # The first 10% (steps up to 5,000) averages -499; the last 10% -90: learned.
    assert learned(floor[:60] + [[at, -90.0] for at in range(30_500, 50_001, 500)], 50_000)
    # 10% better than the start is the line: -450 is not past it (-449.1), -440 is.
    assert not learned(floor[:90] + [[at, -450.0] for at in range(45_500, 50_001, 500)], 50_000)
    assert learned(floor[:90] + [[at, -440.0] for at in range(45_500, 50_001, 500)], 50_000)
    # CartPole-like: 20 at the start, 499 at the end.
    assert learned([[100, 20.0], [90_000, 499.0], [99_000, 499.0]], 100_000)
    assert not learned([[90_000, 499.0]], 100_000)  # no episode in the first 10%: no start to beat


def test_ppo_cost_driver_times_the_keras_program_beside_the_hand_written_loop(tmp_path):
    """`benchmarks/agents/ppo_cost.py` runs this backend's two agents back to back and records each run's
    seconds and phases; the Cost tables render from its file."""
    sys.path.insert(0, ROOT)
    from benchmarks.render_tables import RENDERERS

    out = tmp_path / "cost.json"
    command = [
        sys.executable,
        os.path.join(ROOT, "benchmarks", "agents", "ppo_cost.py"),
        "--backends",
        BACKEND,
        "--envs",
        "CartPole-v1",
        "--seeds",
        "1",
        "--steps",
        "512",
        "--json",
        str(out),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(out.read_text())
    assert {run["agent"] for run in results["runs"].values()} == {"keras", "native"}
    for run in results["runs"].values():
        assert run["backend"] == BACKEND and run["env"] == "CartPole-v1" and run["seed"] == 1
        phases = run["phases"]
        assert set(phases) == {"act", "value", "env", "update", "other"}
        # The phases are parts of the run: together no more than its seconds, and most of them.
        assert 0.5 * run["seconds"] < sum(phases.values()) <= run["seconds"] + 1e-6
    cost = RENDERERS["ppo_cost"]([results])
    assert len(cost) == 3 and cost[2].startswith(f"| CartPole-v1 | {BACKEND} |")
    keras_s, native_s = (
        run["seconds"] for agent in ("keras", "native") for run in results["runs"].values() if run["agent"] == agent
    )
    assert f"{keras_s / native_s:.2f} [" in cost[2]
    assert len(RENDERERS["ppo_cost_phases"]([results])) == 4
