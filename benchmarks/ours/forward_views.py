"""Times the critic's forward passes as a PyTorch host calls them in its loops, against the same `nn.Module`.

sheeprl, NM512, TorchRL and RLlib call their critic (and target critic) eagerly inside every imagined step and
every learner update. Each of multicritic's entry points is timed next to the plain PyTorch module a host would
otherwise hold, with the same sizes: `fast_module()` / `ema_module()` (logits, as sheeprl's critic) against an
`nn.Sequential` MLP with a Linear head; `on_latent`, `critic(h, z)` and the RLlib module (value and logits)
against a module that also decodes the value (`benchmarks/native/native_torch.py`'s critic). Each pair runs in
alternating blocks in one process, with autograd on (a learner's call) and under `torch.no_grad()` (imagination);
the medians' ratio is ours / native (below 1: ours is faster).

    KERAS_BACKEND=torch python benchmarks/ours/forward_views.py --json benchmarks/results/results_forward_views.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

CASES = (("nano", 4), ("XS", 256))


def native_modules(critic):
    """The plain PyTorch modules a host would hold: `(logits_module(latent), value_and_logits(latent),
    value_and_logits(h, z))`."""
    from torch import nn

    from benchmarks.native.native_torch import Critic

    units, layers, in_dim = critic.dense_hidden_units, critic.num_dense_layers, critic.latent_size
    blocks = []
    for i in range(layers):
        blocks += [nn.Linear(in_dim if i == 0 else units, units, bias=False), nn.LayerNorm(units, eps=1e-3), nn.SiLU()]
    logits = nn.Sequential(*blocks, nn.Linear(units, critic.num_buckets))
    on_hz = Critic(in_dim, units, layers)

    class OnLatent(nn.Module):
        def __init__(self):
            super().__init__()
            self.critic = Critic(in_dim, units, layers)

        def forward(self, latent):
            out = self.critic.head(self.critic.mlp(latent)).float()
            return (out.softmax(-1) * self.critic.buckets).sum(-1), out

    return logits, OnLatent(), on_hz


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _block(fn, count):
    _sync()
    start = time.perf_counter()
    for _ in range(count):
        fn()
    _sync()
    return (time.perf_counter() - start) / count


def time_pair(ours, native, repeats, block_seconds):
    """Medians (seconds per call) of `ours` and `native`, in alternating blocks."""
    for fn in (ours, native):
        for _ in range(3):
            fn()
    count = max(10, int(block_seconds / max(_block(ours, 20), _block(native, 20))))
    times = {"ours": [], "native": []}
    for r in range(repeats):
        order = [("ours", ours), ("native", native)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            times[name].append(_block(fn, count))
    return statistics.median(times["ours"]), statistics.median(times["native"])


def variants_main(doc, variants, baseline, column, argv=None):
    """The command line of a script timing hand-written variants of a forward pass (`variants(batch) ->
    {name: fn}`) against its `baseline` entry, under `torch.no_grad()`: a markdown table, one row per variant
    and batch (`column`: the header of the variant's name)."""
    import torch

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[256])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--block-seconds", type=float, default=0.3)
    args = parser.parse_args(argv)
    print(f"| batch | {column} | µs | {baseline} µs | difference µs |\n|---:|---|---:|---:|---:|")
    with torch.no_grad():
        for batch in args.batch:
            fns = variants(batch)
            for name, fn in fns.items():
                if name == baseline:
                    continue
                t, base = time_pair(fn, fns[baseline], args.repeats, args.block_seconds)
                print(f"| {batch} | {name} | {t * 1e6:.1f} | {base * 1e6:.1f} | {(t - base) * 1e6:+.1f} |")


def run(cases, repeats, block_seconds):
    import torch

    from multicritic import CriticNetwork

    torch.manual_seed(0)
    records = []
    for size, batch in cases:
        critic = CriticNetwork(model_size=size)
        device = critic.fast_weights[0].value.device  # where Keras put the critic (a GPU when there is one)
        logits_native, latent_native, hz_native = (m.to(device) for m in native_modules(critic))
        latent = torch.randn(batch, critic.latent_size, device=device)
        h = latent[:, : critic.gru_units].contiguous()
        z = latent[:, critic.gru_units :].reshape(batch, critic.num_z_categoricals, critic.num_z_classes).contiguous()
        fast, ema, rllib = critic.fast_module(), critic.ema_module(), critic.torch_module()
        pairs = {
            "fast_module(latent)": (lambda: fast(latent), lambda: logits_native(latent)),
            "ema_module(latent)": (lambda: ema(latent), lambda: logits_native(latent)),
            "on_latent(latent)": (lambda: critic.on_latent(latent), lambda: latent_native(latent)),
            "critic(h, z)": (lambda: critic(h, z), lambda: hz_native(h, z)),
            "torch_module()(h, z)": (lambda: rllib(h, z, return_logits=True), lambda: hz_native(h, z)),
        }
        for grad in (True, False):
            for entry, (ours, native) in pairs.items():
                with contextlib.nullcontext() if grad else torch.no_grad():
                    t_ours, t_native = time_pair(ours, native, repeats, block_seconds)
                records.append(
                    {
                        "size": size,
                        "batch": batch,
                        "entry": entry,
                        "autograd": grad,
                        "ours_us": t_ours * 1e6,
                        "native_us": t_native * 1e6,
                        "ratio": t_ours / t_native,
                        "repeats": repeats,
                    }
                )
    return records


def table(records):
    lines = [
        "| size | batch | entry | autograd | ours µs | native µs | ours / native |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for r in records:
        lines.append(
            f"| {r['size']} | {r['batch']} | {r['entry']} | {'on' if r['autograd'] else 'no_grad'} | "
            f"{r['ours_us']:.1f} | {r['native_us']:.1f} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", nargs="+", default=[f"{s}:{b}" for s, b in CASES], help="SIZE:BATCH pairs")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--block-seconds", type=float, default=0.3)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.case]
    records = run(cases, args.repeats, args.block_seconds)
    print(table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
