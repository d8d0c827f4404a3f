"""Shared test helpers. Every test runs on the backend named by KERAS_BACKEND."""

from __future__ import annotations

import os

# Compiled PyTorch steps run as their traced ATen graphs in the tests (the capture and its values are what
# most tests check); inductor's code generation costs 10-30 s per step and is tested where it is named
# (tests/backend/test_torch.py, tests/backend/test_torch_step.py). Subprocesses inherit it.
os.environ.setdefault("MULTICRITIC_TORCH_COMPILER", "aten")

# pytest-xdist workers share the machine's cores: each takes its share for PyTorch's OpenMP pool (set before
# PyTorch starts; subprocesses inherit it). Pools of every core in each worker oversubscribe the machine, and
# OpenMP threads that spin at barriers then wait for each other's time slices, so that tests of many small
# ops run several times slower than alone.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

BACKEND = keras.backend.backend()


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {BACKEND}"


def pytest_sessionstart(session):
    wanted = os.environ.get("KERAS_BACKEND")
    if wanted and wanted != BACKEND:
        raise pytest.UsageError(f"KERAS_BACKEND={wanted} but Keras runs on {BACKEND}")


def to_np(x):
    """Backend tensor (or structure of them) -> numpy."""
    if isinstance(x, dict):
        return {k: to_np(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_np(v) for v in x)
    if BACKEND == "torch" and hasattr(x, "detach"):
        x = x.detach()
    return np.asarray(keras.ops.convert_to_numpy(x))


def compiled(fn):
    """`fn` compiled the way this backend compiles (torch: dynamo full graph)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    import torch

    torch._dynamo.reset()
    return torch.compile(fn, backend="aot_eager", fullgraph=True)


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


def random_inputs(critic, batch, seed=0):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(batch, critic.gru_units)).astype("float32")
    z = rng.random(size=(batch, critic.num_z_categoricals, critic.num_z_classes)).astype("float32")
    return h, z


# The two kinds of critic, as options added to a test's own: DreamerV3's `(h, z)`, and one flat feature vector.
CRITIC_KINDS = {"h_z": {}, "features": {"input_size": 10}}


def inputs_of(critic, batch, seed=0):
    """Random inputs for `critic(*inputs)`, `batch` an int or a tuple of leading dims: `(h, z)`, or a features
    critic's `(x,)` (`input_layout="features"`)."""
    rng = np.random.default_rng(seed)
    lead = (batch,) if isinstance(batch, int) else tuple(batch)
    if critic.input_layout == "features":
        return (rng.normal(size=lead + (critic.input_size,)).astype("float32"),)
    h = rng.normal(size=lead + (critic.gru_units,)).astype("float32")
    z = rng.random(size=lead + (critic.num_z_categoricals, critic.num_z_classes)).astype("float32")
    return h, z


def copy_features_into_h_z(features, h_z, rng=None):
    """A features critic's weights (`input_size=D`) into the `(h, z)` critic `h_z` of `gru_units=D` and a
    one-class `z`: the same network but for the first kernel's row for `z` (placed after `h`'s rows, before
    anything a trunk appends to its input, as SimbaV2's shift; random values from `rng`, else 0) and an input
    norm's column for it (0, so that the normalised `z = 0` stays 0). With `z = 0` both compute the same."""
    for mine, theirs in zip(features.weights, h_z.weights):
        value = np.asarray(keras.ops.convert_to_numpy(mine.value))
        if value.shape != tuple(theirs.shape):
            axis = next(i for i, (a, b) in enumerate(zip(value.shape, theirs.shape)) if a != b)
            head, tail = np.split(value, [features.input_size], axis=axis)
            shape = head.shape[:axis] + (1,) + head.shape[axis + 1 :]
            random = rng is not None and mine.path.endswith("kernel")
            row = rng.normal(size=shape) if random else np.zeros(shape)
            value = np.concatenate([head, row.astype(value.dtype), tail], axis=axis)
        theirs.assign(value)


def randomize(critic, seed=0, scale=0.3):
    """Gives every fast weight (the zero head included) random values and re-syncs the EMA copy."""
    rng = np.random.default_rng(seed)
    for v in critic.fast_weights:
        value = rng.normal(scale=scale, size=tuple(v.shape)).astype("float32")
        if v.path.endswith("/moving_variance"):  # a batch norm's (XQC's trunk): positive, as a variance is
            value = np.abs(value) + 1.0
        v.assign(value)
    critic.init_ema()


def grads_of(fn, *args):
    """Gradients of scalar `fn(*args)` with respect to every argument (None where none flows)."""
    args = [keras.ops.convert_to_tensor(a) for a in args]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape(persistent=True) as tape:
            for a in args:
                tape.watch(a)
            out = fn(*args)
        return [tape.gradient(out, a) for a in args]
    if BACKEND == "jax":
        import jax

        return list(jax.grad(lambda *a: fn(*a), argnums=tuple(range(len(args))))(*args))
    import torch

    args = [a.detach().clone().requires_grad_(True) for a in args]
    out = fn(*args)
    return list(torch.autograd.grad(out, args, allow_unused=True))
