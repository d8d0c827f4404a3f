"""PyTorch: gradients with autograd (`loss.backward()`), or the step compiled whole (`torch_step`).

Data parallelism: when `torch.distributed` is initialised with more than one
process, the fast critic's forward pass goes through
`torch.nn.parallel.DistributedDataParallel`, which averages the gradients
over the processes during `backward()` (and broadcasts rank 0's weights,
EMA copy included, when it is set up). Every process then applies the same
clipped update and EMA step, so the weights stay identical everywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import warnings

import keras
import torch
from keras.src.backend.common import global_state
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.torch import core as keras_torch

from multicritic import backend as backend_contract
from multicritic.backend import Backend, torch_replay, torch_step

VIEW_OUTPUTS = ("logits", "value", "both")

# Keras creates its call-context attribute in the first layer call. Made now, a host's `torch.compile` of that
# first call does not guard on its absence (and recompile on the second call).
global_state.set_global_attribute("current_call_ctx", global_state.get_global_attribute("current_call_ctx"))


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
    options = (optimizer.amsgrad, optimizer.weight_decay, optimizer.clipnorm, optimizer.clipvalue,
               optimizer.global_clipnorm, optimizer.gradient_accumulation_steps, optimizer.loss_scale_factor)
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
        if (v.constraint is not None or getattr(v, "overwrite_with_gradient", False) or not torch.is_tensor(g)
                or p.dtype != torch.float32 or g.dtype != torch.float32 or p.device != device or g.device != device):
            return None
    return params if device.type in _FUSED_DEVICES else None


def _alias(tensor, transpose: bool, requires_grad: bool):
    """A parameter sharing `tensor`'s storage, transposed (a Keras kernel `[in, out]` as a torch `Linear.weight`
    `[out, in]`): in-place updates of either are updates of both."""
    return torch.nn.Parameter(tensor.detach().t() if transpose else tensor.detach(), requires_grad=requires_grad)


def _host_contiguous(var) -> None:
    """Lays a Keras kernel's storage out as its transpose (a host's torch `Linear.weight` `[out, in]`, contiguous),
    the kernel becoming a transposed view of it. The host parameter, its gradient (autograd gives a gradient
    the parameter's strides) and an optimizer's state over it (made by `zeros_like`, or loaded from a host
    checkpoint, which is contiguous) then share one layout: torch's fused optimizers (sheeprl's
    `Adam(fused=True)`) assume they do, and on a transposed parameter with a contiguous loaded state they
    update the wrong elements (silently: measured on torch 2.13's CPU kernel)."""
    value = var.value
    if value.dim() == 2 and not value.t().is_contiguous():
        with torch.no_grad():
            value.data = value.data.t().contiguous().t()


def _holder(module, name: str):
    """The submodule that holds a dotted `name` (`_model.0.weight`), plain modules made for its prefixes, and
    the name's last part."""
    *path, leaf = name.split(".")
    for part in path:
        child = module._modules.get(part)
        if child is None:
            child = torch.nn.Module()
            module.add_module(part, child)
        module = child
    return module, leaf


def _register(module, name: str, param) -> None:
    """`param` registered under a dotted `name`, so that `state_dict()` keys are `name`."""
    holder, leaf = _holder(module, name)
    holder.register_parameter(leaf, param)


def _register_buffer(module, name: str, tensor):
    """`tensor` registered as a buffer under a dotted `name`, as `_register` does parameters; returns its holder."""
    holder, leaf = _holder(module, name)
    holder.register_buffer(leaf, tensor)
    return holder


# Wrappers whose attribute name prefixes every key of a wrapped module's state dict: torch.compile,
# DistributedDataParallel, Lightning Fabric (as `multicritic.interop` accepts them).
_WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_forward_module.")


def _unwrap_state_dict(state_dict, own):
    """`state_dict` without the key prefixes of torch.compile / DDP / Fabric wrappers (taken off while every key
    has one and none is one of `own`'s keys: a layout's own names may start like a wrapper's, as TorchRL's)."""
    while state_dict and not any(k in own for k in state_dict):
        prefix = next((p for p in _WRAPPER_PREFIXES
                       if all(isinstance(k, str) and k.startswith(p) for k in state_dict)), None)
        if prefix is None:
            break
        state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
    return state_dict


def _check_state_dict(module, state_dict, strict: bool, prefix: str = "") -> None:
    """A `ValueError` naming `state_dict` unless loading it into `module` (whose keys carry `prefix`) changes every
    parameter it names or none: keys (when `strict`), then every tensor's type, shape, dtype and finiteness as
    the parameter's dtype (a float64 1e39 is inf in float32)."""
    own = {prefix + k: v for k, v in module.state_dict(keep_vars=True).items()}
    if strict:
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if isinstance(k, str) and k.startswith(prefix) and k not in own]
        if missing or unexpected:
            parts = [f"missing {missing[:5]}"] if missing else []
            parts += [f"unexpected {unexpected[:5]}"] if unexpected else []
            raise ValueError(f"state_dict: holds {len(state_dict)} tensors, expected {len(own)}: "
                             f"{'; '.join(parts)}.")
    for name, value in state_dict.items():
        if name not in own:
            continue
        want = tuple(own[name].shape)
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"state_dict[{name!r}]: got a {type(value).__name__}, expected a torch.Tensor of shape "
                             f"{list(want)}.")
        if tuple(value.shape) != want:
            raise ValueError(f"state_dict[{name!r}]: got shape {list(value.shape)}, expected {list(want)}.")
        if not value.is_floating_point():
            raise ValueError(f"state_dict[{name!r}]: got dtype {value.dtype}, expected a floating-point dtype.")
        as_param = value.detach().to(own[name].dtype)
        if not bool(torch.isfinite(as_param).all()):
            raise ValueError(f"state_dict[{name!r}]: got {int((~torch.isfinite(as_param)).sum())} non-finite "
                             f"value(s) (as {own[name].dtype}), expected finite values.")
    for holder, leaf, name in getattr(module, "constants", ()):  # host buffers fixed by the configuration
        value, want = state_dict.get(prefix + name), holder._buffers[leaf]
        if value is not None and not torch.allclose(value.detach().to(want.device, torch.float64),
                                                    want.to(torch.float64), rtol=1e-6, atol=0.0):
            raise ValueError(f"state_dict[{prefix + name!r}]: got values that differ from this critic's (a buffer "
                             "fixed by its configuration: its bins, bounds and scheme).")


class _AllOrNothingLoad:
    """`load_state_dict` for the views, all or nothing: every key, shape, dtype and value is checked before the
    first parameter changes (torch's own copies the tensors that fit, then reports the others), also when the
    view is loaded inside a wrapper (torch.compile, DDP). Values must be tensors of a floating-point dtype,
    finite as the parameters' dtype; keys with a torch.compile / DDP / Fabric wrapper's prefix load too;
    `assign=True` is refused (the parameters are the critic's own tensors: new ones would not be the
    critic's)."""

    def load_state_dict(self, state_dict, strict=True, assign=False):
        from collections.abc import Mapping

        if assign:
            raise ValueError("assign: got True, expected False (the view's parameters are the critic's own tensors; "
                             "assigned ones would not reach the critic).")
        if not isinstance(state_dict, Mapping):
            raise ValueError(f"state_dict: got a {type(state_dict).__name__}, expected a mapping of names to tensors.")
        state_dict = _unwrap_state_dict(state_dict, self.state_dict(keep_vars=True))
        _check_state_dict(self, state_dict, bool(strict))
        return torch.nn.Module.load_state_dict(self, state_dict, strict=strict, assign=False)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if prefix:  # inside a wrapper's load: this view's tensors checked before any of them is copied
            _check_state_dict(self, state_dict, False, prefix)
        return torch.nn.Module._load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                                                     unexpected_keys, error_msgs)


class CriticModule(_AllOrNothingLoad, torch.nn.Module):
    """One half of a critic (fast or EMA) as a `torch.nn.Module` holding the critic's own parameters.

    The parameters are the Keras variables' tensors themselves (no copy):
    a host's optimizer, `load_state_dict`, `.to(device)` and in-place soft
    updates change the critic. The critic is not a submodule, so
    `parameters()` lists this half only.

    With a `layout` (`[(name, variable, transpose), ...]`, from
    `multicritic.interop`), the parameters carry a host's names, order and
    shapes (torch `Linear` weights `[out, in]`: views of the Keras kernels'
    storage, transposed), so the module's `state_dict()` and an optimizer's
    state over its parameters are those of the host's own critic: a host
    checkpoint written with it loads into the host's critic, and one written
    by the host's critic loads into it. An entry `(name, array, "constant")`
    is a host buffer fixed by the critic's configuration (TorchRL's bins):
    registered as a buffer (in `state_dict()`), loaded only when its values
    are the array's to 1e-6 (relative), else a `ValueError`.
    """

    def __init__(self, critic, use_ema: bool, outputs: str, layout=None):
        super().__init__()
        if outputs not in VIEW_OUTPUTS:
            raise ValueError(f"outputs: got {outputs!r}, expected one of {list(VIEW_OUTPUTS)}.")
        if not critic.built:
            raise ValueError("critic: not built yet; call it once or give its input sizes first.")
        self.__dict__["critic"] = critic
        self.use_ema = bool(use_ema)
        self.outputs = outputs
        variables = critic.ema_weights if use_ema else critic.fast_weights
        if layout is None:
            layout = [(name, var, False) for name, var in zip(critic.view_names(), variables)]
        layout = [tuple(entry) for entry in layout]
        constants = [entry for entry in layout if len(entry) == 3 and isinstance(entry[2], str)]
        if any(entry[2] != "constant" for entry in constants):
            raise ValueError("layout: got an entry whose third element is a string other than 'constant'.")
        layout = [entry for entry in layout if not (len(entry) == 3 and isinstance(entry[2], str))]
        if sorted(id(v) for _, v, _ in layout) != sorted(id(v) for v in variables):
            raise ValueError("layout: got entries that are not the critic's "
                             f"{'EMA' if use_ema else 'fast'} variables, each once.")
        self.__dict__["variables"] = [var for _, var, _ in layout]
        self.__dict__["transposed"] = [bool(t) for _, _, t in layout]
        for name, var, transpose in layout:
            if transpose:
                _host_contiguous(var)
            _register(self, name, var.value if not transpose else _alias(var.value, True, var.trainable))
        self.__dict__["params"] = list(self.parameters())
        self.__dict__["aliased"] = any(self.transposed)
        self.__dict__["constants"] = []  # (holder module, leaf name, full name) of each host buffer
        device = variables[0].value.device if variables else None
        for name, array, _ in constants:
            holder = _register_buffer(self, name, torch.as_tensor(array, dtype=torch.float32, device=device).clone())
            self.constants.append((holder, name.rsplit(".", 1)[-1], name))

    def _values(self):
        """The variables' values as the forward pass reads them: the transposed parameters' views back in
        Keras's layout (so gradients reach the parameters the host's optimizer holds)."""
        return [p.t() if t else p for p, t in zip(self.params, self.transposed)]

    def _apply(self, fn, recurse=True):
        # `.to(device)` / `.double()`: a transposed parameter is re-made as a view of the moved Keras tensor, so
        # the two keep sharing storage.
        if not self.aliased:
            return super()._apply(fn, recurse)
        for var, param, transpose in zip(self.variables, self.params, self.transposed):
            var.value.data = fn(var.value.data)
            if transpose:
                param.data = var.value.data.t()
        for holder, leaf, _ in self.constants:
            holder._buffers[leaf] = fn(holder._buffers[leaf])
        return self

    def forward(self, latent, z=None):
        # Replayed here, not only by the critic: a call skips the critic's entry point and its checks.
        key = ("view", z is None, self.use_ema, self.outputs, self.critic.forward_signature())
        inputs = (latent,) if z is None else (latent, z)
        return torch_replay.replay(self, self._variables, key, self._run, inputs,
                                   self._values() if self.aliased else None)

    def _variables(self):
        return self.variables

    def _run(self, latent, z=None):
        if z is None:
            return self.critic.on_latent(latent, use_ema=self.use_ema, outputs=self.outputs)
        with BACKEND.device_scope(latent):
            value, logits = self.critic(latent, z, use_ema=self.use_ema)
        return {"logits": logits, "value": value, "both": (value, logits)}[self.outputs]


class CriticPairModule(_AllOrNothingLoad, torch.nn.Module):
    """Both halves of a critic as one `torch.nn.Module`: `fast` and `ema` views, parameters fast first.

    `forward(h, z=None, return_logits=False, use_ema=False)` and
    `init_ema()` / `update_ema()` are those of RLlib's PyTorch
    `CriticNetwork`, so it takes that critic's place in RLlib's learner.
    """

    def __init__(self, critic, layout=None):
        super().__init__()
        self.__dict__["critic"] = critic
        if layout is None:
            self.fast = CriticModule(critic, False, "both")
            self.ema = CriticModule(critic, True, "both")
            return
        # A host's layout `(fast, ema)`: both halves' parameters under the host's own names on this module
        # (the views are kept aside, not as submodules, so each parameter is listed once).
        self.__dict__["fast"] = CriticModule(critic, False, "both", layout[0])
        self.__dict__["ema"] = CriticModule(critic, True, "both", layout[1])
        for view in (self.fast, self.ema):
            for name, param in view.named_parameters():
                _register(self, name, param)

    def _apply(self, fn, recurse=True):
        if "fast" in self._modules:
            return super()._apply(fn, recurse)
        self.fast._apply(fn, recurse)
        self.ema._apply(fn, recurse)
        return self

    def forward(self, h, z=None, return_logits=False, use_ema=False):
        value, logits = (self.ema if use_ema else self.fast)(h, z)
        return (value, logits) if return_logits else value

    def init_ema(self):
        self.critic.init_ema()

    def update_ema(self):
        self.critic.update_ema()


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
    at the `multicritic.backend.AUTO_COMPILE_AFTER_STEPS`-th call, falling back to eager (with a
    warning) if compilation fails, and not under a loss-scale optimizer
    (Keras's branches on the host). Data-parallel steps keep the loss eager
    (DDP's reducer hooks into autograd) and compile the update when asked.
    """

    def __init__(self, backend, program, distributed):
        if program.jit_compile not in (True, False, "auto"):
            raise ValueError(f"jit_compile: got {program.jit_compile!r}, expected True, False or 'auto'.")
        self.backend = backend
        self.program = program
        self.distributed = distributed
        self.eager_steps = 0
        self.compiled = None  # a WholeStep once compiled
        self._apply = program.apply
        if distributed and program.jit_compile is True:
            self._apply = torch.compile(program.apply)

    def _want_compiled(self):
        mode = self.program.jit_compile
        if self.distributed or mode is False:
            return False
        if mode == "auto" and self.program.loss_scaled:
            return False  # Keras's loss-scale optimizer branches on the host: its update cannot be one graph
        return mode is True or self.eager_steps >= backend_contract.AUTO_COMPILE_AFTER_STEPS

    def _eager(self, batch):
        self.eager_steps += 1
        return self.backend.train_step(self.program, batch, self._apply, self.distributed)

    def __call__(self, *batch):
        if self.compiled is None and self._want_compiled():
            self.compiled = torch_step.WholeStep(self.program, COMPILER)
        if self.compiled is None:
            return self._eager(batch)
        try:
            metrics = self.compiled(*batch)
        except Exception as err:  # an op that reads the host, or one inductor cannot lower
            if self.program.jit_compile != "auto":
                raise
            warnings.warn(f"multicritic: compiling the train step failed; it runs eagerly. {err}",
                          RuntimeWarning, stacklevel=2)
            self.compiled = None
            self.program = dataclasses.replace(self.program, jit_compile=False)
            # A failed compilation assigned nothing: the step is retried eagerly.
            return self._eager(batch)
        # None: more batch signatures than a step compiles (`torch_step.MAX_SIGNATURES`); this one is eager.
        return self._eager(batch) if metrics is None else metrics


# DDP syncs no buffers before a forward pass: Keras keeps every variable as a parameter (the critic has no
# buffers). PyTorch 2.13 renamed the option (the old name warns); earlier versions know only the old one.
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                   if "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
                   else {"broadcast_buffers": False})


@functools.lru_cache(maxsize=None)
def _torch_device(name):
    return torch.device(name)


class TorchBackend(Backend):
    name = "torch"
    has_list_kernels = True
    kernel_scale_from_units = True

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
        return torch_replay.replay(owner, variables, key, fn, inputs)

    def device_scope(self, x):
        want, have = getattr(x, "device", None), _torch_device(keras_torch.get_device())
        if want is None or (want.type == have.type and have.index in (None, want.index)):
            return contextlib.nullcontext()
        return keras_torch.device_scope(str(want))

    def module_view(self, critic, use_ema, outputs, layout=None):
        if use_ema is None:
            return CriticPairModule(critic, layout)
        return CriticModule(critic, use_ema, outputs, layout)

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
        if any(m.stride() != p.stride() or v.stride() != p.stride() or g.stride() != p.stride()
               for p, g, m, v in zip(params, grads, *slots)):
            return optimizer.apply(grads, variables)
        dtype = params[0].dtype
        step = (optimizer.iterations.value + 1).to(dtype)
        beta_1, beta_2 = (torch.tensor(b, dtype=dtype, device=step.device)
                          for b in (optimizer.beta_1, optimizer.beta_2))
        # Keras's update `lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)`: its bias corrections go
        # into the kernel's learning rate, and the kernel's own (`1 - b^step`) are made exactly 1 by a step
        # count whose powers of the betas underflow to 0.
        lr = keras_torch.convert_to_tensor(optimizer.learning_rate, dtype="float32").to(dtype)
        lr = lr * torch.sqrt(1 - beta_2.pow(step)) / (1 - beta_1.pow(step))
        steps = [_saturated_step(params[0].device)] * len(params)
        torch._fused_adam_(
            params, list(grads), slots[0], slots[1], [], steps, lr=lr, beta1=float(optimizer.beta_1),
            beta2=float(optimizer.beta_2), weight_decay=0.0, eps=float(optimizer.epsilon), amsgrad=False,
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
            return None
        ddp = torch.nn.parallel.DistributedDataParallel(critic, **_NO_BUFFER_SYNC)

        def forward(h, z, use_ema=False):
            # EMA passes need no gradients, hence no DDP (its reducer expects
            # one forward pass per backward).
            return critic(h, z, use_ema=True) if use_ema else ddp(h, z)

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

        def run(h, z):
            with torch.no_grad():
                return critic(h, z, use_ema=use_ema)

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
