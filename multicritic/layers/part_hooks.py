"""The hooks of the parts' contract: what the trainer's step calls on a head or trunk besides its forward pass.

A part (a head or a trunk, registered in `multicritic.heads.HEADS` or
`multicritic.trunks.TRUNKS`) is a Keras layer; `PartHooks`, a base of every
part of the package, gives it the two hooks below with defaults that do
nothing. A part without `PartHooks` among its bases is taken as having the
defaults.

**After the optimizer's update** (`after_update(twin)`). The trainer's step
(`CriticTrainer`'s steps and `critic.fit`, eager or compiled: `jax.jit`,
`tf.function` with or without XLA, PyTorch's compiled whole step) calls it on
the fast critic's parts (`critic.mlp`, `critic.return_layer`; an ensemble's
members at once, as its stacked weights) right after the optimizer's update,
before the slow (EMA) critic's update of the same step, inside the step's
all-or-nothing update: a skipped step does not call it. It changes variables
only through `Variable.assign` with `keras.ops` math, so it runs inside every
compiled step (in JAX's pure step its assignments become the step's new
variable values). `twin` is the slow critic's copy of the part, whose
variables are never trainable: the EMA update that follows blends every float
variable of the part into it (`ema <- d * ema + (1 - d) * fast`), so state the
slow critic must share rather than average is assigned to `twin` as well (equal
values blend to themselves). A host that trains the critic with its own
optimizer calls `critic.after_update()` after each of its updates. A part that
overrides the hook sets `has_after_update = True` (the step reads it to know
which variables the hook may assign).

**Batch statistics** (`uses_batch_statistics = True`). The part's `call`
takes `training`; with `training=True` it normalises by the batch's own
statistics and gives the new values of its statistics variables
(non-trainable: BatchNorm's moving mean and variance) to
`update_statistics(variable, value)` instead of assigning them. Inside the
trainer's step (`training_step()`) every forward pass of the critic runs with
`training=True` and the values are collected: they leave the loss as step
outputs (through `jax.grad`'s auxiliary outputs, a `GradientTape`, PyTorch's
traced step), are averaged over data-parallel replicas, and are assigned in
the step's all-or-nothing update, before the EMA update (a skipped step leaves
them as they were). Outside a step (`critic(h, z, training=True)`,
`stateless_call(..., training=True)`, Keras's `fit` of a bare part) they are
assigned at once, as Keras's own layers do, so `stateless_call` returns them
as its new non-trainable values. The slow critic's copy (variables not
trainable) normalises by the batch in the step as well, with its own weights,
and gives no statistics: its moving statistics are the EMA of the fast
part's. `critic(h, z)` without `training` (inference, exports, `evaluate`)
normalises by the moving statistics.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Dict, List, Optional

from keras import ops


class PartHooks:
    """The parts' hooks with their defaults (a mixin of every head and trunk; see the module's docstring)."""

    # Whether `call` takes `training` and normalises by the batch with `training=True` (see the module's docstring).
    uses_batch_statistics: bool = False
    # Whether `after_update` does anything (the step then lets it assign the part's variables).
    has_after_update: bool = False

    @property
    def batch_statistics(self) -> List:
        """The non-trainable variables this part moves from training batches (through `update_statistics`:
        BatchNorm's moving statistics), which the slow critic's copy averages as it averages weights. Default:
        none."""
        return []

    def after_update(self, twin=None) -> None:
        """Called by the trainer's step on the fast part after each optimizer update, before the EMA update (see
        the module's docstring); `twin` is the slow critic's copy of the part. Default: nothing."""


def uses_batch_statistics(part) -> bool:
    """Whether `part` normalises by the batch in training (`PartHooks.uses_batch_statistics`)."""
    return bool(getattr(part, "uses_batch_statistics", False))


def has_after_update(part) -> bool:
    """Whether `part` has an `after_update` hook that does something (`PartHooks.has_after_update`)."""
    return bool(getattr(part, "has_after_update", False))


def after_update(part, twin=None) -> None:
    """`part.after_update(twin)` where the part has the hook."""
    if has_after_update(part):
        part.after_update(twin)


class _Collected:
    """The statistics given while a training step's loss ran: `{variable path: (variable, value)}`."""

    def __init__(self):
        self.values: Dict[str, tuple] = {}


_LOCAL = threading.local()


def _stack() -> List[_Collected]:
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    return stack


@contextlib.contextmanager
def training_step():
    """While open (in this thread), the critic's forward passes are a training step's: parts normalise by the
    batch and their statistics are collected (`collected()`), not assigned."""
    collected = _Collected()
    _stack().append(collected)
    try:
        yield collected
    finally:
        _stack().pop()


def in_training_step() -> Optional[_Collected]:
    """The innermost open `training_step()` of this thread, or None."""
    stack = _stack()
    return stack[-1] if stack else None


def current_statistics(variable):
    """`variable`'s value as the statistics given so far leave it: inside a training step, the value given last
    (a step with two forward passes, as the dream and the replay loss, moves a statistic twice, each time from
    where the last left it), else the variable's own value."""
    collected = in_training_step()
    pending = None if collected is None else collected.values.get(variable.path)
    return variable.value if pending is None else pending[1]


def update_statistics(variable, value) -> None:
    """A part's new value of its statistics `variable` from a training batch: collected inside a training step
    (assigned by the step's update), assigned at once elsewhere."""
    collected = in_training_step()
    if collected is None:
        variable.assign(value)
    else:
        value = value if ops.is_tensor(value) else ops.convert_to_tensor(value)
        collected.values[variable.path] = (variable, ops.stop_gradient(value))


# The prefix of the metrics that carry the parts' batch statistics from a training step's loss to its update.
STATISTICS = "part_statistics:"


def training_loss(loss_fn):
    """`loss_fn(*batch) -> (loss, metrics)` as a training step's loss: inside `training_step()`, with the
    statistics the parts gave added to the metrics (`STATISTICS` + the variable's path), which carry them
    out of the loss (and its gradient transformation) to the step's update (`take_statistics`)."""

    def loss(*batch):
        with training_step() as collected:
            total, metrics = loss_fn(*batch)
        metrics = dict(metrics)
        metrics.update({STATISTICS + path: value for path, (_, value) in collected.values.items()})
        return total, metrics

    return loss


def take_statistics(metrics: Dict, variables, all_gather) -> List:
    """`[(variable, new value)]` of the statistics `training_loss` left in `metrics` (removed from it), each
    the mean over the data-parallel replicas' values that `all_gather` (the backend's) gathers; `variables`:
    the critic's non-trainable variables."""
    keys = [k for k in metrics if k.startswith(STATISTICS)]
    by_path = {v.path: v for v in variables} if keys else {}
    out = []
    for key in keys:
        value = metrics.pop(key)
        gathered = all_gather(ops.expand_dims(value, 0))
        if gathered.shape[0] != 1:  # (one value per replica: their mean)
            value = ops.mean(gathered, axis=0)
        out.append((by_path[key[len(STATISTICS) :]], value))
    return out
