"""The EMA (slow, target) copy: pairing its variables with the fast critic's, copying and moving them.

`CriticNetwork.init_ema` / `update_ema` / `ema_pairs` / `compute_ema` call
these. Every update is `Variable.assign` (through the backend's `blend`), so
it runs inside any backend's compiled step.

Reference: Hafner et al., "Mastering Diverse Domains through World Models"
(DreamerV3), 2023: the critic regularised towards an EMA of its own weights.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from keras import ops

from multicritic.backend import contract as backend_lib
from multicritic.validation import integer, number


def relative_keys(variables, *prefixes) -> List[str]:
    """Variable paths below the critic, with the sub-layer `prefix` renamed to `name` for each `(prefix, name)`."""
    keys = []
    for var in variables:
        path = var.path.split("/", 1)[-1]
        for prefix, name in prefixes:
            if path.startswith(prefix + "/"):
                path = name + path[len(prefix) :]
                break
        keys.append(path)
    return keys


def compute(fast_values: Sequence, ema_values: Sequence, decay) -> List:
    """Pure EMA step: returns `[d * e + (1 - d) * f for f, e in pairs]`.

    Takes and returns plain tensors, so it can run inside `jax.jit` on
    the values of a stateless step (`fast_values` in the order of
    `trainable_variables`, `ema_values` in that of
    `non_trainable_variables`). Not differentiable by design: call it
    outside the loss.
    """
    d = decay
    return [d * e + (1.0 - d) * f for f, e in zip(fast_values, ema_values)]


def pairs(critic, what: str = "ema") -> List[Tuple]:
    """`(fast, ema)` variable pairs, checked to match one to one by path, shape and dtype.

    A fast layer changed alone (`enable_lora`, `quantize` on `mlp` but
    not on `mlp_ema`) raises a `ValueError` naming the first mismatch,
    rather than pairing the wrong variables.
    """
    fast, ema = critic.fast_weights, critic.ema_weights
    fast_keys = relative_keys(fast, ("mlp", "mlp"), ("return_layer", "head"))
    ema_keys = relative_keys(ema, ("mlp_ema", "mlp"), ("return_layer_ema", "head"))
    for i in range(max(len(fast), len(ema))):
        f = fast_keys[i] if i < len(fast) else "<none>"
        e = ema_keys[i] if i < len(ema) else "<none>"
        if f != e or tuple(fast[i].shape) != tuple(ema[i].shape) or fast[i].dtype != ema[i].dtype:
            raise ValueError(
                f"{what}: the fast critic's variable {f!r} does not match the EMA copy's {e!r}; change the EMA "
                "copy's layers as the fast ones (e.g. enable_lora or quantize on mlp_ema as on mlp)."
            )
    return list(zip(fast, ema))


def shared_ids(critic) -> set:
    """The ids of the fast parts' variables the slow twin shares (a part's `shared_state`, such as
    `AdaptiveSupportHead`'s support): `update` copies them, never blends them, since `d * x + (1 - d) * x` is not
    always `x` in float32 (about 1% of values at d = 0.98 move by an ulp)."""
    return {id(v) for part in (critic.mlp, critic.return_layer) for v in getattr(part, "shared_state", ())}


def init(critic) -> None:
    """Copies every fast variable (LayerNorm scale and centre included) into the EMA copy."""
    if not critic.built:
        raise ValueError("init_ema: the critic has no variables yet; call it once or build it first.")
    for fast, ema in pairs(critic, "init_ema"):
        # A copy: the two must never share storage (JAX donates buffers).
        ema.assign(ops.copy(fast.value))


def update(critic, decay: Optional[float] = None, *, tau: Optional[float] = None, step=None, period: int = 1) -> None:
    """`ema <- d * ema + (1 - d) * fast` for every variable, through `Variable.assign`.

    Args:
        decay: `d` (default `ema_decay`; RLlib's convention).
        tau: `1 - d` instead (sheeprl's `tau`, NM512's
            `slow_target_fraction`, the official code's `rate`,
            TorchRL's `SoftUpdate(tau=...)`); not both.
        step: the host's update counter (an int or a scalar tensor).
            With it, step 0 copies the fast weights (as sheeprl and the
            official code do on first use) and a later step updates only
            when `step % period == 0`.
        period: the update period that `step` is checked against.
    """
    if not critic.built:
        raise ValueError("update_ema: the critic has no variables yet; call it once or build it first.")
    if decay is not None and tau is not None:
        raise ValueError(f"tau: got {tau!r} with decay={decay!r}; give one of them (tau = 1 - decay).")
    if tau is not None:
        decay = 1.0 - (tau if ops.is_tensor(tau) else number("tau", tau, low=0.0, high=1.0))
    if decay is not None and not ops.is_tensor(decay):
        decay = number("decay", decay, low=0.0, high=1.0)
    if step is not None:
        period = integer("period", period)
        decay = critic.ema_decay if decay is None else decay
        if ops.is_tensor(step):
            decay = ops.where(step == 0, 0.0, ops.where(step % period == 0, decay, 1.0))
        else:
            step = integer("step", step, low=0)
            decay = None if step % period else 0.0 if step == 0 else decay
    due = step is None or ops.is_tensor(step) or decay is not None
    shared = shared_ids(critic)
    every = pairs(critic, "update_ema") if due or shared else []
    for fast, ema in every:
        if id(fast) in shared:  # at every call, due or not: the twin never decodes with another support
            ema.assign(ops.copy(fast.value))
    if not due:
        return
    moving = [(f, e) for f, e in every if id(f) not in shared and (f.trainable or "float" in str(f.dtype))]
    backend_lib.current().blend(
        [e for _, e in moving], [f.value for f, _ in moving], critic.ema_decay if decay is None else decay
    )
