"""SimbaV2's `Scaler`: Keras's conformance check and its parameterisation."""

import numpy as np
import pytest
from keras.src.testing import TestCase

from multicritic.layers.scaler import Scaler
from tests.conftest import to_np


@pytest.mark.parametrize("members", [None, 2])
def test_passes_keras_run_layer_test(members):
    shape = (3, 4) if members is None else (members, 3, 4)
    TestCase().run_layer_test(
        Scaler,
        init_kwargs={"init": 0.5, "scale": 0.25, "members": members},
        input_shape=shape,
        expected_output_shape=shape,
        expected_num_trainable_weights=1,
        expected_num_non_trainable_weights=0,
        expected_num_seed_generators=0,
        supports_masking=False,
    )


def test_the_effective_scale_starts_at_init_and_is_stored_at_scale():
    scaler = Scaler(init=0.5, scale=0.25, members=2)
    x = np.arange(12, dtype="float32").reshape(2, 2, 3)
    np.testing.assert_allclose(to_np(scaler(x)), 0.5 * x)
    np.testing.assert_array_equal(to_np(scaler.scaler), 0.25)
    scaler.scaler.assign(np.array([[1.0, 2.0, 3.0], [0.0, 0.5, 1.0]], "float32"))
    np.testing.assert_allclose(to_np(scaler(x)), x * (np.array([[1, 2, 3], [0, 0.5, 1]])[:, None] * 2.0), rtol=1e-6)
    with pytest.raises(ValueError, match=r"^scale: got 0, expected a finite number > 0"):
        Scaler(scale=0)
