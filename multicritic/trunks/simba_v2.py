"""SimbaV2's trunk: hyperspherical normalisation of features and weights, LERP residual blocks."""

from __future__ import annotations

import math

import keras
from keras import ops

from multicritic.layers.dispatch import call_layer
from multicritic.layers.mlp import Trunk, dense_layer
from multicritic.layers.scaler import Scaler
from multicritic.layers.sphere import EPSILON, UnitColumns, l2_normalize, project_columns
from multicritic.trunks.common import check_shared, joined
from multicritic.validation import integer, number


@keras.saving.register_keras_serializable(package="multicritic")
class SimbaV2Trunk(Trunk):
    """SimbaV2's critic trunk: features and kernels on the unit sphere, LERP residual blocks.

    The input `x` gets a constant last entry `c_shift` (so that its norm, which
    the projection removes, is kept as a direction), is projected onto the
    unit sphere and embedded: `normalize(scaler(Dense(normalize([x, c_shift]))))`.
    Then `num_dense_layers` blocks, each a linear interpolation (LERP) between
    the block's input `h` and an MLP's output, back on the sphere:
    `normalize(h + alpha * (normalize(Dense(relu(scaler(Dense(h))) + eps)) - h))`,
    the inner width `expansion * dense_hidden_units`. Every Dense has no bias
    and unit-norm columns (each output unit's weights): they are drawn so
    (`kernel_initializer`, then projected) and projected back after every
    optimizer update by the `after_update` hook, which the trainer's steps call
    on every backend (`multicritic.layers.part_hooks`). The scalers (learnable
    per-unit scales) and the LERP's `alpha` start at SimbaV2's values:
    `sqrt(2 / width)` (inner blocks' divided by `sqrt(expansion)`) and
    `1 / (num_dense_layers + 1)`, stored at the scale the authors' code gives
    (see `Scaler`). The output `[..., dense_hidden_units]` is on the unit sphere;
    the critic's head maps it to its outputs (SimbaV2's categorical value head
    is a Dense, a scaler and a Dense with no activation between: the head's
    own Dense spans the same functions).

    The slow (EMA) critic's copy is not projected: as in the authors' code, the
    target network averages the projected weights and is used as averaged.
    The running normalisation of observations (RSNorm) that SimbaV2's agent
    applies before the network is the host's; a DreamerV3 latent needs none.

    Args:
        expansion: the blocks' inner width as a multiple of the width (4).
        c_shift: the constant entry appended to the input (3.0).
        **kwargs: the shared options, as `Trunk`: `model_size` giving
            `num_dense_layers` (the LERP blocks) and `dense_hidden_units` (the
            width); `kernel_initializer` drawing each kernel (per member)
            before its columns are projected onto the sphere (the authors'
            code draws orthogonal kernels: `"orthogonal"`); `members`; `norm`
            only `"layer"`, the critic's default (the trunk's normalisation is
            the projection); `norm_epsilon` not read (a norm is floored at
            SimbaV2's 1e-8 before it is divided by); `use_bias` only False (a
            bias would take the features off the sphere). And
            `keras.layers.Layer`'s (`name`, `dtype`, ...).

    Call arguments:
        inputs: `[..., input_dim]`, or a list of parts whose concatenation is that.

    Returns:
        `[..., dense_hidden_units]` of unit norm (member-major `[K, ...,
        dense_hidden_units]` with members).

    Examples:
        >>> trunk = SimbaV2Trunk(model_size=None, num_dense_layers=2, dense_hidden_units=64)
        >>> features = trunk(np.ones((4, 1280), "float32"))
        >>> features.shape, bool(np.allclose(np.linalg.norm(features, axis=-1), 1.0, atol=1e-5))
        ((4, 64), True)

    Reference:
        Lee et al., "Hyperspherical Normalization for Scalable Deep
        Reinforcement Learning" (SimbaV2), ICML 2025 (arXiv 2502.15280),
        Sec. 4 and Fig. 2; the authors' JAX code (github.com/dojeon-ai/SimbaV2,
        `scale_rl/agents/simbaV2`); Loshchilov et al., "nGPT", arXiv 2410.01131.
    """

    has_after_update = True

    def __init__(self, *, expansion: int = 4, c_shift: float = 3.0, **kwargs):
        super().__init__(**kwargs)
        check_shared("simba_v2", self.norm, self.use_bias, bias_allowed=False)
        self.expansion = integer("expansion", expansion)
        self.c_shift = number("c_shift", c_shift)
        width, depth = self.dense_hidden_units, self.num_dense_layers
        on_sphere = UnitColumns(self.kernel_initializer)

        def dense(units, name, first=False):
            return dense_layer(
                units,
                members=self.members,
                first=first,
                kernel_initializer=on_sphere,
                dtype=self.dtype_policy,
                name=name,
            )

        def scaler(init, scale, name):
            return Scaler(init=init, scale=scale, members=self.members, dtype=self.dtype_policy, name=name)

        # The authors' configuration: scalers at sqrt(2 / width), the blocks' inner ones over sqrt(expansion),
        # the LERP's alpha at 1 / (blocks + 1) stored at 1 / sqrt(width).
        gain = math.sqrt(2.0 / width)
        inner = gain / math.sqrt(self.expansion)
        self.embedding = dense(width, "embedding", first=True)
        self.embedding_scaler = scaler(gain, gain, "embedding_scaler")
        self.block_dense, self.block_scalers, self.block_alphas = [], [], []
        for i in range(depth):
            self.block_dense += [
                dense(width * self.expansion, f"block_{i}_dense_0"),
                dense(width, f"block_{i}_dense_1"),
            ]
            self.block_scalers.append(scaler(inner, inner, f"block_{i}_scaler"))
            self.block_alphas.append(scaler(1.0 / (depth + 1), 1.0 / math.sqrt(width), f"block_{i}_alpha"))
        # Kept as tuples once built (Keras tracked the layers, and ordered their weights, as they were added):
        # Flax NNX's graph does not enter a list (see `MLP`).
        self.block_dense = tuple(self.block_dense)
        self.block_scalers = tuple(self.block_scalers)
        self.block_alphas = tuple(self.block_alphas)

    @property
    def dense_layers(self):
        """Every Dense layer, in call order (each projected onto the sphere after an update)."""
        return [self.embedding] + list(self.block_dense)

    @property
    def clips_inputs(self) -> bool:
        """False: a non-finite input gives non-finite outputs, a finite one finite outputs (see `MLP`)."""
        return False

    def build(self, input_shape):
        width = self.dense_hidden_units
        self.embedding.build((None, int(input_shape[-1]) + 1))
        rows = (None,) if self.members is None else (self.members, None)
        self.embedding_scaler.build(rows + (width,))
        for i in range(self.num_dense_layers):
            self.block_dense[2 * i].build(rows + (width,))
            self.block_scalers[i].build(rows + (width * self.expansion,))
            self.block_dense[2 * i + 1].build(rows + (width * self.expansion,))
            self.block_alphas[i].build(rows + (width,))

    def call(self, inputs):
        x = joined(inputs)
        lead = ops.shape(x)[:-1]
        x = ops.reshape(x, (-1, x.shape[-1]))  # one batch axis: the members' stacked kernels take [K, N, in]
        x = l2_normalize(ops.concatenate([x, ops.ones_like(x[:, :1]) * self.c_shift], axis=-1))
        x = call_layer(self.embedding, x)
        if self.members is not None:
            x = ops.transpose(x, (1, 0, 2))  # [N, K, units] -> member-major [K, N, units]
        x = l2_normalize(call_layer(self.embedding_scaler, x))
        for i in range(self.num_dense_layers):
            branch = call_layer(self.block_scalers[i], call_layer(self.block_dense[2 * i], x))
            branch = l2_normalize(call_layer(self.block_dense[2 * i + 1], ops.relu(branch) + EPSILON))
            x = l2_normalize(x + call_layer(self.block_alphas[i], branch - x))
        members = () if self.members is None else (self.members,)
        return ops.reshape(x, members + tuple(lead) + (self.dense_hidden_units,))

    def after_update(self, twin=None):
        """Projects every kernel's columns back onto the unit sphere (SimbaV2's step after each update); the
        slow critic's copy (`twin`) is left as the EMA makes it, as in the authors' code."""
        project_columns([layer.kernel for layer in self.dense_layers])

    def get_config(self):
        config = super().get_config()
        config.update({"expansion": self.expansion, "c_shift": self.c_shift})
        return config
