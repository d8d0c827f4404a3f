"""Keras-native training: `compile()` / `fit()` / `evaluate()` on the critic, with the EMA inside `train_step`.

`KerasTraining` is the model-side half (a mixin of `CriticNetwork` and
`MultiCritic`): it unpacks Keras's batches and records metrics. The step's
math is `multicritic.training.step`'s, as `CriticTrainer`'s (the same loss, clipping, optimizer and EMA code),
and how gradients are taken is the backend contract's
(`Backend.keras_train_step`, the per-backend `train_step` of Keras's own
trainers). Keras compiles the step (`tf.function`, `jax.jit`, eager PyTorch or
`torch.compile`) as for any model.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Dict, List

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract as backend
from multicritic.training.options import TrainerOptions
from multicritic.training.step import CriticStep, h_and_z, is_multi_critic
from multicritic.training.step_functions import StepFunctions
from multicritic.validation import fmt, integer, real_values

# Options of `compile` that configure the trainer (the rest are Keras's).
TRAINER_OPTIONS = TrainerOptions.defaults(
    (
        "gamma",
        "lambda_",
        "grad_clip",
        "ema_update_period",
        "ema_update_first",
        "ema_regularizer_weight",
        "ema_regularizer",
        "ema_targets",
        "value_loss_weight",
        "seed",
        "learning_rate",
        "epsilon",
    )
)
_UNSUPPORTED = ("metrics", "weighted_metrics", "loss_weights", "auto_scale_loss")
# Options of the default optimizer: with an optimizer of one's own they would be ignored.
_DEFAULT_OPTIMIZER_OPTIONS = ("learning_rate", "epsilon")
# A batch's keys after the critic's inputs (`h, z`, or a features critic's `x`).
_DREAM_KEYS = ("rewards", "continues")
_DIRECT_KEYS = ("value_targets", "loss_weights")


class _FitState:
    """What `compile` sets up (a plain object: Keras neither tracks nor saves it)."""

    def __init__(self, trainer, options, trackers):
        self.trainer = trainer
        self.options = options
        self.trackers = trackers
        self.programs = {}
        # Batches a restored backup already trained on (see `callbacks.BackupAndRestore`).
        self.skip_batches = 0


def _metric_names(critic, regularize: bool) -> List[str]:
    def per_critic(member):
        names = ["value_nll", "ema_regularizer", "clipped_fraction"]
        names += ["ema_value_gap"] if regularize else []
        names += ["member_spread"] if member.ensemble_size > 1 else []
        return names

    if is_multi_critic(critic):
        streams = [f"{s}/{k}" for s, m in critic.streams.items() for k in ["total"] + per_critic(m)]
        return ["total"] + streams
    return ["total"] + per_critic(critic)


class KerasTraining(StepFunctions):
    """`compile` / `fit` / `evaluate` / `predict` for a critic, with the reference's training step.

    `compile()` with no arguments trains as `CriticTrainer` does by default
    (Adam 3e-5, epsilon 1e-5, global-norm clip 100, the critic loss, EMA
    update after every optimizer step). Keras runs the step: `fit` takes
    numpy arrays, `tf.data`, `keras.utils.PyDataset`, a torch `DataLoader`
    or any iterable Keras accepts, with batches of one of two kinds:

    - direct: `x=(h, z)`, `y=value_targets` `[B]` (or `[B, 1]`),
      `sample_weight=loss_weights` `[B]` (default ones); as a dict
      `{"h", "z", "value_targets", "loss_weights"}`.
    - dream: `x=(h, z, rewards, continues)` with no `y`, BATCH-MAJOR
      (`h [B, H+1, gru_units]`, `z [B, H+1, cats, classes]`, `rewards` and
      `continues` `[B, H+1]`), since Keras batches along the first axis;
      as a dict `{"h", "z", "rewards", "continues"}`. The step transposes
      them to `CriticTrainer.train_on_dream`'s time-major layout.

    A features critic (`input_size`) takes its one input `x` in place of
    `(h, z)`: direct `x [B, input_size]` with `y` (`fit(x, y)`), dream
    `x=(x, rewards, continues)` with `x [B, H+1, input_size]` (told apart by
    the rank of `x`); as dicts, the same names with `"x"`.

    The optimizer's `iterations` counts the steps (the EMA period and the
    "min_of_random" draws follow it), so a `.keras` file or a
    `BackupAndRestore` backup resumes the EMA schedule exactly. Logs hold
    `loss` (= `total`), each loss term, `grad_norm`, `ema_value_gap`,
    `clipped_fraction` (epoch means) and `step_skipped` (skipped steps in
    the epoch).
    """

    def compile(
        self, optimizer=None, loss=None, *, jit_compile="auto", steps_per_execution=1, run_eagerly=False, **kwargs
    ):
        """Configures `fit`.

        Args:
            optimizer: a Keras optimizer (instance, name or config); `None`:
                Adam with `learning_rate` and `epsilon`, the reference's. One
                that clips on its own (`clipnorm`, `clipvalue`,
                `global_clipnorm`) is refused while `grad_clip` is set
                (`grad_clip` clips), and so are `learning_rate` / `epsilon`
                with it (they configure the default Adam only).
            loss: `None` or `"critic_loss"`: the critic loss (the only one).
            jit_compile: True, False or `"auto"` (see `CriticTrainer`).
            steps_per_execution: an integer >= 1 (Keras's).
            run_eagerly: True or False (Keras's).
            **kwargs: `CriticTrainer`'s options: `gamma`, `lambda_`,
                `grad_clip`, `ema_update_period`, `ema_regularizer_weight`,
                `ema_regularizer`, `ema_targets`, `seed`, `learning_rate`,
                `epsilon`.

        Everything is checked before anything changes: an unknown or
        out-of-range argument raises a `ValueError` naming it, and the critic
        stays compiled as it was (or not compiled).
        """
        for name in _UNSUPPORTED:
            if kwargs.get(name) is not None:
                raise ValueError(
                    f"{name}: got {kwargs[name]!r}, expected None; the critic's logs hold its loss terms and "
                    "diagnostics (see CriticNetwork.compile)."
                )
        unknown = sorted(set(kwargs) - set(TRAINER_OPTIONS) - set(_UNSUPPORTED))
        if unknown:
            raise ValueError(f"{unknown[0]}: not an option of compile; expected Keras's or {sorted(TRAINER_OPTIONS)}.")
        if loss not in (None, "critic_loss"):
            raise ValueError(f"loss: got {loss!r}, expected None or 'critic_loss' (the critic's own loss).")
        if not self.built:
            raise ValueError("compile: the critic is not built yet; call it once on a batch (or give its input sizes).")
        if (
            jit_compile not in (True, False, "auto")
            or isinstance(jit_compile, (int, float))
            and not isinstance(jit_compile, bool)
        ):
            raise ValueError(f"jit_compile: got {jit_compile!r}, expected True, False or 'auto'.")
        if not isinstance(run_eagerly, (bool, np.bool_)):
            raise ValueError(f"run_eagerly: got {run_eagerly!r}, expected True or False.")
        steps_per_execution = integer("steps_per_execution", steps_per_execution)
        options = {k: kwargs.get(k, v) for k, v in TRAINER_OPTIONS.items()}
        if optimizer is not None:
            given = [k for k in _DEFAULT_OPTIMIZER_OPTIONS if k in kwargs]
            if given:
                raise ValueError(
                    f"{given[0]}: got {kwargs[given[0]]!r} with an optimizer of its own "
                    f"({type(optimizer).__name__}), expected no {given[0]} (it configures the default Adam only); "
                    "set it on the optimizer instead."
                )
            if not isinstance(optimizer, keras.optimizers.Optimizer):
                try:
                    optimizer = keras.optimizers.get(optimizer)
                except (ValueError, TypeError) as err:
                    raise ValueError(
                        f"optimizer: got {optimizer!r}, expected a Keras optimizer (an instance, a name such as "
                        f"'adam', or a config) or None ({err})."
                    ) from None
        if optimizer is None:
            optimizer = keras.optimizers.Adam(learning_rate=options["learning_rate"], epsilon=options["epsilon"])
        if keras.config.dtype_policy().name == "mixed_float16" and not isinstance(
            optimizer, keras.optimizers.LossScaleOptimizer
        ):
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        # Checks the trainer options (and refuses an optimizer clipping on top of `grad_clip`) before any change.
        trainer = CriticStep(
            self,
            optimizer,
            step_counter=optimizer.iterations,
            check_finite=False,
            jit_compile=False if run_eagerly else jit_compile,
            **options,
        )
        regularize = trainer.ema_regularizer_weight > 0.0
        trackers = {"total": keras.metrics.Mean(name="total")}
        for name in _metric_names(self, regularize)[1:] + ["grad_norm"]:
            trackers[name] = keras.metrics.Mean(name=name)
        trackers["step_skipped"] = keras.metrics.Sum(name="step_skipped")
        self._fit = _FitState(trainer, options, trackers)
        super().compile(
            optimizer=trainer.optimizer,
            loss=None,
            jit_compile=backend.current().keras_jit_compile(jit_compile),
            steps_per_execution=steps_per_execution,
            run_eagerly=bool(run_eagerly),
        )

    @property
    def metrics(self):
        fit = getattr(self, "_fit", None)
        if fit is None or not self.compiled:
            return super().metrics
        return [self._loss_tracker] + list(fit.trackers.values())

    @property
    def fit_trainer(self):
        """The `CriticStep` (options, state and math) that `fit` runs (set by `compile`)."""
        fit = getattr(self, "_fit", None)
        if fit is None:
            raise ValueError("fit_trainer: the critic is not compiled; call critic.compile() first.")
        return fit.trainer

    # ------------------------------------------------------------------
    # Saving the compile arguments (`.keras` files compile on load).

    def get_compile_config(self):
        fit = getattr(self, "_fit", None)
        if fit is None:
            return None
        config = super().get_compile_config() or {}
        config = {k: v for k, v in config.items() if k in ("optimizer", "jit_compile", "steps_per_execution")}
        config.update(fit.options)
        return config

    def compile_from_config(self, config):
        config = dict(config)
        optimizer = config.pop("optimizer", None)
        if optimizer is not None:
            optimizer = keras.saving.deserialize_keras_object(optimizer)
            # The saved optimizer carries its own (these configured the default Adam only).
            for name in _DEFAULT_OPTIMIZER_OPTIONS:
                config.pop(name, None)
        self.compile(optimizer=optimizer, **config)

    # ------------------------------------------------------------------
    # Batches.

    def _fit_batch(self, data, need_targets=True):
        """`(kind, tensors)` from a Keras batch: `"direct"` `(h, z, targets, weights)` or `"dream"`
        `(h, z, rewards, continues)` (a features critic: `x` in place of `h, z`), time-major, float32, shapes
        checked."""
        if isinstance(data, (tuple, list)) and len(data) == 1:
            data = data[0]
        inputs = tuple(self.input_row_shapes())
        dream_keys, direct_keys = inputs + _DREAM_KEYS, inputs + _DIRECT_KEYS
        if isinstance(data, dict):
            keys = set(data)
            if keys == set(dream_keys):
                data = tuple(data[k] for k in dream_keys)
            elif {*inputs, "value_targets"} <= keys <= set(direct_keys):
                x = tuple(data[k] for k in inputs)
                data = (x if len(x) > 1 else x[0], data["value_targets"], data.get("loss_weights"))
            else:
                raise ValueError(
                    f"data: got a dict with keys {sorted(keys)}, expected {list(dream_keys)} (dream) or "
                    f"{list(direct_keys)} (direct; loss_weights optional)."
                )
        if len(inputs) == 1:
            return self._features_batch(data, need_targets)
        if not isinstance(data, (tuple, list)):
            raise ValueError(
                f"data: got {type(data).__name__}, expected ((h, z), value_targets[, loss_weights]) "
                "or (h, z, rewards, continues)."
            )
        if len(data) == 4 and not isinstance(data[0], (tuple, list)):
            return "dream", self._dream_batch(data[:2], *data[2:])
        if len(data) == 2 and not any(isinstance(x, (tuple, list, dict)) for x in data):
            data = (tuple(data),)  # x=(h, z) with no y
        x = data[0]
        if not isinstance(x, (tuple, list)) or len(x) != 2:
            raise ValueError(
                "x: expected (h, z) with value targets as y (a direct batch), or x=(h, z, rewards, continues) "
                f"with no y (a dream batch); got x of type {type(x).__name__}"
                + (f" with {len(x)} parts." if isinstance(x, (tuple, list)) else ".")
            )
        y = data[1] if len(data) > 1 else None
        weights = data[2] if len(data) > 2 else None
        if y is None and need_targets:
            raise ValueError("y: got None, expected value targets [B] for x=(h, z).")
        return "direct", self._direct_batch(tuple(x), y, weights)

    def _features_batch(self, data, need_targets):
        """A features critic's batch: `x`, `(x, y[, sample_weight])` (direct: `x [B, input_size]`) or
        `(x, rewards, continues)` (dream: `x [B, H+1, input_size]`); told apart by the rank of `x`."""
        if not isinstance(data, (tuple, list)):
            data = (data,)  # x alone (predict)
        if data and isinstance(data[0], (tuple, list)) and len(data[0]) in (1, 3):
            data = tuple(data[0]) + tuple(data[1:])  # x=(x,) or x=(x, rewards, continues)
        x = data[0] if data else None
        if not data or len(data) > 3 or isinstance(x, (tuple, list, dict)) or not hasattr(x, "shape"):
            raise ValueError(
                f"data: got {type(data).__name__} of {len(data)} parts, expected x [B, input_size] with value "
                "targets as y (a direct batch), or x=(x, rewards, continues) with x [B, H+1, input_size] and no y "
                "(a dream batch)."
            )
        if len(x.shape) == 3:
            if len(data) != 3:
                raise ValueError(
                    f"x: got shape {fmt(tuple(x.shape))} (a dream batch) with {len(data) - 1} more parts, expected "
                    "x=(x, rewards, continues) and no y."
                )
            return "dream", self._dream_batch((x,), data[1], data[2])
        y = data[1] if len(data) > 1 else None
        weights = data[2] if len(data) > 2 else None
        if y is None and need_targets:
            raise ValueError("y: got None, expected value targets [B] for x [B, input_size].")
        return "direct", self._direct_batch((x,), y, weights)

    def _inputs(self, inputs, lead_rank):
        rows = self.input_row_shapes()
        inputs = tuple(ops.cast(real_values(name, x), "float32") for name, x in zip(rows, inputs))
        if any(len(x.shape) != lead_rank + len(row) for x, row in zip(inputs, rows.values())):
            axes = "[B, ...]" if lead_rank == 1 else "[B, H+1, ...] (batch-major)"
            names = ", ".join(rows)
            wants = " and ".join(f"{name} [..., {', '.join(map(str, row))}]" for name, row in rows.items())
            raise ValueError(
                f"{names}: got shapes {' and '.join(fmt(tuple(x.shape)) for x in inputs)}, expected {axes} with "
                f"{wants}."
            )
        first = next(iter(rows))
        lead = tuple(inputs[0].shape[:lead_rank])
        if 0 in lead:
            raise ValueError(
                f"{first}: got shape {fmt(tuple(inputs[0].shape))}, an empty batch; expected at least one row."
            )
        self.check_inputs(*[(None,) + tuple(x.shape[lead_rank:]) for x in inputs])
        return inputs, lead

    def _per_position(self, name, x, lead, per_stream=False):
        """`x` (one value per position of `lead`) as float32; `per_stream`: a `MultiCritic` takes one such
        array per stream, as a dict, and a single critic one array."""

        def one(x, name):
            x = ops.cast(real_values(name, x), "float32")
            if len(x.shape) == len(lead) + 1 and x.shape[-1] == 1:
                x = ops.squeeze(x, -1)
            known = all(a is None or b is None or a == b for a, b in zip(x.shape, lead))
            if len(x.shape) != len(lead) or not known:
                raise ValueError(f"{name}: got shape {fmt(tuple(x.shape))}, expected {fmt(lead)} (one per position).")
            return x

        streams = getattr(self, "stream_names", None)  # a MultiCritic's
        if not per_stream or streams is None:
            if isinstance(x, dict):
                why = "shared by the streams" if streams is not None else "the critic has one reward stream"
                raise ValueError(f"{name}: got a dict with keys {sorted(x)}, expected one array ({why}).")
            return one(x, name)
        if not isinstance(x, dict) or sorted(x) != sorted(streams):
            got = f"a dict with keys {sorted(x)}" if isinstance(x, dict) else "one array"
            raise ValueError(f"{name}: got {got}, expected a dict with one array per stream {list(streams)}.")
        return {k: one(x[k], f"{name}[{k!r}]") for k in streams}

    def _direct_batch(self, inputs, targets, weights):
        inputs, lead = self._inputs(inputs, 1)
        targets = self._per_position("y (value_targets)", targets, lead, per_stream=True)
        first = inputs[0]
        weights = ops.ones_like(first[:, 0]) if weights is None else self._per_position("sample_weight", weights, lead)
        return (*inputs, targets, weights)

    def _dream_batch(self, inputs, rewards, continues):
        inputs, lead = self._inputs(inputs, 2)
        rewards = self._per_position("rewards", rewards, lead, per_stream=True)
        continues = self._per_position("continues", continues, lead)

        def time_major(x):
            return {k: ops.swapaxes(v, 0, 1) for k, v in x.items()} if isinstance(x, dict) else ops.swapaxes(x, 0, 1)

        return tuple(time_major(x) for x in (*inputs, rewards, continues))

    # ------------------------------------------------------------------
    # Keras's entry points: arguments and host data checked before Keras runs anything.

    def fit(self, *args, **kwargs):
        arguments = self._arguments("fit", args, kwargs)
        self._check_data("x", arguments.get("x"), arguments.get("y"), arguments.get("sample_weight"))
        validation = arguments.get("validation_data")
        if isinstance(validation, (tuple, list)) and 2 <= len(validation) <= 3:
            self._check_data("validation_data", *validation)
        return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        arguments = self._arguments("evaluate", args, kwargs)
        self._check_data("x", arguments.get("x"), arguments.get("y"), arguments.get("sample_weight"))
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        arguments = self._arguments("predict", args, kwargs)
        self._check_data("x", arguments.get("x"), targets=False)
        return super().predict(*args, **kwargs)

    def train_on_batch(self, *args, **kwargs):
        arguments = self._arguments("train_on_batch", args, kwargs)
        self._check_data("x", arguments.get("x"), arguments.get("y"), arguments.get("sample_weight"))
        return super().train_on_batch(*args, **kwargs)

    def test_on_batch(self, *args, **kwargs):
        arguments = self._arguments("test_on_batch", args, kwargs)
        self._check_data("x", arguments.get("x"), arguments.get("y"), arguments.get("sample_weight"))
        return super().test_on_batch(*args, **kwargs)

    def _arguments(self, method, args, kwargs) -> Dict[str, object]:
        """Keras's `method(*args, **kwargs)` bound to its signature (an unknown keyword raises `TypeError`
        there, as Keras's would), after the checks every call of it gets."""
        signature = inspect.signature(getattr(super(), method))
        arguments = dict(signature.bind(*args, **kwargs).arguments)
        if method != "predict":
            self._require_compiled(method)
        if arguments.get("class_weight") is not None:
            raise ValueError(
                f"class_weight: got {arguments['class_weight']!r}, expected None (the critic's targets are values, "
                "not classes; weigh positions with sample_weight)."
            )
        return arguments

    def _check_data(self, name, x, y=None, sample_weight=None, targets=True):
        """Host data (numpy arrays, backend tensors, in tuples or dicts) is checked here, before Keras runs
        anything: real numbers, at least one row, and (`targets`: fit, evaluate) as a batch (structure,
        shapes, streams). Other sources (datasets, generators, `PyDataset`s, `DataLoader`s) are
        checked batch by batch in the step, which leaves the state as it was when it refuses one."""
        parts = [(name, x), ("y", y), ("sample_weight", sample_weight)]
        leaves = []
        for part, value in parts:
            if value is None:
                continue
            flat = keras.tree.flatten(value)
            if not flat or not all(isinstance(a, np.ndarray) or ops.is_tensor(a) for a in flat):
                return
            leaves += [(part, a) for a in flat]
        for part, array in leaves:
            real_values(part, array)
            if len(array.shape) == 0 or array.shape[0] == 0:
                raise ValueError(
                    f"{part}: got an array of shape {fmt(tuple(array.shape))}, expected at least one "
                    "row (batches are taken along the first axis)."
                )
        if targets and leaves:
            # Symbolically (shapes and dtypes, no copy of the data): the step's own checks, on whole arrays.
            data = tuple(v for v in (x, y, sample_weight) if v is not None)
            self._fit_batch(
                keras.tree.map_structure(
                    lambda a: keras.KerasTensor(tuple(a.shape), keras.backend.standardize_dtype(a.dtype)), data
                )
            )

    # ------------------------------------------------------------------
    # Steps (Keras's step functions are wrapped by `StepFunctions`).

    def _record(self, metrics, names) -> Dict[str, object]:
        trackers = self._fit.trackers
        self._loss_tracker.update_state(metrics["total"])
        for name in names:
            trackers[name].update_state(metrics[name])
        logs = {"loss": self._loss_tracker.result()}
        logs.update({name: trackers[name].result() for name in names})
        return logs

    def _program(self, kind):
        fit = self._fit
        program = fit.programs.get(kind)
        if program is None:
            trainer = fit.trainer
            run = trainer.dream_loss if kind == "dream" else trainer.loss_parts

            def loss(
                *batch,
            ):  # the inputs (`h, z`, or `x`), then two more (rewards and continues, or targets and weights)
                return run(*h_and_z(batch[:-2]), *batch[-2:])

            names = list(fit.trackers)

            def apply(grads, metrics):
                return self._record(trainer.apply(grads, metrics), names)

            program = trainer.program(loss)
            # The step also writes the loss and metric trackers: they are state a compiled step carries.
            trackers = [v for t in [self._loss_tracker, *fit.trackers.values()] for v in t.variables]
            program = fit.programs[kind] = dataclasses.replace(
                program, apply=apply, state=list(program.state) + trackers
            )
        return program

    def _require_compiled(self, what="fit"):
        if getattr(self, "_fit", None) is None:
            raise ValueError(
                f"{what}: the critic is not compiled; call critic.compile() (no arguments: the "
                "reference's optimizer and loss) first."
            )

    def train_step(self, *args):
        self._require_compiled()
        state, data = (args[0] if len(args) == 2 else None), args[-1]
        kind, batch = self._fit_batch(data)
        return backend.current().keras_train_step(self, self._program(kind), state, batch)

    def test_step(self, *args):
        self._require_compiled()
        state, data = (args[0] if len(args) == 2 else None), args[-1]
        kind, batch = self._fit_batch(data)
        trainer = self._fit.trainer
        names = [n for n in self._fit.trackers if n not in ("grad_norm", "step_skipped")]

        def evaluate(*batch):
            run = trainer.dream_loss if kind == "dream" else trainer.loss_parts
            _, metrics = run(*h_and_z(batch[:-2]), *batch[-2:])
            return self._record(metrics, names)

        return backend.current().keras_test_step(self, evaluate, state, batch)
