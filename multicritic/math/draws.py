"""Counter-based random draws: uniform keys that are a pure function of `(seed, counter)`.

An ensemble's `"min_of_random"` aggregation draws a subset of members at
every train step. Drawn from a hash of the seed, the step count and the
member index, the draw needs no random state (nothing to carry through a
compiled step or to checkpoint: a resumed run draws what the whole run
would have), is the same on every backend, and compiles to a handful of
integer ops (`torch.compile` cannot trace a stateful generator).
"""

from __future__ import annotations

import numpy as np
from keras import ops

# Chris Wellons' `lowbias32` integer hash (github.com/skeeto/hash-prospector): two multiply-xorshift rounds
# with low bias over all 32-bit inputs. Its uint32 arithmetic runs on int32 tensors: multiplication wraps
# modulo 2^32 on every backend, and each right shift is masked into a logical one.
_M1 = int(np.uint32(0x7FEB352D).view(np.int32))
_M2 = int(np.uint32(0x846CA68B).view(np.int32))


def _shift_right(x, bits: int):
    """Logical right shift of int32 `x` (as uint32) by `bits`."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def hash32(x):
    """`lowbias32` of int32 `x`, elementwise, as int32 bits."""
    x = ops.bitwise_xor(x, _shift_right(x, 16))
    x = ops.multiply(x, ops.convert_to_tensor(_M1, "int32"))
    x = ops.bitwise_xor(x, _shift_right(x, 15))
    x = ops.multiply(x, ops.convert_to_tensor(_M2, "int32"))
    return ops.bitwise_xor(x, _shift_right(x, 16))


def as_int32(value: int) -> int:
    """A Python integer in [0, 2^32) as the int32 with the same 32 bits."""
    return int(np.uint32(value).view(np.int32))


def uniform_keys(n: int, seed, counter):
    """`n` float32 keys in [0, 1), a pure function of `(seed, counter)`.

    Args:
        n: how many keys (one per ensemble member).
        seed: an int32 scalar (a Python int or a tensor); see `as_int32`.
        counter: an int32 scalar (a step count).

    Returns:
        float32 `[n]`; key `i` is `hash(hash(hash(seed) ^ counter) ^ i)`, its top 24 bits over 2^24 (exact in
        float32).
    """
    seed = ops.cast(ops.convert_to_tensor(seed), "int32")
    counter = ops.cast(ops.convert_to_tensor(counter), "int32")
    x = hash32(ops.bitwise_xor(hash32(seed), counter))
    x = hash32(ops.bitwise_xor(x, ops.arange(n, dtype="int32")))
    return ops.cast(_shift_right(x, 8), "float32") * (1.0 / (1 << 24))
