"""The DreamerV3 critic loss: the head's value loss plus the slow-critic regulariser."""

from __future__ import annotations

from typing import Dict, Optional

from keras import ops

from multicritic import heads
from multicritic.heads.base import ValueHead
from multicritic.validation import as_float32, check_same_shapes, compatible, fmt, shape_of

EMA_REGULARIZERS = ("two_hot_mean", "distribution")


def _check_loss_shapes(logits, value_targets, ema_value_symlog, loss_weights, ema_logits, units):
    got = shape_of(logits)
    if len(got) < 1 or (got[-1] is not None and got[-1] != units):
        raise ValueError(f"logits: got shape {fmt(got)}, expected [..., units={units}] (the head's width).")
    lead = got[:-1]
    for name, x in (
        ("value_targets", value_targets),
        ("ema_value_symlog", ema_value_symlog),
        ("loss_weights", loss_weights),
    ):
        if x is not None and not compatible(shape_of(x), lead):
            hint = ""
            if len(shape_of(x)) == len(lead) and lead and shape_of(x)[0] == (lead[0] or 0) + 1:
                hint = " (one time step too many: for dream data [H+1, B] take [:-1])"
            raise ValueError(
                f"{name}: got shape {fmt(shape_of(x))}, expected {fmt(lead)} (logits has shape {fmt(got)}){hint}."
            )
    if ema_logits is not None and not compatible(shape_of(ema_logits), got):
        raise ValueError(
            f"ema_logits: got shape {fmt(shape_of(ema_logits))}, expected {fmt(got)} (the shape of logits)."
        )


# Heads built for names, by the arguments that named them: a dict lookup, which a traced step (torch.compile
# with fullgraph, XLA) reads as a constant once an eager call or the import below has built the head.
_HEADS_BY_ARGS: Dict[tuple, ValueHead] = {}


def value_head(head, hl_gauss_sigma=None, **support):
    """The head object `critic_loss` computes with: `head` itself when it is a head (its support then is
    `support`'s where given, else a `ValueError`), else the registered head `head` names (a name or a spec)
    over `support` (the defaults where `None`)."""
    if isinstance(head, ValueHead):
        for key, value in support.items():
            if value is not None and getattr(head, key) != value:
                raise ValueError(
                    f"{key}: got {value!r} with a {type(head).__name__} whose {key} is "
                    f"{getattr(head, key)!r}; the head carries its support (leave {key} out)."
                )
        return head
    key = (head, hl_gauss_sigma, *sorted(support.items())) if isinstance(head, str) else None
    found = _HEADS_BY_ARGS.get(key) if key is not None else None
    if found is not None:
        return found
    shared = {k: v for k, v in support.items() if v is not None}  # the rest: the head's own defaults
    cls, options = heads.HEADS.resolve(heads.legacy_spec(head, hl_gauss_sigma), shared)
    built = cls(**options, **shared, name=f"{heads.HEADS.name_of(cls)}_loss_head")
    if key is not None:
        _HEADS_BY_ARGS[key] = built
    return built


def _drop_trailing_one(x, logits_rank):
    if x is None or len(x.shape) != logits_rank or x.shape[-1] != 1:
        return x
    return ops.squeeze(x, axis=-1)


def critic_loss(
    logits,
    value_targets,
    ema_value_symlog,
    loss_weights,
    *,
    num_buckets: Optional[int] = None,
    lower_bound: Optional[float] = None,
    upper_bound: Optional[float] = None,
    bin_scheme: Optional[str] = None,
    ema_regularizer: str = "two_hot_mean",
    ema_regularizer_weight: float = 1.0,
    ema_logits=None,
    head="two_hot",
    hl_gauss_sigma: Optional[float] = None,
    diagnostics: bool = True,
) -> Dict[str, object]:
    """The critic loss of DreamerV3 over `N` positions (e.g. `[H, B]`, or `[K, H, B]` for an ensemble).

    Per position, with the default two-hot head and `logp =
    log_softmax(logits)` in float32:
    `value_nll = -sum(logp * two_hot(symlog(value_targets)))` and
    `ema_reg = -sum(logp * two_hot(ema_value_symlog))` (two-hot of the slow
    critic's expected value, as the reference), or with
    `ema_regularizer="distribution"` the cross-entropy to the slow critic's
    bucket distribution `softmax(ema_logits)`. Then
    `total = mean((value_nll + ema_regularizer_weight * ema_reg) * loss_weights)`,
    a plain mean over all positions (masked positions stay in the
    denominator). Targets, slow-critic outputs and weights are
    stop-gradient'd, so gradients reach `logits` only: per position
    `d total / d logits = (1 + rw) * softmax - t_value - rw * t_ema`, times
    the position's weight over N.

    Other heads (`multicritic.heads`) give the per-position terms:
    `HLGaussHead` uses Gaussian histograms (`hl_gauss`) in place of two-hot
    encodings; `MSEHead` (logits `[..., 1]`, the symlog value itself) uses
    `0.5 * (v - symlog(target))^2` and `0.5 * (v - ema_value_symlog)^2`;
    `QuantileHead` the quantile Huber loss (see each head).

    Non-finite `value_targets` / `ema_value_symlog` do not propagate: such a
    position gets zero loss (still counted in the mean) and is counted in
    `nonfinite_targets`.

    Args:
        logits: `[..., units]` critic logits (any float dtype; `units` is
            `num_buckets` for the bucket heads, 1 for `MSEHead`).
        value_targets: `[...]` real-space (not symlog) return targets.
        ema_value_symlog: `[...]` the slow critic's expected value, in symlog
            space; `None` to decode it from `ema_logits`, or with
            `ema_regularizer="distribution"`.
        loss_weights: `[...]` per-position weights (dream loss weights).
            Targets, `ema_value_symlog` and weights may carry a trailing 1
            (`[..., 1]`, as sheeprl and NM512 keep them).
        num_buckets: buckets of the support (see `multicritic.math.bins`; 255
            when `head` is a name). A head object carries its own support.
        lower_bound: symlog-space lower end of the support (-20).
        upper_bound: symlog-space upper end of the support (20).
        bin_scheme: `"uniform_symlog"` (the default) or `"symexp"`.
        ema_regularizer: `"two_hot_mean"` or `"distribution"`.
        ema_regularizer_weight: `rw`, the regulariser's weight (1.0 in the
            reference).
        ema_logits: `[..., num_buckets]` slow-critic logits, needed for
            `"distribution"`; with `"two_hot_mean"` and no
            `ema_value_symlog`, their decoded value is the target.
        head: a head object (`critic.return_layer`: its options and support are
            the loss's), or a registered name (`"two_hot"`, the reference;
            see `multicritic.heads.HEADS`) over the support given here.
        hl_gauss_sigma: the 0.1 spelling of `HLGaussHead(sigma=...)`, with
            `head="hl_gauss"`.
        diagnostics: `False` returns `total` alone: the other entries are
            reductions of their own, kernels a step pays for unless asked.

    The arrays may be the backend's tensors, numpy arrays, or another framework's arrays (`__dlpack__`: JAX,
    PyTorch, TensorFlow), which give what the same data as numpy gives (`multicritic.backend.foreign`).

    Returns:
        A dict of float32 scalars (the backend's tensors): `total`; the unweighted means `value_nll`
        and `ema_regularizer`; `clipped_fraction`, the fraction of targets
        outside the bucket range; `nonfinite_targets`, the number of
        positions dropped for non-finite targets.

    Reference:
        Hafner et al. 2023, Sec. 3 "Critic learning" (arXiv 2301.04104);
        RLlib `DreamerV3TfLearner._compute_critic_loss`.
    """
    head = value_head(
        head,
        hl_gauss_sigma,
        num_buckets=num_buckets,
        lower_bound=lower_bound,
        upper_bound=upper_bound,
        bin_scheme=bin_scheme,
    )
    if ema_regularizer not in EMA_REGULARIZERS:
        raise ValueError(f"ema_regularizer: got {ema_regularizer!r}, expected one of {list(EMA_REGULARIZERS)}.")
    if ema_regularizer not in head.regularizers:
        raise ValueError(
            f"ema_regularizer: got {ema_regularizer!r} with head={heads.HEADS.name_of(head)!r}, expected one of "
            f"{list(head.regularizers)}."
        )
    if ema_regularizer == "two_hot_mean" and ema_value_symlog is None and ema_logits is None:
        raise ValueError(
            "ema_value_symlog: got None, expected [...] values (or the slow critic's ema_logits to decode) with "
            "ema_regularizer='two_hot_mean'."
        )
    if ema_regularizer == "distribution" and ema_logits is None:
        raise ValueError(
            "ema_logits: got None, expected [..., num_buckets] logits with ema_regularizer='distribution'."
        )
    named = {
        "logits": logits,
        "value_targets": value_targets,
        "ema_value_symlog": ema_value_symlog,
        "loss_weights": loss_weights,
        "ema_logits": ema_logits,
    }
    logits, value_targets, ema_value_symlog, loss_weights, ema_logits = (
        None if x is None else as_float32(x, name) for name, x in named.items()
    )
    width = head.units
    # sheeprl and NM512 keep a trailing 1 on targets and weights ([T, N, 1] against logits [T, N, U]).
    value_targets, ema_value_symlog, loss_weights = (
        _drop_trailing_one(x, len(logits.shape)) for x in (value_targets, ema_value_symlog, loss_weights)
    )
    _check_loss_shapes(logits, value_targets, ema_value_symlog, loss_weights, ema_logits, width)
    if ema_value_symlog is not None:
        check_same_shapes({"value_targets": value_targets, "ema_value_symlog": ema_value_symlog})
    elif ema_regularizer == "two_hot_mean":
        ema_value_symlog = head.decode(ema_logits)

    value_targets = ops.stop_gradient(value_targets)
    loss_weights = ops.stop_gradient(loss_weights)
    finite = ops.isfinite(value_targets)
    if ema_value_symlog is not None:
        ema_value_symlog = ops.stop_gradient(ema_value_symlog)
        finite = ops.logical_and(finite, ops.isfinite(ema_value_symlog))
        ema_value_symlog = ops.where(finite, ema_value_symlog, 0.0)
    value_targets = ops.where(finite, value_targets, 0.0)
    keep = ops.cast(finite, "float32")
    # A head whose state follows the targets (`AdaptiveSupportHead`'s support) sees the ones that count: inside a
    # trainer's step it gives its new state to the step (`multicritic.layers.part_hooks`); elsewhere it does nothing.
    observe = getattr(head, "observe_targets", None)
    if observe is not None:
        observe(value_targets, ops.logical_and(finite, loss_weights > 0.0))

    per_position, value_nll, ema_reg = head.weighted_position_losses(
        logits,
        value_targets,
        ema_value_symlog if ema_regularizer == "two_hot_mean" else None,
        ema_logits if ema_regularizer == "distribution" else None,
        regularizer=ema_regularizer,
        ema_weight=ema_regularizer_weight,
    )
    total = ops.mean(per_position * keep * loss_weights)
    if not diagnostics:
        return {"total": total}
    value_nll = value_nll * keep
    ema_reg = ema_reg * keep

    # (Non-finite targets are 0 here: not clipped.)
    clipped = head.outside_support(value_targets)
    if clipped is None:
        clipped = ops.zeros_like(finite)
    return {
        "total": total,
        "value_nll": ops.mean(value_nll),
        "ema_regularizer": ops.mean(ema_reg),
        "clipped_fraction": ops.mean(ops.cast(clipped, "float32")),
        "nonfinite_targets": ops.sum(1.0 - keep),
    }


for _name in heads.HEADS:  # the registered heads on the default support, built before any trace
    if "uniform_symlog" in heads.HEADS.traits(_name).get("bin_schemes", ("uniform_symlog",)):
        value_head(_name, num_buckets=None, lower_bound=None, upper_bound=None, bin_scheme=None)
