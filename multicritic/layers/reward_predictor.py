"""The two-hot bucket head shared by DreamerV3's reward predictor and critic."""

from __future__ import annotations

import keras
from keras import ops

from multicritic.bins import bucket_values, check_bin_args, expected_value


@keras.saving.register_keras_serializable(package="multicritic")
class RewardPredictorLayer(keras.layers.Layer):
    """Predicts a distribution over `num_buckets` value buckets and its mean.

    One `Dense(num_buckets)` whose kernel and bias start at zero, so a new head
    predicts a uniform distribution and, with symmetric bounds, a value of
    exactly 0, eager or compiled ("we initialize the output weights of the
    reward predictor and critic to zeros", Hafner et al. 2023). The head
    always computes in float32, whatever the dtype policy: logits, buckets
    and the decoded value are float32 (the precision contract under
    `mixed_bfloat16` / `mixed_float16`); its variables are applied directly,
    as the MLP's.

    Args:
        num_buckets: number of buckets (>= 2; 255 in DreamerV3).
        lower_bound: symlog-space lower end of the support.
        upper_bound: symlog-space upper end of the support.
        bin_scheme: `"uniform_symlog"` (reference, 2023) or `"symexp"`
            (2024: real-space buckets, symmetric decode). See `multicritic.bins`.
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        inputs: float tensor `[..., dim]`.

    Returns:
        `(value_symlog, logits)`: the expected value in symlog space `[...]`
        and the float32 logits `[..., num_buckets]`.

    Example:
        >>> head = RewardPredictorLayer()
        >>> value, logits = head(np.ones((2, 256), "float32"))
        >>> value.shape, logits.shape
        ((2,), (2, 255))

    Reference:
        Hafner et al., arXiv 2301.04104 (v1, 2023, and the 2024 revision);
        RLlib's `dreamerv3/tf/models/components/reward_predictor_layer.py`.
    """

    def __init__(
        self,
        *,
        num_buckets: int = 255,
        lower_bound: float = -20.0,
        upper_bound: float = 20.0,
        bin_scheme: str = "uniform_symlog",
        **kwargs,
    ):
        check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme)
        # float32 unless told otherwise, whatever the global policy: under a
        # mixed policy the MLP below runs in half precision, the head not.
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.num_buckets = int(num_buckets)
        self.lower_bound = float(lower_bound)
        self.upper_bound = float(upper_bound)
        self.bin_scheme = bin_scheme
        # Build the bucket tables now, outside any compiled function.
        bucket_values(num_buckets, lower_bound, upper_bound, bin_scheme)
        self.reward_buckets_layer = keras.layers.Dense(
            self.num_buckets,
            kernel_initializer="zeros",
            bias_initializer="zeros",
            dtype=self.dtype_policy,
            name="reward_buckets",
        )

    def build(self, input_shape):
        self.reward_buckets_layer.build(tuple(input_shape))

    def call(self, inputs):
        dense = self.reward_buckets_layer
        logits = ops.cast(ops.matmul(inputs, dense.kernel) + dense.bias, "float32")
        value = expected_value(
            ops.softmax(logits, axis=-1),
            self.num_buckets,
            self.lower_bound,
            self.upper_bound,
            self.bin_scheme,
        )
        return value, logits

    def compute_output_shape(self, input_shape):
        lead = tuple(input_shape)[:-1]
        return lead, lead + (self.num_buckets,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_buckets": self.num_buckets,
                "lower_bound": self.lower_bound,
                "upper_bound": self.upper_bound,
                "bin_scheme": self.bin_scheme,
            }
        )
        return config
