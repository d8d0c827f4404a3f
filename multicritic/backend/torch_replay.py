"""Forward passes replayed from a graph traced once per input signature (eager PyTorch).

A host calls the critic inside its loops (every imagined step, every
learner update) as a module, eagerly. Through Keras every call pays Keras's
per-op dispatch, tens of times the arithmetic of a small critic. Here the
one-source forward pass is traced once per input signature (shapes, dtypes,
device) with `make_fx` into the ATen ops it runs, and later calls run those
ops as straight-line Python: the same kernels, in the same order, on the
critic's own parameter tensors, so values are bit-identical to the Keras
call and autograd records the same graph. A trace that cannot be made (a
data-dependent op) or does not reproduce the eager outputs is never used.

On the CPU each signature is also traced without the MLP's overflow guards
(`guard_scope`), which cost a small critic's pass about a sixth of its time
and change no value unless a row is far outside float32's range. That pass
runs first and checks its normalisations' own row statistics: each row's
`|mean| + sqrt(units) / rstd` bounds its largest entry, so the largest
`|mean|` plus `sqrt(units)` over the smallest `rstd` bounds them all, and
where that is below 2^55 (NaN and overflow fail it) no guard would have
acted and the pass's outputs are those of the guarded one (the first
Dense's 2^-32 is a power of two: exact, but for products below float32's
normal range, which the guarded pass rounds and this one keeps). Otherwise the guarded pass
runs. On other devices the check's read-back would wait for the device
(and break a CUDA graph's capture): they run the guarded pass.
"""

from __future__ import annotations

import math
import operator
import threading
import warnings
import weakref
from typing import Callable, Sequence

import keras
import torch
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.common.symbolic_scope import in_symbolic_scope
from torch.fx.experimental.proxy_tensor import make_fx

from multicritic.backend import contract as backend_contract
from multicritic.backend import guard_scope, torch_step, trace_reads
from multicritic.backend.compiled_calls import STALE_LIMIT, assigned

# Off: every call runs the Keras ops (to compare against; `multicritic.backend.contract.EAGER` turns off the compiled
# steps too).
ENABLED = True
# Distinct input signatures traced per critic; past this many, a new signature runs eagerly (a host whose
# shapes never repeat would otherwise trace at every call).
MAX_SIGNATURES = 64
_UNTRACEABLE = object()
# A Keras layer on PyTorch is a `torch.nn.Module`: the module's own bookkeeping (its parameter and hook dicts,
# swapped by `torch.func.functional_call`; `training`) is not what the Keras pass reads.
MODULE_BOOKKEEPING = frozenset(vars(torch.nn.Module()))
_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default)
_DROPPED = (torch.ops.aten.lift_fresh_copy.default,)
# Ops whose output shares its input's memory: an in-place op on one writes into the input.
_INPUT_VIEWS = _VIEWS + (
    torch.ops.aten.t.default,
    torch.ops.aten.transpose.int,
    torch.ops.aten.slice.Tensor,
    torch.ops.aten.select.int,
    torch.ops.aten.expand.default,
)
# A row whose `|mean| + sqrt(units) / rstd` stays below this has no entry past the fused normalisations'
# guard limit (2^56; one power of two of margin for the statistics' rounding), in the guarded pass or the
# unguarded one (whose first normalisation sees rows 2^32 times the guarded pass's).
_ROW_BOUND = 2.0**55

# Per owner, by id: a dict lookup per call (a WeakKeyDictionary makes a weak reference at every lookup). An
# owner's entry goes when the owner does (`weakref.finalize`), before its id can be reused.
_CACHES: dict = {}
_LOCK = threading.Lock()


def replayable(inputs: Sequence) -> bool:
    """Whether a call on `inputs` may be replayed: concrete tensors, in eager PyTorch, outside any tracer,
    compiler, exporter (TorchScript's tracer runs the ONNX export), torch.func transform or Keras stateless /
    symbolic scope (they need the ops themselves to run).

    Under a torch.func transform (`grad`, `vmap`, `jacrev`, `jvp`, `functionalize`, ...) the tensors are
    wrapped ones of type `torch.Tensor`, and a trace's checks (`torch.equal` against the eager outputs, the
    unguarded pass's `.item()` row checks) are what a transform cannot run: the eager ops, which every
    transform takes, give its values."""
    for x in inputs:
        if type(x) is not torch.Tensor and type(x) is not torch.nn.Parameter:
            return False
    return not (
        torch_step.tracing()
        or torch._C._are_functorch_transforms_active()
        or torch._C._get_tracing_state() is not None
        or in_stateless_scope()
        or in_symbolic_scope()
    )


class _Cache:
    def __init__(self):
        self.graphs = {}


def autocast_state(device_type: str):
    """What `torch.autocast` changes for ops on `device_type` now: None when it is off, else its dtype."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def _layout(x):
    return (x.shape, x.dtype, x.device, True if x.is_contiguous() else x.stride())


def signature(key, inputs: Sequence, values=None) -> tuple:
    """What selects a traced graph: `key`, the autocast state of the inputs' device, and every input's (and
    value's, where `values` is a list of tensors) shape, dtype, device and strides (a transposed batch takes
    other ops: `reshape` copies it). `values` may instead be a hashable that stands for them."""
    x = inputs[0]
    device = x.device
    parts = (
        key,
        autocast_state(device.type),
        x.shape,
        x.dtype,
        device,
        True if x.is_contiguous() else x.stride(),
        *map(_layout, inputs[1:]),
    )
    if values is not None:
        parts += (values,) if not isinstance(values, list) else tuple(map(_layout, values))
    return parts


def replay(owner, variables: Callable[[], Sequence], key, fn: Callable, inputs: Sequence, values=None, values_key=None):
    """`fn(*inputs)`, replayed from a traced graph where possible.

    A graph is traced per `signature` (the inputs', the values' and
    autocast's state), so a call replays only a graph traced in the same
    state, and gives what `fn` gives.

    Args:
        owner: what the graphs are cached on (a critic, a module view), weakly.
        variables: `() -> [keras.Variable]`: every variable `fn` may read
            (their tensors become the graph's first inputs).
        key: hashable: what besides the inputs' signature selects the
            graph (the entry point, its options, the owner's structure).
        fn: the eager computation, a function of `inputs` only.
        inputs: torch tensors.
        values: tensors `fn` reads in place of the variables' own (in their
            order; e.g. a module's parameters as read through the module, so
            that gradients reach those and swapped ones are read), or None.
        values_key: a hashable standing for the values' shapes, dtypes,
            devices and strides in the signature (the caller knows them
            unchanged), or None: read from the values.
    """
    if not ENABLED or backend_contract.EAGER or not replayable(inputs):
        return _eager(variables, fn, inputs, values)
    cache = _CACHES.get(id(owner))
    if cache is None:
        cache = _cache_of(owner)
    sig = signature(key, inputs, list(values) if values is not None and values_key is None else values_key)
    graph = cache.graphs.get(sig)
    if graph is not None and (graph is _UNTRACEABLE or graph.current()):
        return _eager(variables, fn, inputs, values) if graph is _UNTRACEABLE else graph(inputs, values)
    # Eager first: it validates the inputs and is the reference the trace must reproduce.
    outputs = _eager(variables, fn, inputs, values)
    if graph is not None or len(cache.graphs) < MAX_SIGNATURES:
        # A graph found stale again and again: something it reads changes at every call.
        stale = 0 if graph is None else graph.stale + 1
        made = _UNTRACEABLE if stale >= STALE_LIMIT else _trace(owner, list(variables()), fn, inputs, outputs, values)
        if made is not _UNTRACEABLE:
            made.stale = stale
        cache.graphs[sig] = made
    return outputs


def _cache_of(owner):
    with _LOCK:
        cache = _CACHES.get(id(owner))
        if cache is None:
            cache = _CACHES[id(owner)] = _Cache()
            weakref.finalize(owner, _CACHES.pop, id(owner), None)
        return cache


def _eager(variables, fn, inputs, values):
    if values is None:
        return fn(*inputs)
    with keras.StatelessScope(state_mapping=list(zip(variables(), values))):
        return fn(*inputs)


class _Graph:
    """A traced forward pass: `graph(inputs)` runs its ops on the variables' tensors and `inputs`."""

    def __init__(self, run, run_no_grad, source, tensors, structure):
        self.run = run
        self.run_no_grad = run_no_grad  # the same ops less the `detach`es, which only matter to autograd
        self.source = source  # the generated Python, for inspection
        self.tensors = tensors
        # The first captured tensor's dtype and device (None: the values are passed at each call, and their
        # layouts are part of the signature). Other changes of a captured tensor's layout come with a new
        # layout epoch in the key (`torch_views.layout_epoch`).
        self.layouts = None
        self.structure = structure
        self.reads = None  # what the trace read (`trace_reads.Reads`)
        self.stale = 0  # how many times in a row this signature's graph was found stale
        # The pass without overflow guards, which returns None where its row check fails (or None: none).
        self.unguarded = self.unguarded_no_grad = self.unguarded_source = None

    def current(self) -> bool:
        """Whether everything the trace read is as it was (`trace_reads`), and the tensors captured at trace time
        still have the dtype and device they were traced with (a critic moved or converted as a torch module; a
        graph given its values at each call captures none)."""
        return (
            self.layouts is None or (self.tensors[0].dtype, self.tensors[0].device) == self.layouts
        ) and self.reads.current()

    def __call__(self, inputs, values=None):
        args = (*(self.tensors if values is None else values), *inputs)
        grad = torch.is_grad_enabled()
        out = None
        if self.unguarded is not None:
            out = (self.unguarded if grad else self.unguarded_no_grad)(*args)
        if out is None:
            out = (self.run if grad else self.run_no_grad)(*args)
        if self.structure is None:
            return out
        return tuple(out) if self.structure == "tuple" else keras.tree.pack_sequence_as(self.structure, out)


def _trace(owner, variables, fn, inputs, reference, values=None):
    tensors = [v.value for v in variables] if values is None else list(values)
    n = len(tensors)
    unmapped = {}

    def pure(*args):
        with trace_reads.ReadingScope(state_mapping=list(zip(variables, args[:n]))) as scope:
            start = dict(scope.state_mapping)
            out = fn(*args[n:])
        unmapped.update(scope.unmapped)
        if assigned(scope, start):  # recorded in the scope, not traced: a replay would leave it out
            raise ValueError("the pass assigns a variable")
        # The graph returns a flat list of tensors (a tuple, list, dict or nested outputs: packed back per call).
        return out if isinstance(out, torch.Tensor) else keras.tree.flatten(out)

    examples = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device) for x in inputs]
    args = [*(tensors if values is None else values), *inputs]

    def fx():
        with torch.inference_mode(False), torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch_step.TRACE_LOCK:
                return make_fx(pure, tracing_mode="fake")(*tensors, *examples)

    try:
        with trace_reads.recording() as recorder:
            gm = fx()
        # A variable it was not given would be replayed as the tensor it held at trace time.
        if unmapped:
            return _UNTRACEABLE
        reads = recorder.snapshot(owner, MODULE_BOOKKEEPING)
        if _assigns(gm):  # replaying it (and checking the replay) would assign again: eager, every call
            return _UNTRACEABLE
        run, run_no_grad, source = _straight_line(gm)
        graph = _Graph(run, run_no_grad, source, tensors, _structure(reference))
        graph.reads = reads
        if values is None and tensors:
            graph.layouts = (tensors[0].dtype, tensors[0].device)
        with torch.no_grad():
            runs = [run(*args) for run in (graph.run, graph.run_no_grad)]
        if not all(_same(got, reference) for got in runs):
            return _UNTRACEABLE
    except Exception:  # a data-dependent op, or an op the tracer does not know: this signature runs eagerly
        return _UNTRACEABLE
    if all(x.device.type == "cpu" for x in args):
        _add_unguarded(graph, fx, args, reference)
    if values is not None:
        graph.tensors = None  # given at each call: the traced call's values are not kept alive
    return graph


def _add_unguarded(graph, fx, args, reference):
    """Gives `graph` its pass without overflow guards, where one can be traced whose row checks cover every
    guard left out, and which (with its check passed) reproduces the reference on the traced call's inputs."""
    try:
        with guard_scope.without_guards() as record:
            gm = fx()
        if not record.normalizations or record.unchecked:
            return
        run, run_no_grad, source = _straight_line(gm, checked=record.normalizations)
        with torch.no_grad():
            runs = [fn(*args) for fn in (run, run_no_grad)]
    except Exception:  # no such pass: the guarded one serves every call
        return
    if all(got is not None and _same(got, reference) for got in runs):
        graph.unguarded, graph.unguarded_no_grad, graph.unguarded_source = run, run_no_grad, source


def _assigns(gm) -> bool:
    """Whether the traced pass writes into one of its inputs (a variable's assignment, an in-place op on an
    input): an op whose schema marks an argument as written."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        for arg, value in zip(node.target._schema.arguments, node.args):
            if arg.alias_info is not None and arg.alias_info.is_write and _from_input(value):
                return True
    return False


def _from_input(node) -> bool:
    """Whether `node` is a graph input or a view of one (what an in-place op on it writes into)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _INPUT_VIEWS:
        node = node.args[0]
    return isinstance(node, torch.fx.Node) and node.op == "placeholder"


def _structure(reference):
    """How a graph's flat outputs go back into the pass's: None (one tensor), "tuple" (a flat tuple), or the
    outputs' nesting with placeholder leaves."""
    if isinstance(reference, torch.Tensor):
        return None
    if type(reference) is tuple and all(isinstance(x, torch.Tensor) for x in reference):
        return "tuple"
    return keras.tree.map_structure(lambda _: 0, reference)


def _same(got, reference) -> bool:
    want = (reference,) if isinstance(reference, torch.Tensor) else tuple(keras.tree.flatten(reference))
    got = tuple(got) if isinstance(got, list) else (got,)
    return len(got) == len(want) and all(
        g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w.detach()) for g, w in zip(got, want)
    )


def _straight_line(gm, checked=0):
    """The graph's ops as Python functions calling each op directly (no FX interpreter, no `OpOverload` frame
    per op), with shape-preserving views and constant copies dropped: `(run, run_no_grad, source)`, the second
    without the `detach`es (which only cut autograd's record). An op is called through its `torch.<name>`
    binding where it has one (the same kernel, and a cheaper call than the boxed one that takes a schema's
    arguments from Python, most of all Python scalars), else through its overload's C++ entry.

    `checked`: the graph was traced without overflow guards and has this many layer normalisations to check;
    the functions return None for a call where a row's statistics fail the check (`_ROW_BOUND`), as soon as
    that normalisation has run."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _DROPPED or (node.target in _VIEWS and _same_shape(node, node.args[0])):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    graph.eliminate_dead_code()
    _fold_constants(gm)
    checks = _row_statistics(graph) if checked else []
    if len(checks) != checked:
        raise ValueError(f"expected {checked} layer normalisations to check, found {len(checks)}")
    names, scope, lines, no_grad, params = {}, {}, [], [], []
    # Each intermediate is dropped after its last use, as eager code drops its temporaries: the allocator
    # then hands the next op the block just freed, still in cache, instead of a cold one.
    stats = {rstd: j for j, (_, rstd, _) in enumerate(checks)}
    last_use = {}
    for node in graph.nodes:
        for source in node.all_input_nodes:
            last_use[source] = node
    for mean, rstd, _ in checks:
        last_use[mean] = last_use[rstd] = rstd
    dropped_after = {}  # in graph order
    for source in graph.nodes:
        user = last_use.get(source)
        if user is not None and source.op == "call_function" and user.op != "output":
            dropped_after.setdefault(user, []).append(source)

    def ref(x):
        if isinstance(x, torch.fx.Node):
            return names[x]
        if isinstance(x, (list, tuple)):
            inner = ", ".join(ref(a) for a in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
        if isinstance(x, (bool, int, str, type(None))) or (isinstance(x, float) and math.isfinite(x)):
            return repr(x)
        name = f"_c{len(scope)}"
        scope[name] = x
        return name

    for i, node in enumerate(graph.nodes):
        name = names[node] = f"v{i}"
        if node.op == "placeholder":
            params.append(name)
        elif node.op == "get_attr":
            scope[f"_a{i}"] = getattr(gm, node.target)
            lines.append(f"{name} = _a{i}")
            no_grad.append(lines[-1])
        elif node.op == "call_function":
            target = node.target
            scope[f"_f{i}"] = _callable(target, bool(node.kwargs))
            args = [ref(a) for a in node.args] + [f"{k}={ref(v)}" for k, v in node.kwargs.items()]
            lines.append(f"{name} = _f{i}({', '.join(args)})  # {target}")
            no_grad.append(f"{name} = {args[0]}" if target is torch.ops.aten.detach.default else lines[-1])
            if node in stats:  # a normalisation's statistics, checked as soon as they exist
                j = stats[node]
                mean, rstd, units = checks[j]
                # Two reductions and the rest in Python floats: each op costs about 10 us in a pass at batch
                # 256 on the CPU, whatever its size; a per-row bound took three.
                lines.append(f"_m = _max_abs({names[mean]}, _INF).item()")
                no_grad.append(lines[-1])
                lines.append(
                    f"if not (_m <= {_ROW_BOUND!r} and _amin({names[rstd]}).item() * ({_ROW_BOUND!r} - _m) "
                    f">= {math.sqrt(units)!r}): return None"
                )
                no_grad.append(lines[-1])
            if node in dropped_after:
                lines.append(f"del {', '.join(names[d] for d in dropped_after[node])}")
                no_grad.append(lines[-1])
        elif node.op == "output":
            lines.append(f"return {ref(node.args[0])}")
            no_grad.append(lines[-1])
        else:
            raise ValueError(f"unexpected graph node {node.op}")
    source = "".join(
        f"def {fn}({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
        for fn, body in (("run", lines), ("run_no_grad", no_grad))
    )
    scope.update(_max_abs=torch.linalg.vector_norm, _INF=math.inf, _amin=torch.amin)
    exec(compile(source, "<multicritic replay>", "exec"), scope)
    return scope["run"], scope["run_no_grad"], source


# Overloads whose `torch.<name>` binding takes the same positional arguments (the default and Tensor ones).
_BOUND_OVERLOADS = ("default", "Tensor", "self", "dim_IntList", "int")


def _callable(target, has_kwargs):
    if not isinstance(target, torch._ops.OpOverload):
        return target
    namespace, name = target._schema.name.split("::")
    if namespace == "aten" and not has_kwargs and target._overloadname in _BOUND_OVERLOADS:
        binding = getattr(torch._C._VariableFunctions, name, None) or getattr(torch._C._nn, name, None)
        if binding is not None:
            return binding
    return target._op


def _row_statistics(graph):
    """`[(mean node, rstd node, units)]` of each `native_layer_norm` in `graph`, taken right after it (mean
    first)."""
    found = []
    for node in list(graph.nodes):
        if node.target is torch.ops.aten.native_layer_norm.default:
            with graph.inserting_after(node):
                rstd = graph.call_function(operator.getitem, (node, 2))
            with graph.inserting_after(node):
                mean = graph.call_function(operator.getitem, (node, 1))
            found.append((mean, rstd, math.prod(node.args[1])))
    return found


def _fold_constants(gm):
    """Ops whose inputs are all constants (slices of a bucket table) computed once, at trace time."""
    graph, values = gm.graph, {}
    for node in list(graph.nodes):
        if node.op == "get_attr":
            values[node] = getattr(gm, node.target)
            continue
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        if not inputs or any(n not in values for n in inputs):
            continue
        args = torch.fx.node.map_arg(node.args, values.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, values.__getitem__)
        value = node.target(*args, **kwargs)
        if not isinstance(value, torch.Tensor):
            continue
        name = f"_folded_{len(values)}"
        gm.register_buffer(name, value)
        with graph.inserting_before(node):
            folded = graph.get_attr(name)
        node.replace_all_uses_with(folded)
        graph.erase_node(node)
        values[folded] = value
    graph.eliminate_dead_code()


def _same_shape(node, source) -> bool:
    a, b = node.meta.get("val"), getattr(source, "meta", {}).get("val")
    return a is not None and b is not None and tuple(a.shape) == tuple(b.shape)


def graphs(owner) -> dict:
    """The graphs traced for `owner`, by signature (`None` for one that runs eagerly), for inspection."""
    cache = _CACHES.get(id(owner))
    return {} if cache is None else {k: (None if g is _UNTRACEABLE else g) for k, g in cache.graphs.items()}
