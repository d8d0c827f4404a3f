"""Initializers for stacked ensemble weights."""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="multicritic")
class MemberwiseInitializer(keras.initializers.Initializer):
    """Initialises a `[K, ...]` stacked weight as `K` independent draws of `initializer` on `[...]`.

    Keras's fan-based initializers read a `[K, in, out]` kernel as a
    convolution (fan-in `K * in`); each member of an ensemble must instead be
    initialised as the single layer it stands for. A seeded `initializer`
    gives member `k` the seed `seed + k`, so members differ and runs repeat.

    Args:
        initializer: the per-member initializer (name, config or instance).

    Examples:
        >>> init = MemberwiseInitializer("glorot_uniform")
        >>> init((5, 64, 32)).shape  # 5 glorot-uniform [64, 32] kernels
        (5, 64, 32)
    """

    def __init__(self, initializer="glorot_uniform"):
        self.initializer = keras.initializers.get(initializer)

    def __call__(self, shape, dtype=None):
        # A fresh copy per member from its config (not Keras's serialize, which imports TensorFlow wherever it
        # is installed): an unseeded copy draws its own seed, as a new layer's initializer does.
        config = self.initializer.get_config()
        seed = config.get("seed")
        members = []
        for k in range(int(shape[0])):
            init = type(self.initializer).from_config(dict(config))
            if isinstance(seed, int) and hasattr(init, "seed"):
                init = type(init).from_config(dict(init.get_config(), seed=seed + k))
            members.append(init(tuple(shape[1:]), dtype=dtype))
        return ops.stack(members)

    def get_config(self):
        return {"initializer": keras.initializers.serialize(self.initializer)}
