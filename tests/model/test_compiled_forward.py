"""`CompiledForward`: a host's actor called as the critic is, compiled per input signature, giving what
`model(*inputs, training=False)` gives (bit for bit on PyTorch, to float32 rounding where XLA or grappler fuse),
reading the variables' current values, keyed on what changes the ops, and eager wherever it might not match."""

import keras
import numpy as np
import pytest

from multicritic import CompiledForward
from tests.conftest import BACKEND, to_np

CACHE = {"jax": "_cache_jax_compiled_calls", "tensorflow": "_cache_tf_compiled_calls"}.get(BACKEND)


def _actor(seed=0, units=16):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,))
    x = keras.layers.Dense(units, activation="tanh")(inputs)
    x = keras.layers.Dense(units, activation="tanh")(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def _obs(rows=4, seed=1, dtype="float32"):
    return np.random.default_rng(seed).normal(size=(rows, 5)).astype(dtype)


def _close(got, want):
    got, want = to_np(got), to_np(want)
    if BACKEND == "torch":
        np.testing.assert_array_equal(got, want)  # the same kernels in the same order
    else:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)  # fused by XLA / grappler


def _compiled_count(model):
    if BACKEND == "torch":
        from multicritic.backend import torch_replay

        return sum(g is not None for g in torch_replay.graphs(model).values())
    return len(model.__dict__.get(CACHE, {}))


def _passes(batch_sizes):
    """Compiled passes kept for that many batch sizes of one rank: TensorFlow's leave the batch axis open."""
    return 1 if BACKEND == "tensorflow" else batch_sizes


@pytest.mark.parametrize("rows", [1, 4, 33])
def test_gives_the_models_inference_pass(rows):
    actor = _actor()
    forward = CompiledForward(actor)
    obs = _obs(rows)
    for _ in range(3):  # the first call (eager on PyTorch, then traced) and the compiled ones
        _close(forward(obs), actor(obs, training=False))
    _close(forward(obs), actor.predict_on_batch(obs))
    assert _compiled_count(actor) == 1  # one signature, one compiled pass


def test_each_batch_size_its_own_pass_and_the_same_bits_every_call():
    actor = _actor()
    forward = CompiledForward(actor)
    first = {rows: to_np(forward(_obs(rows))) for rows in (2, 7)}
    for rows in (2, 7, 2):
        np.testing.assert_array_equal(to_np(forward(_obs(rows))), first[rows])
    assert _compiled_count(actor) == _passes(2)


def test_reads_the_variables_after_an_optimizer_update():
    actor = _actor()
    actor.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    forward = CompiledForward(actor)
    obs = _obs()
    before = to_np(forward(obs))
    forward(obs)
    actor.train_on_batch(obs, np.ones((4, 3), "float32"))
    after = to_np(forward(obs))
    assert not np.allclose(before, after)
    _close(after, actor(obs, training=False))


def test_assigned_weights_are_read():
    actor = _actor()
    forward = CompiledForward(actor)
    obs = _obs()
    forward(obs), forward(obs)
    actor.set_weights(_actor(seed=5).get_weights())
    _close(forward(obs), actor(obs, training=False))


def test_several_inputs_and_outputs():
    keras.utils.set_random_seed(3)
    a, b = keras.Input((5,)), keras.Input((2,))
    x = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model([a, b], (keras.layers.Dense(3)(x), keras.layers.Dense(1)(x)))
    forward = CompiledForward(model)
    obs, extra = _obs(), np.ones((4, 2), "float32")
    for _ in range(3):
        got, want = forward([obs, extra]), model([obs, extra], training=False)
        assert len(got) == 2
        for g, w in zip(got, want):
            _close(g, w)


def _warmed(actor):
    """`(forward, obs, structure)`: the actor's `CompiledForward` after two calls on `obs` (compiled, or on
    PyTorch traced), and the structure it was made for."""
    forward, obs = CompiledForward(actor), _obs()
    forward(obs), forward(obs)
    return forward, obs


def test_a_new_dtype_policy_takes_a_new_pass():
    actor = _actor()
    forward, obs = _warmed(actor)
    for layer in actor.layers[1:]:
        layer.dtype_policy = "mixed_bfloat16"
    got = forward(obs)
    assert str(to_np(got).dtype) == str(to_np(actor(obs, training=False)).dtype)
    np.testing.assert_allclose(to_np(got).astype("float32"), to_np(actor(obs)).astype("float32"), rtol=1e-2, atol=1e-2)


def test_a_quantized_model_takes_a_new_pass():
    actor = _actor()
    forward, obs = _warmed(actor)
    actor.quantize("int8")
    for _ in range(2):
        _close(forward(obs), actor(obs, training=False))


def test_float64_host_data_runs_the_eager_pass():
    actor = _actor()
    forward = CompiledForward(actor)
    obs = _obs(dtype="float64")
    for _ in range(3):
        _close(forward(obs), actor(obs, training=False))
    assert _compiled_count(actor) == 0


@pytest.mark.parametrize(
    "model, expected",
    [
        ("not a layer", "model: got str, expected a built keras.Layer"),
        (keras.layers.Dense(3), "model: got the unbuilt Dense"),
    ],
)
def test_bad_model(model, expected):
    with pytest.raises(ValueError, match=expected):
        CompiledForward(model)


def test_no_inputs():
    with pytest.raises(ValueError, match="inputs: got none"):
        CompiledForward(_actor())()


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's autograd through the replay")
def test_torch_gradients_are_the_eager_passes():
    import torch

    actor = _actor()
    forward = CompiledForward(actor)
    obs = torch.as_tensor(_obs(8))
    params = [v.value for v in actor.trainable_weights]

    def grads(out):
        for p in params:
            p.grad = None
        out.square().sum().backward()
        return [p.grad.clone() for p in params]

    for _ in range(2):
        forward(obs)
    replayed = grads(forward(obs))
    eager = grads(actor(obs, training=False))
    for r, e in zip(replayed, eager):
        torch.testing.assert_close(r, e, rtol=0, atol=0)


@pytest.mark.skipif(BACKEND != "jax", reason="JAX's tracers")
def test_jax_under_jit_the_eager_pass_runs():
    import jax

    actor = _actor()
    forward = CompiledForward(actor)
    obs = _obs()
    got = jax.jit(lambda x: forward(x))(obs)
    _close(got, actor(obs, training=False))
    assert _compiled_count(actor) == 0


def test_a_pass_that_assigns_a_variable_runs_eagerly():
    class Counting(keras.layers.Layer):
        def build(self, shape):
            self.count = self.add_weight(shape=(), initializer="zeros", trainable=False)

        def call(self, x):
            self.count.assign(self.count + 1.0)
            return x * 2.0

    inputs = keras.Input((5,))
    model = keras.Model(inputs, Counting()(inputs))
    forward = CompiledForward(model)
    for _ in range(4):
        _close(forward(_obs()), _obs() * 2.0)
    assert float(to_np(model.layers[1].count)) == 4.0  # every call assigned once, as eagerly


@pytest.mark.parametrize("kind", ["h_z", "features"])
def test_an_actor_and_a_critic_as_one_model(kind):
    """The PPO example's acting model: the critic a layer of a functional model (which needs its
    `compute_output_shape` to name only shapes), called in one compiled pass, gives each network's own call: an
    `(h, z)` critic given a constant one-class `z`, a features critic the observation alone (and itself through
    `CompiledForward`)."""
    from multicritic import CriticNetwork

    actor = _actor()
    sizes = dict(gru_units=5, num_z_categoricals=1, num_z_classes=1) if kind == "h_z" else dict(input_size=5)
    critic = CriticNetwork(model_size=None, num_dense_layers=2, dense_hidden_units=8, **sizes)
    obs_in = keras.Input((5,))
    z_in = [keras.ops.expand_dims(keras.ops.ones_like(obs_in[:, :1]), -1)] if kind == "h_z" else []
    value_in, _ = critic(obs_in, *z_in)
    assert keras.backend.standardize_dtype(value_in.dtype) == "float32"
    forward = CompiledForward(keras.Model(obs_in, (actor(obs_in), value_in)))
    obs, z = _obs(6), [np.ones((6, 1, 1), "float32")] if kind == "h_z" else []
    for _ in range(3):
        logits, value = forward(obs)
        _close(logits, actor(obs, training=False))
        _close(value, critic(obs, *z)[0])
    if kind == "features":
        critic_forward = CompiledForward(critic)
        for _ in range(3):
            _close(critic_forward(obs)[1], critic(obs)[1])


@pytest.mark.parametrize("copy_with", ["deepcopy", "pickle"])
def test_a_copy_runs_its_own_models_weights(copy_with):
    import copy
    import pickle

    actor = _actor()
    forward, obs = _warmed(actor)
    copied = copy.deepcopy(forward) if copy_with == "deepcopy" else pickle.loads(pickle.dumps(forward))
    assert copied.model is not actor
    first = to_np(forward(obs))
    for _ in range(3):
        np.testing.assert_array_equal(to_np(copied(obs)), first)
    actor.set_weights(_actor(seed=5).get_weights())  # the original changes, the copy does not
    np.testing.assert_array_equal(to_np(copied(obs)), first)
    _close(forward(obs), actor(obs, training=False))


def test_threads_calling_at_once_each_get_their_rows_pass():
    from concurrent.futures import ThreadPoolExecutor

    actor = _actor()
    forward = CompiledForward(actor)
    batches = {rows: _obs(rows, seed=rows) for rows in (1, 2, 3, 5)}
    want = {rows: to_np(actor(obs, training=False)) for rows, obs in batches.items()}

    def calls(rows):
        return [to_np(forward(batches[rows])) for _ in range(20)]

    with ThreadPoolExecutor(4) as pool:
        got = dict(zip(batches, pool.map(calls, batches)))
    for rows, outputs in got.items():
        for output in outputs:
            _close(output, want[rows])
    assert _compiled_count(actor) == _passes(len(batches))


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's strides")
def test_torch_a_strided_batch_its_own_pass_with_the_contiguous_ones_values():
    import torch

    actor = _actor()
    forward = CompiledForward(actor)
    contiguous = torch.as_tensor(_obs(6))
    strided = contiguous.T.contiguous().T  # the same values, column-major
    assert not strided.is_contiguous()
    for _ in range(3):
        _close(forward(strided), actor(strided, training=False))
        _close(forward(strided), forward(contiguous))
    assert _compiled_count(actor) == _passes(2)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.func.functional_call")
def test_torch_functional_call_the_parameters_given_are_read():
    """A host's torch module holding the actor and acting through `CompiledForward`: under
    `torch.func.functional_call` (and `torch.func.grad` over it) the parameters given are what the pass reads, as
    a torch module's call reads them, replayed or eager: the values and gradients of an actor holding them."""
    import torch

    actor, other = _actor(), _actor(seed=5)
    forward = CompiledForward(actor)

    class Host(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.actor = actor

        def forward(self, x):
            return forward(x)

    host = Host()
    obs = torch.as_tensor(_obs(4))
    swapped = {
        f"actor.{name}": param.detach().clone()
        for (name, _), param in zip(actor.named_parameters(), other.parameters())
    }
    assert [tuple(p.shape) for p in swapped.values()] == [tuple(p.shape) for p in actor.parameters()]
    for _ in range(3):  # the first call eager, then traced and replayed
        with torch.no_grad():
            _close(torch.func.functional_call(host, swapped, (obs,)), other(obs, training=False))
    _close(forward(obs), actor(obs, training=False))  # outside it, the actor's own

    def loss(params, x):
        return torch.func.functional_call(host, params, (x,)).square().sum()

    grads = torch.func.grad(loss)(swapped, obs)
    other(obs, training=False).square().sum().backward()
    for (name, grad), param in zip(grads.items(), other.parameters()):
        torch.testing.assert_close(grad, param.grad, rtol=1e-6, atol=1e-6, msg=name)


def test_a_call_warns_nothing():
    """Every call goes through the backend contract by its own name (the 0.1.0 spelling warns, and cost a
    replayed call a quarter of its time)."""
    import warnings

    actor = _actor()
    forward = CompiledForward(actor)
    obs = _obs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            forward(obs)
