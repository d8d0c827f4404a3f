"""Hyperspherical normalisation: vectors and kernel columns projected onto the unit sphere.

SimbaV2 keeps its features and the columns of its kernels (one output unit's
weights each) at unit norm; XQC's weight normalisation keeps its kernels'
columns there. The kernels are drawn on the sphere (`UnitColumns`) and
projected back after every optimizer update (`project_columns`, from the
trunks' `after_update` hook: `multicritic.layers.part_hooks`).

Reference:
    Lee et al., "Hyperspherical Normalization for Scalable Deep Reinforcement
    Learning" (SimbaV2), ICML 2025 (arXiv 2502.15280), Sec. 4; Palenicek et
    al., "XQC: Well-conditioned Optimization Accelerates Deep Reinforcement
    Learning", ICLR 2026 (arXiv 2509.25174).
"""

from __future__ import annotations

from typing import Sequence

import keras
from keras import ops

# The floor of a norm that is divided by (SimbaV2's): a zero vector stays zero.
EPSILON = 1e-8


def l2_normalize(x, axis: int = -1, epsilon: float = EPSILON):
    """`x / max(||x||_2, epsilon)` along `axis` (half-precision `x`: its norm taken in float32)."""
    dtype = keras.backend.standardize_dtype(x.dtype)
    wide = ops.cast(x, "float32") if dtype in ("float16", "bfloat16") else x
    norm = ops.sqrt(ops.sum(ops.square(wide), axis=axis, keepdims=True))
    out = wide / ops.maximum(norm, epsilon)
    return out if out.dtype == x.dtype else ops.cast(out, dtype)


def project_columns(kernels: Sequence) -> None:
    """Assigns each kernel `[..., in, out]` (a Dense's `[in, out]`, an ensemble's stacked `[K, in, out]`) its
    columns projected onto the unit sphere: each output unit's weights (axis -2) at norm 1."""
    for kernel in kernels:
        kernel.assign(l2_normalize(kernel.value, axis=-2))


@keras.saving.register_keras_serializable(package="multicritic")
class UnitColumns(keras.initializers.Initializer):
    """Draws `initializer`'s kernel `[..., in, out]` and projects its columns onto the unit sphere.

    Each output unit's weights (axis -2) are a unit vector: SimbaV2 draws
    orthogonal kernels and normalises them so.

    Args:
        initializer: the initializer drawn from (name, config or instance).

    Examples:
        >>> kernel = UnitColumns("orthogonal")((8, 4))
        >>> np.allclose(np.linalg.norm(keras.ops.convert_to_numpy(kernel), axis=0), 1.0)
        True
    """

    def __init__(self, initializer="orthogonal"):
        self.initializer = keras.initializers.get(initializer)

    def __call__(self, shape, dtype=None):
        return l2_normalize(self.initializer(shape, dtype=dtype), axis=-2)

    def get_config(self):
        return {"initializer": keras.initializers.serialize(self.initializer)}
