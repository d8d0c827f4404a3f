"""A compiled pass is reused only while what its trace read is unchanged (`multicritic.backend.trace_reads`), on
every backend: the critic's compiled calls, `CompiledForward` and PyTorch's replay follow every edit Keras allows
after the first call, and give the eager call's values (issue 71, findings 1-6, 8-10)."""

import contextlib
import os

import keras
import numpy as np
import pytest
from keras import layers

from multicritic import CompiledForward, CriticNetwork
from multicritic.backend import contract, trace_reads
from tests.conftest import BACKEND, random_inputs, randomize, to_np

# Compiled (XLA, Grappler) kernels round differently from the op-by-op pass in the last bits.
ATOL = 1e-5


@contextlib.contextmanager
def eager():
    """The op-by-op pass, through the one documented switch."""
    before = contract.EAGER
    contract.EAGER = True
    try:
        yield
    finally:
        contract.EAGER = before


def _close(got, want, atol=ATOL):
    got, want = keras.tree.flatten(to_np(got)), keras.tree.flatten(to_np(want))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.astype("float32"), w.astype("float32"), rtol=atol, atol=atol)


def _obs(rows=4, width=5, seed=0, dtype="float32"):
    return np.random.default_rng(seed).normal(size=(rows, width)).astype(dtype)


def _warm(fn, *inputs):
    for _ in range(3):  # eager, then traced, then the compiled pass itself
        fn(*inputs)


class Scale(layers.Layer):
    """A layer whose pass reads a Python attribute."""

    def __init__(self, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor


def _normalizer(seed):
    norm = layers.Normalization()
    norm.adapt(np.random.default_rng(seed).normal(3.0 * seed, 1.0 + seed, size=(64, 5)).astype("float32"))
    return norm


def _model():
    return keras.Sequential(
        [keras.Input((5,)), _normalizer(0), Scale(), layers.Dense(16, activation="tanh"), layers.Dense(3)]
    )


# Every way Keras lets a user change what a built model computes, after its first call.
def _replace_layer(model):
    model.pop()
    model.add(layers.Dense(4))


def _replace_layer_same_width(model):
    model.pop()
    model.add(layers.Dense(3, kernel_initializer="ones"))


def _readapt(model):
    model.layers[0].adapt(np.random.default_rng(5).normal(7.0, 3.0, size=(64, 5)).astype("float32"))


def _load_weights(model, tmp_path):
    other = keras.Sequential([keras.Input((5,)), _normalizer(2), Scale(), layers.Dense(16, "tanh"), layers.Dense(3)])
    path = os.fspath(tmp_path / "other.weights.h5")
    other.save_weights(path)
    model.load_weights(path)


def _set_policy(model):
    model.layers[2].dtype_policy = "mixed_bfloat16"


def _assign(model):
    kernel = model.layers[2].kernel
    kernel.assign(np.full(tuple(kernel.shape), 0.05, "float32"))


def _python_attribute(model):
    model.layers[1].factor = -3.0


def _policy_map_in_place(model):
    policies = keras.dtype_policies.DTypePolicyMap(default_policy="float32")
    model.layers[3].dtype_policy = policies
    model(_obs())  # (the map's first use)
    policies[model.layers[3].path] = "bfloat16"


EDITS = {
    "replace_layer": _replace_layer,
    "replace_layer_same_width": _replace_layer_same_width,
    "readapt": _readapt,
    "load_weights": _load_weights,
    "set_policy": _set_policy,
    "assign_variable": _assign,
    "python_attribute": _python_attribute,
    "policy_map_in_place": _policy_map_in_place,
    "quantize": lambda model: model.quantize("int8"),
    "lora": lambda model: _lora(model),
}


def _lora(model):
    dense = model.layers[3]
    dense.enable_lora(2)
    dense.lora_kernel_b.assign(np.ones(tuple(dense.lora_kernel_b.shape), "float32"))


@pytest.mark.parametrize("edit", list(EDITS))
def test_compiled_forward_follows_every_edit_after_its_first_call(edit, tmp_path):
    model = _model()
    forward, obs = CompiledForward(model), _obs()
    _warm(forward, obs)
    before = to_np(forward(obs))
    EDITS[edit](*((model, tmp_path) if edit == "load_weights" else (model,)))
    want = model(obs, training=False)
    low_precision = edit in ("set_policy", "policy_map_in_place")
    for _ in range(3):
        _close(forward(obs), want, atol=2e-2 if low_precision else ATOL)
    assert to_np(want).shape != before.shape or not np.allclose(to_np(want), before, atol=1e-3)  # it did change
    if low_precision:  # the compiled pass is the new policy's: a fresh one gives its bits
        np.testing.assert_array_equal(to_np(forward(obs)), to_np(CompiledForward(model)(obs)))


def test_issue_71_finding_1_a_replaced_layer_is_run_not_the_removed_one():
    model = keras.Sequential([keras.Input((5,)), layers.Dense(16, activation="tanh"), layers.Dense(3)])
    forward, obs = CompiledForward(model), _obs()
    _warm(forward, obs)
    model.pop()
    model.add(layers.Dense(4))
    assert tuple(to_np(forward(obs)).shape) == (4, 4)
    _close(forward(obs), model(obs, training=False))


def test_issue_71_finding_2_a_readapted_normalizer_and_a_layer_outside_the_model():
    norm = _normalizer(0)
    model = keras.Sequential([keras.Input((5,)), norm, layers.Dense(3)])
    forward, obs = CompiledForward(model), _obs()
    _warm(forward, obs)
    _readapt(model)
    _close(forward(obs), model(obs, training=False))
    # A layer reached through a Lambda, outside the model's tree and its weights.
    outside = layers.Dense(5)
    outside.build((None, 5))
    lam = keras.Sequential([keras.Input((5,)), layers.Lambda(lambda t: outside(t)), layers.Dense(3)])
    forward = CompiledForward(lam)
    _warm(forward, obs)
    outside.kernel.assign(np.ones((5, 5), "float32"))
    _close(forward(obs), lam(obs, training=False))


def _critic():
    critic = CriticNetwork(model_size="nano")
    h, z = random_inputs(critic, 4)
    critic(h, z)
    randomize(critic, seed=3)
    return critic, h, z


def test_issue_71_finding_3_a_byte_swapped_host_array_is_its_values():
    critic, h, z = _critic()
    swapped = (h.astype(">f4"), z.astype(">f4"))
    first = critic(*swapped)  # as a first call of its signature
    _warm(critic, h, z)  # the native array's compiled pass exists now
    for got in (first, critic(*swapped), critic(*swapped)):
        _close(got, critic(h, z))
    model = _model()
    forward, obs = CompiledForward(model), _obs()
    _warm(forward, obs)
    _close(forward(obs.astype(">f4")), forward(obs))


def test_issue_71_finding_4_large_64_bit_integers_are_cast_as_the_eager_pass_casts_them():
    critic, h, z = _critic()
    big = np.full(h.shape, 2**31 + 12345, dtype="int64")
    big[:, ::2] = -(2**33)
    with eager():
        want = critic(big, z)
    for _ in range(3):
        _close(critic(big, z), want)
    _close(want, critic(big.astype("float32"), z))  # exactly the float32 values


def test_issue_71_finding_5_a_norm_layers_policy_set_after_the_first_call():
    critic, h, z = _critic()
    _warm(critic, h, z)
    before = to_np(critic(h, z)[1])
    norms = [layer for layer in critic._flatten_layers() if isinstance(layer, layers.LayerNormalization)]
    assert norms
    for norm in norms:
        norm.dtype_policy = "bfloat16"
    with eager():
        want = to_np(critic(h, z)[1])
    got = to_np(critic(h, z)[1])
    assert not np.array_equal(got, before)
    np.testing.assert_allclose(got, want, atol=5e-3)
    # What the compiled pass gives is a fresh trace's, the new policy's.
    fresh = CriticNetwork.from_config(critic.get_config())
    fresh(h, z)
    fresh.set_weights(critic.get_weights())
    for layer in fresh._flatten_layers():
        if isinstance(layer, layers.LayerNormalization):
            layer.dtype_policy = "bfloat16"
    np.testing.assert_array_equal(got, to_np(fresh(h, z)[1]))


def test_issue_71_finding_6_dict_nested_and_list_outputs():
    inputs = keras.Input((5,))
    dense = layers.Dense(3)(inputs)
    nested = keras.Model(inputs, {"a": dense, "b": (dense * 2.0, [dense + 1.0])})
    listed = keras.Model(inputs, [dense, dense * 3.0])
    obs = _obs()
    for model in (nested, listed):
        forward = CompiledForward(model)
        for _ in range(3):
            got = forward(obs)
            want = model(obs, training=False)
            assert keras.tree.map_structure(lambda _: 0, got) == keras.tree.map_structure(lambda _: 0, want)
            _close(got, want)
    if BACKEND == "torch":
        from multicritic.backend import torch_replay

        assert all(graph is not None for graph in torch_replay.graphs(nested).values())
        assert all(graph is not None for graph in torch_replay.graphs(listed).values())


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's functions per signature")
def test_issue_71_finding_8_one_function_per_rank_whatever_the_batch_sizes():
    critic, h, z = _critic()
    cache = "_cache_tf_compiled_calls"
    rng = np.random.default_rng(0)
    for rows in range(1, 60):
        hh = rng.normal(size=(rows, h.shape[-1])).astype("float32")
        zz = np.broadcast_to(z[:1], (rows,) + z.shape[1:]).copy()
        got = critic(hh, zz)
        if rows % 20 == 1:
            with eager():
                _close(got, critic(hh, zz))
    for steps in (1, 3, 7):  # [T, B] of varying T and B
        hh = rng.normal(size=(steps, 5, h.shape[-1])).astype("float32")
        zz = np.broadcast_to(z[:1], (steps, 5) + z.shape[1:]).copy()
        critic(hh, zz)
    assert len(critic.__dict__[cache]) == 2  # one for [B, ...] inputs, one for [T, B, ...]


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's forward-mode accumulator")
def test_issue_71_finding_9_a_forward_accumulator_after_a_tape_gives_the_eager_jvp():
    import tensorflow as tf

    critic, h, z = _critic()
    h, z = tf.constant(h), tf.constant(z)
    _warm(critic, h, z)
    with tf.GradientTape() as tape:
        tape.watch(h)
        value, _ = critic(h, z)
    tape.gradient(value, h)
    tangent = tf.ones_like(h) * 0.5

    def jvp():
        with tf.autodiff.ForwardAccumulator(h, tangent) as accumulator:
            _, logits = critic(h, z)
        return accumulator.jvp(logits)

    got = jvp()
    with eager():
        want = jvp()
    _close(got, want)
    assert np.abs(to_np(got)).max() > 0


def _compiled_entries(owner):
    if BACKEND == "torch":
        from multicritic.backend import torch_replay

        return len(torch_replay.graphs(owner))
    return len(owner.__dict__.get({"jax": "_cache_jax_compiled_calls"}.get(BACKEND, "_cache_tf_compiled_calls"), {}))


def _framework_switch():
    if BACKEND == "jax":
        import jax

        return jax.disable_jit()
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @contextlib.contextmanager
        def functions_eagerly():
            tf.config.run_functions_eagerly(True)
            try:
                yield
            finally:
                tf.config.run_functions_eagerly(False)

        return functions_eagerly()
    return eager()  # PyTorch has no switch of its own for a replay: the documented one


@pytest.mark.parametrize("switch", ["multicritic", "framework"])
def test_issue_71_finding_10_one_switch_runs_the_op_by_op_pass_on_every_backend(switch):
    critic, h, z = _critic()
    before = _compiled_entries(critic)
    model = _model()
    obs = _obs()
    with eager() if switch == "multicritic" else _framework_switch():
        for rows in (3, 3, 5, 5):
            critic(h[:rows], z[:rows])
            CompiledForward(model)(obs)
    assert _compiled_entries(critic) == before and _compiled_entries(model) == 0


def test_reads_follow_setattr_containers_and_policy_maps():
    model = _model()
    model(_obs())
    with trace_reads.recording() as recorder:
        model(_obs())
    reads = recorder.snapshot(model)
    assert reads.current() and reads.layers >= len(list(model._flatten_layers()))
    model.layers[1].factor = 2.0  # the same object: nothing changed
    assert reads.current()
    model.layers[1].factor = 5.0
    assert not reads.current()
    reads = trace_reads.watch(model)
    model._layers.append(model._layers[-1])  # a list changed in place, without a setattr
    model._layers.pop()
    assert reads.current()
    model.layers[1].extra = 1  # a new attribute
    assert not reads.current()


def test_a_variable_read_outside_the_mapping_is_recorded():
    dense = layers.Dense(2)
    dense.build((None, 3))
    with trace_reads.recording() as recorder:
        with trace_reads.ReadingScope(state_mapping=[(dense.kernel, dense.kernel.value)]) as scope:
            dense(np.ones((1, 3), "float32"))
    assert [v.path for v in scope.unmapped.values()] == [dense.bias.path]
    assert id(dense) in recorder.layers


def test_an_attribute_changing_at_every_call_ends_in_the_eager_pass():
    class Counting(layers.Layer):
        def call(self, x):
            self.calls = getattr(self, "calls", 0) + 1  # read and changed by every pass
            return x * 2.0

    model = keras.Sequential([keras.Input((5,)), Counting(), layers.Dense(2)])
    forward, obs = CompiledForward(model), _obs()
    for _ in range(12):
        _close(forward(obs), model(obs, training=False))
