"""The training step's options and math: losses from a batch, and the update (clip, optimizer, EMA).

One implementation for every backend and for both ways of training:
`CriticTrainer` (its own steps) and `critic.fit` (Keras's loop) build a
`CriticStep` and run its `loss_parts` / `dream_loss` /
`dream_and_replay_loss` and `apply` inside the backend's compiled step
(`multicritic.backend`'s `StepProgram`). Nothing here imports the critic's
modules: a `MultiCritic` is recognised by its `stream_names`.
"""

from __future__ import annotations

import functools
from typing import Dict, Optional

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract as backend

from multicritic.math import draws
from multicritic.protocols import CriticLike
from multicritic.training.options import TrainerOptions
from multicritic.backend.contract import StepProgram
from multicritic.math.bins import inverse_symlog
from multicritic.layers import part_hooks
from multicritic.layers.dispatch import call_layer
from multicritic.math.losses import EMA_REGULARIZERS, critic_loss
from multicritic.math.returns import dream_loss_weights, lambda_returns, replay_lambda_returns
from multicritic.training import hosts
from multicritic.validation import FixedOptions, as_float32, integer, number


def is_multi_critic(critic: CriticLike) -> bool:
    """Whether `critic` has named reward streams (a `MultiCritic`)."""
    return critic.stream_names is not None


def h_and_z(inputs):
    """`(h, z)` as the step's math takes them from the critic's inputs: a features critic's `(x,)` is
    `(x, None)` (its `x` in `h`'s place, no `z`)."""
    return (inputs[0], inputs[1] if len(inputs) > 1 else None)


def task_count(critic: CriticLike) -> Optional[int]:
    """The number of tasks every per-task return normaliser of `critic` takes (the smallest `num_tasks`), or
    None where no normaliser keeps statistics per task."""
    if not is_multi_critic(critic):
        return None
    counts = [n.num_tasks for n in critic.normalizers.values() if n.num_tasks is not None]
    return min(counts) if counts else None


def _step_task_ids(task_ids, count):
    """A dream step's task ids (`[H+1, B]` float32, each column one task, or None) as the int32 ids of its
    returns `[H, B]`, -1 (no statistics) for an id that is not an integer in `[0, count)`, and the number of such
    ids (invalid inputs: the step is skipped)."""
    if task_ids is None:
        return None, 0.0
    inside = ops.logical_and(task_ids >= 0.0, task_ids < count)
    good = ops.logical_and(ops.equal(task_ids, ops.floor(task_ids)), inside)
    ids = ops.cast(ops.where(good, task_ids, -1.0), "int32")[:-1]
    return ids, ops.sum(ops.cast(ops.logical_not(good), "float32"))


def _return_statistics(critic, stream, targets, task_ids, all_gather):
    """A `MultiCritic` stream's return statistics over the whole (data-parallel: gathered) batch of its returns
    `targets`; per task with each return's task from the dreams' `task_ids`, gathered as the returns are."""
    normalizer = critic.normalizers[stream]
    gathered = all_gather(ops.stop_gradient(targets))
    if normalizer.num_tasks is None:
        return normalizer.statistics(gathered)
    if task_ids is None:
        raise ValueError(
            f"task_ids: got None, expected the dreams' tasks: the normaliser of stream {stream!r} keeps statistics "
            f"per task (num_tasks={normalizer.num_tasks}); train with CriticTrainer's train_on_dream(..., "
            "task_ids=...) (fit() takes no task ids)."
        )
    return normalizer.statistics(gathered, all_gather(ops.zeros_like(targets, dtype="int32") + task_ids))


def _like(x, value):
    """`x [...]` repeated to an ensemble's `value [K, ...]` (targets and weights shared by the members)."""
    return x if len(x.shape) == len(value.shape) else _repeat(x, value.shape[0], axis=0)


def _nonfinite(x):
    """1.0 when `x` holds a non-finite value, else 0.0: from its sum (one cheap reduction; a count of
    non-finite entries costs several passes). Finite states so large that their sum overflows (|x| near
    float32's limit) count as non-finite too."""
    return 1.0 - ops.cast(ops.isfinite(ops.sum(x)), "float32")


def _statistics(critic):
    """The names of a `MultiCritic`'s normalisers' batch statistics (none for one critic)."""
    if not is_multi_critic(critic):
        return ()
    return {n for normalizer in critic.normalizers.values() for n in (normalizer.statistic_names or ())}


def _repeat(x, k, axis):
    """`x` repeated `k` times along a new axis `axis` (0: `[k, ...]`, -1: `[..., k]`); a repeat, not a
    broadcast, because TensorFlow's batch axes are unknown when the step is traced."""
    return ops.repeat(ops.expand_dims(x, axis), k, axis=axis)


def _time_major(x, length, members):
    """Outputs on flattened states `[L * B, ...]` as `[L, B, ...]` (an ensemble's `[K, L * B, ...]` as
    `[K, L, B, ...]`)."""
    if members:
        return ops.reshape(x, (x.shape[0], length, -1) + tuple(x.shape[2:]))
    return ops.reshape(x, (length, -1) + tuple(x.shape[1:]))


def _before_last(x, members):
    """The steps before the last of a time-major `[L, ...]` (an ensemble's `[K, L, ...]`)."""
    return x[:, :-1] if members else x[:-1]


# `metrics=`: "all" computes every diagnostic; "core" only what the step's guards need anyway.
METRICS = ("all", "core")
# What a "core" step returns: the loss, the gradient norm and whether the step was skipped (each guard's own
# verdict is a further output, a copy or a kernel of its own).
CORE_METRICS = ("total", "grad_norm", "step_skipped")


def _check_optimizer(optimizer, grad_clip):
    """A Keras optimizer (or None) that does not clip on its own when the step clips, else a `ValueError`."""
    if optimizer is not None and not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            f"optimizer: got {optimizer!r}, expected a keras.optimizers.Optimizer instance or None "
            "(None: Adam with learning_rate and epsilon)."
        )
    if grad_clip is not None and optimizer is not None:
        for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
            for name in ("clipnorm", "clipvalue", "global_clipnorm"):
                if getattr(opt, name, None) is not None:
                    raise ValueError(
                        f"optimizer: got a {type(opt).__name__} with {name}={getattr(opt, name)!r} and "
                        f"grad_clip={grad_clip!r}, expected one clipping: an optimizer without {name} (the "
                        "step clips the global norm to grad_clip), or grad_clip=None."
                    )


def _check_regularizer(critic, ema_regularizer):
    """A regulariser every head of `critic` (each stream's) supports, else a `ValueError`."""
    if not isinstance(ema_regularizer, str) or ema_regularizer not in EMA_REGULARIZERS:
        raise ValueError(f"ema_regularizer: got {ema_regularizer!r}, expected one of {list(EMA_REGULARIZERS)}.")
    for member in critic.stream_critics().values():
        if ema_regularizer not in member.return_layer.regularizers:
            raise ValueError(
                f"ema_regularizer: got {ema_regularizer!r} with the critic's head={member.head!r}, expected one of "
                f"{list(member.return_layer.regularizers)}."
            )


def _check_choices(metrics, jit_compile, **flags):
    """`metrics` one of `METRICS`, `jit_compile` True / False / "auto", each flag a bool; else a `ValueError`."""
    if not isinstance(metrics, str) or metrics not in METRICS:
        raise ValueError(f"metrics: got {metrics!r}, expected one of {list(METRICS)}.")
    if not (isinstance(jit_compile, (bool, np.bool_)) or (isinstance(jit_compile, str) and jit_compile == "auto")):
        raise ValueError(f"jit_compile: got {jit_compile!r}, expected True, False or 'auto'.")
    for name, flag in flags.items():
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name}: got {flag!r}, expected True or False.")


# The options a step's math reads: read-only once the step is built (`FixedOptionError`).
FIXED_OPTIONS = (
    "critic",
    "optimizer",
    "gamma",
    "lambda_",
    "grad_clip",
    "ema_update_period",
    "ema_update_first",
    "ema_regularizer_weight",
    "ema_regularizer",
    "ema_targets",
    "value_loss_weight",
    "replay_loss_weight",
    "replay_discount",
    "seed",
    "jit_compile",
    "metrics",
)


class CriticStep(FixedOptions):
    """A critic's training step: its options, its state and its math, shared by every backend.

    `CriticTrainer` (which adds the input checks, the steps' public API and
    checkpoints) and `critic.compile` / `fit` build one. Its arguments are
    `CriticTrainer`'s, documented there; everything is checked before
    anything changes. The options the math reads (`FIXED_OPTIONS`) are
    read-only afterwards: assigning one raises `FixedOptionError` (a
    `ValueError`), since every backend's compiled step reads them once.
    """

    fixed_options = FIXED_OPTIONS

    def __init__(self, critic, optimizer: Optional[keras.optimizers.Optimizer] = None, **options):
        given = TrainerOptions.from_kwargs(options)
        gamma, lambda_, grad_clip = given.gamma, given.lambda_, given.grad_clip
        ema_update_period, ema_update_first = given.ema_update_period, given.ema_update_first
        ema_regularizer_weight, ema_regularizer = given.ema_regularizer_weight, given.ema_regularizer
        ema_targets, seed, learning_rate, epsilon = given.ema_targets, given.seed, given.learning_rate, given.epsilon
        jit_compile, check_finite, step_counter = given.jit_compile, given.check_finite, given.step_counter
        value_loss_weight, replay_loss_weight = given.value_loss_weight, given.replay_loss_weight
        replay_discount, metrics = given.replay_discount, given.metrics
        if not critic.built:
            raise ValueError("critic: not built yet; call it once on a batch (or give its input sizes) first.")
        gamma = number("gamma", gamma, low=0.0, high=1.0)
        lambda_ = number("lambda_", lambda_, low=0.0, high=1.0)
        grad_clip = number("grad_clip", grad_clip, low=0.0, low_open=True, allow_none=True)
        _check_optimizer(optimizer, grad_clip)
        learning_rate = number("learning_rate", learning_rate, low=0.0, low_open=True)
        epsilon = number("epsilon", epsilon, low=0.0, low_open=True)
        ema_update_period = integer("ema_update_period", ema_update_period)
        ema_regularizer_weight = number("ema_regularizer_weight", ema_regularizer_weight, low=0.0)
        value_loss_weight = number("value_loss_weight", value_loss_weight, low=0.0)
        replay_loss_weight = number("replay_loss_weight", replay_loss_weight, low=0.0)
        replay_discount = number("replay_discount", replay_discount, low=0.0, high=1.0)
        _check_regularizer(critic, ema_regularizer)
        if seed is not None:
            seed = integer("seed", seed, low=0, high=2**32 - 1)
        _check_choices(
            metrics=metrics,
            jit_compile=jit_compile,
            check_finite=check_finite,
            ema_targets=ema_targets,
            ema_update_first=ema_update_first,
        )
        self.critic = critic
        self.gamma = float(gamma)
        self.lambda_ = float(lambda_)
        self.grad_clip = None if grad_clip is None else float(grad_clip)
        self.ema_update_period = int(ema_update_period)
        self.ema_update_first = bool(ema_update_first)
        self.ema_regularizer_weight = float(ema_regularizer_weight)
        self.ema_regularizer = ema_regularizer
        self.ema_targets = bool(ema_targets)
        self.value_loss_weight = float(value_loss_weight)
        self.replay_loss_weight = float(replay_loss_weight)
        self.replay_discount = float(replay_discount)
        self.seed = seed
        self.jit_compile = jit_compile if isinstance(jit_compile, str) else bool(jit_compile)
        self.check_finite = bool(check_finite)
        self.metrics = metrics
        # Before the optimizer exists (an engine may initialise its variables from the chief's).
        hosts.agree_requested(critic, optimizer, dict(self.options(), learning_rate=learning_rate, epsilon=epsilon))
        if optimizer is None:
            optimizer = keras.optimizers.Adam(learning_rate=learning_rate, epsilon=epsilon)
        if keras.config.dtype_policy().name == "mixed_float16" and not isinstance(
            optimizer, keras.optimizers.LossScaleOptimizer
        ):
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        self.optimizer = optimizer
        self.optimizer.build(critic.trainable_variables)
        if step_counter is not None and not any(step_counter is v for v in self.optimizer.variables):
            raise ValueError(
                "step_counter: got a variable the optimizer does not hold, expected the optimizer's own "
                "`iterations` (or None for a counter of the trainer's own)."
            )
        self._own_counter = step_counter is None
        self.steps = (
            keras.Variable(0, dtype="int32", trainable=False, name="critic_trainer_steps")
            if step_counter is None
            else step_counter
        )
        # Member draws of "min_of_random": a pure function of (seed, step count) per stream
        # (`multicritic.math.draws`), so draws need no state of their own and a resumed run draws what the whole
        # run would have. Streams draw apart: each its own offset of the seed.
        draw_seed = int(np.random.default_rng().integers(0, 2**31)) if seed is None else seed
        self.draw_seeds = {}
        for stream, member in self.critics().items():
            if member.ensemble_size > 1 and member.aggregation == "min_of_random":
                self.draw_seeds[stream] = draws.as_int32((draw_seed + len(self.draw_seeds)) % 2**32)
        self._backend = backend.current()
        # On several hosts, every host must build this same trainer: checked before the first collective
        # (PyTorch: DDP's weight broadcast, next).
        self.host_count = hosts.topology(self.state_variables)[1]
        if self.host_count > 1:
            hosts.agree("CriticTrainer", hosts.fingerprint(self), self.state_variables)
        # The critic's forward pass; a backend may route it through its
        # data-parallel engine (PyTorch DDP).
        self._forward = self._backend.forward_function(critic) or functools.partial(call_layer, critic)
        # The parts' hooks (`multicritic.layers.part_hooks`): forward passes in training mode where a part
        # normalises by the batch, and the parts' `after_update` after the optimizer's.
        parts = [p for member in self.critics().values() for p in (member.mlp, member.return_layer)]
        self._batch_statistics = any(part_hooks.uses_batch_statistics(p) for p in parts)
        self._after_update = any(part_hooks.has_after_update(p) for p in parts)
        self.fix_options()

    # ------------------------------------------------------------------
    # State.

    @property
    def state_variables(self):
        """Every variable a step reads or writes, in a fixed order."""
        return (
            list(self.critic.trainable_variables)
            + list(self.critic.non_trainable_variables)
            + list(self.optimizer.variables)
            + ([self.steps] if self._own_counter else [])
        )

    def options(self) -> Dict[str, object]:
        """The trainer's options (the critic's own are in `critic.get_config()`)."""
        return {
            "gamma": self.gamma,
            "lambda_": self.lambda_,
            "grad_clip": self.grad_clip,
            "ema_update_period": self.ema_update_period,
            "ema_update_first": self.ema_update_first,
            "ema_regularizer_weight": self.ema_regularizer_weight,
            "ema_regularizer": self.ema_regularizer,
            "ema_targets": self.ema_targets,
            "value_loss_weight": self.value_loss_weight,
            "replay_loss_weight": self.replay_loss_weight,
            "replay_discount": self.replay_discount,
            "seed": self.seed,
            "jit_compile": self.jit_compile,
            "check_finite": self.check_finite,
            "metrics": self.metrics,
        }

    # ------------------------------------------------------------------
    # The step's math, shared by all backends.

    # The step's math works on named critics: `{None: critic}` for one
    # critic, the streams of a `MultiCritic`.

    def critics(self) -> Dict[Optional[str], object]:
        return self.critic.stream_critics()

    def _outputs(self, h, z, use_ema=False):
        # `z` None: a features critic's `x` (in `h`'s place) is its one input. A training step's passes
        # normalise by the batch (parts with batch statistics; an evaluation's passes do not).
        kwargs = {"training": True} if self._batch_statistics and part_hooks.in_training_step() else {}
        out = self._forward(*((h,) if z is None else (h, z)), use_ema=use_ema, **kwargs)
        return out if isinstance(out, dict) else {None: out}

    def _combine(self, per_stream):
        """One critic's losses, or the streams' weighted sum with per-stream metrics (`"task/total"`)."""
        if list(per_stream) == [None]:
            losses = per_stream[None]
            return losses["total"], losses
        weights = self.critic.stream_weights
        metrics = {f"{s}/{k}": v for s, losses in per_stream.items() for k, v in losses.items()}
        metrics["total"] = sum(weights[s] * losses["total"] for s, losses in per_stream.items())
        for count in ("invalid_inputs", "nonfinite_targets"):
            if all(count in losses for losses in per_stream.values()):
                metrics[count] = sum(losses[count] for losses in per_stream.values())
        return metrics["total"], metrics

    def _critic_losses(self, critic, fast, ema, value_targets, loss_weights):
        """One critic's loss from its fast and EMA outputs (an ensemble's `[K, ...]`)."""
        value, logits = fast
        regularize = self.ema_regularizer_weight > 0.0
        ema_value = ema_logits = None
        if regularize:
            ema_value, ema_logits = ops.stop_gradient(ema[0]), ops.stop_gradient(ema[1])
        targets = _like(value_targets, value)
        core = self.metrics == "core"
        if core:
            # A negative (or NaN) weight becomes NaN, inside the loss's own sum (see below).
            loss_weights = ops.where(loss_weights >= 0.0, loss_weights, float("nan"))
        losses = critic_loss(
            logits,
            targets,
            ema_value if regularize else ops.zeros_like(targets),
            _like(loss_weights, value),
            ema_regularizer=self.ema_regularizer if regularize else "two_hot_mean",
            ema_regularizer_weight=self.ema_regularizer_weight,
            ema_logits=ema_logits if self.ema_regularizer == "distribution" else None,
            diagnostics=not core,
            **critic.loss_options(),
        )
        if core:
            # A negative weight (now NaN) or a non-finite state (non-finite logits: the MLP keeps finite inputs
            # finite) makes the total NaN, and with it the gradients: the gradient norm's check skips the step
            # with no check of its own. A loss-scale optimizer must not take that for an overflow (it would
            # lower its scale): it gets the check. A clipping MLP's states are summed apart
            # (`_invalid_states`).
            scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
            losses["invalid_inputs"] = _nonfinite(losses["total"]) if scaled else ops.zeros(())
            return losses
        if regularize:
            losses["ema_value_gap"] = ops.mean(ops.abs(ops.stop_gradient(value) - ema_value))
        if critic.ensemble_size > 1:
            # Disagreement of the members (symlog space): an uncertainty signal.
            losses["member_spread"] = ops.mean(ops.std(ops.stop_gradient(value), axis=0))
        # Negative (or NaN) weights would turn descent into ascent: such a step is skipped.
        losses["invalid_inputs"] = ops.sum(ops.cast(ops.logical_not(loss_weights >= 0.0), "float32"))
        return losses

    def _invalid_states(self, fast, h, z):
        """1.0 when the states `h`, `z` hold a non-finite value, else 0.0 (such states are no data to learn
        from). A critic whose MLP does not clip its inputs (`MLP.clips_inputs`) gives, with its finite
        weights, a non-finite value exactly for such a state: the check sums its fast values (`[N]`, computed
        anyway) instead of the states (`[N, gru_units]`, `[N, cats, classes]`). Clipping critics sum the
        states themselves."""
        critics = self.critics()
        if not any(c.mlp.clips_inputs for c in critics.values()):
            # "core": the losses' own check (`_critic_losses`) covers the states.
            return 0.0 if self.metrics == "core" else _nonfinite(fast[next(iter(critics))][0])
        return _nonfinite(h) + (0.0 if z is None else _nonfinite(z))

    def loss_parts(self, h, z, value_targets, loss_weights):
        fast = self._outputs(h, z)
        ema = self._outputs(h, z, use_ema=True) if self.ema_regularizer_weight > 0.0 else {}
        targets = value_targets if isinstance(value_targets, dict) else {None: value_targets}
        total, losses = self._combine(
            {
                s: self._critic_losses(c, fast[s], ema.get(s), targets[s], loss_weights)
                for s, c in self.critics().items()
            }
        )
        losses["invalid_inputs"] = losses["invalid_inputs"] + self._invalid_states(fast, h, z)
        return total, losses

    def _dream_losses(self, stream, critic, fast, ema, horizon, rewards, continues, task_ids=None):
        """One critic's dream loss from its outputs on the flattened `[(H+1) * B]` states, and the
        lambda-return from each start state (`[B]`, per member `[K, B]`), which replay returns bootstrap from.
        `task_ids`: the dreams' tasks `[B]` (int32) for a normaliser with statistics per task."""
        value, logits = fast
        ema_value, ema_logits = ema if ema is not None else (None, None)
        members = critic.ensemble_size > 1
        per_member = members and critic.aggregation == "members"

        def steps_before_last(x):
            return _before_last(_time_major(x, horizon, members), members)

        source = ops.stop_gradient(ema_value if self.ema_targets else value)
        values_real = inverse_symlog(_time_major(self._aggregate(stream, critic, source), horizon, per_member))
        if per_member:  # [K, H+1, B]: each member bootstraps from its own values
            k = critic.ensemble_size
            values_real = ops.moveaxis(values_real, 0, -1)
            targets = lambda_returns(
                _repeat(rewards, k, axis=-1), _repeat(continues, k, axis=-1), values_real, self.gamma, self.lambda_
            )
            targets = ops.moveaxis(targets, -1, 0)
        else:
            targets = lambda_returns(rewards, continues, values_real, self.gamma, self.lambda_)
        weights = dream_loss_weights(continues, self.gamma)[:-1]
        fast = (steps_before_last(value), steps_before_last(logits))
        if ema is not None:
            ema = (steps_before_last(ema_value), steps_before_last(ema_logits))
        losses = self._critic_losses(critic, fast, ema, targets, weights)
        if self.metrics == "all":
            losses["value_target_mean"] = ops.mean(targets)
        if is_multi_critic(self.critic):
            # The stream's return statistics over the whole (data-parallel: gathered) batch.
            losses.update(_return_statistics(self.critic, stream, targets, task_ids, self._backend.all_gather))
        return losses, ops.stop_gradient(targets[:, 0] if per_member else targets[0])

    def _aggregate(self, stream, critic, values):
        """`critic.aggregate`, drawing "min_of_random" members from (seed, step count)."""
        if stream not in self.draw_seeds:
            return critic.aggregate(values)
        return critic.aggregate(values, seed=(self.draw_seeds[stream], ops.cast(self.steps, "int32")))

    def _flat_outputs(self, h, z, need_ema):
        """Fast (and EMA: `{}` when not `need_ema`) outputs on time-major states `[L, B, ...]`, flattened."""
        flat_h = ops.reshape(h, (-1, h.shape[-1]))
        flat_z = None if z is None else ops.reshape(z, (-1,) + tuple(z.shape[-2:]))
        return self._outputs(flat_h, flat_z), (self._outputs(flat_h, flat_z, use_ema=True) if need_ema else {})

    def dream_loss(self, h, z, rewards, continues, task_ids=None):
        return self.dream_parts(h, z, rewards, continues, task_ids)[:2]

    def dream_parts(self, h, z, rewards, continues, task_ids=None):
        """`(total, metrics, {stream: start returns})` of a dream batch. `task_ids`: the dreams' tasks as
        float32 `[H+1, B]` (each column one task), for normalisers with statistics per task; an id that is not
        an integer in `[0, task_count(critic))` is an invalid input (the step is skipped)."""
        horizon = h.shape[0]
        fast, ema = self._flat_outputs(h, z, self.ema_regularizer_weight > 0.0 or self.ema_targets)
        rewards = rewards if isinstance(rewards, dict) else {None: rewards}
        ids, bad_ids = _step_task_ids(task_ids, task_count(self.critic))
        per_stream = {
            s: self._dream_losses(s, c, fast[s], ema.get(s), horizon, rewards[s], continues, ids)
            for s, c in self.critics().items()
        }
        total, losses = self._combine({s: parts[0] for s, parts in per_stream.items()})
        outside = ops.logical_not(ops.logical_and(continues >= 0.0, continues <= 1.0))
        invalid = ops.sum(ops.cast(outside, "float32")) + self._invalid_states(fast, h, z) + bad_ids
        losses["invalid_inputs"] = losses["invalid_inputs"] + invalid
        if self.value_loss_weight != 1.0:
            total = total * self.value_loss_weight
        return total, losses, {s: parts[1] for s, parts in per_stream.items()}

    def _replay_losses(self, critic, fast, ema, boot, rewards, is_last, is_terminal):
        """One critic's replay value loss from its outputs on the flattened `[T * B]` replay states."""
        value, logits = fast
        members = critic.ensemble_size > 1
        length = rewards.shape[0]

        def before_last(x):
            return _before_last(_time_major(x, length, members), members)

        if members and critic.aggregation == "members":  # each member's own returns, [K, T, B] -> [T, B, K]
            k = critic.ensemble_size
            targets = replay_lambda_returns(
                _repeat(rewards, k, -1),
                _repeat(is_last, k, -1),
                _repeat(is_terminal, k, -1),
                ops.moveaxis(boot, 0, -1),
                self.replay_discount,
                self.lambda_,
            )
            targets = ops.moveaxis(targets, -1, 0)
        else:
            targets = replay_lambda_returns(rewards, is_last, is_terminal, boot, self.replay_discount, self.lambda_)
        fast = (before_last(value), before_last(logits))
        if ema is not None:
            ema = (before_last(ema[0]), before_last(ema[1]))
        losses = self._critic_losses(critic, fast, ema, targets, 1.0 - is_last[:-1])
        if self.metrics == "all":
            losses["value_target_mean"] = ops.mean(targets)
        return losses

    def dream_and_replay_loss(
        self, h, z, rewards, continues, replay_h, replay_z, replay_rewards, is_last, is_terminal, task_ids=None
    ):
        total, losses, starts = self.dream_parts(h, z, rewards, continues, task_ids)
        length = replay_h.shape[0]
        fast, ema = self._flat_outputs(replay_h, replay_z, self.ema_regularizer_weight > 0.0)
        replay_rewards = replay_rewards if isinstance(replay_rewards, dict) else {None: replay_rewards}
        per_stream = {}
        for stream, critic in self.critics().items():
            # Dream start j = b * T + t is replay step (t, b): [..., B * T] -> [..., T, B].
            start = starts[stream]
            boot = ops.reshape(start, tuple(start.shape[:-1]) + (-1, length))
            boot = ops.swapaxes(boot, -1, -2)
            per_stream[stream] = self._replay_losses(
                critic, fast[stream], ema.get(stream), boot, replay_rewards[stream], is_last, is_terminal
            )
        replay_total, replay = self._combine(per_stream)
        flags = ops.concatenate([ops.reshape(is_last, (-1,)), ops.reshape(is_terminal, (-1,))])
        invalid = ops.sum(ops.cast(ops.logical_not(ops.logical_or(flags == 0.0, flags == 1.0)), "float32"))
        invalid = invalid + self._invalid_states(fast, replay_h, replay_z)
        losses.update({f"repval/{k}": v for k, v in replay.items()})
        losses["invalid_inputs"] = losses["invalid_inputs"] + replay["invalid_inputs"] + invalid
        if "nonfinite_targets" in losses:
            losses["nonfinite_targets"] = losses["nonfinite_targets"] + replay["nonfinite_targets"]
        total = total + self.replay_loss_weight * replay_total
        losses["total"] = total
        return total, losses

    def _loss_scale(self):
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            return self.optimizer.dynamic_scale
        return self.optimizer.loss_scale_factor

    def program(self, loss_fn) -> StepProgram:
        return StepProgram(
            trainable=list(self.critic.trainable_variables),
            state=self.state_variables,
            loss=part_hooks.training_loss(loss_fn) if self._batch_statistics else loss_fn,
            scale_loss=self.optimizer.scale_loss,
            apply=self.apply,
            jit_compile=self.jit_compile,
            private=list(self.optimizer.variables),
            loss_scaled=isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer),
        )

    def apply(self, grads, losses):
        """Clip, update, the parts' hooks, EMA: shared by every backend (assignments via `Variable.assign`).

        All or nothing: with non-finite gradients or invalid inputs (see
        `invalid_inputs`) the weights, the EMA copy, the optimizer's slots,
        the parts' batch statistics and the step counter stay as they were
        (`step_skipped` = 1). Under a loss-scale optimizer, the optimizer
        still sees non-finite gradients, so that it lowers its scale (and
        skips its own update).
        """
        critic = self.critic
        trainable = critic.trainable_variables  # (each read walks the critic's layers)
        grads = [as_float32(g) for g in grads]
        scale = self._loss_scale()
        backend = self._backend
        norm = backend.global_norm(grads)
        if scale is not None:
            norm = norm / ops.cast(scale, "float32")
        metrics = dict(losses)
        statistics = part_hooks.take_statistics(metrics, critic.non_trainable_variables, backend.all_gather)
        metrics["grad_norm"] = norm
        finite = ops.isfinite(norm)
        inputs_ok = ops.equal(losses["invalid_inputs"], 0.0)
        ok = ops.logical_and(finite, inputs_ok)
        metrics["nonfinite_grads"] = 1.0 - ops.cast(finite, "float32")
        metrics["step_skipped"] = 1.0 - ops.cast(ok, "float32")
        if self.grad_clip is not None:
            # tf.clip_by_global_norm's factor (the reference's clipping).
            factor = self.grad_clip * ops.minimum(1.0 / norm, 1.0 / self.grad_clip)
            grads = backend.scale(grads, factor)
        period = self.ema_update_period

        def optimizer_step():
            backend.apply_gradients(self.optimizer, grads, trainable)

        def bookkeeping():
            if self._own_counter:  # else the optimizer has counted the step
                self.steps.assign(self.steps + 1)
            if is_multi_critic(critic):
                for stream, normalizer in critic.normalizers.items():
                    names = normalizer.statistic_names
                    if names and all(f"{stream}/{n}" in metrics for n in names):
                        normalizer.update_from({n: metrics[f"{stream}/{n}"] for n in names})
            # The parts' hooks (`multicritic.layers.part_hooks`): their batch statistics, then `after_update`
            # on the updated weights; the EMA copy follows what they leave.
            for variable, value in statistics:
                variable.assign(value)
            for member in self.critics().values():
                if self._after_update:
                    member.after_update()
                if period == 1:
                    member.update_ema()
                else:
                    due = ops.equal((self.steps - (1 if self.ema_update_first else 0)) % period, 0)
                    member.update_ema(decay=ops.where(due, member.ema_decay, 1.0))

        if self.metrics == "core":  # (and the normalisers' batch statistics, which the update reads above)
            kept = _statistics(critic)
            metrics = {k: v for k, v in metrics.items() if k in CORE_METRICS or k.split("/")[-1] in kept}
        optimizer_state = list(trainable) + list(self.optimizer.variables)
        bookkeeping_state = [self.steps] + list(critic.non_trainable_variables)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            backend.update_if(inputs_ok, optimizer_step, optimizer_state)
            # (The parts' `after_update` assigns weights: selected with the rest of the bookkeeping.)
            backend.update_if(ok, bookkeeping, bookkeeping_state + (list(trainable) if self._after_update else []))
        else:
            backend.update_if(ok, lambda: (optimizer_step(), bookkeeping()), optimizer_state + bookkeeping_state)
        return metrics
