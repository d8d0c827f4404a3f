"""What the step's work beyond the native step costs: the step traced with parts of it left out.

multicritic's step does more than the hand-written native steps: overflow
guards (the first Dense's power-of-two input scale, the LayerNorm's variance
of a row past float32), the invalid-state check that skips a step, the
decoded diagnostics (`ema_value_gap`, `member_spread`, `value_nll`, ...), and
a decode summed over mirrored pairs (exact 0 for a symmetric distribution).
This benchmark traces the step with each of them left out (patched out while
the step is traced, then restored: measurement only, such a step is not
safe) and times it side by side with the full step and the native step(s),
in alternating blocks in one process:

    python benchmarks/ours/extras_cost.py --backend tensorflow --batch 4096 --members 5
    python benchmarks/ours/extras_cost.py --backend jax --batch 256

The variants: `guards` (input scale, LayerNorm fallback, invalid-state
check), `diagnostics` (only `total` and the skip's `invalid_inputs` are
computed), `pairs` (the decode as the plain `sum(p * buckets)`), `all` (the
three). TensorFlow (XLA) and JAX, whose steps are traced once per shape;
PyTorch's compiled step may be traced again after the patches are gone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from benchmarks.ours.train_step import _inputs, dispatch, time_side_by_side  # noqa: E402
from benchmarks.ours.train_step import make_impls as native_steps  # noqa: E402
from benchmarks.render_tables import extras_cost as rendered  # noqa: E402

BACKENDS = ("tensorflow", "jax")
VARIANTS = ("guards", "diagnostics", "pairs", "all")


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def left_out(variant):
    """The context in which a step traced leaves `variant` out (see the module docstring)."""
    from keras import ops

    from multicritic.math import bins
    from multicritic.layers import layer_norm, mlp
    from multicritic.training import step

    full_losses = step.CriticStep._critic_losses

    def total_only(self, *args, **kwargs):
        losses = full_losses(self, *args, **kwargs)
        return {"total": losses["total"], "invalid_inputs": losses["invalid_inputs"]}

    parts = {
        "guards": lambda: [
            _patched(mlp, "_FIRST_INPUT_SCALE", 1.0),
            _patched(layer_norm, "_inv_std", lambda centered, var, eps: ops.rsqrt(var + eps)),
            _patched(step.CriticStep, "_invalid_states", lambda self, fast, h, z: 0.0),
        ],
        "diagnostics": lambda: [_patched(step.CriticStep, "_critic_losses", total_only)],
        "pairs": lambda: [_patched(bins, "_decode_table", lambda *args: None)],
    }
    stack = contextlib.ExitStack()
    for name in tuple(parts) if variant == "all" else (variant,):
        for patch in parts[name]():
            stack.enter_context(patch)
    return stack


def make_impls(backend, size, batch, members, data):
    """`{name: step}`: the full step, each variant (traced on `data` in its context) and the native step(s):
    `train_step.py`'s for one critic (`native`, on TensorFlow also `native_xla`), the vectorised native
    ensemble for `members` > 1 (the same names)."""
    import keras

    from multicritic import CriticNetwork, CriticTrainer, get_model_dims

    def trainer():
        keras.utils.set_random_seed(0)
        return CriticTrainer(CriticNetwork(model_size=size, ensemble_size=members), jit_compile=True)

    impls, first_loss = {}, {}
    for name in ("full",) + VARIANTS:
        t = trainer()
        with contextlib.nullcontext() if name == "full" else left_out(name):
            first_loss[name] = float(t.train_step(*data)["total"])
        impls[name] = t.train_step
    natives = ("native", "native_xla") if backend == "tensorflow" else ("native",)
    if members == 1:
        impls.update(native_steps(backend, size, batch, natives)[0])
        return impls, first_loss
    dims = get_model_dims(size)
    in_dim = dims["gru_units"] + dims["num_z_categoricals"] * dims["num_z_classes"]
    native = __import__(f"benchmarks.native.native_ensemble_{backend}", fromlist=["make_step"])
    for name in natives:
        kwargs = {"jit_compile": name == "native_xla"} if backend == "tensorflow" else {}
        impls[name] = native.make_step(members, in_dim, dims["dense_hidden_units"], dims["num_dense_layers"], **kwargs)
    return impls, first_loss


def run_backend(backend, size, batches, members, repeats, block_seconds):
    if backend not in BACKENDS:
        raise SystemExit(f"--backend: got {backend!r}, expected one of {BACKENDS} (a step traced once per shape)")
    from multicritic import get_model_dims

    dims = get_model_dims(size)
    records = []
    for batch in batches:
        data = _inputs(backend, batch, dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"], seed=batch)
        impls, first_loss = make_impls(backend, size, batch, members, data)
        times, count = time_side_by_side(backend, impls, data, repeats, block_seconds)
        full = times["full"]
        records.append(
            {
                "backend": backend,
                "size": size,
                "batch": batch,
                "members": members,
                "repeats": repeats,
                "steps_per_block": count,
                "first_loss": first_loss,
                "step_ms": {name: statistics.median(v) * 1e3 for name, v in times.items()},
                # The median over blocks of each block's time over the full step's in the same round.
                "over_full": {name: statistics.median([a / b for a, b in zip(v, full)]) for name, v in times.items()},
            }
        )
    return records


def table(records):
    return "\n".join(rendered([records]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "tensorflow"), help=f"one of {BACKENDS}")
    parser.add_argument("--size", default="XS")
    parser.add_argument("--batch", type=int, nargs="+", default=[4096])
    parser.add_argument("--members", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=2.0, help="length of one timed block")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.backend == "all":
        parser.error(f"--backend: got 'all', expected one of {BACKENDS}")
    dispatch(
        __file__,
        args,
        [],
        lambda: run_backend(args.backend, args.size, args.batch, args.members, args.repeats, args.block_seconds),
        table,
    )


if __name__ == "__main__":
    main()
