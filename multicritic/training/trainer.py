"""`CriticTrainer`: the critic's compiled train steps, their input checks, and its checkpoints.

The math of a step (forward passes, loss, clipping, optimizer update, EMA
update) is `multicritic.training.step`'s, written once against `keras.ops`
and `Variable.assign`. How gradients are taken and how the step is compiled
is the backend contract's (`multicritic.backend`), which sees the step only
as a `StepProgram`.
"""

from __future__ import annotations

import inspect
import threading
from typing import Callable, Dict, Optional, Sequence

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract as backend
from multicritic.model.critic import CriticNetwork
from multicritic.model.options import FEATURES
from multicritic.protocols import CriticLike
from multicritic.training import hosts
from multicritic.training.step import CriticStep, h_and_z, is_multi_critic, task_count
from multicritic.validation import as_float32, dtype_name, fmt, real_values, static_shape


def predict_function(critic: CriticNetwork, use_ema: bool = False) -> Callable:
    """A compiled forward pass `fn(h, z) -> (value_symlog, logits)` (a features critic: `fn(x)`) that a new
    batch size does not retrace.

    TensorFlow: a `tf.function` with a `[None, ...]` input signature (one
    trace). JAX: `jax.jit` over `stateless_call`, batches padded to the next
    power of two (>= 8), so at most one compilation per power of two.
    PyTorch: the eager forward under `torch.no_grad()`. Inputs are converted
    to float32 and checked like `critic(h, z)`, with one batch axis.
    """
    run = backend.current().make_predict_function(critic, bool(use_ema))
    names = tuple(critic.input_row_shapes())

    def predict(*inputs):
        if len(inputs) != len(names):
            raise ValueError(f"inputs: got {len(inputs)}, expected {len(names)}: predict({', '.join(names)}).")
        inputs = [ops.convert_to_tensor(_as_float32(x, name)) for name, x in zip(names, inputs)]
        critic.check_inputs(*[x.shape for x in inputs])
        return run(*inputs)

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

    Each entry takes numpy arrays, the backend's tensors or another framework's arrays (JAX, PyTorch,
    TensorFlow: anything with `__dlpack__`, imported by DLPack; `multicritic.backend.foreign`), the last with
    the values the same data gives as numpy.

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

    A features critic (`CriticNetwork(input_size=D)`) is trained by the same
    entries with its one input `x` where an `(h, z)` critic's take `h, z`
    (one positional argument fewer, or by name: `x=`, `replay_x=`).

    Examples:
        >>> trainer = CriticTrainer(CriticNetwork(model_size="nano"))
        >>> metrics = trainer.train_on_dream(h, z, rewards, continues)
        >>> float(metrics["total"])
        >>> features = CriticTrainer(CriticNetwork(input_size=8, model_size="nano"))
        >>> metrics = features.train_step(observations, returns, weights)  # observations [N, 8]
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

    @property
    def compilations(self) -> Dict[str, list]:
        """Every compilation inside a train call so far, per step kind (`"train_step"`, `"train_on_dream"`,
        ...): `multicritic.backend.contract.Compilation`s with the call they happened in, the batch signature,
        the form and the seconds. With the defaults on a CPU each is the first call of its batch signature:
        `jit_compile="auto"` never compiles further in the middle of a run there."""
        return {kind: list(getattr(fn, "compilations", ())) for kind, fn in self._compiled.items()}

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
        """Converts to float32 and checks shapes, sizes and values before anything changes (the states are the
        critic's inputs, `prefix + "h"` and `prefix + "z"`, or a features critic's `prefix + "x"`)."""
        critic = self.critic
        arrays = {name: _as_float32(x, name) for name, x in named.items()}
        rows = {prefix + name: row for name, row in critic.input_row_shapes().items()}
        first = next(iter(rows))
        first_shape = tuple(arrays[first].shape)
        if len(first_shape) != lead_rank + 1:
            size = "input_size" if critic.input_layout == FEATURES else "gru_units"
            lead = "[N" if lead_rank == 1 else "[H+1, B" if not prefix else "[T, B"
            raise ValueError(
                f"{first}: got shape {fmt(first_shape)}, expected {lead}, {size}] with {size}={getattr(critic, size)}."
            )
        lead = first_shape[:lead_rank]
        want = {name: lead + tuple(row) for name, row in rows.items()}
        for name in arrays:
            want.setdefault(name, lead)
        for name, x in arrays.items():
            if tuple(x.shape) != want[name]:
                raise ValueError(f"{name}: got shape {fmt(tuple(x.shape))}, expected {fmt(want[name])}.")
        if 0 in lead:
            raise ValueError(f"{first}: got shape {fmt(first_shape)}, an empty batch; expected at least one row.")
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
            first = next(iter(named))  # `h`, or a features critic's `x`
            if kind != "direct" and batch[0].shape[0] < 2:
                raise ValueError(
                    f"{first}: got shape {fmt(tuple(batch[0].shape))}, expected [H+1, B, ...] with H >= 1."
                )
            if replay is not None:
                replay_batch = self._inputs(replay, 2, prefix="replay_")
                length, size = replay_batch[0].shape[0], replay_batch[0].shape[1]
                if length < 2:
                    raise ValueError(
                        f"replay_{first}: got shape {fmt(tuple(replay_batch[0].shape))}, expected [T, B, ...] with "
                        "T >= 2."
                    )
                if batch[0].shape[1] != length * size:
                    raise ValueError(
                        f"{first}: got {batch[0].shape[1]} dreams for a replay batch of shape [T, B] = "
                        f"[{length}, {size}], expected T * B = {length * size} (one dream from each replay step, "
                        "dream b * T + t starting at replay step t of sequence b)."
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
    # Public steps. Each takes the critic's inputs first: `h, z`, or a features critic's one `x`
    # (`input_layout="features"`: one positional argument fewer), positional or by name.

    def train_step(self, *args, **kwargs) -> Dict[str, object]:
        """One update from given real-space value targets: `train_step(h, z, value_targets, loss_weights)`, a
        features critic's `train_step(x, value_targets, loss_weights)`.

        Arguments, positional or by name:

        - `h`: `[N, gru_units]`.
        - `z`: `[N, num_z_categoricals, num_z_classes]`.
        - `x`: a features critic's `[N, input_size]` (in place of `h` and `z`).
        - `value_targets`: `[N]` real-space return targets (a `MultiCritic`:
          `{stream: [N]}`).
        - `loss_weights`: `[N]` per-position weights.

        Returns:
            The metrics dict (see the class docstring).
        """
        given = self._bind("train_step", ("value_targets", "loss_weights"), args, kwargs)
        inputs = self._critic_inputs(given)
        named = {
            **inputs,
            **self._per_stream("value_targets", given["value_targets"]),
            "loss_weights": given["loss_weights"],
        }
        count = len(inputs)

        def loss(*batch):
            rest = batch[count:]
            return self.loss_parts(*h_and_z(batch[:count]), self._streams_of(rest[:-1]), rest[-1])

        return self._run("direct", loss, named, 1, 0)

    def train_on_dream(self, *args, **kwargs) -> Dict[str, object]:
        """One update from a dreamed trajectory batch, as RLlib's DreamerV3 learner:
        `train_on_dream(h, z, rewards, continues)`, a features critic's `train_on_dream(x, rewards, continues)`.

        Values of all `H+1` states come from the fast critic (or the EMA
        critic with `ema_targets`), stop-gradient'd and in real space;
        targets are `lambda_returns`, weights `dream_loss_weights`; the loss
        covers t < H.

        Arguments, positional or by name:

        - `h`: `[H+1, B, gru_units]` dreamed recurrent states.
        - `z`: `[H+1, B, num_z_categoricals, num_z_classes]`.
        - `x`: a features critic's `[H+1, B, input_size]` imagined (or
          collected) features, in place of `h` and `z`.
        - `rewards`: `[H+1, B]` real-space rewards (`rewards[0]` unused); a
          `MultiCritic`: `{stream: [H+1, B]}`.
        - `continues`: `[H+1, B]` continue flags (`continues[0]` only enters
          the loss weights).
        - `task_ids`: by name only: each dream's task, `[B]` integers in
          `[0, N)`, where a `MultiCritic`'s normaliser keeps statistics
          per task (`ReturnNormalizer(num_tasks=N)`): its returns'
          statistics are then per task, the metrics `[N]` vectors
          (NaN for a task without dreams). Refused otherwise.

        Returns:
            The metrics dict, plus `value_target_mean`.
        """
        task_ids = kwargs.pop("task_ids", None)
        given = self._bind("train_on_dream", ("rewards", "continues"), args, kwargs)
        inputs = self._critic_inputs(given)
        named = {**inputs, **self._per_stream("rewards", given["rewards"]), "continues": given["continues"]}
        named.update(self._task_input(task_ids, given["continues"]))
        count, per_task = len(inputs), "task_ids" in named

        def loss(*batch):
            rest, ids = (batch[count:-1], batch[-1]) if per_task else (batch[count:], None)
            return self.dream_loss(*h_and_z(batch[:count]), self._streams_of(rest[:-1]), rest[-1], ids)

        return self._run("dream", loss, named, 2, 1)

    def train_on_dream_and_replay(self, *args, **kwargs) -> Dict[str, object]:
        """One update from dreams and the replayed trajectories they start from, as the official 2024 agent:
        `train_on_dream_and_replay(h, z, rewards, continues, replay_h, replay_z, replay_rewards, replay_is_last,
        replay_is_terminal)`; a features critic takes `x` and `replay_x` in place of `h, z` and
        `replay_h, replay_z`.

        The dream loss is `train_on_dream`'s (scaled by `value_loss_weight`);
        the replay value loss (`repval`, scaled by `replay_loss_weight`)
        trains the critic on the replayed states towards
        `replay_lambda_returns`, bootstrapped from the dreams' returns: dream
        `j = b * T + t` starts at replay step `t` of sequence `b`, and its
        lambda-return from the start is that step's bootstrap. Steps with
        `replay_is_last` get weight 0; the slow-critic regulariser applies to
        both losses.

        Arguments, positional or by name:

        - `h`: as `train_on_dream`, with `B * T` dreams.
        - `z`: as `train_on_dream`, with `B * T` dreams.
        - `rewards`: as `train_on_dream`, with `B * T` dreams.
        - `continues`: as `train_on_dream`, with `B * T` dreams.
        - `replay_h`: `[T, B, gru_units]` replayed recurrent states.
        - `replay_z`: `[T, B, num_z_categoricals, num_z_classes]`.
        - `replay_rewards`: `[T, B]` (a `MultiCritic`: `{stream: [T, B]}`).
        - `replay_is_last`: `[T, B]` episode-boundary flags (0 or 1).
        - `replay_is_terminal`: `[T, B]` terminal flags (0 or 1).
        - `task_ids`: as `train_on_dream`, with `B * T` dreams (by name).

        Returns:
            The metrics dict of `train_on_dream`, plus the replay loss's as
            `"repval/..."`; `total` is the weighted sum.

        Reference:
            The DreamerV3 code's `repl_loss` (github.com/danijar/dreamerv3, 2024).
        """
        task_ids = kwargs.pop("task_ids", None)
        given = self._bind(
            "train_on_dream_and_replay",
            ("rewards", "continues"),
            args,
            kwargs,
            replay=("replay_rewards", "replay_is_last", "replay_is_terminal"),
        )
        inputs = self._critic_inputs(given)
        named = {**inputs, **self._per_stream("rewards", given["rewards"]), "continues": given["continues"]}
        named.update(self._task_input(task_ids, given["continues"]))
        replay = {
            **self._critic_inputs(given, "replay_"),
            **self._per_stream("replay_rewards", given["replay_rewards"]),
            "replay_is_last": given["replay_is_last"],
            "replay_is_terminal": given["replay_is_terminal"],
        }
        streams = len(self.critic.stream_critics())
        count, per_task = len(inputs), "task_ids" in named

        def loss(*batch):
            states, rest = batch[:count], batch[count:]
            dream, replayed = rest[: streams + 1 + per_task], rest[streams + 1 + per_task :]
            dream, ids = (dream[:-1], dream[-1]) if per_task else (dream, None)
            replay_states, replayed = replayed[:count], replayed[count:]
            return self.dream_and_replay_loss(
                *h_and_z(states),
                self._streams_of(dream[:-1]),
                dream[-1],
                *h_and_z(replay_states),
                self._streams_of(replayed[:-2]),
                replayed[-2],
                replayed[-1],
                task_ids=ids,
            )

        return self._run("dream_replay", loss, named, 2, 1, replay=replay)

    def _bind(
        self, method: str, data: Sequence[str], args, kwargs, replay: Sequence[str] = (), keywords: Dict = None
    ) -> Dict:
        """`method`'s arguments by name, as Python binds a signature: the critic's inputs (`h, z`, or `x`), then
        `data`, then (with `replay`) the replayed inputs (`replay_h, replay_z`, or `replay_x`) and `replay`, then
        the keyword-only `keywords` (`{name: default}`), each present in the result."""
        inputs = tuple(self.critic.input_row_shapes())
        names = inputs + tuple(data)
        if replay:
            names += tuple(f"replay_{name}" for name in inputs) + tuple(replay)
        parameters = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
        parameters += [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in (keywords or {}).items()
        ]
        try:
            bound = inspect.Signature(parameters).bind(*args, **kwargs)
        except TypeError as err:
            raise TypeError(f"{method}({', '.join(names)}): {err}") from None
        bound.apply_defaults()
        return bound.arguments

    def _task_input(self, task_ids, continues) -> Dict[str, object]:
        """`{"task_ids": [H+1, B] float32}` for the step, each dream's task down its column (laid out, and split
        across replicas, as the other dream inputs), or `{}` where no normaliser keeps statistics per task;
        a `ValueError` naming `task_ids` for ids the step cannot take, before anything changes."""
        n = task_count(self.critic)
        if n is None:
            if task_ids is not None:
                raise ValueError(
                    "task_ids: got task ids, expected None: no return normaliser of this critic keeps statistics "
                    "per task (a MultiCritic's ReturnNormalizer(num_tasks=N) does)."
                )
            return {}
        if task_ids is None:
            streams = [s for s, norm in self.critic.normalizers.items() if norm.num_tasks is not None]
            raise ValueError(
                f"task_ids: got None, expected each dream's task, [B] integers in [0, {n}): the normalisers of "
                f"the streams {streams} keep statistics per task."
            )
        ids = real_values("task_ids", task_ids)
        kind = dtype_name(ids.dtype) if ops.is_tensor(ids) else str(ids.dtype)
        if not kind.startswith(("int", "uint")):
            raise ValueError(f"task_ids: got dtype {kind}, expected integers in [0, {n}) (one per dream).")
        lead = static_shape(continues.shape) if hasattr(continues, "shape") else np.shape(continues)
        if len(lead) != 2:  # (`continues` itself is refused first)
            return {"task_ids": ids}
        if static_shape(ids.shape) != (lead[1],):
            raise ValueError(
                f"task_ids: got shape {fmt(static_shape(ids.shape))}, expected [B] = [{lead[1]}] (one task per dream)."
            )
        if isinstance(ids, np.ndarray):
            outside = (ids < 0) | (ids >= n)
            if outside.any():
                raise ValueError(f"task_ids: got {int(ids[outside].flat[0])}, expected integers in [0, {n}).")
            return {"task_ids": np.repeat(ids[None].astype(np.float32), lead[0], axis=0)}
        return {"task_ids": ops.broadcast_to(ops.cast(ids, "float32"), lead)}

    def _critic_inputs(self, given, prefix=""):
        """The critic's inputs among the bound arguments `given`, by name."""
        return {prefix + name: given[prefix + name] for name in self.critic.input_row_shapes()}

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
