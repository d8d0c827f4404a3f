"""PyTorch: gradients with autograd (`loss.backward()`), or the step compiled whole (`torch_step`).

Data parallelism: when `torch.distributed` is initialised with more than one
process, the fast critic's forward pass goes through
`torch.nn.parallel.DistributedDataParallel`, which averages the gradients
over the processes during `backward()` (and broadcasts rank 0's weights,
EMA copy included, when it is set up). Every process then applies the same
clipped update and EMA step, so the weights stay identical everywhere.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import time
import warnings

import keras
import torch
from keras.src.backend.common import global_state
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.torch import core as keras_torch

from multicritic.backend import contract as backend_contract
from multicritic import validation
from multicritic.backend import foreign, torch_replay, torch_step, torch_views, trace_reads
from multicritic.backend.compiled_calls import host_array_kept, native_byte_order
from multicritic.backend.contract import Backend


# Keras creates some of its thread's global attributes in the first layer call (a view's call enters a
# stateless scope, whose exit reads the list of uninitialised variables). Made now, as Keras would make them, a
# host's `torch.compile` of that first call does not guard on their absence (and recompile on the second call).
def _premake_keras_globals():
    for name, value in (("current_call_ctx", None), ("stateless_scope", None), ("uninitialized_variables", [])):
        if global_state.get_global_attribute(name) is None:
            global_state.set_global_attribute(name, value)


_premake_keras_globals()


def _distributed() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


_SATURATED = {}
_CONSTANTS = {}
# Kernel placements with a fused Adam in PyTorch.
_FUSED_DEVICES = ("cpu", "cuda")


def _tensors(items):
    """Keras variables as their tensors (the multi-tensor kernels take tensors)."""
    return [x.value if isinstance(x, keras.Variable) else x for x in items]


def _saturated_step(device):
    """A float32 step count of 2^30 on `device`: `beta ** step` is 0 for every beta < 1 - 2^-26."""
    key = str(device)
    if key not in _SATURATED:
        _SATURATED[key] = torch.tensor(2.0**30, dtype=torch.float32, device=device)
    return _SATURATED[key]


def _fused_adam_params(optimizer, grads, variables):
    """The variables' tensors when `optimizer` is a plain Keras Adam the fused kernel computes exactly (no
    AMSGrad, weight decay, clipping, optimizer EMA, accumulation, loss scale or constraints; float32 weights
    on one CPU or CUDA device, outside a trace: `torch_step.tracing()`), else None."""
    from keras.src.backend.torch.optimizers.torch_adam import Adam

    if type(optimizer) is not Adam or torch_step.tracing():
        return None
    options = (
        optimizer.amsgrad,
        optimizer.weight_decay,
        optimizer.clipnorm,
        optimizer.clipvalue,
        optimizer.global_clipnorm,
        optimizer.gradient_accumulation_steps,
        optimizer.loss_scale_factor,
    )
    if optimizer.use_ema or any(o not in (None, False) for o in options):
        return None
    if not all(isinstance(b, float) for b in (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon)):
        return None
    if not 0.0 <= optimizer.beta_2 < 1.0 - 2.0**-26 or not 0.0 <= optimizer.beta_1 < 1.0 - 2.0**-26:
        return None
    params = [v.value for v in variables]
    if len(grads) != len(params) or not params:
        return None
    device = params[0].device
    for v, p, g in zip(variables, params, grads):
        if (
            v.constraint is not None
            or getattr(v, "overwrite_with_gradient", False)
            or not torch.is_tensor(g)
            or p.dtype != torch.float32
            or g.dtype != torch.float32
            or p.device != device
            or g.device != device
        ):
            return None
    return params if device.type in _FUSED_DEVICES else None


# What compiles a traced step: "inductor" (generated kernels), or "aten" (the traced graph run op by op:
# tests that check what is captured need not wait for code generation).
COMPILER = os.environ.get("MULTICRITIC_TORCH_COMPILER", "inductor")


class TrainFunction:
    """One kind of train step: eager autograd, or compiled whole (`torch_step.WholeStep`).

    Compiled, the step is one graph per batch signature, from the forward
    passes through the backward pass to the last assignment, with no host
    sync: an op that reads a tensor on the host fails the compilation
    instead of silently splitting the step. On CUDA it replays as a CUDA
    graph.

    `jit_compile`: True compiles at the first call; False never; `"auto"`
    on an accelerator at the `multicritic.backend.contract.AUTO_COMPILE_AFTER_STEPS`-th call (never on a
    CPU: `contract.auto_compiles`), saying so once with the time it took, falling back to eager (with a
    warning) if compilation fails, and not under a loss-scale optimizer
    (Keras's branches on the host). Data-parallel steps keep the loss eager
    (DDP's reducer hooks into autograd) and compile the update when asked.
    `compilations` lists every compilation (`contract.Compilation`).
    """

    def __init__(self, backend, program, distributed):
        if program.jit_compile not in (True, False, "auto"):
            raise ValueError(f"jit_compile: got {program.jit_compile!r}, expected True, False or 'auto'.")
        self.backend = backend
        self.program = program
        self.distributed = distributed
        self.eager_steps = 0
        self.calls = 0
        self.compiled = None  # a WholeStep once compiled
        self.compilations = []
        self.signatures = set()  # the batch signatures called so far, compiled or not
        self._apply = program.apply
        if distributed and program.jit_compile is True:
            self._apply = torch.compile(program.apply)

    def _want_compiled(self):
        mode = self.program.jit_compile
        if self.distributed or mode is False or backend_contract.EAGER:
            return False
        if mode == "auto" and (self.program.loss_scaled or not self._auto_device()):
            return False  # Keras's loss-scale optimizer branches on the host: its update cannot be one graph
        return mode is True or self.eager_steps >= backend_contract.AUTO_COMPILE_AFTER_STEPS

    def _auto_device(self):
        return backend_contract.auto_compiles(self.program.trainable[0].value.device.type)

    def _eager(self, batch):
        self.eager_steps += 1
        return self.backend.train_step(self.program, batch, self._apply, self.distributed)

    def __call__(self, *batch):
        if self.compiled is None and self._want_compiled():
            self.compiled = torch_step.WholeStep(self.program, COMPILER)
        # (A MultiCritic's batch holds a dict per stream: its leaves.)
        signature = tuple((tuple(x.shape), x.dtype) for x in keras.tree.flatten(batch))
        first = signature not in self.signatures
        self.signatures.add(signature)
        self.calls += 1
        if self.compiled is None:
            return self._eager(batch)
        graphs, start = len(self.compiled.graphs), time.perf_counter()
        try:
            metrics = self.compiled(*batch)
        except Exception as err:  # an op that reads the host, or one inductor cannot lower
            if self.program.jit_compile != "auto":
                raise
            warnings.warn(
                f"multicritic: compiling the train step failed; it runs eagerly. {err}", RuntimeWarning, stacklevel=2
            )
            self.compiled = None
            self.program = dataclasses.replace(self.program, jit_compile=False)
            # A failed compilation assigned nothing: the step is retried eagerly.
            return self._eager(batch)
        if len(self.compiled.graphs) > graphs:
            event = backend_contract.Compilation(self.calls - 1, signature, COMPILER, time.perf_counter() - start)
            backend_contract.record_compilation(self.compilations, event, first)
        # None: more batch signatures than a step compiles (`torch_step.MAX_SIGNATURES`); this one is eager.
        return self._eager(batch) if metrics is None else metrics


# DDP syncs no buffers before a forward pass: Keras keeps every variable as a parameter (the critic has no
# buffers). PyTorch 2.13 renamed the option (the old name warns); earlier versions know only the old one.
_NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)


class TorchBackend(Backend):
    name = "torch"
    has_list_kernels = True
    kernel_scale_from_units = True
    critic_module_methods = torch_views.CriticModuleMethods

    @property
    def fused_norms(self):
        # Not in an ONNX export's trace: its exporter cannot take the kernels' shape arguments there.
        return not (torch.jit.is_tracing() or torch.onnx.is_in_onnx_export())

    def constant(self, values):
        # `torch.compile` cannot trace numpy: inside it, the Python floats, on Keras's device like the
        # variables (a CPU table in a CUDA trace fails it). Nor is a tensor made while a tracer (`make_fx`,
        # fake tensors) runs cached: it belongs to that trace.
        if torch_step.tracing():
            return torch.tensor(list(values), dtype=torch.float32, device=keras_torch.get_device())
        # Eager: one tensor per table and device, made once (a new one per use cost a tensor's construction
        # and copy a few times per step). Nothing writes into these. Made outside inference mode: a first
        # use under `torch.inference_mode()` would otherwise cache an inference tensor, which autograd
        # refuses to save in a later train step.
        key = (id(values), keras_torch.get_device())
        tensor = _CONSTANTS.get(key)
        if tensor is None:
            with torch.inference_mode(False):
                tensor = _CONSTANTS[key] = super().constant(values)
        return tensor

    def split(self, x, sizes, axis=0):
        # Keras's `ops.split` turns its indices into a tensor and reads them back on the host (`.tolist()`):
        # a host sync per call, and a graph break that cuts a `torch.compile`d step into pieces.
        return list(torch.split(x, [int(s) for s in sizes], dim=axis))

    def replay(self, owner, variables, key, fn, inputs):
        # Host arrays the eager pass takes as they are become the tensors it would make of them first
        # (`ops.convert_to_tensor`, on Keras's device), so that they replay too; other frameworks' arrays are
        # imported first.
        inputs = native_byte_order(foreign.adopted(inputs))
        inputs = [keras.ops.convert_to_tensor(x) if host_array_kept(x) else x for x in inputs]
        # The critic called as a torch module: parameters swapped by `functional_call` (or parametrized) are
        # what it reads.
        values = torch_views.swapped_values(owner, key)
        return torch_replay.replay(owner, variables, (key, torch_views.layout_epoch(owner)), fn, inputs, values)

    def device_scope(self, x):
        return torch_views.device_scope(x)

    def from_dlpack(self, x):
        # On the array's own device, as a tensor there is taken (the critic runs where its input is).
        return torch.from_dlpack(x)

    def module_view(self, critic, use_ema, outputs, layout=None):
        if use_ema is None:
            return torch_views.CriticPairModule(critic, layout)
        return torch_views.CriticModule(critic, use_ema, outputs, layout)

    def apply_gradients(self, optimizer, grads, variables):
        """A plain Keras Adam runs as PyTorch's one fused kernel (one pass over the weights instead of Keras's
        ten foreach passes and its per-call bookkeeping); any other optimizer, or an Adam with options the
        kernel does not take, through `optimizer.apply`."""
        params = _fused_adam_params(optimizer, grads, variables)
        if params is None:
            return optimizer.apply(grads, variables)
        slots = [
            [slot[optimizer._get_variable_index(v)].value for v in variables]
            for slot in (optimizer._momentums, optimizer._velocities)
        ]
        # The fused kernel walks every tensor in the parameter's memory order: it needs one layout for all
        # (a kernel laid out for a host's view, `_host_contiguous`, has a transposed one; its slots do not).
        if any(
            m.stride() != p.stride() or v.stride() != p.stride() or g.stride() != p.stride()
            for p, g, m, v in zip(params, grads, *slots)
        ):
            return optimizer.apply(grads, variables)
        dtype = params[0].dtype
        step = (optimizer.iterations.value + 1).to(dtype)
        beta_1, beta_2 = (
            torch.tensor(b, dtype=dtype, device=step.device) for b in (optimizer.beta_1, optimizer.beta_2)
        )
        # Keras's update `lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)`: its bias corrections go
        # into the kernel's learning rate, and the kernel's own (`1 - b^step`) are made exactly 1 by a step
        # count whose powers of the betas underflow to 0.
        lr = keras_torch.convert_to_tensor(optimizer.learning_rate, dtype="float32").to(dtype)
        lr = lr * torch.sqrt(1 - beta_2.pow(step)) / (1 - beta_1.pow(step))
        steps = [_saturated_step(params[0].device)] * len(params)
        torch._fused_adam_(
            params,
            list(grads),
            slots[0],
            slots[1],
            [],
            steps,
            lr=lr,
            beta1=float(optimizer.beta_1),
            beta2=float(optimizer.beta_2),
            weight_decay=0.0,
            eps=float(optimizer.epsilon),
            amsgrad=False,
            maximize=False,
        )
        optimizer.iterations.assign(optimizer.iterations.value + 1)

    def global_norm(self, tensors):
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(tensors))))

    def scale(self, tensors, factor):
        tensors = list(tensors)
        torch._foreach_mul_(tensors, factor)
        return tensors

    def blend(self, variables, values, decay):
        targets = [v.value for v in variables]
        with torch.no_grad():
            torch._foreach_mul_(targets, decay)
            if torch.is_tensor(decay):
                torch._foreach_add_(targets, torch._foreach_mul(list(values), 1.0 - decay))
            else:
                torch._foreach_add_(targets, list(values), alpha=1.0 - decay)

    @torch.no_grad()
    def norms(self, tensors):
        # Accumulated in float64: no square of a finite float32 overflows there.
        return torch.stack(torch._foreach_norm(_tensors(tensors), 2, dtype=torch.float64)).to(torch.float32)

    @torch.no_grad()
    def multiply(self, tensors, factors):
        return list(torch._foreach_mul(_tensors(tensors), list(factors.unbind())))

    @torch.no_grad()
    def squares(self, tensors):
        tensors = _tensors(tensors)
        return list(torch._foreach_mul(tensors, tensors))

    @torch.no_grad()
    def blended(self, olds, news, decay):
        out = torch._foreach_mul(_tensors(olds), decay)
        torch._foreach_add_(out, _tensors(news), alpha=1.0 - decay)
        return list(out)

    @torch.no_grad()
    def rms_normalize(self, tensors, second_moments, correction, epsilon):
        scale = torch._foreach_div(_tensors(second_moments), correction)
        torch._foreach_sqrt_(scale)
        torch._foreach_add_(scale, epsilon)
        return list(torch._foreach_div(_tensors(tensors), scale))

    @torch.no_grad()
    def add_scaled(self, tensors, values, alpha):
        out = torch._foreach_mul(_tensors(values), alpha)
        torch._foreach_add_(out, _tensors(tensors))
        return list(out)

    def update_if(self, ok, update, variables):
        """Eager PyTorch on the CPU reads the flag on the host: skipping costs nothing. On an accelerator or
        inside `torch.compile` nothing waits for the host (a step CUDA graphs can capture, one compiled graph):
        the update runs, then a select keeps the old values where `ok` is false."""
        if ok.device.type == "cpu" and not torch_step.tracing():
            if bool(ok):
                update()
            return
        old = [v.value.clone() for v in variables]
        update()
        with torch.no_grad():
            if in_stateless_scope():  # a traced step (`torch_step`): assignments are recorded, not copied
                for var, before in zip(variables, old):
                    var.assign(torch.where(ok, var.value, before))
                return
            for var, before in zip(variables, old):
                x = var.value
                x.copy_(torch.where(ok, x, before))

    def all_gather(self, x):
        if not _distributed():
            return x
        parts = [torch.empty_like(x) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    def forward_function(self, critic):
        if not _distributed():
            if not hasattr(critic, "on_latent"):
                return None
            # An eager step's forward passes replay the critic's traced graph (`torch_replay`: the same
            # kernels in the same order, so the same values and the same autograd record) instead of
            # dispatching each Keras op from Python, about half of a small critic's eager step. Where a call
            # cannot replay (a traced step, a scope, a transform) the critic runs its Keras ops.
            # (`inputs`: `h, z`, or a features critic's `x`.)
            # (`training`: a training step's passes of a critic whose parts normalise by the batch.)
            return lambda *inputs, use_ema=False, **kwargs: critic(*inputs, use_ema=use_ema, **kwargs)
        ddp = torch.nn.parallel.DistributedDataParallel(critic, **_NO_BUFFER_SYNC)

        def forward(*inputs, use_ema=False, **kwargs):
            # EMA passes need no gradients, hence no DDP (its reducer expects
            # one forward pass per backward).
            return critic(*inputs, use_ema=True, **kwargs) if use_ema else ddp(*inputs, **kwargs)

        forward.ddp = ddp
        return forward

    def train_step(self, program, batch, apply=None, distributed=False):
        params = [v.value for v in program.trainable]
        for p in params:
            p.grad = None
        loss, metrics = program.loss(*batch)
        program.scale_loss(loss).backward()
        grads = [p.grad for p in params]
        with torch.no_grad():
            metrics = {k: v.detach() for k, v in metrics.items()}
            if distributed:
                # Every process must take the same skip-or-update decision.
                for key in program.decision_metrics:
                    torch.distributed.all_reduce(metrics[key])
            return (apply or program.apply)(grads, metrics)

    def keras_train_step(self, model, program, state, batch):
        fn = program.cache.get("train")
        if fn is None:
            fn = program.cache["train"] = self.make_train_function(program, 0)
        return fn(*batch)

    def keras_test_step(self, model, evaluate, state, batch):
        with torch.no_grad():
            return evaluate(*batch)

    def keras_jit_compile(self, jit_compile):
        # Keras would `torch.compile` its whole train function, whose `backward()` breaks the graph: the step
        # compiles itself (`make_train_function`).
        return False

    def make_train_function(self, program, batch_axis):
        return TrainFunction(self, program, _distributed())

    def make_predict_function(self, critic, use_ema):
        """Eager forward pass without autograd (nothing to trace, nothing to recompile)."""

        def run(*inputs):
            with torch.no_grad():
                return critic(*inputs, use_ema=use_ema)

        return run

    def hosts(self, variables=()):
        if not _distributed():
            return 0, 1
        return torch.distributed.get_rank(), torch.distributed.get_world_size()

    def gather_hosts(self, data, variables=()):
        local = torch.as_tensor(data, dtype=torch.uint8).reshape(-1)
        if not _distributed():
            return local[None].numpy()
        # NCCL gathers CUDA tensors only; gloo (CPU) any.
        device = torch.device("cpu")
        if torch.distributed.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        parts = [torch.empty_like(local, device=device) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(parts, local.to(device))
        return torch.stack(parts).cpu().numpy()


BACKEND = TorchBackend()

# Dynamo traces the critic's Python: what it must not record as the compiled code's guards or side effects.
trace_reads.compiling = torch.compiler.is_compiling
# The dtype names' cache filled now, not by a compiled trace (a dict changed in a trace breaks its graph).
for _dtype in (
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
):
    validation.dtype_name(_dtype)
