"""Keras's own layer conformance check, `keras.src.testing.TestCase.run_layer_test` (the check every Keras and
keras-hub layer passes: serialization round trip, symbolic and eager calls, a training step, mixed precision),
run on every layer and head of the package, on every backend; and the heads' one output-dtype contract under a
mixed policy."""

import keras
import numpy as np
import pytest
from keras.src.testing import TestCase

from multicritic.heads import HEADS
from multicritic.layers.layer_norm import LayerNormalization
from multicritic.layers.mlp import MLP
from tests.test_registry import declared_state

B, D, U, K = 4, 12, 16, 3

# name: (layer class, init kwargs, input shape, expected output shape, trainable weights)
LAYERS = {
    "MLP": (MLP, {"model_size": None, "num_dense_layers": 2, "dense_hidden_units": U}, (B, D), (B, U), 6),
    "MLP rms bias": (
        MLP,
        {"model_size": None, "num_dense_layers": 2, "dense_hidden_units": U, "norm": "rms", "use_bias": True},
        (B, D),
        (B, U),
        6,
    ),
    "MLP members": (
        MLP,
        {"model_size": None, "num_dense_layers": 2, "dense_hidden_units": U, "members": K},
        (B, D),
        (K, B, U),
        6,
    ),
    "MLP members leading dims": (
        MLP,
        {"model_size": None, "num_dense_layers": 2, "dense_hidden_units": U, "members": K},
        (2, B, D),
        (K, 2, B, U),
        6,
    ),
    "MLP output": (
        MLP,
        {"model_size": None, "num_dense_layers": 1, "dense_hidden_units": U, "output_layer_size": 5},
        (B, D),
        (B, 5),
        5,
    ),
    "LayerNormalization": (LayerNormalization, {"epsilon": 1e-3}, (B, D), (B, D), 2),
    "LayerNormalization rms members": (
        LayerNormalization,
        {"epsilon": 1e-4, "rms": True, "members": K},
        (K, B, D),
        (K, B, D),
        1,
    ),
}


class Conformance(TestCase):
    def check(self, cls, kwargs, shape, out_shape, weights):
        # A normalisation maps each row on its own: Keras's LayerNormalization passes masks through, as ours.
        self.run_layer_test(
            cls,
            init_kwargs=kwargs,
            input_shape=shape,
            expected_output_shape=out_shape,
            expected_num_trainable_weights=weights,
            expected_num_non_trainable_weights=0,
            expected_num_seed_generators=0,
            supports_masking=cls is LayerNormalization,
        )


@pytest.mark.parametrize("name", LAYERS)
def test_layer_passes_keras_run_layer_test(name):
    Conformance().check(*LAYERS[name])


@pytest.mark.parametrize("members", [None, K])
@pytest.mark.parametrize("head", HEADS)
def test_head_passes_keras_run_layer_test(head, members):
    cls = HEADS[head]
    units = cls().units
    lead = (B,) if members is None else (K, B)
    shape = lead + (D,)
    Conformance().run_layer_test(
        cls,
        init_kwargs={"members": members},
        input_shape=shape,
        expected_output_shape=(lead, lead + (units,)),
        expected_num_trainable_weights=2,
        expected_num_non_trainable_weights=declared_state(cls, {"members": members}, shape),
        expected_num_seed_generators=0,
        supports_masking=False,
    )


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("head", HEADS)
def test_a_head_outputs_float32_under_a_mixed_policy_on_every_backend(head, policy):
    layer = HEADS[head](dtype=policy)
    value, logits = layer(np.ones((B, D), "float32"))
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


def test_mlp_with_members_works_standalone_as_its_docstring_says():
    mlp = MLP(model_size=None, num_dense_layers=2, dense_hidden_units=U, members=K)
    out = mlp(np.ones((B, D), "float32"))
    assert tuple(out.shape) == (K, B, U)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(mlp))
    again.set_weights(mlp.get_weights())
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(again(np.ones((B, D), "float32"))), keras.ops.convert_to_numpy(out)
    )
