"""Counter-based draws: the hash is lowbias32's uint32 arithmetic on every backend, eager and compiled."""

import keras
import numpy as np
import pytest

from multicritic.math import draws


def lowbias32(x):
    """The reference hash in numpy uint32 (wrapping multiplication, logical shifts)."""
    x = np.asarray(x, np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x = x * np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x = x * np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    return x


def keys_reference(n, seed, counter):
    x = lowbias32(lowbias32(np.uint32(seed)) ^ np.uint32(counter))
    x = lowbias32(x ^ np.arange(n, dtype=np.uint32))
    return (x >> np.uint32(8)).astype(np.float64) / 2**24


def test_hash32_is_lowbias32_for_all_bit_patterns():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.integers(0, 2**32, 4096, dtype=np.uint64), [0, 1, 2**31 - 1, 2**31, 2**32 - 1]])
    values = values.astype(np.uint32)
    got = keras.ops.convert_to_numpy(draws.hash32(keras.ops.convert_to_tensor(values.view(np.int32))))
    np.testing.assert_array_equal(got.view(np.uint32), lowbias32(values))


@pytest.mark.parametrize("compiled", [False, True])
def test_uniform_keys_are_the_reference_in_range_and_spread(compiled):
    fn = _compiled_keys if compiled else draws.uniform_keys
    for seed, counter in ((0, 0), (7, 3), (2**32 - 1, 2**31 - 1), (123456789, 10**6)):
        got = np.asarray(keras.ops.convert_to_numpy(fn(6, draws.as_int32(seed), counter)))
        want = keys_reference(6, seed, counter)
        np.testing.assert_array_equal(got.astype(np.float64), want)
        assert ((got >= 0) & (got < 1)).all()
    # Over many counters each of 4 members is the smallest about a quarter of the time.
    firsts = np.array([np.argmin(keys_reference(4, 11, c)) for c in range(4000)])
    assert np.all(np.abs(np.bincount(firsts, minlength=4) / 4000 - 0.25) < 0.03)


def _compiled_keys(n, seed, counter):
    """`uniform_keys` inside the backend's compiled function (tf.function / jax.jit / torch.compile)."""
    backend = keras.backend.backend()
    seed = keras.ops.convert_to_tensor(seed, "int32")
    counter = keras.ops.convert_to_tensor(counter, "int32")
    if backend == "jax":
        import jax

        return jax.jit(lambda s, c: draws.uniform_keys(n, s, c))(seed, counter)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(lambda s, c: draws.uniform_keys(n, s, c), jit_compile=True)(seed, counter)
    import torch

    return torch.compile(lambda s, c: draws.uniform_keys(n, s, c), fullgraph=True)(seed, counter)
