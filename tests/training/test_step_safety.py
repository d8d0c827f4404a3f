"""A step either does what it says or changes nothing; bad options and inputs are refused before any change."""

import threading

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from tests.conftest import BACKEND, random_inputs, randomize, to_np


def direct_batch(critic, n=32, seed=0):
    h, z = random_inputs(critic, n, seed)
    rng = np.random.default_rng(seed + 1)
    return h, z, (30.0 * rng.normal(size=n)).astype(np.float32), rng.uniform(0.2, 1.0, size=n).astype(np.float32)


def dream_batch(critic, horizon=4, b=3, seed=0):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(horizon + 1, b, critic.gru_units)).astype(np.float32)
    z = rng.random(size=(horizon + 1, b, critic.num_z_categoricals, critic.num_z_classes)).astype(np.float32)
    rewards = rng.normal(size=(horizon + 1, b)).astype(np.float32)
    continues = np.ones((horizon + 1, b), np.float32)
    return h, z, rewards, continues


def state(trainer):
    return [to_np(v).copy() for v in trainer.state_variables]


def assert_unchanged(trainer, before):
    after = state(trainer)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)


def trained(seed=0, **kwargs):
    critic = CriticNetwork(model_size="nano")
    randomize(critic, seed=seed)
    trainer = CriticTrainer(critic, learning_rate=1e-3, **kwargs)
    trainer.train_step(*direct_batch(critic, seed=seed))  # slots and counter away from their initial values
    return critic, trainer


# Findings 2, 3, 20: options.
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"grad_clip": float("inf")}, r"grad_clip: got inf, expected a finite number > 0 or None"),
        ({"grad_clip": float("nan")}, r"grad_clip: got nan"),
        ({"learning_rate": float("nan")}, r"learning_rate: got nan, expected a finite number > 0"),
        ({"learning_rate": float("inf")}, r"learning_rate: got inf"),
        ({"learning_rate": 0.0}, r"learning_rate: got 0.0"),
        ({"epsilon": -1e-5}, r"epsilon: got -1e-05"),
        ({"gamma": "0.9"}, r"gamma: got '0.9', expected a finite number in \[0, 1\]"),
        ({"gamma": None}, r"gamma: got None"),
        ({"lambda_": float("nan")}, r"lambda_: got nan"),
        ({"optimizer": "adam"}, r"optimizer: got 'adam', expected a keras.optimizers.Optimizer instance or None"),
        ({"jit_compile": "yes"}, r"jit_compile: got 'yes', expected True, False or 'auto'"),
    ],
)
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CriticTrainer(CriticNetwork(model_size="nano"), **kwargs)


# Findings 7, 8, 20: inputs refused before any change (numpy inputs).
@pytest.mark.parametrize(
    "change, match",
    [
        (lambda b: (b[0][:0], b[1][:0], b[2][:0], b[3][:0]), r"h: got shape \[0, 16\], an empty batch"),
        (lambda b: (b[0], b[1], b[2], -b[3]), r"loss_weights: got 32 negative value\(s\), expected weights >= 0"),
        (lambda b: (b[0], b[1], None, b[3]), r"value_targets: got None, expected a real-valued array"),
        (lambda b: (b[0], b[1], ["a"] * 32, b[3]), r"value_targets: got an array of dtype <U1, expected real numbers"),
        (
            lambda b: (b[0], b[1], [[1.0], [1.0, 2.0]], b[3]),
            r"value_targets: got a list that is not a rectangular array",
        ),
        (lambda b: (b[0][0], b[1], b[2], b[3]), r"h: got shape \[16\], expected \[N, gru_units\]"),
    ],
)
def test_bad_direct_inputs_change_nothing(change, match):
    critic, trainer = trained()
    before = state(trainer)
    with pytest.raises(ValueError, match=match):
        trainer.train_step(*change(direct_batch(critic, seed=5)))
    assert_unchanged(trainer, before)


@pytest.mark.parametrize("bad", [2.0, -1.0, np.nan])
def test_continues_outside_unit_interval_are_refused(bad):
    critic, trainer = trained()
    h, z, rewards, continues = dream_batch(critic)
    continues[2, 1] = bad
    before = state(trainer)
    with pytest.raises(ValueError, match=r"continues: got"):
        trainer.train_on_dream(h, z, rewards, continues)
    assert_unchanged(trainer, before)


def test_empty_dream_batch_is_refused():
    critic, trainer = trained()
    h, z, rewards, continues = dream_batch(critic, b=0)
    before = state(trainer)
    with pytest.raises(ValueError, match=r"h: got shape \[5, 0, 16\], an empty batch"):
        trainer.train_on_dream(h, z, rewards, continues)
    assert_unchanged(trainer, before)


# Finding 8, backend tensors: values are not read on the host; the step is skipped instead.
def test_invalid_tensor_inputs_skip_the_whole_step():
    critic, trainer = trained()
    before = state(trainer)
    h, z, targets, weights = direct_batch(critic, seed=7)
    weights[4] = -1.0
    metrics = to_np(trainer.train_step(h, z, targets, keras.ops.convert_to_tensor(weights)))
    assert metrics["invalid_inputs"] == 1.0 and metrics["step_skipped"] == 1.0
    assert_unchanged(trainer, before)

    h, z, rewards, continues = dream_batch(critic)
    continues[1, 0] = 2.0
    metrics = to_np(trainer.train_on_dream(h, z, rewards, keras.ops.convert_to_tensor(continues)))
    assert metrics["invalid_inputs"] == 1.0 and metrics["step_skipped"] == 1.0
    assert_unchanged(trainer, before)


# The guarded step's contract: non-finite gradients change nothing at all (weights, EMA, slots, counter).
def test_nonfinite_gradients_change_nothing():
    critic, trainer = trained()
    before = state(trainer)
    h, z, targets, weights = direct_batch(critic, seed=9)
    h[0, 0] = np.inf
    metrics = to_np(trainer.train_step(keras.ops.convert_to_tensor(h), z, targets, weights))
    # A non-finite state is an invalid input (the forward pass alone would clip it).
    assert metrics["invalid_inputs"] == 1.0 and metrics["step_skipped"] == 1.0
    assert_unchanged(trainer, before)
    # And the next good step is exactly the step an untouched trainer takes.
    twin_critic, twin = trained()
    good = direct_batch(critic, seed=10)
    a, b = to_np(trainer.train_step(*good)), to_np(twin.train_step(*good))
    assert a["step_skipped"] == 0.0
    np.testing.assert_array_equal(a["total"], b["total"])
    for x, y in zip(state(trainer), state(twin)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_nonfinite_state_tensor_is_an_invalid_input(policy, bad):
    # float32: seen in the critic's values (its MLP keeps non-finite inputs non-finite); float16: its MLP
    # clips its inputs (+-inf would become 65504), so the states themselves are checked.
    keras.config.set_dtype_policy(policy)
    try:
        critic, trainer = trained()
        assert critic.mlp.clips_inputs == (policy == "mixed_float16")
        before = state(trainer)
        h, z, rewards, continues = dream_batch(critic)
        z[2, 1, 0, 0] = bad
        metrics = to_np(trainer.train_on_dream(h, keras.ops.convert_to_tensor(z), rewards, continues))
        assert metrics["invalid_inputs"] == 1.0 and metrics["step_skipped"] == 1.0
        assert_unchanged(trainer, before)
        h, z, targets, weights = direct_batch(critic, seed=3)
        metrics = to_np(trainer.train_step(h, z, targets, weights))
        assert metrics["invalid_inputs"] == 0.0 and metrics["step_skipped"] == 0.0
    finally:
        keras.config.set_dtype_policy("float32")


def test_a_good_step_is_not_skipped_and_moves_everything():
    critic, trainer = trained()
    before = state(trainer)
    metrics = to_np(trainer.train_step(*direct_batch(critic, seed=11)))
    assert metrics["step_skipped"] == 0.0 and metrics["invalid_inputs"] == 0.0
    after = state(trainer)
    changed = [not np.array_equal(a, b) for a, b in zip(after, before)]
    assert all(changed[: len(critic.trainable_variables)])  # every fast weight moved
    assert int(to_np(trainer.steps)) == 2


# Finding 4: PyTorch inputs with autograd history.
@pytest.mark.skipif(BACKEND != "torch", reason="autograd history exists only on PyTorch")
def test_torch_inputs_with_history_get_no_gradient_and_can_be_reused():
    import torch

    critic, trainer = trained()
    world_model = torch.nn.Linear(8, critic.gru_units)
    h = world_model(torch.randn(32, 8))
    _, z, targets, weights = direct_batch(critic)
    z = torch.tensor(z, requires_grad=True)
    for _ in range(2):  # a second step on the same tensors must not backward through their graph again
        metrics = to_np(trainer.train_step(h, z, targets, weights))
        assert metrics["step_skipped"] == 0.0
    assert world_model.weight.grad is None and z.grad is None


# Finding 17.
def test_frozen_critic_is_a_clear_error():
    critic, trainer = trained()
    critic.trainable = False
    before = state(trainer)
    with pytest.raises(ValueError, match=r"critic: has no trainable variables \(critic.trainable is False\)"):
        trainer.train_step(*direct_batch(critic))
    assert_unchanged(trainer, before)
    critic.trainable = True
    assert to_np(trainer.train_step(*direct_batch(critic)))["step_skipped"] == 0.0


# Finding 18: one step at a time.
def test_a_second_concurrent_step_is_a_clear_error():
    critic, trainer = trained()
    before = state(trainer)
    trainer._lock.acquire()  # a step in flight on another thread
    try:
        with pytest.raises(RuntimeError, match="another thread is running a step"):
            trainer.train_step(*direct_batch(critic))
    finally:
        trainer._lock.release()
    assert_unchanged(trainer, before)


def test_two_threads_training_one_trainer_never_corrupt_it():
    critic, trainer = trained()
    errors, done = [], []
    batch = direct_batch(critic, n=256)

    def work():
        for _ in range(5):
            try:
                trainer.train_step(*batch)
                done.append(1)
            except RuntimeError as err:
                assert "another thread is running a step" in str(err)
            except Exception as err:  # anything else is a failure
                errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert int(to_np(trainer.steps)) == 1 + len(done)
    assert all(np.isfinite(a).all() for a in state(trainer))
