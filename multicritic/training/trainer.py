"""`CriticTrainer`: the critic's compiled train steps, their input checks, and its checkpoints.

The math of a step (forward passes, loss, clipping, optimizer update, EMA
update) is `multicritic.training.step`'s, written once against `keras.ops`
and `Variable.assign`. How gradients are taken and how the step is compiled
is the backend contract's (`multicritic.backend`), which sees the step only
as a `StepProgram`.
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, Optional

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract as backend
from multicritic.model.critic import CriticNetwork
from multicritic.protocols import CriticLike
from multicritic.training import hosts
from multicritic.training.step import CriticStep, is_multi_critic
from multicritic.validation import as_float32, fmt, real_values


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
        critic.check_inputs(h.shape, z.shape)
        return run(h, z)

    predict.compiled = getattr(run, "compiled", None)
    return predict


def _as_float32(x, name="x"):
    """Host data as a float32 numpy array (its values are checked on the host), tensors as float32 tensors
    cut from any autograd graph they carry (nothing outside the critic may receive gradients)."""
    x = real_values(name, x)
    if isinstance(x, np.ndarray):
        return x.astype(np.float32, copy=False)
    return backend.current().detached(as_float32(x))


class CriticTrainer(CriticStep):
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
        **options: the trainer's options by keyword, each one of
            `TrainerOptions` (its defaults and what each does): `gamma`,
            `lambda_`, `grad_clip`, the EMA's `ema_update_period`,
            `ema_update_first`, `ema_regularizer`, `ema_regularizer_weight`,
            `ema_targets`, `seed`, the default Adam's `learning_rate` and
            `epsilon`, `jit_compile`, `check_finite`, `metrics`, ...

    Each step returns a dict of scalar backend tensors: `total`,
    `value_nll`, `ema_regularizer`, `grad_norm` (before clipping),
    `clipped_fraction` (targets outside the bucket range), `ema_value_gap`
    (mean |fast - EMA| value, symlog space), `nonfinite_targets`,
    `nonfinite_grads`, `invalid_inputs`, `step_skipped`; an ensemble adds
    `member_spread`, and a `MultiCritic` each stream's metrics as
    `"stream/name"` (with its normaliser's batch statistics, e.g.
    `return_low` / `return_high`). `metrics="core"` returns only `total`,
    `grad_norm` and `step_skipped` (with a `MultiCritic`'s normaliser
    statistics): every diagnostic is a reduction or an output of its own, a
    kernel or a copy each on a GPU, and a step that does not log them need
    not pay for them. The update is the same either way: the guards still
    run, and a negative weight or a non-finite state then skips the step
    through its non-finite gradients.

    Examples:
        >>> trainer = CriticTrainer(CriticNetwork(model_size="nano"))
        >>> metrics = trainer.train_on_dream(h, z, rewards, continues)
        >>> float(metrics["total"])
    """

    def __init__(self, critic: CriticNetwork, optimizer: Optional[keras.optimizers.Optimizer] = None, **options):
        if not isinstance(critic, CriticLike):
            raise ValueError(
                f"critic: got {type(critic).__name__}, expected a CriticNetwork or a MultiCritic "
                "(a multicritic.protocols.CriticLike)."
            )
        super().__init__(critic, optimizer, **options)
        self._compiled: Dict[str, Callable] = {}
        self._agreed_batches: Dict[str, dict] = {}  # per step kind, the batch shapes every host last agreed on
        # One step at a time: a second thread gets a clear error, not a
        # half-updated state (or, on JAX, donated buffers).
        self._lock = threading.Lock()

    # ------------------------------------------------------------------
    # Checkpoints.

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
        step_input = backend.current().step_input
        return [x if keras.ops.is_tensor(x) else step_input(x) for x in arrays.values()]

    def _run(self, kind, loss_fn, named, lead_rank, batch_axis, replay=None):
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                "CriticTrainer: another thread is running a step, save or restore on this trainer; "
                "one trainer takes one step at a time (use one trainer per thread, or a lock)."
            )
        try:
            fn = self._compiled.get(kind)
            # (The trainable variables are listed, a walk over the critic's layers, once per step kind.)
            if not self.critic.trainable or (fn is None and not self.critic.trainable_variables):
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
                    raise ValueError(
                        f"replay_h: got shape {fmt(tuple(replay_batch[0].shape))}, expected [T, B, ...] with T >= 2."
                    )
                if batch[0].shape[1] != length * size:
                    raise ValueError(
                        f"h: got {batch[0].shape[1]} dreams for a replay batch of shape [T, B] = [{length}, {size}], "
                        f"expected T * B = {length * size} (one dream from each replay step, dream b * T + t "
                        "starting at replay step t of sequence b)."
                    )
                batch = batch + replay_batch
            if self.host_count > 1:
                shapes = {name: tuple(x.shape) for name, x in zip((*named, *(replay or ())), batch)}
                if self._agreed_batches.get(kind) != shapes:
                    hosts.agree_batch(kind, shapes, batch_axis, self.state_variables)
                    self._agreed_batches[kind] = shapes
            if fn is None:
                fn = self._compiled[kind] = backend.current().make_train_function(self.program(loss_fn), batch_axis)
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
            return self.loss_parts(h, z, self._streams_of(rest[:-1]), rest[-1])

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
            return self.dream_loss(h, z, self._streams_of(rest[:-1]), rest[-1])

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
        replay = {
            "replay_h": replay_h,
            "replay_z": replay_z,
            **self._per_stream("replay_rewards", replay_rewards),
            "replay_is_last": replay_is_last,
            "replay_is_terminal": replay_is_terminal,
        }
        streams = len(self.critic.stream_critics())

        def loss(h, z, *rest):
            dream, replayed = rest[: streams + 1], rest[streams + 1 :]
            return self.dream_and_replay_loss(
                h,
                z,
                self._streams_of(dream[:-1]),
                dream[-1],
                replayed[0],
                replayed[1],
                self._streams_of(replayed[2:-2]),
                replayed[-2],
                replayed[-1],
            )

        return self._run("dream_replay", loss, named, 2, 1, replay=replay)

    def _per_stream(self, name, value):
        """`{name: value}`, or for a `MultiCritic` `{"name/stream": value[stream]}` for every stream."""
        if not is_multi_critic(self.critic):
            if isinstance(value, dict):
                raise ValueError(f"{name}: got a dict, expected one array (the critic has one reward stream).")
            return {name: value}
        streams = self.critic.stream_names
        if not isinstance(value, dict) or sorted(value) != sorted(streams):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"{name}: got {got}, expected a dict with one array per stream {streams}.")
        return {f"{name}/{s}": value[s] for s in streams}

    def _streams_of(self, tensors):
        if not is_multi_critic(self.critic):
            return tensors[0]
        return dict(zip(self.critic.stream_names, tensors))
