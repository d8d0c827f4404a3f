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
"""

from __future__ import annotations

import math
import threading
import warnings
import weakref
from typing import Callable, Sequence

import keras
import torch
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.common.symbolic_scope import in_symbolic_scope
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

# Off: every call runs the Keras ops (for debugging, or to compare against).
ENABLED = True
# Distinct input signatures traced per critic; past this many, a new signature runs eagerly (a host whose
# shapes never repeat would otherwise trace at every call).
MAX_SIGNATURES = 64
_UNTRACEABLE = object()
_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default)
_DROPPED = (torch.ops.aten.lift_fresh_copy.default,)

_CACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def replayable(inputs: Sequence) -> bool:
    """Whether a call on `inputs` may be replayed: concrete tensors, in eager PyTorch, outside any tracer,
    compiler, exporter (TorchScript's tracer runs the ONNX export) or Keras stateless / symbolic scope (they
    need the ops themselves to run)."""
    for x in inputs:
        if type(x) is not torch.Tensor and type(x) is not torch.nn.Parameter:
            return False
    return not (
        torch.compiler.is_compiling()
        or is_in_torch_dispatch_mode()
        or torch._C._get_tracing_state() is not None
        or in_stateless_scope()
        or in_symbolic_scope()
    )


class _Cache:
    def __init__(self):
        self.graphs = {}


def replay(owner, variables: Callable[[], Sequence], key, fn: Callable, inputs: Sequence, values=None):
    """`fn(*inputs)`, replayed from a traced graph where possible.

    Args:
        owner: what the graphs are cached on (a critic, a module view), weakly.
        variables: `() -> [keras.Variable]`: every variable `fn` may read
            (their tensors become the graph's first inputs).
        key: hashable: what besides the inputs' signature selects the
            graph (the entry point, its options, the owner's structure).
        fn: the eager computation, a function of `inputs` only.
        inputs: torch tensors.
        values: tensors `fn` reads in place of the variables' own (in their
            order; e.g. views of a module's parameters, so that gradients
            reach those), or None.
    """
    if not ENABLED or not replayable(inputs):
        return _eager(variables, fn, inputs, values)
    cache = _CACHES.get(owner)
    if cache is None:
        with _LOCK:
            cache = _CACHES.setdefault(owner, _Cache())
    signature = (key,) + tuple((x.shape, x.dtype, x.device) for x in inputs)
    graph = cache.graphs.get(signature)
    if graph is not None:
        return _eager(variables, fn, inputs, values) if graph is _UNTRACEABLE else graph(inputs, values)
    # Eager first: it validates the inputs and is the reference the trace must reproduce.
    outputs = _eager(variables, fn, inputs, values)
    if len(cache.graphs) < MAX_SIGNATURES:
        cache.graphs[signature] = _trace(list(variables()), fn, inputs, outputs, values)
    return outputs


def _eager(variables, fn, inputs, values):
    if values is None:
        return fn(*inputs)
    with keras.StatelessScope(state_mapping=list(zip(variables(), values))):
        return fn(*inputs)


class _Graph:
    """A traced forward pass: `graph(inputs)` runs its ops on the variables' tensors and `inputs`."""

    def __init__(self, run, source, tensors, structure):
        self.run = run
        self.source = source  # the generated Python, for inspection
        self.tensors = tensors
        self.structure = structure

    def __call__(self, inputs, values=None):
        out = self.run(*(self.tensors if values is None else values), *inputs)
        return out if self.structure is None else tuple(out)


def _trace(variables, fn, inputs, reference, values=None):
    tensors = [v.value for v in variables] if values is None else list(values)
    n = len(tensors)

    def pure(*args):
        with keras.StatelessScope(state_mapping=list(zip(variables, args[:n]))):
            out = fn(*args[n:])
        return list(out) if isinstance(out, tuple) else out

    examples = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in inputs]
    try:
        with torch.inference_mode(False), torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm = make_fx(pure, tracing_mode="fake")(*tensors, *examples)
        run, source = _straight_line(gm)
        graph = _Graph(run, source, tensors, "tuple" if isinstance(reference, tuple) else None)
        with torch.no_grad():
            got = graph(inputs, values)
    except Exception:  # a data-dependent op, or an op the tracer does not know: this signature runs eagerly
        return _UNTRACEABLE
    want = reference if isinstance(reference, tuple) else (reference,)
    got = got if isinstance(got, tuple) else (got,)
    same = len(got) == len(want) and all(
        g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w.detach()) for g, w in zip(got, want)
    )
    return graph if same else _UNTRACEABLE


def _straight_line(gm):
    """The graph's ops as one Python function calling each op's C++ entry directly (no FX interpreter, no
    `OpOverload` frame per op), with shape-preserving views and constant copies dropped."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _DROPPED or (node.target in _VIEWS and _same_shape(node, node.args[0])):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    graph.eliminate_dead_code()
    _fold_constants(gm)
    names, scope, lines, params = {}, {}, [], []

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
        elif node.op == "call_function":
            target = node.target
            scope[f"_f{i}"] = target._op if isinstance(target, torch._ops.OpOverload) else target
            args = [ref(a) for a in node.args] + [f"{k}={ref(v)}" for k, v in node.kwargs.items()]
            lines.append(f"{name} = _f{i}({', '.join(args)})  # {target}")
        elif node.op == "output":
            lines.append(f"return {ref(node.args[0])}")
        else:
            raise ValueError(f"unexpected graph node {node.op}")
    source = f"def run({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in lines)
    exec(compile(source, "<multicritic replay>", "exec"), scope)
    return scope["run"], source


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
    cache = _CACHES.get(owner)
    return {} if cache is None else {k: (None if g is _UNTRACEABLE else g) for k, g in cache.graphs.items()}
