"""`CriticTrainer`: the critic's compiled train steps, with the step's math shared by all backends.

The math of a step (forward passes, loss, clipping, optimizer update, EMA
update) is written here once, against `keras.ops` and `Variable.assign`. The
modules `tensorflow.py`, `torch.py` and `jax.py` beside this one only say how
gradients are taken and how the step is compiled on their backend.
"""

from __future__ import annotations

import importlib
import threading
from typing import Callable, Dict, Optional

import keras
import numpy as np
from keras import ops

from multicritic.bins import inverse_symlog
from multicritic.critic import CriticNetwork
from multicritic.losses import critic_loss
from multicritic.returns import dream_loss_weights, lambda_returns
from multicritic.training import checkpoint
from multicritic.validation import as_float32, fmt, number


def backend_module():
    """The backend-specific half of the trainer for the running Keras backend."""
    name = keras.backend.backend()
    if name not in ("tensorflow", "torch", "jax"):
        raise ValueError(f"KERAS_BACKEND: got {name!r}, expected 'tensorflow', 'torch' or 'jax'.")
    return importlib.import_module(f"multicritic.training.{name}")


def predict_function(critic: CriticNetwork, use_ema: bool = False) -> Callable:
    """A compiled forward pass `fn(h, z) -> (value_symlog, logits)` that a new batch size does not retrace.

    TensorFlow: a `tf.function` with a `[None, ...]` input signature (one
    trace). JAX: `jax.jit` over `stateless_call`, batches padded to the next
    power of two (>= 8), so at most one compilation per power of two.
    PyTorch: the eager forward under `torch.no_grad()`. Inputs are converted
    to float32 and checked like `critic(h, z)`.
    """
    run = backend_module().make_predict_function(critic, bool(use_ema))

    def predict(h, z):
        h, z = ops.convert_to_tensor(_as_float32(h, "h")), ops.convert_to_tensor(_as_float32(z, "z"))
        critic._check_inputs(h.shape, z.shape)
        return run(h, z)

    predict.compiled = getattr(run, "compiled", None)
    return predict


def global_norm(tensors):
    return ops.sqrt(sum(ops.sum(t * t) for t in tensors))


def _as_float32(x, name="x"):
    """Host data as a float32 numpy array (its values are checked on the host), tensors as float32 tensors
    cut from any autograd graph they carry (nothing outside the critic may receive gradients)."""
    if x is None or isinstance(x, (str, bytes)):
        raise ValueError(f"{name}: got {x!r}, expected a real-valued array.")
    if isinstance(x, (np.ndarray, list, tuple, float, int, np.generic)):
        try:
            array = np.asarray(x)
        except ValueError as err:  # ragged nested lists
            raise ValueError(f"{name}: got a {type(x).__name__} that is not a rectangular array ({err}).") from None
        if array.dtype.kind not in "fiub":
            raise ValueError(f"{name}: got an array of dtype {array.dtype}, expected real numbers.")
        return array.astype(np.float32, copy=False)
    if not ops.is_tensor(x):
        raise ValueError(f"{name}: got a {type(x).__name__}, expected an array or a backend tensor.")
    kind = keras.backend.standardize_dtype(x.dtype)
    if not kind.startswith(("float", "int", "uint", "bool")):
        raise ValueError(f"{name}: got a tensor of dtype {kind}, expected real numbers.")
    return ops.stop_gradient(as_float32(x))


class CriticTrainer:
    """Trains a `CriticNetwork` with one compiled step per call, on any backend.

    Each step does, as one compiled function (`tf.function`, `jax.jit` over a
    stateless step, or PyTorch autograd with optional `torch.compile`): the
    fast and EMA forward passes, `critic_loss`, gradients of the fast weights
    only, global-norm clipping, the optimizer update, then the EMA update
    (every `critic.ema_update_period` steps). After each call the critic's
    and optimizer's variables hold the new values on every backend.

    The slow-critic options (`ema_decay`, `ema_update_period`,
    `ema_regularizer`, `ema_regularizer_weight`, `ema_targets`) are
    attributes of the critic, so they travel with its checkpoints.

    Args:
        critic: a built `CriticNetwork`.
        optimizer: a Keras optimizer; default Keras `Adam(learning_rate,
            epsilon=epsilon)`, the reference's. Under the `mixed_float16`
            policy it is wrapped in a `keras.optimizers.LossScaleOptimizer`.
            Clipping is done here: give it no `clipnorm` of its own.
        gamma: discount for lambda-returns and dream loss weights.
        lambda_: TD(lambda) parameter.
        grad_clip: global-norm clip (100 in the reference); `None` for none.
        learning_rate, epsilon: of the default Adam (3e-5, 1e-5).
        jit_compile: TensorFlow: compile the step with XLA; PyTorch: compile
            the update (clip, optimizer, EMA) with `torch.compile` (about 15 s
            once; the forward and backward passes stay eager); JAX: always
            jitted.
        check_finite: raise a `ValueError` for non-finite numpy inputs before
            any state changes. Backend tensors are not inspected on the host;
            inside the compiled step non-finite targets are dropped from the
            loss (counted in `nonfinite_targets`) and non-finite gradients
            are replaced by zeros (`nonfinite_grads` = 1).

    Each step returns a dict of scalar backend tensors: `total`,
    `value_nll`, `ema_regularizer`, `grad_norm` (before clipping),
    `clipped_fraction` (targets outside the bucket range), `ema_value_gap`
    (mean |fast - EMA| value, symlog space), `nonfinite_targets`,
    `nonfinite_grads`.

    Example:
        >>> trainer = CriticTrainer(CriticNetwork(model_size="nano"))
        >>> metrics = trainer.train_on_dream(h, z, rewards, continues)
        >>> float(metrics["total"])
    """

    def __init__(
        self,
        critic: CriticNetwork,
        optimizer: Optional[keras.optimizers.Optimizer] = None,
        *,
        gamma: float = 0.997,
        lambda_: float = 0.95,
        grad_clip: Optional[float] = 100.0,
        learning_rate: float = 3e-5,
        epsilon: float = 1e-5,
        jit_compile: bool = False,
        check_finite: bool = True,
    ):
        if not isinstance(critic, CriticNetwork):
            raise ValueError(f"critic: got {type(critic).__name__}, expected a CriticNetwork.")
        if not critic.built:
            raise ValueError("critic: not built yet; call it once on a batch (or give its input sizes) first.")
        if optimizer is not None and not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ValueError(
                f"optimizer: got {optimizer!r}, expected a keras.optimizers.Optimizer instance or None "
                "(None: Adam with learning_rate and epsilon)."
            )
        gamma = number("gamma", gamma, low=0.0, high=1.0)
        lambda_ = number("lambda_", lambda_, low=0.0, high=1.0)
        grad_clip = number("grad_clip", grad_clip, low=0.0, low_open=True, allow_none=True)
        learning_rate = number("learning_rate", learning_rate, low=0.0, low_open=True)
        epsilon = number("epsilon", epsilon, low=0.0, low_open=True)
        for name, flag in (("jit_compile", jit_compile), ("check_finite", check_finite)):
            if not isinstance(flag, (bool, np.bool_)):
                raise ValueError(f"{name}: got {flag!r}, expected True or False.")
        self.critic = critic
        if optimizer is None:
            optimizer = keras.optimizers.Adam(learning_rate=learning_rate, epsilon=epsilon)
        if keras.config.dtype_policy().name == "mixed_float16" and not isinstance(
            optimizer, keras.optimizers.LossScaleOptimizer
        ):
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        self.optimizer = optimizer
        self.gamma = float(gamma)
        self.lambda_ = float(lambda_)
        self.grad_clip = None if grad_clip is None else float(grad_clip)
        self.jit_compile = bool(jit_compile)
        self.check_finite = bool(check_finite)
        self.optimizer.build(critic.trainable_variables)
        self.steps = keras.Variable(0, dtype="int32", trainable=False, name="critic_trainer_steps")
        self._backend = backend_module()
        self._compiled: Dict[str, Callable] = {}
        # One step at a time: a second thread gets a clear error, not a
        # half-updated state (or, on JAX, donated buffers).
        self._lock = threading.Lock()
        # The critic's forward pass; a backend may route it through its
        # data-parallel engine (PyTorch DDP).
        self._forward = critic.apply_network

    # ------------------------------------------------------------------
    # State.

    @property
    def state_variables(self):
        """Every variable a step reads or writes, in a fixed order."""
        return (
            list(self.critic.trainable_variables)
            + list(self.critic.non_trainable_variables)
            + list(self.optimizer.variables)
            + [self.steps]
        )

    def options(self) -> Dict[str, object]:
        """The trainer's own options (the slow-critic options live on the critic)."""
        return {
            "gamma": self.gamma,
            "lambda_": self.lambda_,
            "grad_clip": self.grad_clip,
            "jit_compile": self.jit_compile,
            "check_finite": self.check_finite,
        }

    def save(self, path) -> str:
        """Saves the critic (fast and EMA), optimizer slots and step counter to one `.npz`
        file that loads on any backend; returns the path written."""
        with self._lock:
            return checkpoint.save(self, path)

    def restore(self, path) -> None:
        """Restores a `save`d state, so a resumed run continues exactly where it stopped.

        Everything is checked before the first variable changes: the file's
        SHA-256 seal, its metadata, the critic's config, the trainer options
        that change the math (`gamma`, `lambda_`, `grad_clip`), the
        optimizer's class and config, and every array (keyed by variable
        path: none missing, none extra, shapes, dtypes, finite values).

        Raises:
            ValueError: naming what differs or what is damaged; nothing is
                changed then.
        """
        with self._lock:
            checkpoint.load(self, path)

    # ------------------------------------------------------------------
    # The step's math, shared by all backends.

    def _loss_parts(self, h, z, value_targets, loss_weights, fast=None, ema=None):
        """The loss from (possibly precomputed) fast and EMA outputs."""
        critic = self.critic
        value, logits = fast if fast is not None else self._forward(h, z)
        regularize = critic.ema_regularizer_weight > 0.0
        ema_value = ema_logits = None
        if regularize:
            ema_value, ema_logits = ema if ema is not None else self._forward(h, z, use_ema=True)
            ema_value, ema_logits = ops.stop_gradient(ema_value), ops.stop_gradient(ema_logits)
        losses = critic_loss(
            logits,
            value_targets,
            ema_value if regularize else ops.zeros_like(value_targets),
            loss_weights,
            num_buckets=critic.num_buckets,
            lower_bound=critic.lower_bound,
            upper_bound=critic.upper_bound,
            bin_scheme=critic.bin_scheme,
            ema_regularizer=critic.ema_regularizer if regularize else "two_hot_mean",
            ema_regularizer_weight=critic.ema_regularizer_weight,
            ema_logits=ema_logits if critic.ema_regularizer == "distribution" else None,
        )
        if regularize:
            losses["ema_value_gap"] = ops.mean(ops.abs(ops.stop_gradient(value) - ema_value))
        # Negative (or NaN) weights would turn descent into ascent: such a step is skipped.
        losses["invalid_inputs"] = ops.sum(ops.cast(ops.logical_not(loss_weights >= 0.0), "float32"))
        return losses["total"], losses

    def _dream_loss(self, h, z, rewards, continues):
        critic = self.critic
        horizon = h.shape[0]
        flat_h = ops.reshape(h, (-1, h.shape[-1]))
        flat_z = ops.reshape(z, (-1,) + tuple(z.shape[-2:]))
        value, logits = self._forward(flat_h, flat_z)
        need_ema = critic.ema_regularizer_weight > 0.0 or critic.ema_targets
        ema_value, ema_logits = self._forward(flat_h, flat_z, use_ema=True) if need_ema else (None, None)

        def time_major(x):
            return ops.reshape(x, (horizon, -1) + tuple(x.shape[1:]))

        source = ema_value if critic.ema_targets else value
        values_real = inverse_symlog(ops.stop_gradient(time_major(source)))
        targets = lambda_returns(rewards, continues, values_real, self.gamma, self.lambda_)
        weights = dream_loss_weights(continues, self.gamma)[:-1]
        fast = (time_major(value)[:-1], time_major(logits)[:-1])
        ema = (time_major(ema_value)[:-1], time_major(ema_logits)[:-1]) if need_ema else None
        total, losses = self._loss_parts(None, None, targets, weights, fast=fast, ema=ema)
        losses["value_target_mean"] = ops.mean(targets)
        outside = ops.logical_not(ops.logical_and(continues >= 0.0, continues <= 1.0))
        losses["invalid_inputs"] = losses["invalid_inputs"] + ops.sum(ops.cast(outside, "float32"))
        return total, losses

    def _loss_scale(self):
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            return self.optimizer.dynamic_scale
        return self.optimizer.loss_scale_factor

    def _scaled_loss(self, loss):
        return self.optimizer.scale_loss(loss)

    def _apply(self, grads, losses):
        """Clip, update, EMA: shared by every backend (assignments via `Variable.assign`).

        All or nothing: with non-finite gradients or invalid inputs (see
        `invalid_inputs`) the weights, the EMA copy, the optimizer's slots
        and the step counter stay as they were (`step_skipped` = 1). Under a
        loss-scale optimizer, the optimizer still sees non-finite gradients,
        so that it lowers its scale (and skips its own update).
        """
        critic = self.critic
        grads = [as_float32(g) for g in grads]
        scale = self._loss_scale()
        norm = global_norm(grads)
        if scale is not None:
            norm = norm / ops.cast(scale, "float32")
        metrics = dict(losses)
        metrics["grad_norm"] = norm
        finite = ops.isfinite(norm)
        inputs_ok = ops.equal(losses["invalid_inputs"], 0.0)
        ok = ops.logical_and(finite, inputs_ok)
        metrics["nonfinite_grads"] = 1.0 - ops.cast(finite, "float32")
        metrics["step_skipped"] = 1.0 - ops.cast(ok, "float32")
        if self.grad_clip is not None:
            # tf.clip_by_global_norm's factor (the reference's clipping).
            factor = self.grad_clip * ops.minimum(1.0 / norm, 1.0 / self.grad_clip)
            grads = [g * factor for g in grads]
        backend = self._backend

        def optimizer_step():
            backend.apply_gradients(self.optimizer, grads, critic.trainable_variables)

        def bookkeeping():
            self.steps.assign(self.steps + 1)
            if critic.ema_update_period == 1:
                critic.update_ema()
            else:
                due = ops.equal(self.steps % critic.ema_update_period, 0)
                critic.update_ema(decay=ops.where(due, critic.ema_decay, 1.0))

        optimizer_state = list(critic.trainable_variables) + list(self.optimizer.variables)
        bookkeeping_state = [self.steps] + list(critic.non_trainable_variables)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            backend.update_if(inputs_ok, optimizer_step, optimizer_state)
            backend.update_if(ok, bookkeeping, bookkeeping_state)
        else:
            backend.update_if(ok, lambda: (optimizer_step(), bookkeeping()), optimizer_state + bookkeeping_state)
        return metrics

    # ------------------------------------------------------------------
    # Input checks, outside the compiled step.

    def _inputs(self, named, lead_rank):
        """Converts to float32 and checks shapes, sizes and values before anything changes."""
        critic = self.critic
        arrays = {name: _as_float32(x, name) for name, x in named.items()}
        h_shape = tuple(arrays["h"].shape)
        if len(h_shape) != lead_rank + 1:
            axes = "[N, gru_units]" if lead_rank == 1 else "[H+1, B, gru_units]"
            raise ValueError(f"h: got shape {fmt(h_shape)}, expected {axes} with gru_units={critic.gru_units}.")
        lead = h_shape[:lead_rank]
        want = {
            "h": lead + (critic.gru_units,),
            "z": lead + (critic.num_z_categoricals, critic.num_z_classes),
        }
        for name in arrays:
            want.setdefault(name, lead)
        for name, x in arrays.items():
            if tuple(x.shape) != want[name]:
                raise ValueError(f"{name}: got shape {fmt(tuple(x.shape))}, expected {fmt(want[name])}.")
        if 0 in lead:
            raise ValueError(f"h: got shape {fmt(h_shape)}, an empty batch; expected at least one row.")
        host = {name: x for name, x in arrays.items() if isinstance(x, np.ndarray)}
        if self.check_finite:
            for name, x in host.items():
                if not np.isfinite(x).all():
                    raise ValueError(
                        f"{name}: got {int((~np.isfinite(x)).sum())} non-finite value(s) in an array of shape "
                        f"{fmt(x.shape)}, expected finite values."
                    )
        if "continues" in host and not ((host["continues"] >= 0) & (host["continues"] <= 1)).all():
            x = host["continues"]
            raise ValueError(
                f"continues: got values in [{np.nanmin(x):g}, {np.nanmax(x):g}], expected continue flags or "
                "probabilities in [0, 1]."
            )
        if "loss_weights" in host and not (host["loss_weights"] >= 0).all():
            raise ValueError(
                f"loss_weights: got {int((~(host['loss_weights'] >= 0)).sum())} negative value(s), expected "
                "weights >= 0 (a negative weight turns descent into ascent)."
            )
        return [x if keras.ops.is_tensor(x) else ops.convert_to_tensor(x) for x in arrays.values()]

    def _run(self, kind, loss_fn, named, lead_rank, batch_axis):
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                "CriticTrainer: another thread is running a step, save or restore on this trainer; "
                "one trainer takes one step at a time (use one trainer per thread, or a lock)."
            )
        try:
            if not self.critic.trainable or not self.critic.trainable_variables:
                raise ValueError(
                    "critic: has no trainable variables (critic.trainable is False); set critic.trainable = True "
                    "to train it."
                )
            batch = self._inputs(named, lead_rank)
            if kind == "dream" and batch[0].shape[0] < 2:
                raise ValueError(f"h: got shape {fmt(tuple(batch[0].shape))}, expected [H+1, B, ...] with H >= 1.")
            fn = self._compiled.get(kind)
            if fn is None:
                fn = self._compiled[kind] = self._backend.make_train_function(self, loss_fn, batch_axis)
            return fn(*batch)
        finally:
            self._lock.release()

    # ------------------------------------------------------------------
    # Public steps.

    def train_step(self, h, z, value_targets, loss_weights) -> Dict[str, object]:
        """One update from given real-space value targets.

        Args:
            h: `[N, gru_units]`.
            z: `[N, num_z_categoricals, num_z_classes]`.
            value_targets: `[N]` real-space return targets.
            loss_weights: `[N]` per-position weights.

        Returns:
            The metrics dict (see the class docstring).
        """
        named = {"h": h, "z": z, "value_targets": value_targets, "loss_weights": loss_weights}
        return self._run("direct", self._loss_parts, named, 1, 0)

    def train_on_dream(self, h, z, rewards, continues) -> Dict[str, object]:
        """One update from a dreamed trajectory batch, as RLlib's DreamerV3 learner.

        Values of all `H+1` states come from the fast critic (or the EMA
        critic with `critic.ema_targets`), stop-gradient'd and in real space;
        targets are `lambda_returns`, weights `dream_loss_weights`; the loss
        covers t < H.

        Args:
            h: `[H+1, B, gru_units]` dreamed recurrent states.
            z: `[H+1, B, num_z_categoricals, num_z_classes]`.
            rewards: `[H+1, B]` real-space rewards (`rewards[0]` unused).
            continues: `[H+1, B]` continue flags (`continues[0]` only enters
                the loss weights).

        Returns:
            The metrics dict, plus `value_target_mean`.
        """
        named = {"h": h, "z": z, "rewards": rewards, "continues": continues}
        return self._run("dream", self._dream_loss, named, 2, 1)
