"""A residual trunk in the style of BRO's BroNet."""

from __future__ import annotations

import keras
from keras import ops

from multicritic.layers.dispatch import call_layer
from multicritic.layers.layer_norm import LayerNormalization
from multicritic.layers.mlp import MLP, Trunk, dense_layer


def activation_function(name: str):
    """The function a Keras activation name, or a name registered with `keras.saving.register_keras_serializable`
    (`"package>name"`), stands for; `None` for another string."""
    try:
        return keras.activations.get(name)
    except (ValueError, TypeError):
        return keras.saving.get_registered_object(name)


def activation_name(activation) -> str:
    """The name a Keras activation (a name or a function) is saved under, else a `ValueError` naming
    `activation`: a trunk's options travel in its config, so a function without a name is refused."""
    if isinstance(activation, str):
        name = activation
    elif callable(activation):
        # Keras's own activations by their names, else the name it was registered under (a lambda has neither).
        name = getattr(activation, "__name__", None)
        if not isinstance(name, str) or activation_function(name) is not activation:
            name = keras.saving.get_registered_name(activation)
    else:
        name = None
    fn = activation_function(name) if isinstance(name, str) else None
    if fn is not None and (isinstance(activation, str) or fn is activation):
        return name
    raise ValueError(
        f"activation: got {activation!r}, expected a Keras activation name (such as 'silu' or 'relu') or a "
        "function Keras saves by name (keras.activations.*, or one registered with "
        "keras.saving.register_keras_serializable)."
    )


@keras.saving.register_keras_serializable(package="multicritic")
class ResidualTrunk(Trunk):
    """A projection block then residual blocks: the critic's `trunk="residual"`.

    The input goes through one `Dense -> LayerNorm -> SiLU` block (an `MLP`
    of one layer, with its finiteness guards) to `dense_hidden_units`, then
    `num_dense_layers` residual blocks, each
    `x + LayerNorm(Dense(activation(LayerNorm(Dense(x)))))`: the BroNet
    block of BRO (Nauman et al. 2024), which BRC and SimbaV2's critics build
    on. The skip keeps the trunk trainable as it deepens and widens; the norm
    closing each branch keeps the residual stream's scale in check. With
    `members=K` every layer holds K stacked members, as in `MLP`.

    Args:
        activation: the residual branch's activation: a Keras activation
            name (`"silu"` as DreamerV3, `"relu"` as BRO) or a function Keras
            knows by a name (`keras.activations.relu`, or one registered with
            `keras.saving.register_keras_serializable`), kept as that name.
            Anything else is refused here (it could not be saved).
        **kwargs: the shared options, as `Trunk` (`model_size` giving
            `num_dense_layers`, the residual blocks, and `dense_hidden_units`,
            the width; `norm` `"layer"` or `"rms"`, as `MLP`; ...), and
            `keras.layers.Layer`'s (`name`, `dtype`, ...).

    Call arguments:
        inputs: `[..., input_dim]`, or a list of parts whose concatenation is
            that (as `MLP`).

    Returns:
        `[..., dense_hidden_units]` (member-major `[K, ..., dense_hidden_units]`
        with members).

    Examples:
        >>> trunk = ResidualTrunk(model_size=None, num_dense_layers=2, dense_hidden_units=64)
        >>> trunk(np.zeros((4, 1280), "float32")).shape
        (4, 64)

    Reference:
        Nauman et al., "Bigger, Regularized, Optimistic: scaling for compute
        and sample-efficient continuous control", NeurIPS 2024 (arXiv
        2405.16158), Fig. 3; He et al., "Deep Residual Learning", CVPR 2016.
    """

    def __init__(self, *, activation: str = "silu", **kwargs):
        super().__init__(**kwargs)
        activation = activation_name(activation)
        self.activation_fn = activation_function(activation)
        self.activation = activation
        # The projection is an MLP's single block; the size's depth counts the residual blocks.
        self.projection = MLP(
            model_size=None,
            num_dense_layers=1,
            dense_hidden_units=self.dense_hidden_units,
            kernel_initializer=self.kernel_initializer,
            members=self.members,
            norm=self.norm,
            norm_epsilon=self.norm_epsilon,
            use_bias=self.use_bias,
            dtype=self.dtype_policy,
            name="projection",
        )
        self.block_dense, self.block_norms = [], []
        for i in range(self.num_dense_layers):
            for j in range(2):
                self.block_dense.append(
                    dense_layer(
                        self.dense_hidden_units,
                        members=self.members,
                        use_bias=self.use_bias,
                        kernel_initializer=self.kernel_initializer,
                        dtype=self.dtype_policy,
                        name=f"block_{i}_dense_{j}",
                    )
                )
                self.block_norms.append(
                    LayerNormalization(
                        epsilon=self.norm_epsilon,
                        members=self.members,
                        rms=self.norm == "rms",
                        dtype=self.dtype_policy,
                        name=f"block_{i}_norm_{j}",
                    )
                )
        # Kept as tuples once built (Keras tracked the layers, and ordered their weights, as they were appended):
        # Flax NNX's graph does not enter a list (see `MLP`).
        self.block_dense, self.block_norms = tuple(self.block_dense), tuple(self.block_norms)

    @property
    def dense_layers(self):
        """Every Dense layer, in call order (what a forward pass's signature reads)."""
        return list(self.projection.dense_layers) + list(self.block_dense)

    @property
    def clips_inputs(self) -> bool:
        """As `MLP.clips_inputs`, of the projection (the only layer that sees the input)."""
        return self.projection.clips_inputs

    def build(self, input_shape):
        self.projection.build(input_shape)
        shape = (
            (None, self.dense_hidden_units) if self.members is None else (self.members, None, self.dense_hidden_units)
        )
        for layer in (*self.block_dense, *self.block_norms):
            layer.build(shape)

    def call(self, inputs):
        x = self.projection(inputs) if isinstance(inputs, (list, tuple)) else call_layer(self.projection, inputs)
        lead = None
        if self.members is not None and len(x.shape) > 3:
            # Stacked kernels take `[K, N, units]`: the leading dims are flattened, then restored.
            lead = ops.shape(x)[1:-1]
            x = ops.reshape(x, (self.members, -1, self.dense_hidden_units))
        for i in range(self.num_dense_layers):
            dense_a, dense_b = self.block_dense[2 * i], self.block_dense[2 * i + 1]
            norm_a, norm_b = self.block_norms[2 * i], self.block_norms[2 * i + 1]
            branch = self.activation_fn(call_layer(norm_a, call_layer(dense_a, x)))
            x = x + call_layer(norm_b, call_layer(dense_b, branch))
        if lead is not None:
            x = ops.reshape(x, (self.members,) + tuple(lead) + (self.dense_hidden_units,))
        return x

    def compute_output_shape(self, input_shape):
        return self.projection.compute_output_shape(input_shape)

    def get_config(self):
        config = super().get_config()
        config["activation"] = self.activation
        return config
