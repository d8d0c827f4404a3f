"""TensorFlow: gradients with `tf.GradientTape`, the step compiled by `tf.function` (optionally XLA).

Data parallelism: when the critic and trainer were created inside a
`tf.distribute.Strategy` scope (e.g. `MirroredStrategy`), each replica takes
its slice of the batch and computes gradients of its share of the mean loss;
the gradients are summed across replicas, then clipped, applied and
EMA-averaged once, in cross-replica context, on the mirrored variables.
Under `MultiWorkerMirroredStrategy` (one worker per host, `TF_CONFIG`) each
worker is given its own rows and splits them over its own replicas.
"""

from __future__ import annotations

import operator
import time
from collections import OrderedDict

import numpy as np
import tensorflow as tf
from tensorflow.python import pywrap_tfe

from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.common.symbolic_scope import in_symbolic_scope

from multicritic.backend import contract as backend_contract
from multicritic.backend import foreign
from multicritic.backend.compiled_calls import LIMIT, CompiledCalls, host_array_kept, native_byte_order
from multicritic.backend.contract import Backend, StepProgram


def batch_signature(batch, batch_axis, static=False):
    """TensorSpecs with the batch axis left open, so a new batch size does not retrace; `static`: with the
    batch's own sizes (XLA compiles one program per batch size anyway)."""
    specs = []
    for x in batch:
        shape = list(x.shape)
        if not static:
            shape[batch_axis] = None
        specs.append(tf.TensorSpec(shape, x.dtype))
    return specs


def _xla(program: StepProgram, calls: int) -> bool:
    """Whether the step compiles with XLA: when asked, and under `"auto"` on an accelerator from a step
    kind's `AUTO_COMPILE_AFTER_STEPS`-th call on (XLA's fused step is faster than the plain graph's op-by-op
    kernels there; before, no XLA compilation per batch shape for a short run; on a CPU never:
    `contract.auto_compiles`), unless loss-scaled (Keras's loss-scale optimizer's conditional update is left
    to the graph)."""
    if program.jit_compile == "auto":
        return (
            calls >= backend_contract.AUTO_COMPILE_AFTER_STEPS
            and not program.loss_scaled
            and backend_contract.auto_compiles(_device_type(program.trainable[:1]))
        )
    return program.jit_compile is True


def _device_type(variables) -> str:
    """The device type (`"CPU"`, `"GPU"`) the first of `variables` lives on; the default device's if none."""
    for var in variables:
        return tf.DeviceSpec.from_string(getattr(var, "value", var).device).device_type or "CPU"
    return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"


def _strategy(variables=()):
    """The strategy the variables were created under (mirrored variables remember it), whether or not its
    scope is open now; else the strategy of the open scope; else None."""
    for var in variables:
        strategy = getattr(getattr(var, "value", var), "_distribute_strategy", None)
        if strategy is not None:
            return strategy
    return tf.distribute.get_strategy() if tf.distribute.has_strategy() else None


def _workers(strategy):
    """`(index, count)` of this worker among a `MultiWorkerMirroredStrategy`'s workers, the chief first (the
    order of the strategy's replicas); `(0, 1)` for any other strategy."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 0, 1
    spec = resolver.cluster_spec().as_dict()
    tasks = [(job, i) for job in ("chief", "worker") for i in range(len(spec.get(job, ())))]
    if (resolver.task_type, resolver.task_id) not in tasks:
        return 0, 1
    return tasks.index((resolver.task_type, resolver.task_id)), len(tasks)


def _outside_scope():
    """Raises unless the caller is outside every `tf.distribute.Strategy` scope: in one, Keras's optimizer
    updates only from a replica context (`merge_call`), and a step's update runs in the cross-replica one."""
    if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context():
        raise ValueError(
            f"train step: got a call inside `{type(tf.distribute.get_strategy()).__name__}.scope()`, expected it "
            "outside the scope (build the critic and trainer inside the scope, then train outside it)."
        )


def _distributed_train_function(program: StepProgram, batch_axis, strategy):
    replicas = strategy.num_replicas_in_sync
    # This worker's replicas (all of them under MirroredStrategy): each worker is given its own rows.
    local = len(strategy.extended.worker_devices)
    sum_, mean = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN

    def replica_step(*batch):
        with tf.GradientTape() as tape:
            loss, metrics = program.loss(*batch)
            scaled = program.scale_loss(loss) / replicas
        return tape.gradient(scaled, list(program.trainable)), metrics

    # One function for every call of a distributed run: `"auto"` keeps it the plain graph.
    @tf.function(jit_compile=_xla(program, calls=0), reduce_retracing=True)
    def step(*batch):
        grads, metrics = strategy.run(replica_step, args=batch)
        grads = [strategy.reduce(sum_, g, axis=None) for g in grads]
        # Per-replica means average; counts add up.
        metrics = {
            k: strategy.reduce(sum_ if k.split("/")[-1] in program.sum_metrics else mean, v, axis=None)
            for k, v in metrics.items()
        }
        return program.apply(grads, metrics)

    def run(*batch):
        _outside_scope()
        if batch[0].shape[batch_axis] % local:
            where = f"this worker's {local}" if local < replicas else f"the {replicas}"
            raise ValueError(
                f"batch: got {batch[0].shape[batch_axis]} rows on axis {batch_axis}, expected a multiple "
                f"of {where} replicas of the distribution strategy."
            )
        parts = [tf.split(x, local, axis=batch_axis) for x in batch]
        values = [
            strategy.experimental_distribute_values_from_function(
                lambda ctx, p=p: p[ctx.replica_id_in_sync_group % local]
            )
            for p in parts
        ]
        return step(*values)

    run.compiled = {"distributed": step}
    return run


def _tracing_for_xla():
    """Whether the graph being traced is compiled by XLA (a `tf.function(jit_compile=True)`): the check
    TensorFlow's own control flow makes. False where that internal module is gone."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - a TensorFlow without it
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _resource_variables(variables):
    """The `tf.Variable`s holding `variables` (Keras variables or `tf.Variable`s), or None where one is
    distributed (a strategy's variable assigns through the strategy) or is not a `tf.Variable`."""
    if _strategy(variables) is not None:
        return None
    out = {}
    for var in variables:
        resource = getattr(var, "value", var)
        if not isinstance(resource, tf.Variable):
            return None
        out[id(resource)] = resource
    return list(out.values())


class _SelectedAssignments:
    """While open, every `assign`, `assign_add` and `assign_sub` of the given `tf.Variable`s stores
    `where(ok, new value, current value)`. Keras's variables, its optimizers (also their weight decay) and
    multicritic's EMA all assign through these three methods of the `tf.Variable` they hold, so each assignment
    of an update traced inside is selected where it is made. The methods are shadowed on the instances for
    the trace only."""

    # Each method's new value from the current one and its argument.
    _METHODS = {"assign": lambda current, value: value, "assign_add": operator.add, "assign_sub": operator.sub}

    def __init__(self, ok, resources):
        self.ok, self.resources = ok, resources
        self.shadowed = []

    def __enter__(self):
        for resource in self.resources:
            self.shadowed.append({m: vars(resource)[m] for m in self._METHODS if m in vars(resource)})
            assign = resource.assign
            for method, new_value in self._METHODS.items():

                def selected(
                    value,
                    use_locking=None,
                    name=None,
                    read_value=True,
                    _var=resource,
                    _assign=assign,
                    _new_value=new_value,
                ):
                    current = _var.read_value()
                    value = _new_value(current, tf.convert_to_tensor(value, dtype=_var.dtype))
                    return _assign(tf.where(self.ok, value, current), use_locking, name, read_value)

                setattr(resource, method, selected)
        return self

    def __exit__(self, *exc):
        for resource, before in zip(self.resources, self.shadowed):
            for method in self._METHODS:
                vars(resource).pop(method, None)
            vars(resource).update(before)
        return False


def _compile_call(fn, variables):
    """`fn` as concrete functions of a `tf.function` (a plain graph, as the eager ops; it reads the variables
    themselves, so a later assignment is what the next call reads, and it is differentiable under a
    `GradientTape`). Called as a concrete function, a call skips the polymorphic function's dispatch on the
    inputs' trace types (227 µs a call of the PPO agent's critic at batch 4, against 566 µs through the
    `tf.function`).

    The specs leave the inputs' leading axes open (as many as the lowest-ranked input has before its last), so
    one function serves every batch size and leading shape (a host's `[T, B]` of varying `T`, a varying number
    of live environments): TensorFlow keeps every function it ever traced, about half a megabyte each. A pass
    that cannot be traced so (a layer that needs a static axis) is traced with only the first axis open, else
    per shape (`LIMIT` shapes kept). Inputs whose leading axes differ from each other are traced for their
    exact shapes, where the pass's own checks see them (a batch-size mismatch is its `ValueError`)."""
    # One `tf.function` per number of open axes: asked for a concrete function, a `tf.function` returns any it
    # traced whose specs are more general (an open trace for exact shapes, skipping the exact trace's checks).
    graphs = {}
    made = OrderedDict()  # the closed axes' sizes -> concrete function
    opened = []  # how many leading axes are open, found at the first call

    def call(*inputs):
        if not opened:
            lowest = min(len(x.shape) for x in inputs)
            for n in sorted({max(lowest - 1, 0), min(lowest, 1), 0}, reverse=True):
                try:
                    concrete = _concrete(graphs, fn, inputs, n)
                except Exception:
                    if n == 0:  # the exact shapes too: the pass's own error
                        raise
                    continue
                opened.append(n)
                made[(n, _closed(inputs, n))] = concrete
                break
        n = opened[0]
        if n and len({tuple(x.shape)[:n] for x in inputs}) > 1:
            n = 0  # leading axes that differ between inputs: the pass's own checks see the exact shapes
        closed = (n, _closed(inputs, n))
        concrete = made.get(closed)
        if concrete is None:
            concrete = made[closed] = _concrete(graphs, fn, inputs, n)
            while len(made) > LIMIT:
                made.popitem(last=False)
        return concrete(*inputs)

    return call


def _concrete(graphs, fn, inputs, opened):
    graph = graphs.get(opened)
    if graph is None:
        graph = graphs[opened] = tf.function(fn, autograph=False)
    return graph.get_concrete_function(*(_spec(x, opened) for x in inputs))


def _spec(x, opened):
    shape = tuple(x.shape)
    return tf.TensorSpec((None,) * opened + shape[opened:], x.dtype)


def _closed(inputs, opened):
    return tuple(tuple(x.shape)[opened:] for x in inputs)


_CALLS = CompiledCalls(_compile_call, "_cache_tf_compiled_calls")
# TensorFlow's allocator's alignment (`Allocator::kAllocatorAlignment`), which its CPU kernels assume.
_ALIGNMENT = 64


def _call_signature(inputs):
    """The inputs' ranks and dtypes (the compiled call keys their shapes itself) where a graph call gives the
    eager call's result, else None: eager tensors or host arrays the eager pass keeps as they are, executing
    eagerly (not under `tf.config.run_functions_eagerly`, the framework's own switch to run op by op), outside
    Keras's stateless
    and symbolic scopes, any `tf.distribute` strategy and any forward-mode accumulator (a concrete function's
    JVP through the critic's `tf.cond` fails in TensorFlow once a tape has differentiated it)."""
    if (
        not tf.executing_eagerly()
        or tf.config.functions_run_eagerly()
        or in_stateless_scope()
        or in_symbolic_scope()
        or tf.distribute.has_strategy()
    ):
        return None
    signature = []
    for x in inputs:
        if isinstance(x, tf.Tensor):
            signature.append((x.shape.rank, x.dtype.name, x.device))
        elif host_array_kept(x):
            signature.append((x.ndim, x.dtype, "host"))
        else:
            return None
    if _forward_accumulating(inputs):
        return None
    return tuple(signature)


def _forward_accumulating(inputs) -> bool:
    """Whether a `tf.autodiff.ForwardAccumulator` watches any of `inputs` (their tangents would be packed)."""
    tensors = [x for x in inputs if isinstance(x, tf.Tensor)]
    return bool(tensors) and bool(pywrap_tfe.TFE_Py_PackJVPs(tensors)[1])


class TensorFlowBackend(Backend):
    name = "tensorflow"
    concatenates_first_input = True

    def replay(self, owner, variables, key, fn, inputs):
        # Eagerly every op is dispatched from Python: each input signature runs as a graph (other frameworks'
        # arrays too, imported first).
        inputs = native_byte_order(foreign.adopted(inputs))
        return _CALLS(owner, variables, key, fn, inputs, _call_signature(inputs))

    @property
    def lazy_fallbacks(self):
        # A plain graph runs each op as a pass of its own, so the fallback waits in a cond; under XLA a cond
        # splits the fusions around it and materialises its operands, and the fallback beside the variance
        # costs less.
        return not _tracing_for_xla()

    def from_dlpack(self, x):
        # TensorFlow imports a capsule only (not an object with `__dlpack__`) and refuses a strided layout. Its
        # kernels assume its allocator's 64-byte alignment, which the import does not check (a numpy-backed
        # PyTorch tensor aborts the process at the first op): other memory is copied through the host.
        capsule = x.__dlpack__()
        if foreign.capsule_address(capsule) % _ALIGNMENT:
            raise BufferError("the array's memory is not aligned as TensorFlow's kernels require")
        return tf.experimental.dlpack.from_dlpack(capsule)

    def detached(self, x):
        # TensorFlow differentiates only what a tape is asked for (the step's own tape: the critic's
        # variables); an input tensor carries no graph that a step could send gradients into.
        return x

    def global_norm(self, tensors):
        # `tf.clip_by_global_norm`'s norm (the reference's clipping): one fused `l2_loss` pass per tensor, where
        # `sum(t * t)` is a square and a sum.
        return tf.linalg.global_norm(list(tensors))

    @staticmethod
    def _softmax_parts(logits):
        # One composition for both: in a traced step the decode's `softmax` and the loss's `log_softmax` of the
        # same logits are then the same ops, which XLA and Grappler compute once, and `log_softmax`'s gradient
        # reads `exp` from the forward pass where `tf.nn.log_softmax`'s computes `exp(logp)` again. The
        # maximum only keeps `exp` in range: both results are unchanged by any shift, so it takes no gradient.
        logits = tf.convert_to_tensor(logits)
        shifted = logits - tf.stop_gradient(tf.reduce_max(logits, axis=-1, keepdims=True))
        exp = tf.exp(shifted)
        return shifted, exp, tf.reduce_sum(exp, axis=-1, keepdims=True)

    def softmax(self, logits):
        _, exp, total = self._softmax_parts(logits)
        return exp / total

    def log_softmax(self, logits):
        shifted, _, total = self._softmax_parts(logits)
        return shifted - tf.math.log(total)

    def take_along_last_axis(self, x, indices):
        # One batched gather: Keras's `take_along_axis` first broadcasts `x` to the indices' leading shape, a
        # copy of it (and a reduction in the gradient) when the batch size is open, as in the trainer's steps.
        x = tf.convert_to_tensor(x)
        return tf.gather(x, tf.convert_to_tensor(indices), batch_dims=x.shape.rank - 1)

    def update_if(self, ok, update, variables):
        """In a plain graph a `tf.cond`: the update's assignments run only in the taken branch.

        Under XLA each assignment is selected as it is made instead, as on JAX. XLA turned the cond into
        selects applied after the whole update; the update and those selects both read the old weights and
        slots, so XLA copied them before every step. Selected as they are made, what the update reads
        afterwards (Adam's new moments, the new weights the EMA follows) is the selected value, each weight
        and slot buffer is read by one fusion, and XLA updates it in place. The same assignments, fused
        differently by XLA (float32 rounding)."""
        resources = _resource_variables(variables)
        if resources is None or not _tracing_for_xla():

            def run():
                update()
                return tf.constant(True)

            tf.cond(ok, run, lambda: tf.constant(False))
            return
        with _SelectedAssignments(ok, resources):
            update()

    def all_gather(self, x):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return x
        return context.all_gather(x, axis=0)

    def train_step(self, program, batch):
        with tf.GradientTape() as tape:
            loss, metrics = program.loss(*batch)
            scaled = program.scale_loss(loss)
        return program.apply(tape.gradient(scaled, list(program.trainable)), metrics)

    def hosts(self, variables=()):
        return _workers(_strategy(variables))

    def gather_hosts(self, data, variables=()):
        data = np.asarray(data, np.uint8)
        strategy = _strategy(variables)
        if _workers(strategy)[1] == 1:
            return data[None]
        # (TensorFlow's collectives gather no uint8: as int32.)
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(data[None].astype(np.int32))
        )
        # One row per replica, replicas in worker order: each worker's first.
        rows = strategy.gather(values, axis=0).numpy()[:: len(strategy.extended.worker_devices)]
        return rows.astype(np.uint8)

    def make_train_function(self, program, batch_axis):
        strategy = _strategy(program.trainable[:1])
        if strategy is not None and strategy.num_replicas_in_sync > 1:
            return _distributed_train_function(program, batch_axis, strategy)
        compiled = {}
        calls = [0]
        compilations, signatures = [], set()

        def step(*batch):
            return self.train_step(program, batch)

        def run(*batch):
            if strategy is not None:
                _outside_scope()
            xla = _xla(program, calls[0])
            # Under XLA the trace sees the batch size, so the model can choose by it (where the first layer's
            # input scale goes: `multicritic.layers.mlp`), as on JAX.
            signature = batch_signature(batch, batch_axis, static=xla)
            key = tuple((tuple(s.shape), s.dtype) for s in signature) + (xla,)
            fn = compiled.get(key)
            if backend_contract.EAGER:  # the step's ops one by one
                return step(*batch)
            calls[0] += 1
            shapes = tuple((tuple(x.shape), x.dtype) for x in batch)
            first = shapes not in signatures
            if first:
                signatures.add(shapes)
            if fn is not None:
                return fn.concrete(*batch)
            # Called as its concrete function: the key above already chose it (a `tf.function` call would
            # bind and match the signature again, ~0.5 ms a step).
            start = time.perf_counter()
            fn = compiled[key] = tf.function(step, input_signature=signature, jit_compile=xla)
            fn.concrete = fn.get_concrete_function()
            metrics = fn.concrete(*batch)  # (XLA compiles at the first run)
            event = backend_contract.Compilation(
                calls[0] - 1, shapes, "xla" if xla else "graph", time.perf_counter() - start
            )
            backend_contract.record_compilation(compilations, event, first)
            return metrics

        run.compiled = compiled
        run.compilations = compilations
        return run

    def keras_batch_signature(self, source):
        # Keras's TensorFlow step functions are `tf.function`s with `reduce_retracing`: a second batch shape
        # (another horizon) would retrace them with that axis unknown. A `tf.data` iterator's element spec
        # names the static shapes of what it yields.
        spec = getattr(source, "element_spec", None)
        return None if spec is None else repr(spec)

    def make_predict_function(self, critic, use_ema):
        """`tf.function` traced once for every batch size (`[None, ...]` signature, as the reference)."""
        # `h [None, gru_units]`, `z [None, cats, classes]`, or a features critic's `x [None, input_size]`.
        signature = [tf.TensorSpec((None,) + row, tf.float32) for row in critic.input_row_shapes().values()]
        compiled = tf.function(lambda *inputs: critic(*inputs, use_ema=use_ema), input_signature=signature)

        def run(*inputs):
            return critic(*inputs, use_ema=use_ema) if backend_contract.EAGER else compiled(*inputs)

        run.compiled = compiled
        return run


BACKEND = TensorFlowBackend()
