"""Data-parallel throughput on this machine: steps/s of CriticTrainer.train_step vs devices/processes.

CPU-simulated: JAX virtual CPU devices (XLA_FLAGS), PyTorch gloo processes,
TensorFlow logical CPU devices; all share the machine's cores, so this shows
overhead and correctness of the engines' data parallelism, not speed-up.

    python benchmarks/ours/scaling.py --size XS --batch 4096 --steps 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository

WORKER = r"""
import json, os, sys, time, datetime
sys.path.insert(0, {root!r})
backend, n, size, batch, steps, rank, port = {args!r}
import numpy as np
if backend == "tensorflow":
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
if backend == "torch" and n > 1:
    import torch
    torch.set_num_threads(max(1, os.cpu_count() // n))
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=n,
                                         timeout=datetime.timedelta(seconds=120))
import keras
from multicritic import CriticNetwork, CriticTrainer
def build():
    critic = CriticNetwork(model_size=size)
    return CriticTrainer(critic)
if backend == "jax" and n > 1:
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices()[:n]))
if backend == "tensorflow" and n > 1:
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{{i}}" for i in range(n)])
    with strategy.scope():
        trainer = build()
else:
    trainer = build()
critic = trainer.critic
local = batch // n if backend == "torch" else batch
rng = np.random.default_rng(rank)
data = [rng.normal(size=(local, critic.gru_units)).astype("float32"),
        rng.random((local, critic.num_z_categoricals, critic.num_z_classes)).astype("float32"),
        (100 * rng.normal(size=local)).astype("float32"), np.ones(local, "float32")]
data = [keras.ops.convert_to_tensor(x) for x in data]
for _ in range(2):
    m = trainer.train_step(*data)
float(keras.ops.convert_to_numpy(m["total"]))
start = time.perf_counter()
for _ in range(steps):
    m = trainer.train_step(*data)
float(keras.ops.convert_to_numpy(m["total"]))
print(json.dumps({{"steps_per_s": steps / (time.perf_counter() - start)}}))
"""


def measure(backend, n, size, batch, steps):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    if backend == "jax":
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n}"
    procs = 1 if backend != "torch" else n
    port = 29500 + n
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER.format(root=ROOT, args=(backend, n, size, batch, steps, rank, port))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(procs)
    ]
    outs = [c.communicate(timeout=900) for c in children]
    for c, (out, err) in zip(children, outs):
        if c.returncode != 0:
            raise SystemExit(f"{backend} x{n} failed: {err[-1500:]}")
    return min(json.loads(out.strip().splitlines()[-1])["steps_per_s"] for out, _ in outs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="XS")
    parser.add_argument("--batch", type=int, default=4096, help="global batch")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"])
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    rows = []
    for backend in args.backends:
        for n in args.devices:
            rate = measure(backend, n, args.size, args.batch, args.steps)
            rows.append({"backend": backend, "devices": n, "steps_per_s": rate, "samples_per_s": rate * args.batch})
            print(f"{backend:<11} x{n}: {rate:6.2f} steps/s ({rate * args.batch:8.0f} samples/s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
