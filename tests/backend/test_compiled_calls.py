"""A host's eager forward passes, compiled per input signature (`multicritic.backend.compiled_calls`):
the compiled call gives the eager pass's values, reads the variables' current values, and steps aside wherever it
might not (tracers, scopes, inputs the eager pass converts)."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.backend import compiled_calls
from multicritic.backend.compiled_calls import CompiledCalls
from tests.conftest import BACKEND, compiled, random_inputs, randomize, to_np

COMPILED = BACKEND in ("jax", "tensorflow")
needs_compiled = pytest.mark.skipif(not COMPILED, reason="JAX's and TensorFlow's compiled eager calls")
CACHE = {"jax": "_cache_jax_compiled_calls", "tensorflow": "_cache_tf_compiled_calls"}.get(BACKEND)


class _Owner:
    pass


def _recording():
    made = []

    def compile(fn, variables):
        made.append(fn)
        return lambda *inputs: ("compiled", fn(*inputs))

    return CompiledCalls(compile, "_calls"), made


def test_each_signature_compiles_once_at_its_first_call():
    calls, made = _recording()
    owner = _Owner()
    fn = lambda x: x + 1  # noqa: E731
    assert calls(owner, list, "k", fn, (1,), ("sig",)) == ("compiled", 2)
    assert calls(owner, list, "k", fn, (2,), ("sig",)) == ("compiled", 3)
    assert len(made) == 1
    assert calls(owner, list, "other", fn, (1,), ("sig",)) == ("compiled", 2)  # another key: its own function
    assert calls(owner, list, "k", fn, (1,), ("sig2",)) == ("compiled", 2)
    assert len(made) == 3


def test_an_owner_not_yet_built_is_called_eagerly():
    calls, made = _recording()
    owner = _Owner()
    owner.built = False  # its call makes its variables: only eagerly
    assert calls(owner, list, "k", lambda x: x + 1, (1,), ("sig",)) == 2
    assert made == []


def test_a_call_without_signature_is_always_eager():
    calls, made = _recording()
    owner = _Owner()
    for _ in range(3):
        assert calls(owner, list, "k", lambda x: x * 2, (3,), None) == 6
    assert made == [] and "_calls" not in owner.__dict__


def test_the_least_recently_used_signatures_beyond_the_limit_go(monkeypatch):
    monkeypatch.setattr(compiled_calls, "LIMIT", 3)
    calls, made = _recording()
    owner = _Owner()
    for i in range(5):
        calls(owner, list, "k", lambda x: x, (i,), (i,))
    calls(owner, list, "k", lambda x: x, (2,), (2,))  # used again: the most recent
    assert list(owner._calls) == [("k", (3,)), ("k", (4,)), ("k", (2,))]
    calls(owner, list, "k", lambda x: x, (0,), (0,))  # forgotten: compiled again
    assert len(made) == 6 and list(owner._calls) == [("k", (4,)), ("k", (2,)), ("k", (0,))]


def test_host_arrays_the_eager_pass_keeps():
    assert compiled_calls.host_array_kept(np.zeros(3, "float32"))
    assert compiled_calls.host_array_kept(np.zeros(3, "int32"))  # cast by the pass itself, compiled too
    assert not compiled_calls.host_array_kept(np.zeros(3, "float64"))  # the boundary would round it
    assert not compiled_calls.host_array_kept([0.0, 1.0])


def _critic(**options):
    critic = CriticNetwork(model_size="nano", **options)
    h, z = random_inputs(critic, 4)
    critic(h, z)
    randomize(critic, seed=3)
    return critic


def _close(actual, expected, rtol=1e-5, atol=1e-6):
    """`(value, logits)` pairs (or single arrays) equal to compiled-kernel rounding."""
    actual, expected = to_np(actual), to_np(expected)
    if isinstance(expected, tuple):
        assert len(actual) == len(expected)
        for a, b in zip(actual, expected):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    else:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def _entries(critic):
    return {k: v for k, v in critic.__dict__.get(CACHE, {}).items() if isinstance(v, compiled_calls.Entry)}


def _eager(critic, call):
    """`call()` on the eager path: in a stateless scope of the critic's own values (which no compiled call
    takes)."""
    with keras.StatelessScope(state_mapping=[(w, w.value) for w in critic.weights]):
        return to_np(call())


@needs_compiled
@pytest.mark.parametrize("host", [True, False], ids=["numpy", "tensor"])
def test_repeated_calls_give_the_eager_pass_values(host):
    critic = _critic()
    h, z = random_inputs(critic, 5, seed=1)
    if not host:
        h, z = keras.ops.convert_to_tensor(h), keras.ops.convert_to_tensor(z)
    first, before = _eager(critic, lambda: critic(h, z)), len(_entries(critic))
    for _ in range(3):
        _close(critic(h, z), first)
    # (TensorFlow's functions leave the batch axis open: the batch of 4 that built the critic made this one,
    # for host arrays.)
    new = 0 if BACKEND == "tensorflow" and host else 1
    assert len(_entries(critic)) == before + new
    ema = _eager(critic, lambda: critic(h, z, use_ema=True))
    for _ in range(3):
        _close(critic(h, z, use_ema=True), ema)
    latent = np.concatenate([to_np(h), to_np(z).reshape(5, -1)], -1)
    for _ in range(3):
        _close(critic.on_latent(latent, outputs="both"), first)  # the flat latent is the pair
    assert len(_entries(critic)) == before + new + 2


@needs_compiled
def test_an_assignment_is_what_the_next_compiled_call_reads():
    critic, other = _critic(), _critic()
    randomize(other, seed=9)
    h, z = random_inputs(critic, 4, seed=2)
    for _ in range(3):
        critic(h, z)
    for mine, theirs in zip(critic.weights, other.weights):
        mine.assign(theirs)
    _close(critic(h, z), other(h, z))


@needs_compiled
def test_a_stateless_scope_gives_its_own_values():
    critic, other = _critic(), _critic()
    randomize(other, seed=9)
    h, z = random_inputs(critic, 4, seed=2)
    for _ in range(3):
        critic(h, z)
    with keras.StatelessScope(state_mapping=list(zip(critic.weights, [w.value for w in other.weights]))):
        scoped = to_np(critic(h, z))
    _close(scoped, other(h, z))


@needs_compiled
def test_inside_the_frameworks_own_compilation_the_call_is_traced_as_before():
    critic = _critic()
    h, z = (keras.ops.convert_to_tensor(x) for x in random_inputs(critic, 4, seed=2))
    expected, before = _eager(critic, lambda: critic(h, z)), len(_entries(critic))
    for _ in range(2):
        _close(compiled(lambda a, b: critic(a, b))(h, z), expected)
    assert len(_entries(critic)) == before  # only ever traced: nothing compiled of its own


@needs_compiled
def test_a_host_array_the_eager_pass_converts_is_not_compiled():
    critic = _critic()
    h, z = random_inputs(critic, 4, seed=2)
    h64, before = h.astype("float64"), len(_entries(critic))
    outs = [to_np(critic(h64, z)) for _ in range(3)]
    assert len(_entries(critic)) == before
    _close(outs[2], critic(h, z))


@needs_compiled
def test_bad_input_is_refused_as_eagerly_once_compiled():
    critic = _critic()
    h, z = random_inputs(critic, 4, seed=2)
    for _ in range(3):
        critic(h, z)
    with pytest.raises(ValueError, match="h"):
        critic(h[:, :-1], z)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's GradientTape over a compiled call")
def test_a_gradient_tape_sees_through_the_compiled_call():
    import tensorflow as tf

    critic = _critic()
    h, z = (tf.constant(x) for x in random_inputs(critic, 4, seed=2))

    def grads():
        with tf.GradientTape() as tape:
            tape.watch(h)
            loss = tf.reduce_sum(tf.math.reduce_logsumexp(critic(h, z)[1], -1))
        return tape.gradient(loss, [h] + critic.trainable_variables)

    before = len(_entries(critic))
    with tf.GradientTape() as tape:
        tape.watch(h)
        with keras.StatelessScope(state_mapping=[(w, w.value) for w in critic.weights]):  # the eager pass
            loss = tf.reduce_sum(tf.math.reduce_logsumexp(critic(h, z)[1], -1))
    first = [to_np(g) for g in tape.gradient(loss, [h] + critic.trainable_variables)]
    assert len(_entries(critic)) == before
    for _ in range(2):
        for a, b in zip(grads(), first):
            np.testing.assert_allclose(to_np(a), b, rtol=1e-5, atol=1e-6)
    assert len(_entries(critic)) == before + 1


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's replay of host arrays")
def test_a_float32_host_array_replays_as_its_tensor():
    import torch

    critic = _critic()
    h, z = random_inputs(critic, 4, seed=2)
    expected = to_np(critic(torch.from_numpy(h), torch.from_numpy(z)))
    for _ in range(3):
        _close(critic(h, z), expected, rtol=1e-6, atol=1e-7)


def _parts():
    from multicritic.heads import HEADS
    from multicritic.trunks import TRUNKS

    # Each head with the reference trunk, each trunk with the reference head (the forward pass is the trunk's then
    # the head's): the cases grow with the parts, not their product.
    return [(head, "mlp") for head in HEADS] + [("two_hot", trunk) for trunk in TRUNKS if trunk != "mlp"]


@needs_compiled
@pytest.mark.parametrize("head, trunk", _parts())
def test_every_head_and_trunk_compiles_to_its_eager_values(head, trunk):
    critic = _critic(head=head, trunk=trunk, ensemble_size=2)
    h, z = random_inputs(critic, 3, seed=4)
    first = _eager(critic, lambda: critic(h, z))
    for _ in range(3):
        _close(critic(h, z), first)
    assert _entries(critic)
