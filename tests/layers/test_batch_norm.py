"""`BatchNormalization`: Keras's conformance check, the equations per member, the moving statistics."""

import numpy as np
import pytest
from keras.src.testing import TestCase

from multicritic.layers.batch_norm import BatchNormalization
from multicritic.layers import part_hooks
from tests.conftest import to_np


@pytest.mark.parametrize("members", [None, 3])
def test_passes_keras_run_layer_test(members):
    shape = (5, 4) if members is None else (members, 5, 4)
    TestCase().run_layer_test(
        BatchNormalization,
        init_kwargs={"members": members, "momentum": 0.9},
        input_shape=shape,
        expected_output_shape=shape,
        expected_num_trainable_weights=2,
        expected_num_non_trainable_weights=2,
        expected_num_seed_generators=0,
        supports_masking=False,
    )


def test_training_and_inference_are_the_equations_per_member():
    norm = BatchNormalization(members=2, momentum=0.8, epsilon=1e-2)
    norm.build((2, None, 3))
    rng = np.random.default_rng(0)
    gamma, beta, mean, var = (rng.normal(size=(2, 3)).astype("float32") for _ in range(4))
    var = np.abs(var)
    for v, value in zip((norm.gamma, norm.beta, norm.moving_mean, norm.moving_variance), (gamma, beta, mean, var)):
        v.assign(value)
    x = rng.normal(size=(2, 6, 3)).astype("float32")
    inference = to_np(norm(x))
    want = (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-2) * gamma[:, None] + beta[:, None]
    np.testing.assert_allclose(inference, want, rtol=1e-5, atol=1e-6)
    with part_hooks.training_step() as collected:  # inside a step: given to the step, nothing assigned
        trained = to_np(norm(x, training=True))
    b_mean, b_var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    want = (x - b_mean) / np.sqrt(b_var + 1e-2) * gamma[:, None] + beta[:, None]
    np.testing.assert_allclose(trained, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(to_np(norm.moving_mean), mean)
    new = {path: to_np(value) for path, (_, value) in collected.values.items()}
    np.testing.assert_allclose(new[norm.moving_mean.path], 0.8 * mean + 0.2 * b_mean[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new[norm.moving_variance.path], 0.8 * var + 0.2 * b_var[:, 0], rtol=1e-5, atol=1e-6)
    norm(x, training=True)  # outside a step: assigned at once
    np.testing.assert_allclose(to_np(norm.moving_mean), new[norm.moving_mean.path], rtol=1e-6)
    norm.trainable = False  # a frozen (slow) copy normalises by the batch and moves nothing
    before = to_np(norm.moving_mean)
    np.testing.assert_allclose(to_np(norm(x, training=True)), trained, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(to_np(norm.moving_mean), before)


def test_a_negative_moving_variance_counts_as_zero():
    norm = BatchNormalization(epsilon=0.25)
    norm.build((None, 2))
    norm.moving_variance.assign(np.array([-4.0, 1.0], "float32"))
    out = to_np(norm(np.ones((1, 2), "float32")))
    np.testing.assert_allclose(out, [[1.0 / 0.5, 1.0 / np.sqrt(1.25)]], rtol=1e-6)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"momentum": -0.1}, r"^momentum: got -0\.1"),
        ({"epsilon": 0.0}, r"^epsilon: got 0\.0"),
        ({"members": 0}, r"^members: got 0"),
    ],
)
def test_bad_options_are_refused_naming_them(options, message):
    with pytest.raises(ValueError, match=message):
        BatchNormalization(**options)


def test_two_passes_in_one_step_move_the_statistics_twice():
    """A step with a dream and a replay pass: the second moves the statistics from where the first left them."""
    norm = BatchNormalization(momentum=0.5)
    norm.build((None, 2))
    x1, x2 = np.array([[1.0, 2.0], [3.0, 6.0]], "float32"), np.array([[5.0, 0.0], [7.0, 0.0]], "float32")
    with part_hooks.training_step() as collected:
        norm(x1, training=True)
        norm(x2, training=True)
    got = to_np(collected.values[norm.moving_mean.path][1])
    np.testing.assert_allclose(got, 0.5 * (0.5 * 0.0 + 0.5 * x1.mean(0)) + 0.5 * x2.mean(0), rtol=1e-6)
    np.testing.assert_array_equal(to_np(norm.moving_mean), 0.0)  # nothing assigned inside the step
