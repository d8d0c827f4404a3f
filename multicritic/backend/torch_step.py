"""The PyTorch train step compiled whole: one graph from the forward passes to the last assignment.

`torch.compile` cannot take a step whole: `loss.backward()` ends dynamo's
graph, so a compiled step is at least two graphs (loss with its backward,
then the update), and every call of each pays dynamo's guard evaluation and
AOTAutograd's runtime wrappers (about 0.7 ms a call on a CPU core: most of a
small batch's step). Here the one-source step (`StepProgram.loss`, its
gradients by `torch.autograd.grad`, `StepProgram.apply`) is traced once per
input signature with `make_fx` into one ATen graph, backward pass and
in-place assignments included, and that graph goes to inductor directly
(`torch._inductor.compile`). A call looks its graph up by the batch's
shapes, dtypes and devices, the autocast state and the variables' dtypes,
devices and memory layouts (a dictionary lookup: no guards to evaluate; a
non-contiguous batch is copied contiguous first) and runs it on the variables' own tensors,
which it updates in place. On CUDA the compiled step is recorded once as a
CUDA graph and replayed (one launch a step).

A step that reads a tensor on the host (`.item()`, `bool(t)`, `.tolist()`)
cannot be traced: compiling it fails instead of silently splitting the step.

Reference:
    Ansel et al., "PyTorch 2: Faster Machine Learning Through Dynamic Python
    Bytecode Transformation and Graph Compilation", ASPLOS 2024 (make_fx,
    AOTAutograd, inductor).
"""

from __future__ import annotations

import threading
import warnings
from typing import Callable, Dict, List, Sequence

import torch
import torch._inductor
from keras import StatelessScope
from torch._guards import TracingContext
from torch._guards import tracing as tracing_context
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

# One `make_fx` trace at a time in this process: FX keeps "a trace is running" in a process-wide flag that each
# trace sets and restores, so two threads' overlapping traces can leave it set, after which every
# `torch.compile`d call raises ("FX to symbolically trace a dynamo-optimized function").
TRACE_LOCK = threading.RLock()

# Distinct batch signatures compiled per step kind; past this many a new one runs eagerly (a caller whose
# shapes never repeat would otherwise compile at every call).
MAX_SIGNATURES = 8


def tracing() -> bool:
    """Whether the current code runs under a tracer in this thread (dynamo's `torch.compile`, `make_fx`):
    nothing may be read on the host, and kernels that only run eagerly (PyTorch's fused Adam) are not called.

    Thread-local on purpose: PyTorch's `torch.compiler.is_compiling()` and
    `is_in_torch_dispatch_mode()` read process-wide flags, which another
    thread's trace sets while this thread trains (then this thread's step
    would take the traced path's kernels, and round differently). Dynamo
    folds `is_dynamo_compiling()` to True in what it traces; the dispatch
    mode stack (fake tensors, `make_fx`'s proxy mode) is per thread."""
    return torch.compiler.is_dynamo_compiling() or torch._C._len_torch_dispatch_stack() > 0


class WholeStep:
    """`step(*batch) -> metrics`: one train step as one compiled graph per batch signature.

    Args:
        program: the `StepProgram` (loss, scale, apply, the state it reads
            and writes: trainable variables first).
        compiler: `"inductor"` (generated kernels) or `"aten"` (the traced
            graph run op by op: what is captured, without code generation).
        cuda_graphs: on CUDA, replay each compiled step as a CUDA graph.

    Attributes:
        compilations: how many graphs were traced and compiled.
        graphs: `{signature: callable}`.
    """

    def __init__(self, program, compiler: str = "inductor", cuda_graphs: bool = True):
        if compiler not in ("inductor", "aten"):
            raise ValueError(f"compiler: got {compiler!r}, expected 'inductor' or 'aten'.")
        self.program = program
        self.compiler = compiler
        self.cuda_graphs = cuda_graphs
        self.state = list(program.state)
        self.n_trainable = len(program.trainable)  # the state's first (`StepProgram` checks)
        self.graphs: Dict[tuple, Callable] = {}
        self.compilations = 0

    def _pure(self, *args):
        """The step on `args` = (the state's tensors, the batch): updates the state's tensors in place and
        returns the metrics. Traced, every read of a variable is a read of its graph input."""
        n = len(self.state)
        values, batch = list(args[:n]), args[n:]
        program, params = self.program, values[: self.n_trainable]
        with StatelessScope(state_mapping=list(zip(self.state, values))) as scope:
            loss, metrics = program.loss(*batch)
            grads = torch.autograd.grad(program.scale_loss(loss), params, allow_unused=True)
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
            with torch.no_grad():
                metrics = program.apply(grads, {k: v.detach() for k, v in metrics.items()})
                # Keras records assignments in the scope; the backend's multi-tensor updates wrote in place.
                for var, value in zip(self.state, values):
                    new = scope.get_current_value(var)
                    if new is not None and new is not value:
                        value.copy_(new)
        return metrics

    def _compile(self, values: List[torch.Tensor], batch: Sequence[torch.Tensor]):
        examples = [x.detach().requires_grad_(i < self.n_trainable) for i, x in enumerate(values)]
        try:
            with torch.enable_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with TRACE_LOCK:
                    gm = make_fx(self._pure, tracing_mode="fake")(*examples, *batch)
        except AssertionError as err:
            if "FakeTensor" not in str(err):
                raise
            raise ValueError(
                "StepProgram: the step reads a tensor that is in neither its state nor its batch (a "
                f"variable missing from `state`?): {err}"
            ) from None
        self.compilations += 1
        if self.compiler == "aten":
            fn = gm
        else:
            # A shape environment (static: no symbolic sizes) lets inductor and AOTAutograd look the graph up
            # in their on-disk caches: a second process skips code generation.
            fake_mode = FakeTensorMode(shape_env=ShapeEnv())
            with torch.no_grad(), tracing_context(TracingContext(fake_mode)):
                fn = torch._inductor.compile(gm, list(values) + list(batch))
        if self.cuda_graphs and values[0].device.type == "cuda":
            fn = _CudaGraphStep(fn, len(values))
        return fn

    def __call__(self, *batch):
        values = [v.value for v in self.state]
        # A graph is compiled for its inputs' strides: a non-contiguous batch (a transposed view) is copied
        # into the contiguous layout the step's graphs take, as an eager step's first reshape would.
        batch = [x if x.is_contiguous() else x.contiguous() for x in batch]
        device = batch[0].device.type if batch else "cpu"
        autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        signature = (
            (autocast,)
            + tuple((x.shape, x.dtype, x.device) for x in batch)
            + tuple((x.dtype, x.device, x.stride()) for x in values)
        )
        fn = self.graphs.get(signature)
        if fn is None:
            if len(self.graphs) >= MAX_SIGNATURES:
                return None  # the caller runs this one eagerly
            fn = self.graphs[signature] = self._compile(values, batch)
        with torch.no_grad():
            return fn(*values, *batch)


class _CudaGraphStep:
    """A compiled step recorded once as a CUDA graph on the variables' own memory, replayed per call with the
    batch copied into the recorded input buffers. Recorded again if a variable's memory moves (a restore that
    replaced a tensor instead of copying into it)."""

    def __init__(self, fn, n_values: int):
        self.fn = fn
        self.n_values = n_values
        self.graph = self.pointers = self.inputs = self.outputs = None

    def _record(self, values, batch):
        self.inputs = [x.clone() for x in batch]
        saved = [x.clone() for x in values]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (allocations, autotuning) outside the recording
            self.fn(*values, *self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():
            for x, old in zip(values, saved):  # the warm-up was not a step
                x.copy_(old)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = self.fn(*values, *self.inputs)
        self.pointers = [x.data_ptr() for x in values]

    def __call__(self, *args):
        values, batch = list(args[: self.n_values]), args[self.n_values :]
        if [x.data_ptr() for x in values] != self.pointers:
            self._record(values, batch)
        for buffer, x in zip(self.inputs, batch):
            buffer.copy_(x)
        self.graph.replay()
        # The recorded outputs are overwritten by the next replay.
        return {k: v.clone() for k, v in self.outputs.items()}
