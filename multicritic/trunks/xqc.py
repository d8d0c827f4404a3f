"""XQC's trunk: batch normalisation and weight normalisation."""

from __future__ import annotations

import keras
from keras import ops

from multicritic.layers.batch_norm import BatchNormalization
from multicritic.layers.dispatch import call_layer
from multicritic.layers.mlp import Trunk, dense_layer
from multicritic.layers.sphere import UnitColumns, project_columns
from multicritic.trunks.common import check_shared, joined
from multicritic.trunks.residual import activation_function, activation_name
from multicritic.validation import number


@keras.saving.register_keras_serializable(package="multicritic")
class XQCTrunk(Trunk):
    """XQC's critic trunk: `BatchNorm`, then blocks of weight-normalised `Dense -> BatchNorm -> ReLU`.

    The input is batch-normalised (as CrossQ's critic, on which XQC builds),
    then goes through `num_dense_layers` blocks `activation(BatchNorm(Dense(x)))`.
    Each Dense's columns (one output unit's weights) are kept at unit norm:
    drawn so (`kernel_initializer`, then projected) and projected back after
    every optimizer update by the `after_update` hook, which the trainer's
    steps call on every backend (`multicritic.layers.part_hooks`). The
    BatchNorm after each Dense makes the block blind to its columns' scale, so
    the projection changes no output: it keeps the effective learning rate
    from decaying as the weights grow (the paper's analysis: with the
    batch norms and the head's cross-entropy loss the critic's Hessian is far
    better conditioned).

    Batch statistics are state: in the trainer's step every forward pass runs
    with `training=True`, so each BatchNorm normalises by the batch, and the
    fast trunk's moving means and variances (non-trainable variables) move
    towards the batch's in the step's all-or-nothing update. The slow (EMA)
    critic's copy normalises by the same batch with its own weights in the
    step (CrossQ's lesson: statistics that match the batch), and its moving
    statistics are the EMA of the fast trunk's, as its weights are. Outside a
    step (inference, exports, `evaluate`) the trunk normalises by the moving
    statistics; `critic(h, z, training=True)` or `stateless_call(...,
    training=True)` normalise by the batch and assign (return) the new moving
    statistics. Under data parallelism each replica normalises by its own
    rows and the moving statistics move by the replicas' mean (JAX's global
    arrays: by the whole batch). The slow copy's Dense layers are not
    projected (they average projected weights).

    Args:
        activation: the blocks' activation, a Keras activation name (`"relu"`,
            the paper's) or a function Keras knows by a name.
        momentum: of the batch norms' moving statistics (0.99, CrossQ's).
        **kwargs: the shared options, as `Trunk`: `model_size` giving
            `num_dense_layers` (the blocks) and `dense_hidden_units` (the
            width); `kernel_initializer` drawing each kernel (per member)
            before its columns are projected onto the sphere; `members`, each
            member with its own batch statistics; `norm` only `"layer"`, the
            critic's default (this trunk's norms are batch norms);
            `norm_epsilon` the batch norms' epsilon (1e-3: the critic's
            default, Keras's and CrossQ's); `use_bias` giving the Dense layers
            a bias (the batch norm after each cancels it; off by default). And
            `keras.layers.Layer`'s (`name`, `dtype`, ...).

    Call arguments:
        inputs: `[..., input_dim]`, or a list of parts whose concatenation is that.
        training: normalise by the batch (and move the statistics) when true.

    Returns:
        `[..., dense_hidden_units]` (member-major `[K, ...,
        dense_hidden_units]` with members).

    Examples:
        >>> trunk = XQCTrunk(model_size=None, num_dense_layers=2, dense_hidden_units=64)
        >>> trunk(np.ones((4, 1280), "float32"), training=True).shape
        (4, 64)

    Reference:
        Palenicek et al., "XQC: Well-conditioned Optimization Accelerates Deep
        Reinforcement Learning", ICLR 2026 (arXiv 2509.25174); Bhatt et al.,
        "CrossQ: Batch Normalization in Deep Reinforcement Learning for
        Greater Sample Efficiency and Simplicity", ICLR 2024; Palenicek et al.,
        "Scaling CrossQ with Weight Normalization", arXiv 2506.03758.
    """

    uses_batch_statistics = True
    has_after_update = True

    def __init__(self, *, activation: str = "relu", momentum: float = 0.99, **kwargs):
        super().__init__(**kwargs)
        check_shared("xqc", self.norm, self.use_bias, bias_allowed=True)
        activation = activation_name(activation)
        self.activation_fn = activation_function(activation)
        self.activation = activation
        self.momentum = number("momentum", momentum, low=0.0, high=1.0)

        def batch_norm(name):
            return BatchNormalization(
                momentum=self.momentum,
                epsilon=self.norm_epsilon,
                members=self.members,
                dtype=self.dtype_policy,
                name=name,
            )

        self.input_norm = batch_norm("input_norm")
        # Tuples: Flax NNX's graph does not enter a list (see `MLP`).
        self.dense_layers = tuple(
            dense_layer(
                self.dense_hidden_units,
                members=self.members,
                use_bias=self.use_bias,
                kernel_initializer=UnitColumns(self.kernel_initializer),
                dtype=self.dtype_policy,
                name=f"dense_{i}",
            )
            for i in range(self.num_dense_layers)
        )
        self.batch_norms = tuple(batch_norm(f"batch_norm_{i}") for i in range(self.num_dense_layers))

    @property
    def batch_statistics(self):
        """The batch norms' moving means and variances (see `PartHooks.batch_statistics`)."""
        norms = [self.input_norm] + list(self.batch_norms)
        return [v for norm in norms if norm.built for v in (norm.moving_mean, norm.moving_variance)]

    @property
    def clips_inputs(self) -> bool:
        """False: a non-finite input gives non-finite outputs (in training, for the whole batch: its statistics)."""
        return False

    def build(self, input_shape):
        rows = (None,) if self.members is None else (self.members, None)
        shape = rows + (int(input_shape[-1]),)
        self.input_norm.build(shape)
        for dense, norm in zip(self.dense_layers, self.batch_norms):
            dense.build(shape)
            shape = rows + (self.dense_hidden_units,)
            norm.build(shape)

    def call(self, inputs, training=None):
        x = joined(inputs)
        lead = ops.shape(x)[:-1]
        x = ops.reshape(x, (-1, x.shape[-1]))  # the batch's rows on one axis: its statistics' axis
        if self.members is not None:  # each member normalises the shared input with its own variables
            x = ops.repeat(ops.expand_dims(x, 0), self.members, axis=0)
        x = call_layer(self.input_norm, x, training=training)
        for dense, norm in zip(self.dense_layers, self.batch_norms):
            x = self.activation_fn(call_layer(norm, call_layer(dense, x), training=training))
        members = () if self.members is None else (self.members,)
        return ops.reshape(x, members + tuple(lead) + (self.dense_hidden_units,))

    def after_update(self, twin=None):
        """Projects every Dense kernel's columns back onto the unit sphere (the weight normalisation); the
        slow critic's copy (`twin`) is left as the EMA makes it."""
        project_columns([layer.kernel for layer in self.dense_layers])

    def get_config(self):
        config = super().get_config()
        config.update({"activation": self.activation, "momentum": self.momentum})
        return config
