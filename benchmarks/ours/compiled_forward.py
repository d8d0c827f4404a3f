"""Times a host's actor called once per environment step: a Keras model eagerly, through `predict_on_batch` and
through `multicritic.CompiledForward`, against the same network written natively.

The actor of `examples/ppo/` (observations 4 -> 64 -> 64 -> 2, tanh) at batch 1, the call an agent makes per
environment step. Native: on PyTorch an `nn.Sequential` of `nn.Linear` / `nn.Tanh`, on JAX a pure function
under `jax.jit`, on TensorFlow a `tf.function` over `tf.Variable`s, each holding the Keras model's weights and
checked to give its outputs. On PyTorch both with autograd on (a learner's call) and under `torch.no_grad()` (an
acting loop). Each backend runs in its own process; within one, the variants run in alternating blocks, and a
call's time is the median over blocks [min, max].

    python benchmarks/ours/compiled_forward.py --json benchmarks/results/results_compiled_forward.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BACKENDS = ("jax", "tensorflow", "torch")
OBS, UNITS, ACTIONS = 4, 64, 2


def actor():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((OBS,)),
            keras.layers.Dense(UNITS, activation="tanh"),
            keras.layers.Dense(UNITS, activation="tanh"),
            keras.layers.Dense(ACTIONS),
        ]
    )


def native(model):
    """`(call, modes)`: the same network written in the backend's own terms, holding `model`'s weights, and the
    autograd modes to time it in (`[None]` where the backend has none)."""
    import keras

    weights = [keras.ops.convert_to_numpy(w) for w in model.weights]  # kernel, bias per layer
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        layers = []
        for i in range(0, len(weights), 2):
            linear = torch.nn.Linear(*weights[i].shape)
            with torch.no_grad():
                linear.weight.copy_(torch.as_tensor(weights[i].T))
                linear.bias.copy_(torch.as_tensor(weights[i + 1]))
            layers += [linear, torch.nn.Tanh()]
        return torch.nn.Sequential(*layers[:-1]), [True, False]
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        params = [jnp.asarray(w) for w in weights]

        @jax.jit
        def apply(params, x):
            for i in range(0, len(params) - 2, 2):
                x = jnp.tanh(x @ params[i] + params[i + 1])
            return x @ params[-2] + params[-1]

        return (lambda x: apply(params, x)), [None]
    import tensorflow as tf

    variables = [tf.Variable(w) for w in weights]

    @tf.function
    def apply(x):
        for i in range(0, len(variables) - 2, 2):
            x = tf.tanh(x @ variables[i] + variables[i + 1])
        return x @ variables[-2] + variables[-1]

    return apply, [None]


def child(blocks: int, calls: int, batch: int) -> list:
    import keras
    import numpy as np

    from multicritic import CompiledForward

    backend = keras.backend.backend()
    model = actor()
    base, modes = native(model)
    obs = np.random.default_rng(0).normal(size=(batch, OBS)).astype("float32")
    if backend == "torch":
        import torch

        x = torch.as_tensor(obs)
    else:
        x = keras.ops.convert_to_tensor(obs)
    forward = CompiledForward(model)
    variants = {
        "keras_call": lambda: model(x, training=False),
        "predict_on_batch": lambda: model.predict_on_batch(x),
        "compiled_forward": lambda: forward(x),
        "native": lambda: base(x),
    }
    want = keras.ops.convert_to_numpy(model(x, training=False))
    for name, call in variants.items():  # the same numbers, and every compiled pass made before timing
        for _ in range(3):
            got = keras.ops.convert_to_numpy(call())
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
    records = []
    for mode in modes:
        grad = contextlib.nullcontext() if mode in (None, True) else __import__("torch").no_grad()
        times = {name: [] for name in variants}
        with grad:
            for _ in range(blocks):
                for name, call in variants.items():
                    n = calls if name != "predict_on_batch" and name != "keras_call" else max(calls // 10, 10)
                    start = time.perf_counter()
                    for _ in range(n):
                        out = call()
                    if hasattr(out, "block_until_ready"):  # JAX dispatches asynchronously
                        out.block_until_ready()
                    times[name].append((time.perf_counter() - start) / n * 1e6)
        for name, per_block in times.items():
            records.append(
                {
                    "backend": backend,
                    "variant": name,
                    "batch": batch,
                    "autograd": mode,
                    "us_median": statistics.median(per_block),
                    "us_min": min(per_block),
                    "us_max": max(per_block),
                    "blocks": blocks,
                }
            )
    return records


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="calls per block (a tenth for the Keras calls)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.blocks, args.calls, args.batch)))
        return None
    records = []
    for backend in args.backends:
        command = [sys.executable, os.path.abspath(__file__), "--child", "--blocks", str(args.blocks)]
        command += ["--calls", str(args.calls), "--batch", str(args.batch)]
        env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": ROOT}
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{backend}: the timing process failed:\n{done.stderr[-3000:]}")
        records += json.loads(done.stdout.strip().splitlines()[-1])
        for r in records[-(4 if backend != "torch" else 8) :]:
            print(f"{backend:10s} {r['variant']:17s} autograd={r['autograd']!s:5s} {r['us_median']:8.1f} us "
                  f"[{r['us_min']:.1f}, {r['us_max']:.1f}]")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["python", *sys.argv]), "records": records}, f, indent=1)
    return records


if __name__ == "__main__":
    main()
