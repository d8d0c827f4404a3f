"""PyTorch: gradients with autograd (`loss.backward()`); the update optionally through `torch.compile`.

Data parallelism: when `torch.distributed` is initialised with more than one
process, the fast critic's forward pass goes through
`torch.nn.parallel.DistributedDataParallel`, which averages the gradients
over the processes during `backward()` (and broadcasts rank 0's weights,
EMA copy included, when it is set up). Every process then applies the same
clipped update and EMA step, so the weights stay identical everywhere.
"""

from __future__ import annotations

import contextlib

import keras
import torch
from keras.src.backend.common import global_state
from keras.src.backend.torch import core as keras_torch

from multicritic.backend import Backend

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
    on one CPU or CUDA device, outside `torch.compile`), else None."""
    from keras.src.backend.torch.optimizers.torch_adam import Adam

    if type(optimizer) is not Adam or torch.compiler.is_compiling():
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


class CriticModule(torch.nn.Module):
    """One half of a critic (fast or EMA) as a `torch.nn.Module` holding the critic's own parameters.

    The parameters are the Keras variables' tensors themselves (no copy):
    a host's optimizer, `load_state_dict`, `.to(device)` and in-place soft
    updates change the critic. The critic is not a submodule, so
    `parameters()` lists this half only.
    """

    def __init__(self, critic, use_ema: bool, outputs: str):
        super().__init__()
        if outputs not in VIEW_OUTPUTS:
            raise ValueError(f"outputs: got {outputs!r}, expected one of {list(VIEW_OUTPUTS)}.")
        if not critic.built:
            raise ValueError("critic: not built yet; call it once or give its input sizes first.")
        self.__dict__["critic"] = critic
        self.use_ema = bool(use_ema)
        self.outputs = outputs
        variables = critic.ema_weights if use_ema else critic.fast_weights
        for name, var in zip(critic.view_names(), variables):
            self.register_parameter(name, var.value)

    def forward(self, latent, z=None):
        if z is None:
            value, logits = self.critic.on_latent(latent, use_ema=self.use_ema)
        else:
            with BACKEND.device_scope(latent):
                value, logits = self.critic(latent, z, use_ema=self.use_ema)
        return {"logits": logits, "value": value, "both": (value, logits)}[self.outputs]


class CriticPairModule(torch.nn.Module):
    """Both halves of a critic as one `torch.nn.Module`: `fast` and `ema` views, parameters fast first.

    `forward(h, z=None, return_logits=False, use_ema=False)` and
    `init_ema()` / `update_ema()` are those of RLlib's PyTorch
    `CriticNetwork`, so it takes that critic's place in RLlib's learner.
    """

    def __init__(self, critic):
        super().__init__()
        self.fast = CriticModule(critic, False, "both")
        self.ema = CriticModule(critic, True, "both")
        self.__dict__["critic"] = critic

    def forward(self, h, z=None, return_logits=False, use_ema=False):
        value, logits = (self.ema if use_ema else self.fast)(h, z)
        return (value, logits) if return_logits else value

    def init_ema(self):
        self.critic.init_ema()

    def update_ema(self):
        self.critic.update_ema()


class TorchBackend(Backend):
    name = "torch"
    has_list_kernels = True
    kernel_scale_from_units = True

    @property
    def fused_norms(self):
        # Not in an ONNX export's trace: its exporter cannot take the kernels' shape arguments there.
        return not (torch.jit.is_tracing() or torch.onnx.is_in_onnx_export())

    def constant(self, values):
        # `torch.compile` cannot trace numpy: inside it, the Python floats.
        if torch.compiler.is_compiling():
            return torch.tensor(list(values), dtype=torch.float32)
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

    def device_scope(self, x):
        want, have = getattr(x, "device", None), torch.device(keras_torch.get_device())
        if want is None or (want.type == have.type and have.index in (None, want.index)):
            return contextlib.nullcontext()
        return keras_torch.device_scope(str(want))

    def module_view(self, critic, use_ema, outputs):
        return CriticPairModule(critic) if use_ema is None else CriticModule(critic, use_ema, outputs)

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
        if ok.device.type == "cpu" and not torch.compiler.is_compiling():
            if bool(ok):
                update()
            return
        values = [v.value for v in variables]  # assignments copy into these tensors
        old = [x.clone() for x in values]
        update()
        with torch.no_grad():
            for x, before in zip(values, old):
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
        ddp = torch.nn.parallel.DistributedDataParallel(critic, broadcast_buffers=False)

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

    def keras_test_step(self, model, evaluate, state, batch):
        with torch.no_grad():
            return evaluate(*batch)

    def make_train_function(self, program, batch_axis):
        distributed = _distributed()
        # jit_compile: torch.compile fuses the update's parameter-sized
        # elementwise work (clip, Adam, EMA) into a few loops. The forward and
        # backward passes stay eager: compiled through Keras's layers they
        # were slower on CPU, after minutes of compilation (torch 2.13).
        apply = torch.compile(program.apply) if program.jit_compile else program.apply

        def step(*batch):
            return self.train_step(program, batch, apply, distributed)

        return step

    def make_predict_function(self, critic, use_ema):
        """Eager forward pass without autograd (nothing to trace, nothing to recompile)."""

        def run(h, z):
            with torch.no_grad():
                return critic(h, z, use_ema=use_ema)

        return run


BACKEND = TorchBackend()
