"""The critic train step written by hand in plain PyTorch: the baseline multicritic must match.

nn.Linear / nn.LayerNorm / SiLU modules, an EMA copy with requires_grad off,
the two-hot cross-entropy by gathering two buckets, clip_grad_norm_
(foreach), Adam in foreach ops with Keras's epsilon placement (the
trainer's; `torch.optim.Adam` places it after the bias correction), EMA
with _foreach ops; with
`jit_compile`, the forward pass and loss (their backward with them) and the
update each go through `torch.compile` (PyTorch's recipe for a compiled
training step); with `jit_compile="cuda_graph"` (a CUDA device) the whole
step, forward, backward, clip, Adam and EMA, is captured by hand as one CUDA
graph (`torch.cuda.graph`, PyTorch's whole-network capture recipe, as
TorchRL's learner does): static input buffers, a warm-up on a side stream,
gradients allocated in the graph's pool, every step one `replay()`. Its Adam
is the foreach one with its step count on the device (capturable);
`torch.optim.Adam(capturable=True)` would put epsilon after the bias
correction, and the per-step epsilon that makes it Keras's (the fused
variant's) is a host number a graph cannot take. Same math as the reference
critic step.

Variants tried (`benchmarks/ours/baseline_variants.py`, XS, 2 vCPUs, medians of 5
alternating blocks, ms per step at batch 256 / 4096 / 15360; the file
`results_baseline_variants.json`): two-hot by gather + foreach Adam 7.97 /
69.85 / 283.2; gather + torch.optim.Adam's fused kernel 8.24 / 70.31 / 278.3;
dense two-hot product + foreach 8.22 / 70.46 / 285.9; dense + fused 7.81 /
70.19 / 289.8. All within 5% (the machine's noise); `benchmarks.options_for(native,
batch)` takes the fastest at the nearest measured batch.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

# Where Keras puts multicritic's variables, so the native steps run beside them.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

NUM_BUCKETS, LOWER, UPPER = 255, -20.0, 20.0


class Critic(nn.Module):
    def __init__(self, in_dim, units, layers):
        super().__init__()
        blocks = []
        for i in range(layers):
            blocks += [
                nn.Linear(in_dim if i == 0 else units, units, bias=False),
                nn.LayerNorm(units, eps=1e-3),
                nn.SiLU(),
            ]
        self.mlp = nn.Sequential(*blocks)
        self.head = nn.Linear(units, NUM_BUCKETS)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.register_buffer("buckets", torch.linspace(LOWER, UPPER, NUM_BUCKETS))

    def forward(self, h, z):
        logits = self.head(self.mlp(torch.cat([h, z.flatten(1)], -1))).float()
        return (logits.softmax(-1) * self.buckets).sum(-1), logits


def two_hot_parts(v):
    delta = (UPPER - LOWER) / (NUM_BUCKETS - 1)
    v = v.clamp(LOWER, UPPER)
    idx = (v - LOWER) / delta
    k, kp1 = idx.floor(), idx.ceil()
    kp1 = torch.where(k == kp1, kp1 + 1, kp1)
    kp1 = torch.where(kp1 == NUM_BUCKETS, kp1 - 2, kp1)
    b_k, b_kp1 = LOWER + k * delta, LOWER + kp1 * delta
    w_k = (v - b_kp1) / (b_k - b_kp1)
    return k.long(), kp1.long(), w_k, 1 - w_k


def symlog(x):
    return torch.sign(x) * torch.log1p(x.abs())


def loss_from(logits, ema_value, targets, weights, two_hot="gather"):
    """The DreamerV3 critic loss (two-hot NLL + two-hot of the EMA's value), weighted mean over positions:
    `"gather"` picks the two log-probabilities of each encoding, `"dense"` builds both encodings as
    `[B, 255]` distributions and takes their product with the log-probabilities."""
    logp = logits.log_softmax(-1)
    k, kp1, w_k, w_kp1 = two_hot_parts(symlog(targets))
    ek, ekp1, ew_k, ew_kp1 = two_hot_parts(ema_value)
    idx = torch.stack([k, kp1, ek, ekp1], -1)
    w = torch.stack([w_k, w_kp1, ew_k, ew_kp1], -1)
    if two_hot == "gather":
        per = -(logp.gather(-1, idx) * w).sum(-1)
    elif two_hot == "dense":
        target = torch.zeros_like(logp).scatter_add_(-1, idx, w)
        per = -(logp * target).sum(-1)
    else:
        raise ValueError(f"two_hot: got {two_hot!r}, expected 'gather' or 'dense'.")
    return (per * weights).mean()


# Variants of the step (`make_step` keywords), computing the same math.
VARIANTS = {"two_hot": ("gather", "dense"), "optimizer": ("foreach", "fused")}


# The fastest measured per batch (benchmarks/ours/baseline_variants.py, XS; see the module docstring).
FASTEST = {
    256: {"two_hot": "dense", "optimizer": "fused"},
    4096: {"two_hot": "gather", "optimizer": "foreach"},
    15360: {"two_hot": "gather", "optimizer": "fused"},
}


def make_step(
    in_dim,
    units,
    layers,
    lr=3e-5,
    eps=1e-5,
    clip=100.0,
    decay=0.98,
    jit_compile=False,
    initial=None,
    two_hot="gather",
    optimizer="foreach",
    precision="float32",
):
    """`step(h, z, targets, weights) -> metrics`; `initial`: `(fast, ema)` state dicts to start from
    (`step.read("fast" | "ema")` reads them back); `two_hot`, `optimizer`: the variant (see `VARIANTS`);
    `precision="bfloat16"`: the forward passes under `torch.autocast` (matmuls in bfloat16; the loss, the
    weights and the update in float32), PyTorch's mixed precision."""
    if precision not in ("float32", "bfloat16"):
        raise ValueError(f"precision: got {precision!r}, expected 'float32' or 'bfloat16'.")
    critic = Critic(in_dim, units, layers).to(DEVICE)
    ema = copy.deepcopy(critic).requires_grad_(False)
    if initial is not None:
        for module, state in zip((critic, ema), initial):
            module.load_state_dict({k: torch.as_tensor(v, device=DEVICE) for k, v in state.items()}, strict=False)
    params = list(critic.parameters())
    ema_params = list(ema.parameters())
    # Adam with Keras's epsilon placement (`lr_t * m / (sqrt(v) + eps)`, as CriticTrainer's), in foreach ops
    # or through torch.optim.Adam's fused kernel (which adds epsilon after the bias correction: see update()).
    moments = [torch.zeros_like(p) for p in params]
    velocities = [torch.zeros_like(p) for p in params]
    count = torch.zeros((), device=DEVICE)
    steps = [0]  # the fused optimizer's step count, on the host (its epsilon is a Python float)
    if optimizer == "fused":
        opt = torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), fused=True)
    elif optimizer != "foreach":
        raise ValueError(f"optimizer: got {optimizer!r}, expected 'foreach' or 'fused'.")

    def forward_loss(h, z, targets, weights):
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            _, logits = critic(h, z)
            with torch.no_grad():
                ema_value, _ = ema(h, z)
        return loss_from(logits.float(), ema_value.float(), targets, weights, two_hot)

    cuda_graphs = jit_compile == "reduce-overhead"

    def step(h, z, targets, weights):
        if cuda_graphs:  # a new step: the last one's graph outputs may be overwritten (PyTorch's recipe)
            torch.compiler.cudagraph_mark_step_begin()
        loss = forward_loss(h, z, targets, weights)
        if optimizer == "fused":
            opt.zero_grad(set_to_none=True)
        else:
            for p in params:
                p.grad = None
        loss.backward()
        return {"total": loss.detach(), "grad_norm": update()}

    def update():
        norm = nn.utils.clip_grad_norm_(params, clip, foreach=True)
        grads = [p.grad for p in params]
        with torch.no_grad():
            if optimizer == "fused":
                steps[0] += 1
                # Keras's `lr_t * m / (sqrt(v) + eps)` is torch's `lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t)
                # + eps')` with eps' = eps / sqrt(1 - b2^t): the fused kernel with that step's epsilon.
                opt.param_groups[0]["eps"] = eps / (1.0 - 0.999 ** steps[0]) ** 0.5
                opt.step()
                torch._foreach_lerp_(ema_params, params, 1.0 - decay)
                return norm
            count.add_(1.0)
            alpha = lr * torch.sqrt(1.0 - 0.999**count) / (1.0 - 0.9**count)
            torch._foreach_lerp_(moments, grads, 0.1)
            torch._foreach_mul_(velocities, 0.999)
            torch._foreach_addcmul_(velocities, grads, grads, value=0.001)
            denominators = torch._foreach_sqrt(velocities)
            torch._foreach_add_(denominators, eps)
            updates = torch._foreach_div(moments, denominators)
            torch._foreach_mul_(updates, alpha)
            torch._foreach_sub_(params, updates)
            torch._foreach_lerp_(ema_params, params, 1.0 - decay)
        return norm

    if jit_compile and jit_compile != "cuda_graph":
        # The whole step as PyTorch compiles it: the forward pass and loss (AOTAutograd compiles their backward
        # with them) and the update (the "compiled optimizer" recipe), with the foreach Adam (the fused one's
        # epsilon changes on the host every step, which would recompile).
        if optimizer == "fused":
            raise ValueError("optimizer: 'fused' with jit_compile=True; the compiled step takes 'foreach'.")
        # `jit_compile="reduce-overhead"`: the same with CUDA graphs (PyTorch's recipe for small steps on a GPU).
        mode = jit_compile if isinstance(jit_compile, str) else None
        forward_loss = torch.compile(forward_loss, fullgraph=True, mode=mode)
        update = torch.compile(update, fullgraph=True, mode=mode)

    def read(which):
        return {
            k: v.detach().cpu().numpy().copy()
            for k, v in (critic if which == "fast" else ema).state_dict().items()
            if k != "buckets"
        }

    if jit_compile == "cuda_graph":
        if optimizer != "foreach":
            raise ValueError(f"optimizer: got {optimizer!r} with jit_compile='cuda_graph', expected 'foreach'.")
        return _captured(forward_loss, update, params, [*params, *ema_params, *moments, *velocities, count], read)
    step.read = read
    return step


def _captured(forward_loss, update, params, state, read):
    """The step `forward_loss` + backward + `update` captured as one CUDA graph per input shape."""
    if not torch.cuda.is_available():
        raise ValueError(
            "jit_compile: got 'cuda_graph' without a CUDA device, expected True, False or 'reduce-overhead'."
        )
    graphs = {}

    def body(inputs):
        loss = forward_loss(*inputs)
        loss.backward()
        return loss.detach(), update()

    def capture(batch):
        inputs = [x.clone() for x in batch]  # the graph's own input buffers
        saved = [t.detach().clone() for t in state]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (cuBLAS handles, allocator pools) outside the capture
            for _ in range(3):
                for p in params:
                    p.grad = None
                body(inputs)
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():  # the warm-up's steps undone: the first replay is the first step
            for t, s in zip(state, saved):
                t.copy_(s)
        for p in params:
            p.grad = None  # allocated inside the capture, from the graph's pool
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = body(inputs)
        return graph, inputs, outputs

    def step(h, z, targets, weights):
        batch = (h, z, targets, weights)
        key = tuple((tuple(x.shape), x.dtype) for x in batch)
        if key not in graphs:
            graphs[key] = capture(batch)
        graph, inputs, (loss, norm) = graphs[key]
        for buffer, x in zip(inputs, batch):
            buffer.copy_(x)
        graph.replay()
        # The graph's output buffers: the next replay overwrites them (read them before the next step).
        return {"total": loss, "grad_norm": norm}

    step.read = read
    return step
