"""`ValueHead`: what every value head of the critic provides."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import keras
from keras import ops

from multicritic.backend import contract as backend
from multicritic.math.bins import bucket_range, bucket_values, check_bin_args, expected_value
from multicritic.heads import HEADS
from multicritic.layers.mlp import dense_layer
from multicritic.layers.part_hooks import PartHooks
from multicritic.layers.dispatch import call_layer
from multicritic.validation import FixedOptions, cast_to, integer


class ValueHead(FixedOptions, PartHooks, keras.layers.Layer):
    """Base class of the critic's value heads: a zero-initialised linear output, its decode and its loss.

    A head maps the trunk's features to `(value_symlog, logits)` and knows the
    per-position loss against real-space return targets and its slow-critic
    regulariser. Its output `Dense` (named `reward_buckets`, the reference's
    layout) starts at zero: a new distributional head predicts a uniform
    distribution, a new regression head 0. A head computes in float32 unless
    given another dtype, and returns float32 outputs under every policy,
    mixed ones included (the precision contract: the same on every backend,
    symbolic calls included).

    The support (`num_buckets`, the bounds, `bin_scheme`) is shared by all
    heads: the critic gives it. Anything else a head takes is its own option,
    kept as an attribute and in `get_config`; the critic, the loss and the
    checkpoints read it from there (see `multicritic.registry`).

    A new head is a subclass in its own module, registered in
    `multicritic.heads.HEADS`: it sets `units` (when not `num_buckets`) and
    overrides `decode` and `position_losses` (and `outside_support` when it
    has no bucket support). See the docs' "Adding a part".

    Hooks (`PartHooks`, see `multicritic.layers.part_hooks`): a head whose
    state changes after each optimizer update (a support that adapts) sets
    `has_after_update = True` and overrides `after_update(twin)`, which the
    trainer's step calls on the fast head after the optimizer's update and
    before the EMA update, inside every backend's compiled step (`twin` is the
    slow critic's head: state it must share is assigned there too).

    Args:
        num_buckets: buckets of the distribution (>= 2).
        lower_bound: symlog-space lower end of the support.
        upper_bound: symlog-space upper end of the support.
        bin_scheme: `"uniform_symlog"` or `"symexp"` (see `multicritic.math.bins`).
        members: `None`, or the ensemble size `K` (stacked output weights).
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        inputs: `[..., dim]`, or member-major `[K, B, dim]` with members.

    Returns:
        `(value_symlog [...], logits [..., units])` in float32 (with members
        `[K, B]` and `[K, B, units]`).
    """

    # Slow-critic regularisers this head supports (see `critic_loss`).
    regularizers: Tuple[str, ...] = ("two_hot_mean", "distribution")

    def __init__(
        self,
        *,
        num_buckets: int = 255,
        lower_bound: float = -20.0,
        upper_bound: float = 20.0,
        bin_scheme: str = "uniform_symlog",
        members: Optional[int] = None,
        **kwargs,
    ):
        check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme)
        schemes = _traits(type(self)).get("bin_schemes")
        if schemes and bin_scheme not in schemes:
            raise ValueError(
                f"bin_scheme: got {bin_scheme!r} with head={HEADS.name_of(self)!r}, expected one of {list(schemes)}."
            )
        if members is not None:
            integer("members", members)
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.num_buckets = int(num_buckets)
        self.lower_bound = float(lower_bound)
        self.upper_bound = float(upper_bound)
        self.bin_scheme = bin_scheme
        self.members = None if members is None else int(members)
        # Build the bucket tables now, outside any compiled function.
        bucket_values(num_buckets, lower_bound, upper_bound, bin_scheme)
        self.reward_buckets_layer = dense_layer(
            self.units,
            members=self.members,
            use_bias=True,
            kernel_initializer="zeros",
            bias_initializer="zeros",
            dtype=self.dtype_policy,
            name="reward_buckets",
        )

    @property
    def units(self) -> int:
        """Width of the logits (`num_buckets` for a bucket head)."""
        return self.num_buckets

    def build(self, input_shape):
        self.reward_buckets_layer.build(tuple(input_shape))

    def call(self, inputs):
        logits = cast_to(call_layer(self.reward_buckets_layer, inputs), "float32")
        return self.decode(logits), logits

    def decode(self, logits):
        """The expected value in symlog space of `logits [..., units]`: `[...]`."""
        return expected_value(
            backend.current().softmax(logits), self.num_buckets, self.lower_bound, self.upper_bound, self.bin_scheme
        )

    def position_losses(self, logits, value_targets, ema_value_symlog, ema_logits, *, regularizer):
        """Per-position `(value_term, ema_term)`, each `[...]`, for finite real-space `value_targets`.

        `ema_term` is the slow-critic regulariser (`regularizer` one of
        `regularizers`), `None` when `ema_value_symlog` and `ema_logits` are
        both `None`.
        """
        raise NotImplementedError

    def weighted_position_losses(self, logits, value_targets, ema_value_symlog, ema_logits, *, regularizer, ema_weight):
        """`(value_term + ema_weight * ema_term, value_term, ema_term)` of `position_losses` (the first is
        `value_term` when `ema_term` is None). A head whose two terms come from shared work may override it to
        sum them in one reduction: the first is the term the loss differentiates, so its gradient then has no
        slices to pad back."""
        value_term, ema_term = self.position_losses(
            logits, value_targets, ema_value_symlog, ema_logits, regularizer=regularizer
        )
        if ema_term is None:
            return value_term, value_term, None
        return value_term + (ema_term if ema_weight == 1.0 else ema_weight * ema_term), value_term, ema_term

    def outside_support(self, value_targets):
        """Whether each finite real-space target lies outside what the head can represent (it is clipped
        there): a bool tensor shaped like `value_targets`, or `None` for a head without a support."""
        low, high = bucket_range(self.num_buckets, self.lower_bound, self.upper_bound, self.bin_scheme)
        if self.bin_scheme == "uniform_symlog":
            low, high = math.copysign(math.expm1(abs(low)), low), math.copysign(math.expm1(abs(high)), high)
        if low == -high:
            return ops.abs(value_targets) > high
        return ops.logical_or(value_targets < low, value_targets > high)

    def compute_output_shape(self, input_shape):
        lead = tuple(input_shape)[:-1]
        return lead, lead + (self.units,)

    def compute_output_spec(self, inputs):
        # The outputs are float32 under every policy (the precision contract), symbolically as eagerly.
        return tuple(keras.KerasTensor(shape, dtype="float32") for shape in self.compute_output_shape(inputs.shape))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_buckets": self.num_buckets,
                "lower_bound": self.lower_bound,
                "upper_bound": self.upper_bound,
                "bin_scheme": self.bin_scheme,
                "members": self.members,
            }
        )
        return config


def _traits(cls):
    """The registered traits of head class `cls` (none for a class not registered)."""
    for name in HEADS:
        if HEADS[name] is cls:
            return HEADS.traits(name)
    return {}


def cross_entropy(target_probs, logp):
    """`-sum(target_probs * logp)` over the last axis."""
    return -ops.sum(target_probs * logp, axis=-1)
