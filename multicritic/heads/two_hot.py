"""The two-hot bucket head shared by DreamerV3's reward predictor and critic."""

from __future__ import annotations

import keras
from keras import ops

from multicritic.backend import contract as backend
from multicritic.math.bins import inverse_symlog, symlog, two_hot_indices
from multicritic.heads.base import ValueHead, cross_entropy


class TwoHotHead(ValueHead):
    """Predicts a distribution over `num_buckets` value buckets and its mean; trained on two-hot targets.

    One `Dense(num_buckets)` whose kernel and bias start at zero, so a new head
    predicts a uniform distribution and, with symmetric bounds, a value of
    exactly 0, eager or compiled ("we initialize the output weights of the
    reward predictor and critic to zeros", Hafner et al. 2023). The head
    always computes in float32, whatever the dtype policy: logits, buckets
    and the decoded value are float32 (the precision contract under
    `mixed_bfloat16` / `mixed_float16`). The critic's `head="two_hot"`;
    `RewardPredictorLayer`, the reference's name for it, is the same class.

    Its loss is the cross-entropy to the two-hot encoding of the target
    (`multicritic.math.bins.two_hot`), computed from the two non-zero buckets.

    Args:
        num_buckets: number of buckets (>= 2; 255 in DreamerV3).
        lower_bound: symlog-space lower end of the support.
        upper_bound: symlog-space upper end of the support.
        bin_scheme: `"uniform_symlog"` (reference, 2023) or `"symexp"`
            (2024: real-space buckets, symmetric decode). See `multicritic.math.bins`.
        members: `None`, or the ensemble size `K` (stacked output weights).
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        inputs: float tensor `[..., dim]` (`[K, B, dim]` with members).

    Returns:
        `(value_symlog, logits)`: the expected value in symlog space `[...]`
        and the float32 logits `[..., num_buckets]`.

    Examples:
        >>> head = TwoHotHead()
        >>> value, logits = head(np.ones((2, 256), "float32"))
        >>> value.shape, logits.shape
        ((2,), (2, 255))

    Reference:
        Hafner et al., arXiv 2301.04104 (v1, 2023, and the 2024 revision);
        RLlib's `dreamerv3/tf/models/components/reward_predictor_layer.py`.
    """

    def position_losses(self, logits, value_targets, ema_value_symlog, ema_logits, *, regularizer):
        _, value_term, ema_term = self.weighted_position_losses(
            logits, value_targets, ema_value_symlog, ema_logits, regularizer=regularizer, ema_weight=1.0
        )
        return value_term, ema_term

    def weighted_position_losses(self, logits, value_targets, ema_value_symlog, ema_logits, *, regularizer, ema_weight):
        num_buckets, lower_bound, upper_bound, bin_scheme = (
            self.num_buckets,
            self.lower_bound,
            self.upper_bound,
            self.bin_scheme,
        )
        logp = backend.current().log_softmax(logits)
        two_hot_ema = ema_value_symlog is not None and regularizer == "two_hot_mean"
        # Both two-hot targets at once, in the space the scheme interpolates in.
        if bin_scheme == "uniform_symlog":
            targets_in_space, ema_in_space = symlog(value_targets), ema_value_symlog
        else:
            targets_in_space = value_targets
            ema_in_space = (
                None
                if ema_value_symlog is None
                else inverse_symlog(ops.clip(ema_value_symlog, lower_bound, upper_bound))
            )
        both = ops.stack([targets_in_space, ema_in_space], axis=-1) if two_hot_ema else targets_in_space[..., None]
        k, kp1, w_k, w_kp1 = two_hot_indices(
            both, num_buckets, lower_bound, upper_bound, bin_scheme, real_space=bin_scheme == "symexp"
        )
        # Gathering the two non-zero buckets per target is the reference's
        # dense `sum(logp * two_hot)` exactly (the other terms are zeros) at
        # a fraction of the memory traffic.
        picked = backend.current().take_along_last_axis(logp, ops.concatenate([k, kp1], axis=-1)) * ops.concatenate(
            [w_k, w_kp1], axis=-1
        )
        width = k.shape[-1]
        terms = -(picked[..., :width] + picked[..., width:])
        value_term = terms[..., 0]
        if two_hot_ema:
            ema_term = terms[..., 1]
            # The loss's term as one sum over the four picked terms ([k, k_ema, k+1, k+1_ema] weighted [1, rw,
            # 1, rw]): its gradient reaches the gathered log-probabilities whole, with no slice to pad back.
            coef = 1.0 if ema_weight == 1.0 else ops.convert_to_tensor([1.0, ema_weight, 1.0, ema_weight])
            return -ops.sum(picked * coef, axis=-1), value_term, ema_term
        if ema_logits is not None:
            ema_term = cross_entropy(ops.stop_gradient(backend.current().softmax(ema_logits)), logp)
            return value_term + (ema_term if ema_weight == 1.0 else ema_weight * ema_term), value_term, ema_term
        return value_term, value_term, None


# Keras names a layer's arrays in weight files and `.keras` archives after its class's `__name__`: the head keeps
# the reference's name there (RLlib's `RewardPredictorLayer`), so that every file written since 0.1.0 loads.
TwoHotHead.__name__ = TwoHotHead.__qualname__ = "RewardPredictorLayer"
keras.saving.register_keras_serializable(package="multicritic")(TwoHotHead)
keras.saving.get_custom_objects()["multicritic>TwoHotHead"] = TwoHotHead
RewardPredictorLayer = TwoHotHead
"""`TwoHotHead` under the reference's name (RLlib's `RewardPredictorLayer`): the same class."""
