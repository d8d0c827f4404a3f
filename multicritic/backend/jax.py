"""JAX: gradients with `jax.grad` over a stateless step, compiled with `jax.jit`.

All state (critic, EMA copy, optimizer, step counter) goes into the jitted
function as arrays and comes back updated; the shared step runs inside
`keras.StatelessScope`s and its `Variable.assign`s become the new state.

Data parallelism: under a `keras.distribution.DataParallel` distribution the
variables are replicated by Keras when created, and each batch is sharded
here along its batch axis; XLA (GSPMD) inserts the gradient all-reduce. With
several processes (`jax.distributed.initialize`, one per host) each process
gives its own rows, and the global batch is assembled from them.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.experimental import multihost_utils
from keras import StatelessScope
from keras.src.backend.common.stateless_scope import get_stateless_scope, in_stateless_scope
from keras.src.backend.common.symbolic_scope import in_symbolic_scope

from multicritic.backend import contract, foreign, trace_reads
from multicritic.backend.compiled_calls import CompiledCalls, assigned, host_array_kept, native_byte_order
from multicritic.backend.contract import Backend


def _shard_batch(batch, batch_axis):
    """Places each array with its batch axis split over the distribution's mesh."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return batch
    if not isinstance(distribution, keras.distribution.DataParallel):
        raise ValueError(
            f"keras.distribution: got {type(distribution).__name__}, expected DataParallel "
            "(the critic is small: its weights are replicated, the batch is sharded)."
        )
    mesh = distribution.device_mesh
    # Several processes (hosts): each gives its own rows, the shard of its devices, and the global batch is
    # assembled from them (`jax.make_array_from_process_local_data`) without copying rows between hosts.
    hosts = jax.process_count()
    devices = mesh.shape[0] // hosts
    out = []
    for x in batch:
        axes = [None] * len(x.shape)
        axes[batch_axis] = distribution.batch_dim_name
        if x.shape[batch_axis] % devices:
            where = f"this host's {devices}" if hosts > 1 else f"the {devices}"
            raise ValueError(
                f"batch: got {x.shape[batch_axis]} rows on axis {batch_axis}, expected a multiple "
                f"of {where} devices of the data-parallel mesh."
            )
        layout = keras.distribution.TensorLayout(axes, mesh)
        if hosts > 1:
            out.append(jax.make_array_from_process_local_data(layout.backend_layout, x))
        else:
            out.append(keras.distribution.distribute_tensor(x, layout))
    return out


def _stateless_step(program, variables, state, batch):
    """`program`'s step on the values `state` of `variables` (trainable first): `(new_state, metrics)`."""
    n_trainable = len(program.trainable)
    if [id(v) for v in variables[:n_trainable]] != [id(v) for v in program.trainable]:
        raise ValueError("StepProgram: state must start with the trainable variables, in their order.")

    def scaled_loss(trainable_values):
        mapping = list(zip(variables, list(trainable_values) + state[n_trainable:]))
        with StatelessScope(state_mapping=mapping) as scope:
            loss, metrics = program.loss(*batch)
            scaled = program.scale_loss(loss)
        # State the loss moved (a seed generator's), kept for the update.
        return scaled, (metrics, [scope.get_current_value(v) for v in variables[n_trainable:]])

    grads, (metrics, moved) = jax.grad(scaled_loss, has_aux=True)(state[:n_trainable])
    state = state[:n_trainable] + [old if new is None else new for old, new in zip(state[n_trainable:], moved)]
    return _run_stateless(variables, state, lambda: program.apply(list(grads), metrics))


def _run_stateless(variables, state, fn):
    """`fn()` with `variables` reading `state`: `(new_state, fn's result)`."""
    with StatelessScope(state_mapping=list(zip(variables, state))) as scope:
        result = fn()
    new_state = []
    for var, old in zip(variables, state):
        value = scope.get_current_value(var)
        new_state.append(old if value is None else value)
    return new_state, result


class _SelectedUpdates(StatelessScope):
    """The enclosing stateless scope continued, where an assignment to a variable of `old` (by id) stores
    `where(ok, value, old value)`."""

    def __init__(self, outer, ok, old):
        super().__init__()
        self.state_mapping = dict(outer.state_mapping)
        self.ok, self.old = ok, old

    def add_update(self, update):
        variable, value = update
        before = self.old.get(id(variable))
        super().add_update((variable, value if before is None else jnp.where(self.ok, value, before)))


def _split(values, groups):
    out, start = [], 0
    for group in groups:
        out.append(list(values[start : start + len(group)]))
        start += len(group)
    return tuple(out)


def _bucket(batch: int) -> int:
    return max(8, 1 << (batch - 1).bit_length())


def _compile_call(fn, variables):
    """`fn` under `jax.jit`, the variables' values passed in (read in a `StatelessScope`, as Keras's own
    trainer does), so a later assignment is what the next call reads. XLA fuses the pass's ops: its results
    can differ from the eager pass's in the last bit."""

    # The variables the pass reads, passed in: `variables()` and any other its trace reads (a layer reached
    # outside the owner, through a `Lambda`), which would otherwise be baked in as constants.
    held = list(variables())
    eager = []

    def pure(values, *inputs):
        with trace_reads.ReadingScope(state_mapping=list(zip(held, values))) as scope:
            start = dict(scope.state_mapping)
            out = fn(*inputs)
        if assigned(scope, start):  # a random layer's seed, a counter: lost in the scope
            raise _Assigns
        if scope.unmapped:
            raise _ReadsMore(list(scope.unmapped.values()))
        return out

    jitted = jax.jit(pure)

    def call(*inputs):
        while not eager:
            try:
                # The stored values, as Keras's trainer passes them (`value` would apply an autocast scope's
                # cast, which the pass's own reads apply in the scope; and it costs 20 times as much).
                return jitted([v._value for v in held], *inputs)
            except _Assigns:
                eager.append(True)
            except _ReadsMore as more:
                held.extend(more.variables)  # traced again with them passed in
        return fn(*inputs)

    return call


class _ReadsMore(Exception):
    """A compiled call's trace read variables it was not given (raised while it is traced)."""

    def __init__(self, variables):
        super().__init__()
        self.variables = variables


class _Assigns(Exception):
    """A compiled call's pass assigned a variable (raised while it is traced)."""


_CALLS = CompiledCalls(_compile_call, "_cache_jax_compiled_calls")


def _call_signature(inputs):
    """The inputs' shapes and dtypes where a jitted call gives the eager call's result, else None: concrete
    arrays (not tracers) or host arrays the eager pass keeps as they are, outside Keras's stateless and
    symbolic scopes and any distribution (whose layouts the eager pass places)."""
    if (
        in_stateless_scope()
        or in_symbolic_scope()
        or keras.distribution.distribution() is not None
        or jax.config.jax_disable_jit  # the framework's own switch to run op by op
    ):
        return None
    signature = []
    for x in inputs:
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            signature.append((x.shape, x.dtype, "jax", x.sharding))  # the dtype object: `str` costs 2 µs
        elif host_array_kept(x) and (x.dtype.itemsize < 8 or jax.config.jax_enable_x64):
            # (64-bit integers: without x64 the call's boundary wraps them to 32 bits, the eager pass casts them.)
            signature.append((x.shape, x.dtype, "host"))
        else:
            return None
    return tuple(signature)


class JaxBackend(Backend):
    name = "jax"

    def replay(self, owner, variables, key, fn, inputs):
        # Eagerly every op is dispatched from Python: each input signature runs jitted (other frameworks' arrays
        # too, imported first).
        inputs = native_byte_order(foreign.adopted(inputs))
        return _CALLS(owner, variables, key, fn, inputs, _call_signature(inputs))

    def detached(self, x):
        # A concrete array is in no gradient computation (only tracers are): no op to dispatch.
        return x if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) else super().detached(x)

    def from_dlpack(self, x):
        # JAX shares the producer's buffer where its device is JAX's and its layout row-major, else copies.
        return jax.dlpack.from_dlpack(x)

    def step_input(self, x):
        # `jnp.asarray` dispatches a primitive per array (~100 µs on a CPU); the jitted step's own transfer of a
        # host array is one C++ call, and gives the same float32 array.
        return x

    def apply_gradients(self, optimizer, grads, variables):
        """A loss-scale optimizer through `stateless_apply`: its stateful path branches with `ops.cond`, whose
        assignments JAX cannot carry out of the branch. Any other optimizer applies in the step's own scope,
        where `update_if` selects each assignment as it is made."""
        if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return optimizer.apply(grads, variables)
        opt_vars = optimizer.variables
        new_vars, new_opt = optimizer.stateless_apply([v.value for v in opt_vars], grads, [v.value for v in variables])
        for var, value in zip(list(variables) + list(opt_vars), list(new_vars) + list(new_opt)):
            var.assign(value)

    def all_gather(self, x):
        # Under GSPMD the arrays are global: their statistics already are the batch's.
        return x

    def hosts(self, variables=()):
        return jax.process_index(), jax.process_count()

    def gather_hosts(self, data, variables=()):
        data = np.asarray(data, np.uint8)
        if jax.process_count() == 1:
            return data[None]
        return np.asarray(multihost_utils.process_allgather(data), np.uint8)

    def update_if(self, ok, update, variables):
        """XLA has no conditional assignment: both values exist and a select picks one. Each assignment is
        selected as it is made, so what the update reads afterwards (Adam's new moments, the new weights the
        EMA follows) is the selected value, which is the step's output: every slot and weight buffer is then
        read by one fusion, and XLA updates the donated ones in place instead of copying them first. The values
        are the same as selecting after the whole update."""
        outer = get_stateless_scope()
        old = {id(v): v.value for v in variables}
        if outer is None:
            update()
            for var in variables:
                var.assign(jnp.where(ok, var.value, old[id(var)]))
            return
        with _SelectedUpdates(outer, ok, old) as scope:
            update()
        outer.state_mapping.update(scope.state_mapping)

    def make_train_function(self, program, batch_axis):
        private = {id(v) for v in program.private}
        shared_vars = [v for v in program.state if id(v) not in private]
        private_vars = [v for v in program.state if id(v) in private]
        variables = shared_vars + private_vars
        n_shared = len(shared_vars)

        def step(shared_state, private_state, batch):
            return _stateless_step(program, variables, list(shared_state) + list(private_state), batch)

        # Donating the optimizer's state lets XLA update it in place. The
        # critic's weights are not donated: other threads may be reading them
        # (forward passes, `predict_function`, a `var.value` held by a caller).
        # `contract.EAGER`: the step's ops one by one, as `jax.disable_jit()` would run them.
        compiled = step if contract.EAGER else jax.jit(step, donate_argnums=1)

        def arguments(batch, direct):
            # Outside a caller's StatelessScope (and outside layer calls: no autocast) a variable's value is
            # its stored array: read without `Variable.value`'s scope lookups, as `_direct_assign` stores it.
            state, seen = [], set()
            for i, var in enumerate(variables):
                value = var._value if direct else var.value
                if i >= n_shared and id(value) in seen:  # one buffer cannot be donated twice
                    value = value.copy()
                seen.add(id(value))
                state.append(value)
            return state[:n_shared], state[n_shared:], _shard_batch(batch, batch_axis)

        calls, compilations, signatures = [0], [], set()
        cache_size = getattr(compiled, "_cache_size", lambda: 0)

        def run(*batch):
            direct = not in_stateless_scope()
            shapes = tuple((tuple(x.shape), x.dtype) for x in batch)
            first = shapes not in signatures
            signatures.add(shapes)
            calls[0] += 1
            programs, start = cache_size(), time.perf_counter()
            new_state, metrics = compiled(*arguments(batch, direct))
            if cache_size() > programs:
                event = contract.Compilation(calls[0] - 1, shapes, "jit", time.perf_counter() - start)
                contract.record_compilation(compilations, event, first)
            # The step's outputs have the variables' shapes and dtypes: stored without `assign`'s conversion
            # and checks (tens of microseconds per step), except inside a caller's StatelessScope.
            for var, value in zip(variables, new_state):
                var._direct_assign(value) if direct else var.assign(value)
            return metrics

        run.compiled = compiled
        run.compilations = compilations
        if not contract.EAGER:
            # The step lowered for `batch`, to inspect what XLA makes of it (`.compile().as_text()`).
            run.lower = lambda *batch: compiled.lower(*arguments(batch, not in_stateless_scope()))
        return run

    def keras_train_step(self, model, program, state, batch):
        """Keras's stateless `train_step`: `state` = (trainable, non-trainable, optimizer, metrics) values."""
        groups = (
            model.trainable_variables,
            model.non_trainable_variables,
            model.optimizer.variables,
            model.metrics_variables,
        )
        variables = [v for group in groups for v in group]
        new_state, logs = _stateless_step(program, variables, [x for part in state for x in part], batch)
        return logs, _split(new_state, groups)

    def keras_test_step(self, model, evaluate, state, batch):
        groups = (model.trainable_variables, model.non_trainable_variables, model.metrics_variables)
        variables = [v for group in groups for v in group]
        new_state, logs = _run_stateless(variables, [x for part in state for x in part], lambda: evaluate(*batch))
        return logs, _split(new_state, groups)

    def make_predict_function(self, critic, use_ema):
        """Jitted forward pass; batches are padded to a power of two (rows are independent),
        so batch sizes 1..8 share one compilation, 9..16 the next, and so on."""

        def forward(trainable, non_trainable, *inputs):
            outputs, _ = critic.stateless_call(trainable, non_trainable, *inputs, use_ema=use_ema)
            return outputs

        compiled = forward if contract.EAGER else jax.jit(forward)

        def run(*inputs):  # `h, z`, or a features critic's `x`
            batch = inputs[0].shape[0]
            pad = _bucket(batch) - batch
            inputs = [jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) for x in inputs]
            outputs = compiled(
                [v.value for v in critic.trainable_variables],
                [v.value for v in critic.non_trainable_variables],
                *inputs,
            )
            # Rows are the last-but-one axis of every output ([B] or [K, B] values).
            return tuple(o[..., :batch] if o.ndim == outputs[0].ndim else o[..., :batch, :] for o in outputs)

        run.compiled = compiled
        return run


BACKEND = JaxBackend()
