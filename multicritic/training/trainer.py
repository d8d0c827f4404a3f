"""`CriticTrainer`: the critic's compiled train steps, with the step's math shared by all backends.

The math of a step (forward passes, loss, clipping, optimizer update, EMA
update) is written here once, against `keras.ops` and `Variable.assign`. How
gradients are taken and how the step is compiled is the backend contract's
(`multicritic.backend`), which sees the step only as a `StepProgram`.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Dict, Optional

import keras
import numpy as np
from keras import ops

from multicritic import backend, draws, heads
from multicritic.backend import StepProgram
from multicritic.bins import inverse_symlog
from multicritic.critic import CriticNetwork
from multicritic.layers.dispatch import call_layer
from multicritic.multi_critic import MultiCritic
from multicritic.losses import EMA_REGULARIZERS, critic_loss
from multicritic.returns import dream_loss_weights, lambda_returns, replay_lambda_returns
from multicritic.training import checkpoint, hosts
from multicritic.validation import as_float32, fmt, integer, number, real_values


def predict_function(critic: CriticNetwork, use_ema: bool = False) -> Callable:
    """A compiled forward pass `fn(h, z) -> (value_symlog, logits)` that a new batch size does not retrace.

    TensorFlow: a `tf.function` with a `[None, ...]` input signature (one
    trace). JAX: `jax.jit` over `stateless_call`, batches padded to the next
    power of two (>= 8), so at most one compilation per power of two.
    PyTorch: the eager forward under `torch.no_grad()`. Inputs are converted
    to float32 and checked like `critic(h, z)`.
    """
    run = backend.current().make_predict_function(critic, bool(use_ema))

    def predict(h, z):
        h, z = ops.convert_to_tensor(_as_float32(h, "h")), ops.convert_to_tensor(_as_float32(z, "z"))
        critic._check_inputs(h.shape, z.shape)
        return run(h, z)

    predict.compiled = getattr(run, "compiled", None)
    return predict


def _nonfinite(x):
    """1.0 when `x` holds a non-finite value, else 0.0: from its sum (one cheap reduction; a count of
    non-finite entries costs several passes). Finite states so large that their sum overflows (|x| near
    float32's limit) count as non-finite too."""
    return 1.0 - ops.cast(ops.isfinite(ops.sum(x)), "float32")


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


def _as_float32(x, name="x"):
    """Host data as a float32 numpy array (its values are checked on the host), tensors as float32 tensors
    cut from any autograd graph they carry (nothing outside the critic may receive gradients)."""
    x = real_values(name, x)
    if isinstance(x, np.ndarray):
        return x.astype(np.float32, copy=False)
    return backend.current().detached(as_float32(x))


class CriticTrainer:
    """Trains a `CriticNetwork` with one compiled step per call, on any backend.

    Each step does, as one compiled function (`tf.function`, `jax.jit` over a
    stateless step, or PyTorch autograd with optional `torch.compile`): the
    fast and EMA forward passes, `critic_loss`, gradients of the fast weights
    only, global-norm clipping, the optimizer update, then the EMA update
    (every `ema_update_period` steps). After each call the critic's
    and optimizer's variables hold the new values on every backend.

    The critic holds the model (architecture, head, members, the EMA decay);
    how it is trained is set here. An ensemble (`critic.ensemble_size > 1`)
    is trained as K critics at once: targets come from the aggregate of the
    members' values (`critic.aggregation`; `"members"`: each member its own),
    every member is regularised towards its own EMA copy, and the loss is the
    mean of the members' losses.

    Args:
        critic: a built `CriticNetwork`.
        optimizer: a Keras optimizer; default Keras `Adam(learning_rate,
            epsilon=epsilon)`, the reference's. Under the `mixed_float16`
            policy it is wrapped in a `keras.optimizers.LossScaleOptimizer`.
            Clipping is done here: one that clips on its own (`clipnorm`,
            `clipvalue`, `global_clipnorm`) is refused unless `grad_clip=None`.
        gamma: discount for lambda-returns and dream loss weights.
        lambda_: TD(lambda) parameter.
        grad_clip: global-norm clip (100 in the reference); `None` for none.
        ema_update_period: update the EMA every this many optimizer steps.
        ema_update_first: with a period above 1, update at the first step
            of each period (steps 1, 1 + period, ...: the official code's
            slow critic `every`) instead of its last (period, 2 * period,
            ...: RLlib's).
        ema_regularizer_weight: weight of the slow-critic regulariser in the
            loss (1.0 in the reference).
        ema_regularizer: `"two_hot_mean"` (cross-entropy to the head's
            target encoding of the EMA critic's value, the reference) or
            `"distribution"` (cross-entropy to the EMA critic's bucket
            distribution).
        ema_targets: compute lambda-return targets from the EMA critic's
            values instead of the fast critic's.
        seed: seed of the member draws of `aggregation="min_of_random"`; the
            members drawn at a step are a function of the seed and the step
            count (no random state to carry or checkpoint).
        learning_rate: of the default Adam (3e-5).
        epsilon: of the default Adam (1e-5).
        jit_compile: True, False or `"auto"` (the default: each backend's
            faster choice). TensorFlow: compile the `tf.function` step with
            XLA (`"auto"`: no XLA). PyTorch: compile the whole step with
            `torch.compile` (two graphs, no host sync: the loss with its
            backward, and the update; CUDA graphs on a GPU); `"auto"` runs
            a step kind's first 1000 calls eagerly (about what a compilation
            costs), then compiles it (see
            `multicritic.backend.torch.TrainFunction`). JAX: always jitted.
        check_finite: raise a `ValueError` for non-finite numpy inputs before
            any state changes. Backend tensors are not inspected on the host;
            inside the compiled step non-finite targets are dropped from the
            loss (counted in `nonfinite_targets`), and a batch with
            non-finite gradients (`nonfinite_grads` = 1) or invalid inputs
            (`invalid_inputs` > 0: negative weights, continues outside
            [0, 1], non-finite states) is skipped whole (`step_skipped` = 1).

    Each step returns a dict of scalar backend tensors: `total`,
    `value_nll`, `ema_regularizer`, `grad_norm` (before clipping),
    `clipped_fraction` (targets outside the bucket range), `ema_value_gap`
    (mean |fast - EMA| value, symlog space), `nonfinite_targets`,
    `nonfinite_grads`, `invalid_inputs`, `step_skipped`; an ensemble adds
    `member_spread`, and a `MultiCritic` each stream's metrics as
    `"stream/name"` (with its normaliser's batch statistics, e.g.
    `return_low` / `return_high`).

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
        ema_update_period: int = 1,
        ema_update_first: bool = False,
        ema_regularizer_weight: float = 1.0,
        ema_regularizer: str = "two_hot_mean",
        ema_targets: bool = False,
        seed: Optional[int] = None,
        learning_rate: float = 3e-5,
        epsilon: float = 1e-5,
        jit_compile="auto",
        check_finite: bool = True,
        step_counter: Optional[keras.Variable] = None,
        value_loss_weight: float = 1.0,
        replay_loss_weight: float = 0.3,
        replay_discount: float = 1.0 - 1.0 / 333,
    ):
        if not isinstance(critic, (CriticNetwork, MultiCritic)):
            raise ValueError(f"critic: got {type(critic).__name__}, expected a CriticNetwork or a MultiCritic.")
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
        if grad_clip is not None and optimizer is not None:
            for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
                for name in ("clipnorm", "clipvalue", "global_clipnorm"):
                    if getattr(opt, name, None) is not None:
                        raise ValueError(
                            f"optimizer: got a {type(opt).__name__} with {name}={getattr(opt, name)!r} and "
                            f"grad_clip={grad_clip!r}, expected one clipping: an optimizer without {name} (the "
                            "step clips the global norm to grad_clip), or grad_clip=None."
                        )
        learning_rate = number("learning_rate", learning_rate, low=0.0, low_open=True)
        epsilon = number("epsilon", epsilon, low=0.0, low_open=True)
        ema_update_period = integer("ema_update_period", ema_update_period)
        ema_regularizer_weight = number("ema_regularizer_weight", ema_regularizer_weight, low=0.0)
        value_loss_weight = number("value_loss_weight", value_loss_weight, low=0.0)
        replay_loss_weight = number("replay_loss_weight", replay_loss_weight, low=0.0)
        replay_discount = number("replay_discount", replay_discount, low=0.0, high=1.0)
        if not isinstance(ema_regularizer, str) or ema_regularizer not in EMA_REGULARIZERS:
            raise ValueError(f"ema_regularizer: got {ema_regularizer!r}, expected one of {list(EMA_REGULARIZERS)}.")
        for member in (critic.streams.values() if isinstance(critic, MultiCritic) else [critic]):
            if ema_regularizer not in heads.get(member.head).regularizers:
                raise ValueError(
                    f"ema_regularizer: got {ema_regularizer!r} with the critic's head={member.head!r}, expected one of "
                    f"{list(heads.get(member.head).regularizers)}."
                )
        if seed is not None:
            seed = integer("seed", seed, low=0, high=2**32 - 1)
        if not (isinstance(jit_compile, (bool, np.bool_)) or (isinstance(jit_compile, str) and jit_compile == "auto")):
            raise ValueError(f"jit_compile: got {jit_compile!r}, expected True, False or 'auto'.")
        for name, flag in (("check_finite", check_finite), ("ema_targets", ema_targets),
                           ("ema_update_first", ema_update_first)):
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
        # (`multicritic.draws`), so draws need no state of their own and a resumed run draws what the whole
        # run would have. Streams draw apart: each its own offset of the seed.
        draw_seed = int(np.random.default_rng().integers(0, 2**31)) if seed is None else seed
        self.draw_seeds = {}
        for stream, member in self._critics().items():
            if member.ensemble_size > 1 and member.aggregation == "min_of_random":
                self.draw_seeds[stream] = draws.as_int32((draw_seed + len(self.draw_seeds)) % 2**32)
        self._backend = backend.current()
        self._compiled: Dict[str, Callable] = {}
        # One step at a time: a second thread gets a clear error, not a
        # half-updated state (or, on JAX, donated buffers).
        self._lock = threading.Lock()
        # On several hosts, every host must build this same trainer: checked before the first collective
        # (PyTorch: DDP's weight broadcast, next).
        if hosts.topology(self.state_variables)[1] > 1:
            hosts.agree("CriticTrainer", hosts.fingerprint(self), self.state_variables)
        # The critic's forward pass; a backend may route it through its
        # data-parallel engine (PyTorch DDP).
        self._forward = self._backend.forward_function(critic) or functools.partial(call_layer, critic)

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
        }

    def save(self, path) -> str:
        """Saves the critic (fast and EMA), optimizer slots and step counter to one `.npz`
        file that loads on any backend; returns the path written.

        On several hosts (`multicritic.training.hosts`) every host calls it
        and host 0 alone writes the file; the others wait until it is written.
        """
        with self._lock:
            return hosts.save(self, path)

    def restore(self, path) -> Dict[str, object]:
        """Restores a `save`d state, so a resumed run continues exactly where it stopped.

        Everything is checked before the first variable changes: the file's
        SHA-256 seal, its metadata, the critic's config, the trainer options
        that change the math (`gamma`, `lambda_`, `grad_clip`), the
        optimizer's class and config, and every array (keyed by variable
        path: none missing, none extra, shapes, dtypes, finite values).

        On several hosts every host calls it with the same file (a shared file
        system, or a copy of it): the hosts compare the files' SHA-256 before
        any of them assigns. A checkpoint saved on another number of hosts
        restores, with a warning saying so.

        Returns:
            `{"step": the restored step count, "saved_on_hosts": ...,
            "hosts": ...}` (see `multicritic.training.hosts.restore`).

        Raises:
            ValueError: naming what differs or what is damaged (on any host);
                nothing is changed then, on any host.
        """
        with self._lock:
            return hosts.restore(self, path)

    # ------------------------------------------------------------------
    # The step's math, shared by all backends.

    @staticmethod
    def _like(x, value):
        """`x [...]` repeated to an ensemble's `value [K, ...]` (targets and weights shared by the members)."""
        return x if len(x.shape) == len(value.shape) else _repeat(x, value.shape[0], axis=0)

    # The step's math works on named critics: `{None: critic}` for one
    # critic, the streams of a `MultiCritic`.

    def _critics(self) -> Dict[Optional[str], CriticNetwork]:
        return self.critic.streams if isinstance(self.critic, MultiCritic) else {None: self.critic}

    def _outputs(self, h, z, use_ema=False):
        out = self._forward(h, z, use_ema=use_ema)
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
            metrics[count] = sum(losses[count] for losses in per_stream.values())
        return metrics["total"], metrics

    def _critic_losses(self, critic, fast, ema, value_targets, loss_weights):
        """One critic's loss from its fast and EMA outputs (an ensemble's `[K, ...]`)."""
        value, logits = fast
        regularize = self.ema_regularizer_weight > 0.0
        ema_value = ema_logits = None
        if regularize:
            ema_value, ema_logits = ops.stop_gradient(ema[0]), ops.stop_gradient(ema[1])
        targets = self._like(value_targets, value)
        losses = critic_loss(
            logits,
            targets,
            ema_value if regularize else ops.zeros_like(targets),
            self._like(loss_weights, value),
            ema_regularizer=self.ema_regularizer if regularize else "two_hot_mean",
            ema_regularizer_weight=self.ema_regularizer_weight,
            ema_logits=ema_logits if self.ema_regularizer == "distribution" else None,
            **critic.loss_options(),
        )
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
        critics = self._critics()
        if not any(c.mlp.clips_inputs for c in critics.values()):
            return _nonfinite(fast[next(iter(critics))][0])
        return _nonfinite(h) + _nonfinite(z)

    def _loss_parts(self, h, z, value_targets, loss_weights):
        fast = self._outputs(h, z)
        ema = self._outputs(h, z, use_ema=True) if self.ema_regularizer_weight > 0.0 else {}
        targets = value_targets if isinstance(value_targets, dict) else {None: value_targets}
        total, losses = self._combine(
            {s: self._critic_losses(c, fast[s], ema.get(s), targets[s], loss_weights) for s, c in self._critics().items()}
        )
        losses["invalid_inputs"] = losses["invalid_inputs"] + self._invalid_states(fast, h, z)
        return total, losses

    def _dream_losses(self, stream, critic, fast, ema, horizon, rewards, continues):
        """One critic's dream loss from its outputs on the flattened `[(H+1) * B]` states, and the
        lambda-return from each start state (`[B]`, per member `[K, B]`), which replay returns bootstrap from."""
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
        losses["value_target_mean"] = ops.mean(targets)
        if isinstance(self.critic, MultiCritic):
            # The stream's return statistics over the whole (data-parallel: gathered) batch.
            normalizer = self.critic.normalizers[stream]
            losses.update(normalizer.statistics(self._backend.all_gather(ops.stop_gradient(targets))))
        return losses, ops.stop_gradient(targets[:, 0] if per_member else targets[0])

    def _aggregate(self, stream, critic, values):
        """`critic.aggregate`, drawing "min_of_random" members from (seed, step count)."""
        if stream not in self.draw_seeds:
            return critic.aggregate(values)
        return critic.aggregate(values, seed=(self.draw_seeds[stream], ops.cast(self.steps, "int32")))

    def _flat_outputs(self, h, z, need_ema):
        """Fast (and EMA: `{}` when not `need_ema`) outputs on time-major states `[L, B, ...]`, flattened."""
        flat_h = ops.reshape(h, (-1, h.shape[-1]))
        flat_z = ops.reshape(z, (-1,) + tuple(z.shape[-2:]))
        return self._outputs(flat_h, flat_z), (self._outputs(flat_h, flat_z, use_ema=True) if need_ema else {})

    def _dream_loss(self, h, z, rewards, continues):
        return self._dream_parts(h, z, rewards, continues)[:2]

    def _dream_parts(self, h, z, rewards, continues):
        """`(total, metrics, {stream: start returns})` of a dream batch."""
        horizon = h.shape[0]
        fast, ema = self._flat_outputs(h, z, self.ema_regularizer_weight > 0.0 or self.ema_targets)
        rewards = rewards if isinstance(rewards, dict) else {None: rewards}
        per_stream = {
            s: self._dream_losses(s, c, fast[s], ema.get(s), horizon, rewards[s], continues)
            for s, c in self._critics().items()
        }
        total, losses = self._combine({s: parts[0] for s, parts in per_stream.items()})
        outside = ops.logical_not(ops.logical_and(continues >= 0.0, continues <= 1.0))
        invalid = ops.sum(ops.cast(outside, "float32")) + self._invalid_states(fast, h, z)
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
                _repeat(rewards, k, -1), _repeat(is_last, k, -1), _repeat(is_terminal, k, -1),
                ops.moveaxis(boot, 0, -1), self.replay_discount, self.lambda_,
            )
            targets = ops.moveaxis(targets, -1, 0)
        else:
            targets = replay_lambda_returns(rewards, is_last, is_terminal, boot, self.replay_discount, self.lambda_)
        fast = (before_last(value), before_last(logits))
        if ema is not None:
            ema = (before_last(ema[0]), before_last(ema[1]))
        losses = self._critic_losses(critic, fast, ema, targets, 1.0 - is_last[:-1])
        losses["value_target_mean"] = ops.mean(targets)
        return losses

    def _dream_and_replay_loss(self, h, z, rewards, continues, replay_h, replay_z, replay_rewards, is_last, is_terminal):
        total, losses, starts = self._dream_parts(h, z, rewards, continues)
        length = replay_h.shape[0]
        fast, ema = self._flat_outputs(replay_h, replay_z, self.ema_regularizer_weight > 0.0)
        replay_rewards = replay_rewards if isinstance(replay_rewards, dict) else {None: replay_rewards}
        per_stream = {}
        for stream, critic in self._critics().items():
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
        losses["nonfinite_targets"] = losses["nonfinite_targets"] + replay["nonfinite_targets"]
        total = total + self.replay_loss_weight * replay_total
        losses["total"] = total
        return total, losses

    def _loss_scale(self):
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            return self.optimizer.dynamic_scale
        return self.optimizer.loss_scale_factor

    def _program(self, loss_fn) -> StepProgram:
        return StepProgram(
            trainable=list(self.critic.trainable_variables),
            state=self.state_variables,
            loss=loss_fn,
            scale_loss=self.optimizer.scale_loss,
            apply=self._apply,
            jit_compile=self.jit_compile,
            private=list(self.optimizer.variables),
            loss_scaled=isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer),
        )

    def _apply(self, grads, losses):
        """Clip, update, EMA: shared by every backend (assignments via `Variable.assign`).

        All or nothing: with non-finite gradients or invalid inputs (see
        `invalid_inputs`) the weights, the EMA copy, the optimizer's slots
        and the step counter stay as they were (`step_skipped` = 1). Under a
        loss-scale optimizer, the optimizer still sees non-finite gradients,
        so that it lowers its scale (and skips its own update).
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
            if isinstance(critic, MultiCritic):
                for stream, normalizer in critic.normalizers.items():
                    names = normalizer.statistic_names
                    if names and all(f"{stream}/{n}" in metrics for n in names):
                        normalizer.update_from({n: metrics[f"{stream}/{n}"] for n in names})
            for member in self._critics().values():
                if period == 1:
                    member.update_ema()
                else:
                    due = ops.equal((self.steps - (1 if self.ema_update_first else 0)) % period, 0)
                    member.update_ema(decay=ops.where(due, member.ema_decay, 1.0))

        optimizer_state = list(trainable) + list(self.optimizer.variables)
        bookkeeping_state = [self.steps] + list(critic.non_trainable_variables)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            backend.update_if(inputs_ok, optimizer_step, optimizer_state)
            backend.update_if(ok, bookkeeping, bookkeeping_state)
        else:
            backend.update_if(ok, lambda: (optimizer_step(), bookkeeping()), optimizer_state + bookkeeping_state)
        return metrics

    # ------------------------------------------------------------------
    # Input checks, outside the compiled step.

    def _inputs(self, named, lead_rank, prefix=""):
        """Converts to float32 and checks shapes, sizes and values before anything changes (the states are
        `prefix + "h"` and `prefix + "z"`)."""
        critic = self.critic
        arrays = {name: _as_float32(x, name) for name, x in named.items()}
        h_name, z_name = prefix + "h", prefix + "z"
        h_shape = tuple(arrays[h_name].shape)
        if len(h_shape) != lead_rank + 1:
            axes = "[N, gru_units]" if lead_rank == 1 else "[H+1, B, gru_units]" if not prefix else "[T, B, gru_units]"
            raise ValueError(f"{h_name}: got shape {fmt(h_shape)}, expected {axes} with gru_units={critic.gru_units}.")
        lead = h_shape[:lead_rank]
        want = {
            h_name: lead + (critic.gru_units,),
            z_name: lead + (critic.num_z_categoricals, critic.num_z_classes),
        }
        for name in arrays:
            want.setdefault(name, lead)
        for name, x in arrays.items():
            if tuple(x.shape) != want[name]:
                raise ValueError(f"{name}: got shape {fmt(tuple(x.shape))}, expected {fmt(want[name])}.")
        if 0 in lead:
            raise ValueError(f"{h_name}: got shape {fmt(h_shape)}, an empty batch; expected at least one row.")
        host = {name: x for name, x in arrays.items() if isinstance(x, np.ndarray)}
        if self.check_finite:
            for name, x in host.items():
                if not np.isfinite(x).all():
                    raise ValueError(
                        f"{name}: got {int((~np.isfinite(x)).sum())} non-finite value(s) in an array of shape "
                        f"{fmt(x.shape)}, expected finite values."
                    )
        for flag in ("replay_is_last", "replay_is_terminal"):
            if flag in host and not np.isin(host[flag], (0.0, 1.0)).all():
                raise ValueError(f"{flag}: got values other than 0 and 1, expected flags.")
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

    def _run(self, kind, loss_fn, named, lead_rank, batch_axis, replay=None):
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
            if kind != "direct" and batch[0].shape[0] < 2:
                raise ValueError(f"h: got shape {fmt(tuple(batch[0].shape))}, expected [H+1, B, ...] with H >= 1.")
            if replay is not None:
                replay_batch = self._inputs(replay, 2, prefix="replay_")
                length, size = replay_batch[0].shape[0], replay_batch[0].shape[1]
                if length < 2:
                    raise ValueError(f"replay_h: got shape {fmt(tuple(replay_batch[0].shape))}, expected [T, B, ...] "
                                     "with T >= 2.")
                if batch[0].shape[1] != length * size:
                    raise ValueError(
                        f"h: got {batch[0].shape[1]} dreams for a replay batch of shape [T, B] = [{length}, {size}], "
                        f"expected T * B = {length * size} (one dream from each replay step, dream b * T + t "
                        "starting at replay step t of sequence b)."
                    )
                batch = batch + replay_batch
            fn = self._compiled.get(kind)
            if fn is None:
                fn = self._compiled[kind] = self._backend.make_train_function(self._program(loss_fn), batch_axis)
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
            value_targets: `[N]` real-space return targets (a `MultiCritic`:
                `{stream: [N]}`).
            loss_weights: `[N]` per-position weights.

        Returns:
            The metrics dict (see the class docstring).
        """
        named = {"h": h, "z": z, **self._per_stream("value_targets", value_targets), "loss_weights": loss_weights}

        def loss(h, z, *rest):
            return self._loss_parts(h, z, self._streams_of(rest[:-1]), rest[-1])

        return self._run("direct", loss, named, 1, 0)

    def train_on_dream(self, h, z, rewards, continues) -> Dict[str, object]:
        """One update from a dreamed trajectory batch, as RLlib's DreamerV3 learner.

        Values of all `H+1` states come from the fast critic (or the EMA
        critic with `ema_targets`), stop-gradient'd and in real space;
        targets are `lambda_returns`, weights `dream_loss_weights`; the loss
        covers t < H.

        Args:
            h: `[H+1, B, gru_units]` dreamed recurrent states.
            z: `[H+1, B, num_z_categoricals, num_z_classes]`.
            rewards: `[H+1, B]` real-space rewards (`rewards[0]` unused); a
                `MultiCritic`: `{stream: [H+1, B]}`.
            continues: `[H+1, B]` continue flags (`continues[0]` only enters
                the loss weights).

        Returns:
            The metrics dict, plus `value_target_mean`.
        """
        named = {"h": h, "z": z, **self._per_stream("rewards", rewards), "continues": continues}

        def loss(h, z, *rest):
            return self._dream_loss(h, z, self._streams_of(rest[:-1]), rest[-1])

        return self._run("dream", loss, named, 2, 1)

    def train_on_dream_and_replay(
        self, h, z, rewards, continues, replay_h, replay_z, replay_rewards, replay_is_last, replay_is_terminal
    ) -> Dict[str, object]:
        """One update from dreams and the replayed trajectories they start from, as the official 2024 agent.

        The dream loss is `train_on_dream`'s (scaled by `value_loss_weight`);
        the replay value loss (`repval`, scaled by `replay_loss_weight`)
        trains the critic on the replayed states towards
        `replay_lambda_returns`, bootstrapped from the dreams' returns: dream
        `j = b * T + t` starts at replay step `t` of sequence `b`, and its
        lambda-return from the start is that step's bootstrap. Steps with
        `replay_is_last` get weight 0; the slow-critic regulariser applies to
        both losses.

        Args:
            h: as `train_on_dream`, with `B * T` dreams.
            z: as `train_on_dream`, with `B * T` dreams.
            rewards: as `train_on_dream`, with `B * T` dreams.
            continues: as `train_on_dream`, with `B * T` dreams.
            replay_h: `[T, B, gru_units]` replayed recurrent states.
            replay_z: `[T, B, num_z_categoricals, num_z_classes]`.
            replay_rewards: `[T, B]` (a `MultiCritic`: `{stream: [T, B]}`).
            replay_is_last: `[T, B]` episode-boundary flags (0 or 1).
            replay_is_terminal: `[T, B]` terminal flags (0 or 1).

        Returns:
            The metrics dict of `train_on_dream`, plus the replay loss's as
            `"repval/..."`; `total` is the weighted sum.

        Reference:
            The DreamerV3 code's `repl_loss` (github.com/danijar/dreamerv3, 2024).
        """
        named = {"h": h, "z": z, **self._per_stream("rewards", rewards), "continues": continues}
        replay = {"replay_h": replay_h, "replay_z": replay_z, **self._per_stream("replay_rewards", replay_rewards),
                  "replay_is_last": replay_is_last, "replay_is_terminal": replay_is_terminal}
        streams = 1 if not isinstance(self.critic, MultiCritic) else len(self.critic.stream_names)

        def loss(h, z, *rest):
            dream, replayed = rest[: streams + 1], rest[streams + 1 :]
            return self._dream_and_replay_loss(
                h, z, self._streams_of(dream[:-1]), dream[-1], replayed[0], replayed[1],
                self._streams_of(replayed[2:-2]), replayed[-2], replayed[-1],
            )

        return self._run("dream_replay", loss, named, 2, 1, replay=replay)

    def _per_stream(self, name, value):
        """`{name: value}`, or for a `MultiCritic` `{"name/stream": value[stream]}` for every stream."""
        if not isinstance(self.critic, MultiCritic):
            if isinstance(value, dict):
                raise ValueError(f"{name}: got a dict, expected one array (the critic has one reward stream).")
            return {name: value}
        streams = self.critic.stream_names
        if not isinstance(value, dict) or sorted(value) != sorted(streams):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"{name}: got {got}, expected a dict with one array per stream {streams}.")
        return {f"{name}/{s}": value[s] for s in streams}

    def _streams_of(self, tensors):
        if not isinstance(self.critic, MultiCritic):
            return tensors[0]
        return dict(zip(self.critic.stream_names, tensors))
