"""The adaptive-support value head: a bucket head whose bounds follow the targets."""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract as backend
from multicritic.heads.base import ValueHead, cross_entropy
from multicritic.layers import part_hooks
from multicritic.math import support as live
from multicritic.math.bins import SYMLOG_LIMIT, symlog
from multicritic.validation import as_float32, number

ENCODINGS = ("hl_gauss", "two_hot")

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def _checked_sigma(sigma, num_buckets) -> float:
    """`sigma` as a float if its histograms are finite in float32, else a `ValueError` naming it. In bucket units
    (`multicritic.math.support.hl_gauss_histogram`) the distances reach `num_buckets` and the smallest total mass
    is `2 erf(1 / (2 sqrt(2) sigma))`: `sigma` in `[num_buckets / (sqrt(2) float32_max), 1 / (2 sqrt(2)
    float32_tiny)]`, whatever the support (`HLGaussHead`'s limits on a grid of unit spacing)."""
    buckets = num_buckets if isinstance(num_buckets, int) and num_buckets >= 2 else 2  # (refused by ValueHead)
    low, high = buckets / (math.sqrt(2.0) * _FLOAT32_MAX), 1.0 / (2.0 * math.sqrt(2.0) * _FLOAT32_TINY)
    sigma = number("sigma", sigma, low=0.0, low_open=True)
    if not low <= sigma <= high:
        raise ValueError(
            f"sigma: got {sigma!r}, expected a number in [{low:.3g}, {high:.3g}] (a ratio of the bucket width; "
            "beyond it the histograms overflow or vanish in float32)."
        )
    return sigma


@keras.saving.register_keras_serializable(package="multicritic")
class AdaptiveSupportHead(ValueHead):
    """A bucket head whose support adapts to the targets: the critic's `head="adaptive"`.

    The zero-initialised `Dense(num_buckets)` of the other bucket heads, over
    a uniform symlog grid whose bounds are state, not options: a
    non-trainable variable `support` (`[2]`, or `[K, 2]` with members: each
    member's `(low, high)` in symlog space) that starts at the critic's
    `lower_bound` / `upper_bound`. The targets are encoded on the current
    support (`encoding="hl_gauss"`, the papers' encoding, or `"two_hot"`,
    DreamerV3's), and the value is decoded from it, eager or compiled: every
    backend's compiled step and forward pass read the variable when they
    run (it is one of their variables), and an export reads it when it is
    made (the support at export time is the served one).

    After each optimizer step that is not skipped, the trainer moves the
    support towards the range of the batch's symlog targets (finite, with a
    positive loss weight; over every data-parallel replica), by this rule
    (`multicritic.math.support.adapted_bounds`):

    - wanted: the targets' range, at least `min_span` wide, widened by
      `margin` of its width on each side;
    - a bound the wanted interval lies beyond moves there at once;
    - a bound inside it moves `shrink_rate` of the way there.

    Why this rule. Neither paper has public code, and what is public of
    them does not give an update rule. AHL-Gauss (OpenReview cGu5LtGcRD)
    starts from a narrow interval and adapts it to reduce the projection
    error; "Learning the Supports for Categorical Critic" (Chang, Osa and
    Harada, arXiv 2607.01880) learns the bounds jointly with the logits
    through a Lagrangian on how much of the targets' mass the support
    covers. The projection error of a target is the distance its encoding
    moves it: zero inside the support for two-hot, and the clipping distance
    outside it, the error a fixed support that is too narrow cannot remove.
    Growing at once removes it for every target seen. The price of a wider
    support is coarser buckets (HL-Gauss's smoothing, `sigma` buckets, grows
    with them), so the support also shrinks back, slowly, where the targets
    no longer reach: a running estimate of the targets' range, as
    robust to one narrow batch as `shrink_rate` makes it. The margin (about
    21 of 255 buckets on each side by default, against HL-Gauss's reach of
    about 3 `sigma` = 2.25) keeps targets at the edges clear of the
    truncated Gaussian's bias and absorbs steady growth of the returns
    without an update for every batch. This head does not learn the bounds
    by gradient; the logits follow the moved support as they follow any new
    target (a moved support moves the decoded value of unchanged logits).
    In a step with dream and replay losses the rule runs once per loss.

    The slow (EMA) critic decodes with the same support, not an average of
    it: `support` is state the twin shares (`shared_state`), which
    `update_ema` (at every call, due or not) and `init_ema` copy from the
    fast head rather than blend, so the regulariser's target and the fast
    critic's value are on one grid. Checkpoints and weight files hold both
    copies (equal). The update runs through the parts' batch-statistics
    hook (`multicritic.layers.part_hooks`): `critic_loss` shows the head the
    targets that count (`observe_targets`), the head hands the new support
    to the trainer's step, and the step assigns it with its other updates,
    all or nothing, before the slow critic's update. Outside a trainer's
    step a loss changes nothing: a loop of one's own calls `update_support`
    and then `critic.update_ema()`. Hosts that keep their own loss (the
    official agent's, `multicritic.interop`) train it as a fixed support.

    Args:
        encoding: `"hl_gauss"` (a Gaussian histogram of the target, as
            `HLGaussHead`) or `"two_hot"` (as `TwoHotHead`), on the current
            support.
        sigma: with `"hl_gauss"`, the Gaussian's standard deviation as a
            ratio of the bucket width (0.75, as `HLGaussHead`).
        margin: room added on each side of the targets' range, as a ratio of
            its width (>= 0).
        shrink_rate: the fraction of the way a bound moves inwards per
            update, in [0, 1] (0: the support only grows).
        min_span: the narrowest support the rule makes, in symlog units
            (> 0): constant targets get a support this wide around them.
        **kwargs: as `ValueHead` (`num_buckets`, the initial bounds,
            `members`, ...); the grid is uniform in symlog space
            (`bin_scheme="uniform_symlog"`).

    Call arguments:
        inputs: `[..., dim]` (`[K, B, dim]` with members).

    Returns:
        `(value_symlog, logits)` as `TwoHotHead`, decoded on the current
        support.

    Examples:
        >>> head = AdaptiveSupportHead(lower_bound=-0.2, upper_bound=0.2)
        >>> value, logits = head(np.ones((2, 8), "float32"))
        >>> head.update_support(np.array([1000.0, -5.0], "float32"))
        >>> [round(float(b), 2) for b in keras.ops.convert_to_numpy(head.support)]
        [-2.66, 7.78]

    Reference:
        AHL-Gauss, OpenReview cGu5LtGcRD (adaptive interval, projection
        error); Chang, Osa and Harada, "Learning the Supports for
        Categorical Critic in Reinforcement Learning", arXiv 2607.01880;
        Farebrother et al., "Stop Regressing", arXiv 2403.03950 (HL-Gauss).
    """

    # The support is state the trainer's step updates from each batch (`multicritic.layers.part_hooks`).
    uses_batch_statistics = True

    def __init__(
        self,
        *,
        encoding: str = "hl_gauss",
        sigma: float = 0.75,
        margin: float = 0.1,
        shrink_rate: float = 0.01,
        min_span: float = 0.1,
        **kwargs,
    ):
        if not isinstance(encoding, str) or encoding not in ENCODINGS:
            raise ValueError(f"encoding: got {encoding!r}, expected one of {list(ENCODINGS)}.")
        self.sigma = _checked_sigma(sigma, kwargs.get("num_buckets", 255))
        self.encoding = encoding
        self.margin = number("margin", margin, low=0.0, high=1e6)
        self.shrink_rate = number("shrink_rate", shrink_rate, low=0.0, high=1.0)
        self.min_span = number("min_span", min_span, low=0.0, high=2.0 * SYMLOG_LIMIT, low_open=True)
        super().__init__(**kwargs)
        live.tables(self.num_buckets)  # now, outside any compiled function

    def build(self, input_shape):
        super().build(input_shape)
        initial = np.array([self.lower_bound, self.upper_bound], "float32")
        if self.members is not None:
            initial = np.tile(initial, (self.members, 1))
        self.support = self.add_weight(
            shape=initial.shape,
            initializer=keras.initializers.Constant(initial),
            trainable=False,
            dtype="float32",
            autocast=False,  # float32 under every policy: the support is the head's, and the head's math float32
            name="support",
        )

    @property
    def shared_state(self):
        """The variables the slow (EMA) twin shares with this head: copied to it, never averaged."""
        return [self.support] if self.built else []

    def bounds(self, rank: int = 0):
        """`(low, high)` of the current support in symlog space, each shaped to broadcast against a tensor of
        `rank` dims (member-major with members: `[K, 1, ...]`); the initial bounds before the head is built."""
        if not self.built:
            return ops.convert_to_tensor(self.lower_bound), ops.convert_to_tensor(self.upper_bound)
        low, high = live.ordered(ops.convert_to_tensor(self.support))
        if self.members is None or rank == 0:
            return low, high
        shape = (self.members,) + (1,) * (rank - 1)
        return ops.reshape(low, shape), ops.reshape(high, shape)

    def decode(self, logits):
        low, high = self.bounds(len(logits.shape) - 1)
        return live.expected_value(backend.current().softmax(logits), low, high)

    def position_losses(self, logits, value_targets, ema_value_symlog, ema_logits, *, regularizer):
        logp = backend.current().log_softmax(logits)
        low, high = self.bounds(len(value_targets.shape))
        both = ema_value_symlog is not None and regularizer == "two_hot_mean"
        values = symlog(value_targets)
        if both:  # the target and the slow critic's value, encoded at once
            values, low, high = ops.stack([values, ema_value_symlog], axis=-1), low[..., None], high[..., None]
        x = live.positions(values, low, high, self.num_buckets)
        if not both:
            x = x[..., None]
        if self.encoding == "two_hot":
            k, w_k, w_kp1 = live.two_hot_pairs(x, self.num_buckets)
            picked = backend.current().take_along_last_axis(logp, ops.concatenate([k, k + 1], axis=-1))
            width = k.shape[-1]
            terms = -(picked[..., :width] * w_k + picked[..., width:] * w_kp1)
        else:
            targets = live.hl_gauss_histogram(x, self.num_buckets, self.sigma)
            terms = cross_entropy(targets, logp[..., None, :])
        value_term = terms[..., 0]
        if both:
            return value_term, terms[..., 1]
        if ema_logits is None:
            return value_term, None
        return value_term, cross_entropy(ops.stop_gradient(backend.current().softmax(ema_logits)), logp)

    def outside_support(self, value_targets):
        low, high = self.bounds(len(value_targets.shape))
        values = symlog(value_targets)
        return ops.logical_or(values < low, values > high)

    def call(self, inputs, training=None):
        # `training` (given in a trainer's step, `uses_batch_statistics`) changes nothing in the forward pass: the
        # support follows the targets, which the loss sees (`observe_targets`).
        return super().call(inputs)

    def target_range(self, value_targets, valid):
        """`(min, max)` of the symlog `value_targets` where `valid`, over every data-parallel replica (the range
        the support's update reads; `(+inf, -inf)` for no valid target)."""
        lowest, highest = live.target_range(symlog(value_targets), valid)
        gathered = backend.current().all_gather(ops.reshape(ops.stack([lowest, -highest]), (1, 2)))
        extremes = ops.min(gathered, axis=0)
        return extremes[0], -extremes[1]

    def adapted(self, support, value_targets, valid):
        """The support `[..., 2]` after one update from the targets (see the class for the rule)."""
        low, high = live.ordered(support)
        low, high = live.adapted_bounds(
            low,
            high,
            *self.target_range(value_targets, valid),
            margin=self.margin,
            shrink_rate=self.shrink_rate,
            min_span=self.min_span,
        )
        return ops.stack([low, high], axis=-1)

    def observe_targets(self, value_targets, valid):
        """The loss's hook (`critic_loss` calls it with the finite real-space targets and which positions count):
        inside a trainer's step, the support after this batch goes to the step, which assigns it with the
        step's other updates (all or nothing, before the slow critic's update; `multicritic.layers.part_hooks`).
        A step with two losses (dream and replay) applies the rule twice, the second time to the first's
        result. Elsewhere nothing: a loss computed outside a step changes no state (`update_support` updates it
        in a loop of one's own)."""
        collected = part_hooks.in_training_step()
        if collected is None or not self.built:
            return
        pending = collected.values.get(self.support.path)
        current = ops.convert_to_tensor(self.support) if pending is None else pending[1]
        part_hooks.update_statistics(self.support, self.adapted(current, value_targets, valid))

    def update_support(self, value_targets, loss_weights=None):
        """One update of the support from real-space `value_targets` `[...]` (the finite ones with a positive
        `loss_weights`, all when None), at once: what the trainer's step does, for a loop of one's own. The
        slow critic's copy follows at its next `critic.update_ema()` (or `init_ema()`)."""
        if not self.built:
            raise ValueError("update_support: the head has no support yet; call it once or build it first.")
        targets = as_float32(value_targets, "value_targets")
        valid = ops.isfinite(targets)
        if loss_weights is not None:
            valid = ops.logical_and(valid, as_float32(loss_weights, "loss_weights") > 0.0)
        self.support.assign(self.adapted(ops.convert_to_tensor(self.support), ops.where(valid, targets, 0.0), valid))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "encoding": self.encoding,
                "sigma": self.sigma,
                "margin": self.margin,
                "shrink_rate": self.shrink_rate,
                "min_span": self.min_span,
            }
        )
        return config
