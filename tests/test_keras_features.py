"""Keras features that need every layer's own `call` to run: quantization, LoRA, summaries."""

import numpy as np
import pytest

from multicritic import CriticNetwork
from tests.conftest import random_inputs, randomize, to_np


@pytest.mark.parametrize("members", [1, 3])
def test_int8_quantized_logits_stay_within_a_percent(members):
    critic = CriticNetwork(model_size="nano", ensemble_size=members)
    rng = np.random.default_rng(0)
    for layer in (critic.return_layer, critic.return_layer_ema):  # a trained-looking head (it starts at zero)
        for v in layer.weights:
            v.assign(rng.normal(scale=0.05, size=tuple(v.shape)).astype("float32"))
    h, z = random_inputs(critic, 32)
    value, logits = to_np(critic(h, z))
    with pytest.warns(UserWarning, match="LayerNormalization does not have a `quantize` method"):
        critic.quantize("int8")
    assert "int8" in str(critic.mlp.dense_layers[0].kernel.dtype)
    q_value, q_logits = to_np(critic(h, z))
    assert np.abs(q_logits - logits).max() <= 1e-2 * max(1.0, np.abs(logits).max())
    assert np.abs(q_value - value).max() <= 1e-2


def test_lora_trains_only_the_adapters():
    from multicritic import CriticTrainer

    critic = CriticNetwork(model_size="nano")
    h, z = random_inputs(critic, 8)
    critic.mlp.dense_layers[0].enable_lora(2)
    # The EMA copy must be changed the same way: pairing the wrong variables is refused.
    with pytest.raises(ValueError, match="update_ema: the fast critic's variable 'mlp/dense_0/lora_kernel_a'"):
        critic.update_ema()
    critic.mlp_ema.dense_layers[0].enable_lora(2)
    names = [v.path for v in critic.trainable_variables]
    assert "critic/mlp/dense_0/lora_kernel_a" in names and "critic/mlp/dense_0/kernel" not in names
    critic.return_layer.reward_buckets_layer.kernel.assign(np.full((16, 255), 0.01, np.float32))
    kernel = to_np(critic.mlp.dense_layers[0]._kernel).copy()  # `kernel` is the merged one
    lora_b = to_np(critic.mlp.dense_layers[0].lora_kernel_b).copy()
    trainer = CriticTrainer(critic, learning_rate=1e-2)
    rng = np.random.default_rng(0)
    for _ in range(2):
        trainer.train_step(h, z, rng.normal(size=8).astype("float32") * 10, np.ones(8, "float32"))
    np.testing.assert_array_equal(to_np(critic.mlp.dense_layers[0]._kernel), kernel)
    assert not np.allclose(to_np(critic.mlp.dense_layers[0].lora_kernel_b), lora_b)


def test_summary_lists_the_sub_layers():
    lines = []
    CriticNetwork(model_size="nano").summary(print_fn=lambda line, **kw: lines.append(line))
    text = "\n".join(lines)
    for name in ("mlp", "return_layer", "mlp_ema", "return_layer_ema"):
        assert name in text


@pytest.mark.parametrize("change", ["quantize", "lora", "layer_policy", "critic_policy", "policy_map"])
def test_the_compiled_calls_follow_every_change_a_forward_pass_depends_on(change):
    import keras

    from multicritic.backend import contract

    critic = CriticNetwork(model_size="nano")
    h, z = random_inputs(critic, 2)
    critic(h, z)
    randomize(critic, seed=1)
    for _ in range(3):  # eager, traced, compiled
        before = to_np(critic(h, z)[1])
    layer = critic.mlp.dense_layers[0]
    if change == "quantize":
        layer.quantize("int8")
    elif change == "lora":
        layer.enable_lora(2)
        layer.lora_kernel_b.assign(np.full(tuple(layer.lora_kernel_b.shape), 0.5, "float32"))
    elif change == "layer_policy":
        layer.dtype_policy = "bfloat16"
    elif change == "critic_policy":
        critic.dtype_policy = "mixed_bfloat16"
    else:  # a map changes in place
        policies = keras.dtype_policies.DTypePolicyMap(default_policy="float32")
        layer.dtype_policy = policies
        critic(h, z)
        policies[layer.path] = "bfloat16"
    contract.EAGER = True
    try:
        want = to_np(critic(h, z)[1])
    finally:
        contract.EAGER = False
    got = to_np(critic(h, z)[1])
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype("float32"), want.astype("float32"), atol=2e-2)
    if change in ("quantize", "lora"):  # float32 math: the compiled pass's rounding only
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert not np.array_equal(want.astype("float32"), before)
