"""The critic as PyTorch `nn.Module`s: views holding the critic's own tensors, for hosts' loops and optimizers.

A view's parameters are the Keras variables' tensors themselves (or, in a
host's layout, transposed views of their storage), so a host's optimizer,
`load_state_dict`, soft update or `.to(device)` changes the critic. A view
behaves as a PyTorch module in the ways PyTorch's own module checks
exercise (`tests/backend/test_torch_module_checks.py`):

- `forward` reads the parameters through the module each call, so
  `torch.func.functional_call` (swapped parameters) and
  `torch.nn.utils.parametrize` are honoured, as for a `torch.nn.Linear`;
- a copy (`copy.deepcopy`, `pickle`, `torch.save` / `torch.load`) is a view
  of a copy of the critic: its parameters and its outputs move together,
  apart from the original's;
- `load_state_dict` is all or nothing, also when the view is one of several
  inside a wrapper module (`ModuleDict({"critic": fast, "target": slow})`):
  every view the load reaches is checked before the first tensor is copied;
- device moves (`.to(device)`) move the critic's tensors; dtype conversions
  (`.double()`, `.half()`, `.to(dtype)`) are refused with a `ValueError`
  before anything changes: the critic's variables keep the dtype its Keras
  dtype policy gives them (run a view under `torch.autocast` for lower
  precision);
- the slow (EMA) critic's parameters never require gradients, whatever
  `requires_grad_` is applied to the module;
- under a `torch.func` transform (`grad`, `vmap`, a `stack_module_state`
  ensemble) a call runs the eager ops, not a replay (`torch_replay.replayable`):
  the eager path's values, as for any other module.

The critic itself, a `torch.nn.Module` on this backend, takes the views' module
methods (`CriticModuleMethods`): conversions, `requires_grad_` and
`load_state_dict` behave on it as on its views.
"""

from __future__ import annotations

import contextlib
import operator
import sys
from collections.abc import Mapping

import torch
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.torch import core as keras_torch

from multicritic.backend import torch_replay, trace_reads

VIEW_OUTPUTS = ("logits", "value", "both")

# Wrappers whose attribute name prefixes every key of a wrapped module's state dict: torch.compile,
# DistributedDataParallel, Lightning Fabric (as `multicritic.interop` accepts them).
WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_forward_module.")


# A dict, not `functools.lru_cache`: a host's `torch.compile` traces `device_scope`, and Dynamo warns at every
# cache wrapper it traces (a warning a user reads as one about correctness); a dict lookup it traces silently.
_DEVICES = {}


def _torch_device(name):
    if torch.compiler.is_dynamo_compiling():
        # Read in a trace, the cache would be guarded on, and its first entry (made by the trace) recompile.
        return torch.device(name)
    device = _DEVICES.get(name)
    if device is None:
        device = _DEVICES[name] = torch.device(name)
    return device


def device_scope(x):
    """Keras's device scope for `x`'s device where Keras's default device differs (else a null context)."""
    want, have = getattr(x, "device", None), _torch_device(keras_torch.get_device())
    if want is None or (want.type == have.type and have.index in (None, want.index)):
        return contextlib.nullcontext()
    return keras_torch.device_scope(str(want))


def layout_epoch(critic) -> int:
    """Counts the changes of the critic's tensors' devices and memory layouts made here (device moves, a
    host's layout): part of every replay's key, so no graph traced before such a change is replayed after it."""
    return critic.__dict__.get("_torch_layout_epoch", 0)


def _new_layout(critic) -> None:
    critic.__dict__["_torch_layout_epoch"] = layout_epoch(critic) + 1


def _critic_slots(critic, key=None):
    """`([(holder, leaf)], [stored tensor])`: where `critic.named_parameters()` holds each of `critic.weights`
    (Keras's per-layer `ParameterDict`s, keyed by the variable's path), in that order, and the tensor each
    variable stores; cached on the critic (or another Keras model, `multicritic.CompiledForward`'s) while its
    layers are unchanged (`trace_reads.watch`: `quantize` and LoRA, the only ways to add variables, change them).

    A variable Keras does not list as a parameter (one LoRA adds after the model's parameters were listed) makes
    it `(None, None)`: nothing is read in place of the variables. A variable whose stored tensor is not listed,
    but whose path is, is one `functional_call` swapped now: its slot is found by the path, and nothing is cached
    (what is listed after the swap is the critic's own)."""
    cached = critic.__dict__.get("_cache_torch_slots")
    if cached is not None and cached[0].current():
        return cached[1]
    names = {id(param): name for name, param in critic.named_parameters()}
    by_path, slots, stored = None, [], []
    for var in critic.weights:
        stored.append(var._value)  # the tensor Keras stores (`value` may be a scope's or an autocast copy)
        name = names.get(id(stored[-1]))
        if name is None:
            if by_path is None:
                by_path = {}
                for listed, _ in critic.named_parameters(remove_duplicate=False):
                    by_path.setdefault(listed.rpartition(".")[2], listed)  # the first holder, as listed
            name = by_path.get(var.path)
            if name is None:
                slots = stored = None
                break
        prefix, _, leaf = name.rpartition(".")
        slots.append((critic.get_submodule(prefix) if prefix else critic, leaf))
    if by_path is None or slots is None:
        # Kept while the critic's layers are as they are now (`trace_reads`: `quantize` and LoRA change them).
        critic.__dict__["_cache_torch_slots"] = (
            trace_reads.watch(critic, torch_replay.MODULE_BOOKKEEPING),
            (slots, stored),
        )
    return slots, stored


def swapped_values(critic, key=None):
    """What the critic, called as a torch module, reads in place of its variables' own tensors (in the order of
    `critic.weights`): None in the usual case; the parameters as read through the module where
    `torch.func.functional_call` swapped one or a parametrization computes one (as a `torch.nn.Linear` reads
    its weight)."""
    if in_stateless_scope() or torch.compiler.is_dynamo_compiling():
        # A caller's scope (a view's call, a traced step) says what the variables hold; dynamo runs the ops.
        return None
    slots, stored = _critic_slots(critic, key)
    if slots is None:
        return None
    read = []
    for holder, leaf in slots:
        param = holder._parameters.get(leaf)
        read.append(param if param is not None else getattr(holder, leaf))
    return None if all(map(operator.is_, read, stored)) else read


def _alias(tensor, transpose: bool, requires_grad: bool):
    """A parameter sharing `tensor`'s storage, transposed (a Keras kernel `[in, out]` as a torch `Linear.weight`
    `[out, in]`): in-place updates of either are updates of both."""
    return torch.nn.Parameter(tensor.detach().t() if transpose else tensor.detach(), requires_grad=requires_grad)


def _host_contiguous(critic, var) -> None:
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
        _new_layout(critic)


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


def _register(module, name: str, param):
    """`param` registered under a dotted `name`, so that `state_dict()` keys are `name`; returns its holder."""
    holder, leaf = _holder(module, name)
    holder.register_parameter(leaf, param)
    return holder


def _register_buffer(module, name: str, tensor):
    """`tensor` registered as a buffer under a dotted `name`, as `_register` does parameters; returns its holder."""
    holder, leaf = _holder(module, name)
    holder.register_buffer(leaf, tensor)
    return holder


def _unwrap_state_dict(state_dict, own):
    """`state_dict` without the key prefixes of torch.compile / DDP / Fabric wrappers (taken off while every key
    has one and none is one of `own`'s keys: a layout's own names may start like a wrapper's, as TorchRL's)."""
    while state_dict and not any(k in own for k in state_dict):
        prefix = next(
            (p for p in WRAPPER_PREFIXES if all(isinstance(k, str) and k.startswith(p) for k in state_dict)), None
        )
        if prefix is None:
            break
        state_dict = {k[len(prefix) :]: v for k, v in state_dict.items()}
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
            raise ValueError(f"state_dict: holds {len(state_dict)} tensors, expected {len(own)}: {'; '.join(parts)}.")
    for name, value in state_dict.items():
        if name not in own:
            continue
        want = tuple(own[name].shape)
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"state_dict[{name!r}]: got a {type(value).__name__}, expected a torch.Tensor of shape {list(want)}."
            )
        if tuple(value.shape) != want:
            raise ValueError(f"state_dict[{name!r}]: got shape {list(value.shape)}, expected {list(want)}.")
        if not value.is_floating_point():
            raise ValueError(f"state_dict[{name!r}]: got dtype {value.dtype}, expected a floating-point dtype.")
        as_param = value.detach().to(own[name].dtype)
        if not bool(torch.isfinite(as_param).all()):
            raise ValueError(
                f"state_dict[{name!r}]: got {int((~torch.isfinite(as_param)).sum())} non-finite "
                f"value(s) (as {own[name].dtype}), expected finite values."
            )
    # One tensor under several keys (the critic lists each variable under its layer and again under the model, as
    # Keras's parameter dicts hold it): torch copies every key in turn, so an edited value under one key would be
    # silently overwritten by the other's.
    keys = {}
    for name, param in own.items():
        keys.setdefault(id(param), []).append(name)
    for names in keys.values():
        given = [name for name in names if name in state_dict]
        for name in given[1:]:
            first, value = (state_dict[k].detach().to(own[name].device, own[name].dtype) for k in (given[0], name))
            if not torch.equal(first, value):
                raise ValueError(
                    f"state_dict[{name!r}]: got values that differ from state_dict[{given[0]!r}], expected the same "
                    "values: both keys name one parameter."
                )
    for holder, leaf, name in getattr(module, "constants", ()):  # host buffers fixed by the configuration
        value, want = state_dict.get(prefix + name), holder._buffers[leaf]
        if value is not None and not torch.allclose(
            value.detach().to(want.device, torch.float64), want.to(torch.float64), rtol=1e-6, atol=0.0
        ):
            raise ValueError(
                f"state_dict[{prefix + name!r}]: got values that differ from this critic's (a buffer "
                "fixed by its configuration: its bins, bounds and scheme)."
            )


def _outer_load():
    """`(root module, whole state dict)` of the `Module.load_state_dict` call running in this thread (its
    outermost), or None: torch hands each submodule only its own keys, and a view inside a wrapper checks every
    view of the wrapper before its own tensors are copied."""
    code = torch.nn.Module.load_state_dict.__code__
    frame, found = sys._getframe(1), None
    while frame is not None:
        if frame.f_code is code:
            found = frame
        frame = frame.f_back
    if found is None:
        return None
    root, state_dict = found.f_locals.get("self"), found.f_locals.get("state_dict")
    if not isinstance(root, torch.nn.Module) or not isinstance(state_dict, Mapping):
        return None
    return root, state_dict


class _AllOrNothingLoad:
    """`load_state_dict` for the views and the critic, all or nothing: every key, shape, dtype and value is checked
    before the first parameter changes (torch's own copies the tensors that fit, then reports the others), also
    when the module is loaded inside a wrapper (torch.compile, DDP, a module holding several views: every view it
    holds is checked first). Values must be tensors of a floating-point dtype, finite as the parameters' dtype,
    the same under every key of one parameter; keys with a torch.compile / DDP / Fabric wrapper's prefix load
    too; `assign=True` is refused (the parameters are the critic's own tensors: new ones would not be the
    critic's)."""

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if assign:
            raise ValueError(
                "assign: got True, expected False (the view's parameters are the critic's own tensors; "
                "assigned ones would not reach the critic)."
            )
        if not isinstance(state_dict, Mapping):
            raise ValueError(f"state_dict: got a {type(state_dict).__name__}, expected a mapping of names to tensors.")
        state_dict = _unwrap_state_dict(state_dict, self.state_dict(keep_vars=True))
        _check_state_dict(self, state_dict, bool(strict))
        return torch.nn.Module.load_state_dict(self, state_dict, strict=strict, assign=False)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        if prefix:  # inside a wrapper's load: every view it reaches checked before any tensor is copied
            if local_metadata.get("assign_to_params_buffers", False):
                raise ValueError(
                    "assign: got True, expected False (the view's parameters are the critic's own "
                    "tensors; assigned ones would not reach the critic)."
                )
            outer = _outer_load()
            if outer is None:
                _check_state_dict(self, state_dict, False, prefix)
            else:
                root, whole = outer
                for name, module in root.named_modules():
                    if isinstance(module, _AllOrNothingLoad) and name:
                        _check_state_dict(module, whole, False, name + ".")
        return torch.nn.Module._load_from_state_dict(
            self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


def _moved(variables, fn):
    """`fn` (a `Module._apply` conversion) applied to the variables' tensors, every result made before any is
    kept: a `ValueError` where it would change a dtype."""
    moved = []
    for var in variables:
        old = var.value.data
        new = fn(old)
        if new.dtype != old.dtype:
            raise ValueError(
                f"dtype: got a conversion of the critic's {old.dtype} parameters to {new.dtype}, expected their own "
                f"dtype ({old.dtype}, the critic's Keras dtype policy: build the critic with dtype=... for "
                "another); for lower precision run the module under torch.autocast. Device moves are taken."
            )
        moved.append(new)
    return moved


def _take(critic, variables, moved, fn):
    """`.to(device)` for a module over `critic`'s `variables`: their tensors given `moved` (`_moved(variables, fn)`,
    refused before anything changes where a dtype would change) in place, their gradients moved too. In place,
    not as torch's `Module._apply` may do it (new `Parameter`s under
    `torch.__future__.set_overwrite_module_params_on_conversion`): Keras, the critic's views and a host's
    optimizer hold these very tensors. A new layout epoch: no replay traced before the move runs after it."""
    _new_layout(critic)
    for var, new in zip(variables, moved):
        tensor = var.value
        tensor.data = new
        if tensor.grad is not None:
            tensor.grad = fn(tensor.grad)


class _FrozenSlowCritic:
    """`requires_grad_` as torch's, except that the slow (EMA) critic's parameters (`_slow_parameters()`) never
    require gradients: a host freezing the module for an actor's update and unfreezing it after must not make
    the EMA copy trainable, or an optimizer built from the parameters that require gradients trains it."""

    def _slow_parameters(self):
        return []

    def requires_grad_(self, requires_grad=True):
        slow = {id(param) for param in self._slow_parameters()}
        for param in self.parameters():
            param.requires_grad_(bool(requires_grad) and id(param) not in slow)
        return self


class CriticModuleMethods(_FrozenSlowCritic, _AllOrNothingLoad):
    """The critic itself (a Keras model: a `torch.nn.Module` on this backend) behaves as its views do: dtype
    conversions refused and device moves taken in place (`_take`), the slow critic's parameters never requiring
    gradients, `load_state_dict` all or nothing. A base of `CriticNetwork` on PyTorch
    (`multicritic.model.views.ModuleViews`, through the backend's `critic_module_methods`)."""

    def _slow_parameters(self):
        return [var.value for var in self.ema_weights]

    def _apply(self, fn, recurse=True):
        # Every parameter of the critic is one of its Keras variables' tensors (no buffers): moving the
        # variables moves the module.
        _take(self, self.variables, _moved(self.variables, fn), fn)
        return self


def _rebuild_view(critic, use_ema, outputs, layout, training, requires_grad):
    """A view of `critic` from what `CriticModule.__reduce_ex__` kept (variables by their index)."""
    variables = critic.ema_weights if use_ema else critic.fast_weights
    layout = [(name, variables[i], t) if t != "constant" else (name, i, t) for name, i, t in layout]
    view = CriticModule(critic, use_ema, outputs, layout)
    view.train(training)
    for param, flag in zip(view.params, requires_grad):
        param.requires_grad_(flag)
    return view


def _rebuild_pair(critic, layouts, training):
    """A pair view of `critic` from what `CriticPairModule.__reduce_ex__` kept."""
    if layouts is not None:
        layouts = [
            [
                (name, (critic.ema_weights if k else critic.fast_weights)[i], t) if t != "constant" else (name, i, t)
                for name, i, t in layout
            ]
            for k, layout in enumerate(layouts)
        ]
    view = CriticPairModule(critic, layouts)
    view.train(training)
    return view


class CriticModule(_FrozenSlowCritic, _AllOrNothingLoad, torch.nn.Module):
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
            raise ValueError(
                f"layout: got entries that are not the critic's {'EMA' if use_ema else 'fast'} variables, each once."
            )
        self.__dict__["names"] = [name for name, _, _ in layout]
        self.__dict__["variables"] = [var for _, var, _ in layout]
        self.__dict__["transposed"] = [bool(t) for _, _, t in layout]
        slots = []
        for name, var, transpose in layout:
            if transpose:
                _host_contiguous(critic, var)
            param = var.value if not transpose else _alias(var.value, True, var.trainable)
            slots.append((_register(self, name, param), name.rsplit(".", 1)[-1], bool(transpose)))
        # (holder module, leaf name, transposed) of each parameter: where `forward` reads it.
        self.__dict__["slots"] = slots
        self.__dict__["params"] = [holder._parameters[leaf] for holder, leaf, _ in slots]
        self.__dict__["aliased"] = any(self.transposed)  # some parameters are transposed views of the variables
        index = {id(v): i for i, v in enumerate(variables)}
        # What the forward pass computes, apart from the values: the half, the outputs and the order and
        # layout the values come in.
        self.__dict__["structure"] = (
            "view",
            self.use_ema,
            outputs,
            tuple((index[id(v)], t) for v, t in zip(self.variables, self.transposed)),
        )
        self.__dict__["constants"] = []  # (holder module, leaf name, full name) of each host buffer
        self.__dict__["constant_arrays"] = [(name, array) for name, array, _ in constants]
        device = variables[0].value.device if variables else None
        for name, array, _ in constants:
            holder = _register_buffer(self, name, torch.as_tensor(array, dtype=torch.float32, device=device).clone())
            self.constants.append((holder, name.rsplit(".", 1)[-1], name))

    def __reduce_ex__(self, protocol):
        # A copy is a view of a copy of the critic (`copy.deepcopy` copies the critic through this), never of the
        # variables alone: the copied critic's forward pass reads what the copied parameters hold.
        own = self.critic.ema_weights if self.use_ema else self.critic.fast_weights
        index = {id(v): i for i, v in enumerate(own)}
        layout = [(name, index[id(var)], t) for name, var, t in zip(self.names, self.variables, self.transposed)]
        layout += [(name, array, "constant") for name, array in self.constant_arrays]
        return _rebuild_view, (
            self.critic,
            self.use_ema,
            self.outputs,
            layout,
            self.training,
            [p.requires_grad for p in self.params],
        )

    def read(self):
        """The parameters as read through the module now, in the variables' order: a parameter swapped by
        `torch.func.functional_call` or computed by a parametrization (`torch.nn.utils.parametrize`) is what
        is read, as a `torch.nn.Linear` reads its weight."""
        out = []
        for holder, leaf, _ in self.slots:
            param = holder._parameters.get(leaf)
            out.append(param if param is not None else getattr(holder, leaf))  # None: parametrized
        return out

    def values(self, read=None):
        """The tensors the forward pass reads (`read()`), in Keras's layout: a transposed parameter read back
        as a view, so gradients reach what the host's optimizer holds."""
        read = self.read() if read is None else read
        return [p.t() if t else p for p, (_, _, t) in zip(read, self.slots)]

    def _slow_parameters(self):
        return self.params if self.use_ema else []

    def _apply(self, fn, recurse=True):
        # A transposed parameter is re-made as a view of the moved Keras tensor, so the module and the critic keep
        # sharing storage.
        moved = _moved(self.variables, fn)
        buffers = [fn(holder._buffers[leaf]) for holder, leaf, _ in self.constants]
        _take(self.critic, self.variables, moved, fn)
        for param, transpose, new in zip(self.params, self.transposed, moved):
            if transpose:
                param.data = new.t()
                if param.grad is not None:
                    param.grad = fn(param.grad)
        for (holder, leaf, _), new in zip(self.constants, buffers):
            holder._buffers[leaf] = new
        return self

    def forward(self, latent, z=None):
        # Replayed here, not only by the critic: a call skips the critic's entry point and its checks.
        # Traced graphs are kept on the critic, shared by its views of one structure (a view made for one call
        # replays what an earlier one traced): they are given the values at each call.
        critic = self.critic
        key = (self.structure, z is None, layout_epoch(critic))
        inputs = (latent,) if z is None else (latent, z)
        read = self.read()
        # The module's own parameters (the usual case) change layout only with a new epoch: no need to read
        # their layouts at every call.
        own = ("own",) if all(map(operator.is_, read, self.params)) else None
        values = self.values(read) if self.aliased else read
        return torch_replay.replay(critic, self._variables, key, self._run, inputs, values, own)

    def _variables(self):
        return self.variables

    def _run(self, latent, z=None):
        if z is None:
            return self.critic.on_latent(latent, use_ema=self.use_ema, outputs=self.outputs)
        with device_scope(latent):
            value, logits = self.critic(latent, z, use_ema=self.use_ema)
        return {"logits": logits, "value": value, "both": (value, logits)}[self.outputs]


class CriticPairModule(_FrozenSlowCritic, _AllOrNothingLoad, torch.nn.Module):
    """Both halves of a critic as one `torch.nn.Module`: `fast` and `ema` views, parameters fast first.

    `forward(h, z=None, return_logits=False, use_ema=False)` and
    `init_ema()` / `update_ema()` are those of RLlib's PyTorch
    `CriticNetwork`, so it takes that critic's place in RLlib's learner.
    """

    def __init__(self, critic, layout=None):
        super().__init__()
        self.__dict__["critic"] = critic
        self.__dict__["layouts"] = layout
        if layout is None:
            self.fast = CriticModule(critic, False, "both")
            self.ema = CriticModule(critic, True, "both")
            return
        # A host's layout `(fast, ema)`: both halves' parameters under the host's own names on this module
        # (the views are kept aside, not as submodules, so each parameter is listed once). The views read
        # their parameters through this module (`functional_call` over it swaps these).
        self.__dict__["fast"] = CriticModule(critic, False, "both", layout[0])
        self.__dict__["ema"] = CriticModule(critic, True, "both", layout[1])
        for view in (self.fast, self.ema):
            slots = []
            for name, (_, leaf, transpose) in zip(view.names, view.slots):
                param = view.get_parameter(name)
                slots.append((_register(self, name, param), leaf, transpose))
            view.__dict__["slots"] = slots

    def __reduce_ex__(self, protocol):
        layouts = None
        if self.layouts is not None:
            layouts = []
            for view in (self.fast, self.ema):
                own = self.critic.ema_weights if view.use_ema else self.critic.fast_weights
                index = {id(v): i for i, v in enumerate(own)}
                layout = [(n, index[id(v)], t) for n, v, t in zip(view.names, view.variables, view.transposed)]
                layouts.append(layout + [(n, a, "constant") for n, a in view.constant_arrays])
        return _rebuild_pair, (self.critic, layouts, self.training)

    def _slow_parameters(self):
        return self.ema.params

    def _apply(self, fn, recurse=True):
        if "fast" in self._modules:
            _moved(self.fast.variables + self.ema.variables, fn)  # refused before either half moves
            return super()._apply(fn, recurse)
        _moved(self.fast.variables + self.ema.variables, fn)
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
