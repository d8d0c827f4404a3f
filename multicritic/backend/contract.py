"""The backend contract: all that differs between TensorFlow, PyTorch and JAX, in one typed interface.

Everything else in multicritic is written once against `keras.ops` and
`Variable.assign`. A backend says only how gradients are taken, how a step is
compiled, how a conditional update is expressed, how a constant enters a
compiled function, how data parallelism hooks in, which kernels it runs
fastest (fused norms, the first Dense by input parts) and how lists of
tensors (gradients, weights) are reduced, scaled and blended; one module per backend
(`tensorflow.py`, `torch.py`, `jax.py`) implements `Backend`, as Keras's own
`backend/{jax,tensorflow,torch}/trainer.py` do for `Model.fit`.

A backend module sees a train step only through a `StepProgram`: public
callables and variable lists, no trainer internals.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import importlib
import logging
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from multicritic.backend.selection import SUPPORTED

# What Keras's `Model.export` produces from each backend with a dynamic batch (plain data: readable without
# importing the backend's framework).
EXPORT_FORMATS = {
    "tensorflow": ("tf_saved_model", "onnx", "litert"),
    "jax": ("tf_saved_model", "onnx"),
    "torch": ("onnx", "torch"),
}
_TORCH_ONLY = "Keras writes a torch.export program from the PyTorch backend only"
EXPORT_LIMITS = {
    "torch": {
        "tf_saved_model": "Keras exports a SavedModel from PyTorch through torch_xla (no CPU build for this torch)",
        "litert": "Keras's PyTorch LiteRT path (litert-torch) fixes the batch size; the signature's batch is dynamic",
    },
    "jax": {"litert": "Keras has no LiteRT export from JAX", "torch": _TORCH_ONLY},
    "tensorflow": {"torch": _TORCH_ONLY},
}

Metrics = Dict[str, Any]

# `jit_compile="auto"`: where a backend compiles a step further than its default way of running it (PyTorch:
# the whole step by inductor instead of eager autograd; TensorFlow: XLA instead of the plain graph), it does so
# on an accelerator at a step kind's this-many-th call, never on a CPU (`auto_compiles`). Counted in calls, not
# seconds, so that a run is reproducible (the two ways round differently; a switch timed by the clock would
# move with the machine's load). Short runs (tests, scripts) never switch.
AUTO_COMPILE_AFTER_STEPS = 1000

# Where `"auto"` switches. On a CPU the compilation (PyTorch's inductor: 7 s with a warm cache, a minute with a
# cold one, for the PPO critic; TensorFlow's XLA: a few percent faster steps) does not pay back within the
# runs users make (10^5 environment steps: about 3,000 updates), so `"auto"` keeps the default way there, as
# Keras and TorchRL do; `jit_compile=True` compiles at the first call for a user who knows the run is long.
AUTO_COMPILE_DEVICES = ("cuda", "gpu", "tpu", "xpu", "mps")

_log = logging.getLogger("multicritic")


def auto_compiles(device_type: str) -> bool:
    """Whether `jit_compile="auto"` switches a step on a device of this type (`"cpu"`, `"cuda"`, `"GPU"`...)."""
    return str(device_type).lower() in AUTO_COMPILE_DEVICES


@dataclasses.dataclass(frozen=True)
class Compilation:
    """One compilation inside a train call: the step kind's call it happened in (0 for the first), the batch
    signature it compiled for, the form (`"jit"`, `"graph"`, `"xla"`, `"inductor"`) and its seconds (the call's
    wall time, the compilation and the step together)."""

    call: int
    signature: Any
    form: str
    seconds: float


def record_compilation(events: List[Compilation], event: Compilation, first_of_signature: bool) -> None:
    """Appends `event` to a train function's `compilations`; a compilation that is not the first call of its
    signature (the switch of `"auto"`) says so, once per train function, with the time it took, on the
    `multicritic` logger."""
    switched = any(e.form == event.form for e in events)
    events.append(event)
    if not first_of_signature and not switched:
        _log.warning(
            "multicritic: the train step compiled (%s) at call %d of this step kind, for a batch signature it had "
            "run before (jit_compile='auto' switches so on an accelerator); the compilation took %.1f s. "
            "jit_compile=True compiles at a signature's first call, False never.",
            event.form,
            event.call,
            event.seconds,
        )


# The one switch for debugging, on every backend (`MULTICRITIC_EAGER=1` in the environment, or this set to True
# before the critic's first call): the forward passes run the Keras ops one by one instead of a compiled or
# replayed pass, and the train and predict steps run their ops eagerly (not under `jax.jit`, `tf.function` or
# `torch.compile`), whatever `jit_compile` says. Each framework's own switch is honoured too by the forward
# passes: `jax.disable_jit()`, `tf.config.run_functions_eagerly(True)`.
EAGER = os.environ.get("MULTICRITIC_EAGER", "") not in ("", "0")


@dataclasses.dataclass(frozen=True)
class StepProgram:
    """What a backend needs to compile one kind of train step.

    Attributes:
        trainable: the variables gradients are taken of (the fast critic's).
        state: every variable the step reads or writes, trainable first.
        loss: `loss(*batch) -> (loss, metrics)`, the unscaled loss.
        scale_loss: `scale_loss(loss) -> loss` times the loss scale (mixed
            precision), what gradients are taken of.
        apply: `apply(grads, metrics) -> metrics`: clip, optimizer, EMA,
            assigned through `Variable.assign`, all or nothing.
        jit_compile: the trainer's `jit_compile` option: True, False or
            `"auto"` (the backend's choice; see `Backend.resolve_jit_compile`).
        sum_metrics: metrics that are counts (summed, not averaged, over
            data-parallel replicas).
        decision_metrics: counts every replica must agree on before `apply`
            (its skip-or-update decision depends on them).
        private: the variables of `state` that only the step reads (the
            optimizer's slots): a backend may donate their buffers.
        loss_scaled: whether the optimizer scales the loss (a Keras
            `LossScaleOptimizer`, whose update branches on the gradients).
    """

    trainable: Sequence
    state: Sequence
    loss: Callable[..., Tuple[Any, Metrics]]
    scale_loss: Callable[[Any], Any]
    apply: Callable[[List, Metrics], Metrics]
    jit_compile: Any
    sum_metrics: Tuple[str, ...] = ("nonfinite_targets", "invalid_inputs")
    decision_metrics: Tuple[str, ...] = ("invalid_inputs",)
    private: Sequence = ()
    loss_scaled: bool = False
    # What a backend builds for this program (its compiled functions), kept with it.
    cache: Dict[str, Any] = dataclasses.field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self):
        if [id(v) for v in list(self.state)[: len(self.trainable)]] != [id(v) for v in self.trainable]:
            raise ValueError("StepProgram: state must start with the trainable variables, in their order.")


class Backend(abc.ABC):
    """The per-backend half of training and inference."""

    name: str
    # Normalisations as one kernel each (Keras's `ops.layer_normalization` / `ops.rms_normalization`): eager
    # PyTorch has fused kernels for them; XLA fuses the written-out formula into fewer passes than Keras's.
    fused_norms: bool = False
    # The first Dense's overflow scale goes on its kernel from `units` rows on (each pass costs what it reads, and
    # the split saves the input's concatenation too: eager PyTorch), not from `in` rows (XLA folds the input's
    # scale and concatenation into the matmul's operand; TensorFlow's graph measured so too).
    kernel_scale_from_units: bool = False
    # The first Dense's input parts (`h`, flat `z`) concatenated for one GEMM where its overflow scale goes on
    # the kernel too (where it goes on the input, they always are): TensorFlow's XLA and graph run one GEMM of
    # the concatenation faster than a GEMM per part; JAX's XLA and inductor run the GEMM per part faster.
    concatenates_first_input: bool = False
    # An overflow guard's fallback (the LayerNorm's variance of a row past float32) in a cond, computed only for
    # a batch that needs it: graph-mode TensorFlow runs each op as a pass of its own; under XLA a cond splits
    # the fusions around it and materialises its operands (TensorFlow's backend answers per trace).
    lazy_fallbacks: bool = False
    # A base of the critic's class (`multicritic.model.views.ModuleViews`) where the critic is a framework's module
    # (PyTorch's): the module methods of its views, for the critic itself (dtype conversions refused, the slow
    # critic never requiring gradients, all-or-nothing loads).
    critic_module_methods: type = object

    @property
    def export_formats(self) -> Tuple[str, ...]:
        """The `critic.export` formats Keras produces from this backend with a dynamic batch."""
        return EXPORT_FORMATS[self.name]

    @property
    def export_limits(self) -> Dict[str, str]:
        """Why the other formats are not exported from this backend."""
        return EXPORT_LIMITS.get(self.name, {})

    def constant(self, values: Tuple[float, ...]):
        """A cached table of Python floats as a float32 backend tensor, usable inside this backend's compiled
        functions."""
        array = _ARRAYS.get(id(values))
        if array is None:
            array = _ARRAYS[id(values)] = np.asarray(values, np.float32)
        return ops.convert_to_tensor(array)

    def softmax(self, logits):
        """`ops.softmax(logits, axis=-1)`: the probabilities a head decodes (and a regulariser's slow-critic
        distribution)."""
        return ops.softmax(logits, axis=-1)

    def log_softmax(self, logits):
        """`ops.log_softmax(logits, axis=-1)`: the log-probabilities a head's loss reads."""
        return ops.log_softmax(logits, axis=-1)

    def take_along_last_axis(self, x, indices):
        """`ops.take_along_axis(x, indices, axis=-1)` for `x [..., n]` and int32 `indices [..., m]` in range
        (the two-hot loss's picks from the log-probabilities)."""
        return ops.take_along_axis(x, indices, axis=-1)

    def split(self, x, sizes: Sequence[int], axis: int = 0) -> List:
        """`x` cut into consecutive parts of the static Python `sizes` along `axis` (`ops.split` at the sizes'
        running sums)."""
        return ops.split(x, np.cumsum(list(sizes)[:-1]).tolist(), axis=axis)

    def detached(self, x):
        """`x` cut from any gradient computation it takes part in (`ops.stop_gradient`)."""
        return ops.stop_gradient(x)

    def from_dlpack(self, x):
        """`x`, another framework's array (an object with `__dlpack__`), as this backend's tensor by this
        framework's DLPack import: on `x`'s device, sharing its memory where the framework can; raises where it
        cannot (`multicritic.backend.foreign` then copies through the host). Here: through a numpy array."""
        return ops.convert_to_tensor(np.from_dlpack(x))

    def step_input(self, x: np.ndarray):
        """A checked float32 host array as a compiled step takes it (`ops.convert_to_tensor`; JAX: the array
        itself, which `jax.jit` moves to the device in one call)."""
        return ops.convert_to_tensor(x)

    def apply_gradients(self, optimizer, grads: Sequence, variables: Sequence) -> None:
        """The optimizer update, inside a step (assignments through `Variable.assign`)."""
        optimizer.apply(grads, variables)

    # Lists of tensors (a step's gradients, a critic's weights): a backend with multi-tensor kernels runs each
    # as a few of them, in place where the buffers are the step's own.

    def global_norm(self, tensors: Sequence):
        """`sqrt` of the sum of squares of every entry of `tensors`."""
        return ops.sqrt(sum(ops.sum(t * t) for t in tensors))

    def scale(self, tensors: Sequence, factor) -> List:
        """`[t * factor for t in tensors]`; may overwrite `tensors` (pass only a step's own gradients)."""
        return [t * factor for t in tensors]

    def blend(self, variables: Sequence, values: Sequence, decay) -> None:
        """`v <- decay * v + (1 - decay) * x` for each variable `v` and value `x` (the EMA update), no gradient
        flowing from `x`."""
        values = [ops.stop_gradient(x) for x in values]
        for v, new in zip(variables, self.blended([v.value for v in variables], values, decay)):
            v.assign(new)

    # Functional list ops (an optimizer's update over all its tensors at once, `multicritic.training.optimizers`):
    # they take tensors or variables, return new tensors and change nothing.

    has_list_kernels: bool = False  # whether the list ops below run as multi-tensor kernels

    def norms(self, tensors: Sequence):
        """The L2 norm of each tensor, over all its entries, as one float32 vector `[len(tensors)]`; finite for
        every finite tensor whose norm is below float32's largest value."""
        return ops.stack([_l2_norm(t) for t in tensors])

    def multiply(self, tensors: Sequence, factors) -> List:
        """`[t * factors[i] ...]` for a vector `factors` `[len(tensors)]`."""
        return [t * factors[i] for i, t in enumerate(tensors)]

    def squares(self, tensors: Sequence) -> List:
        """`[t * t ...]`."""
        return [t * t for t in tensors]

    def blended(self, olds: Sequence, news: Sequence, decay) -> List:
        """`[decay * old + (1 - decay) * new ...]`."""
        return [decay * old + (1.0 - decay) * new for old, new in zip(olds, news)]

    def rms_normalize(self, tensors: Sequence, second_moments: Sequence, correction, epsilon: float) -> List:
        """`[t / (sqrt(nu / correction) + epsilon) ...]`."""
        return [t / (ops.sqrt(nu / correction) + epsilon) for t, nu in zip(tensors, second_moments)]

    def add_scaled(self, tensors: Sequence, values: Sequence, alpha) -> List:
        """`[t + alpha * x ...]`."""
        return [t + alpha * x for t, x in zip(tensors, values)]

    @abc.abstractmethod
    def update_if(self, ok, update: Callable[[], None], variables: Sequence) -> None:
        """Runs `update` (which assigns `variables`) only when the boolean tensor `ok` is true."""

    def all_gather(self, x):
        """`x` from every data-parallel replica, concatenated on axis 0, inside a step (statistics that must be
        those of the global batch); `x` itself without data parallelism."""
        return x

    def forward_function(self, critic) -> Optional[Callable]:
        """A data-parallel forward pass `fn(h, z, use_ema=False)` (a features critic: `fn(x, use_ema=False)`) for the
        critic, or None for `critic(...)`. It passes further keywords (`training=True`: a training step's passes of
        a critic whose parts normalise by the batch) to the critic."""
        return None

    # Hosts: the processes of a data-parallel run over several machines (or several processes on one), each
    # with its own devices, its own rank and its share of the global batch.

    def hosts(self, variables: Sequence = ()) -> Tuple[int, int]:
        """`(index, count)`: this host's rank and the number of hosts of the data-parallel run that `variables`
        (the critic's and trainer's, or none yet) take part in: JAX processes, `torch.distributed` ranks,
        TensorFlow `MultiWorkerMirroredStrategy` workers (the chief first). `(0, 1)` on one host; host 0 is
        the chief."""
        return 0, 1

    def gather_hosts(self, data: np.ndarray, variables: Sequence = ()) -> np.ndarray:
        """`data`, a uint8 vector of the same length on every host, from every host, stacked `[hosts, n]` in
        host order: a collective outside any step, which every host must call. `data[None]` on one host."""
        return np.asarray(data, np.uint8)[None]

    def train_step(self, program: StepProgram, batch: Sequence) -> Metrics:
        """One step, not compiled: gradients of `program.loss`, then `program.apply`. A compiled step
        (`make_train_function`, Keras's `fit`) runs it inside its own compilation."""
        raise NotImplementedError(f"{self.name}: train steps are stateless; see keras_train_step.")

    def keras_train_step(self, model, program: StepProgram, state, batch):
        """`Model.train_step` for Keras's `fit`: `program` over `batch`; returns the logs.

        `state` is what Keras passes a stateless backend (JAX: the model's,
        optimizer's and metrics' variable values), None on the others; a
        stateless backend returns `(logs, new_state)`.
        """
        return self.train_step(program, batch)

    def keras_jit_compile(self, jit_compile):
        """What Keras's `Model.compile` gets for the critic's `compile(jit_compile=...)`: Keras's own
        compilation of `fit`'s step, unless this backend compiles the step itself."""
        return jit_compile

    def keras_test_step(self, model, evaluate: Callable[..., Metrics], state, batch):
        """`Model.test_step` for Keras's `evaluate`: `evaluate(*batch)` (losses and metric updates, no
        gradients); returns the logs (stateless backends: `(logs, new_state)`)."""
        return evaluate(*batch)

    def keras_batch_signature(self, source) -> Any:
        """The static signature of the batches Keras's step function reads from `source` (what it passes the
        step: an iterator or a batch), where a traced step would otherwise be relaxed to a new one (shapes
        generalised to unknown sizes): `fit` then keeps one Keras step function per signature. None (the
        default): the step is traced per shape anyway."""
        return None

    def replay(self, owner, variables: Callable[[], Sequence], key, fn: Callable, inputs: Sequence):
        """`fn(*inputs)`: a forward pass a host calls in its loops. A backend whose eager calls are costly may
        run it from a graph traced once per input signature (PyTorch); `variables()` lists every variable `fn`
        reads, `key` what else selects the graph."""
        return fn(*inputs)

    def device_scope(self, x):
        """A context in which the critic makes its tensors on the device of the host's tensor `x` (PyTorch);
        nothing elsewhere (TensorFlow and JAX place ops by their inputs)."""
        return contextlib.nullcontext()

    def module_view(self, critic, use_ema: Optional[bool], outputs: str, layout=None):
        """A framework-native module holding one half of `critic` (`critic.fast_module()`), or with `use_ema=None`
        both (`critic.torch_module()`), its parameters named and shaped as `layout` says: PyTorch only."""
        raise ValueError(
            f"fast_module / ema_module: torch.nn.Module views need KERAS_BACKEND=torch (this is {self.name}); "
            "on JAX use the critic's stateless_call with trainable_variables / non_trainable_variables, on "
            "TensorFlow the critic itself (a Keras model) and its fast_weights / ema_weights."
        )

    @abc.abstractmethod
    def make_train_function(self, program: StepProgram, batch_axis: int) -> Callable[..., Metrics]:
        """`fn(*batch) -> metrics`: one compiled step; afterwards `program.state` holds the new values.

        The returned function may carry a `compiled` attribute (the traced
        or jitted functions), for inspection.
        """

    @abc.abstractmethod
    def make_predict_function(self, critic, use_ema: bool) -> Callable:
        """`fn(h, z) -> critic(h, z, use_ema)` (a features critic: `fn(x)`), compiled so that a new batch size does
        not retrace."""


# Sums of squares past float32's range are recomputed on the tensor times 2^-64 (exact: a power of two).
_SMALL = 2.0**-64


def _l2_norm(x):
    """The L2 norm of all of `x`'s entries, finite for any finite `x` whose norm fits float32."""
    squares = ops.sum(ops.square(x))
    fits = ops.isfinite(squares)
    # The second sum runs on the scaled tensor only where it is needed: scaled regardless, the squares of
    # ordinary weights and gradients would be denormal numbers, which many CPUs compute far slower.
    small = ops.sum(ops.square(x * ops.where(fits, 1.0, _SMALL)))
    return ops.where(fits, ops.sqrt(squares), ops.sqrt(small) / _SMALL)


_BACKENDS: Dict[str, Backend] = {}
# numpy copies of the constant tables, by id (the tables are cached for the life of the process).
_ARRAYS: Dict[int, np.ndarray] = {}


def current() -> Backend:
    """The `Backend` of the running Keras backend."""
    name = keras.backend.backend()
    backend = _BACKENDS.get(name)
    if backend is None:
        if name not in SUPPORTED:
            raise ValueError(f"KERAS_BACKEND: got {name!r}, expected 'tensorflow', 'torch' or 'jax'.")
        backend = _BACKENDS[name] = importlib.import_module(f"multicritic.backend.{name}").BACKEND
    return backend
