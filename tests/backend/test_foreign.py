"""Other frameworks' arrays (`multicritic.backend.foreign`): the critic's calls, the trainer's entries and the loss
take them with the values the same data gives as numpy, imported by DLPack without a copy where the devices allow.

In this process (every backend session): a DLPack producer no framework knows (a numpy array behind the protocol).
Marked `cross_backend` (the session with all three frameworks installed): one subprocess per Keras backend feeds it
the other two frameworks' arrays. Run as a script it is the subprocess body: `python -m tests.backend.test_foreign`.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BACKENDS = ("jax", "torch", "tensorflow")
FRAMEWORKS = ("jax", "jaxlib", "torch", "tensorflow")
BATCH = 4


class Producer:
    """An array of a framework nobody imports: a numpy array behind DLPack (and numpy's `__array__`, the way
    out of a layout DLPack cannot describe)."""

    def __init__(self, array):
        self.array = array
        self.dtype = array.dtype

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.array, dtype)


class Unreadable:
    """An object with `__dlpack__` whose export fails, and nothing else to read it by."""

    dtype = "float32"

    def __dlpack__(self, **kwargs):
        raise BufferError("no export")


def aligned(array, alignment=64):
    """`array` copied into memory aligned as every framework's allocator aligns (TensorFlow's kernels assume it)."""
    buffer = np.empty(array.nbytes + alignment, np.uint8)
    start = -buffer.ctypes.data % alignment
    out = buffer[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def host(x):
    if hasattr(x, "detach"):
        x = x.detach()
    return np.asarray(keras.ops.convert_to_numpy(x))


def gap(got, want) -> float:
    """The largest difference of two (structures of) arrays: 0.0 where equal; inf where shapes differ."""
    if isinstance(want, dict):
        return max(gap(got[k], want[k]) for k in want)
    if isinstance(want, (list, tuple)):
        return max(gap(g, w) for g, w in zip(got, want))
    got, want = host(got), host(want)
    if got.shape != want.shape:
        return float("inf")
    return 0.0 if np.array_equal(got, want) else float(np.max(np.abs(got.astype("float64") - want)))


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(BATCH, 16)).astype("float32")
    z = rng.random((BATCH, 4, 4)).astype("float32")
    return h, z


def critic_and_trainer():
    from multicritic import CriticNetwork, CriticTrainer

    keras.utils.set_random_seed(7)
    critic = CriticNetwork(model_size="nano")
    critic(*inputs())
    rng = np.random.default_rng(1)
    for v in critic.fast_weights:  # the zero head too: outputs that depend on every input
        v.assign(rng.normal(scale=0.3, size=tuple(v.shape)).astype("float32"))
    critic.init_ema()
    return critic, CriticTrainer(critic)


def call_gaps(make, critic) -> dict:
    """For the critic's call, the largest difference between its result on `make(array)`'s and on the numpy
    arrays: float32, and float64 and integers (converted as numpy's are, on the host)."""
    h, z = inputs()
    h64, z_int = h.astype("float64") * 3, (z > 0.5).astype("int32")
    return {
        "call": gap(critic(make(h), make(z)), critic(h, z)),
        "call float64, int32": gap(critic(make(h64), make(z_int)), critic(h64, z_int)),
    }


def entry_gaps(make, critic, trainer) -> dict:
    """`call_gaps`, and the same for the critic's other entries, the loss and a trainer step."""
    from multicritic import CompiledForward, critic_loss

    h, z = inputs()
    out = call_gaps(make, critic)
    out["call use_ema=True"] = gap(critic(make(h), make(z), use_ema=True), critic(h, z, use_ema=True))
    weights = (critic.trainable_variables, critic.non_trainable_variables)
    out["stateless_call"] = gap(
        critic.stateless_call(*weights, make(h), make(z)), critic.stateless_call(*weights, h, z)
    )
    latent = np.concatenate([h, z.reshape(BATCH, -1)], -1)
    out["on_latent"] = gap(critic.on_latent(make(latent)), critic.on_latent(latent))
    forward = CompiledForward(critic.mlp)
    out["CompiledForward"] = gap(forward(make(latent)), forward(latent))
    logits = host(critic(h, z)[1])
    targets, ema, weights = np.linspace(-50, 50, BATCH, dtype="float32"), h[:, 0], np.ones(BATCH, "float32")
    out["critic_loss"] = gap(
        critic_loss(make(logits), make(targets), make(ema), make(weights)), critic_loss(logits, targets, ema, weights)
    )
    # A trainer step from the same state: metrics and every variable after it.
    state = trainer.state_variables
    start = [host(v) for v in state]
    steps = []
    for convert in (lambda x: x, make):
        for v, value in zip(state, start):
            v.assign(value)
        metrics = trainer.train_step(convert(h), convert(z), convert(targets), convert(weights))
        steps.append((metrics, [host(v) for v in state]))
    out["train_step"] = gap(steps[1], steps[0])
    return out


# ---------------------------------------------------------------------------
# In this process, any backend: a producer no framework knows.


def test_the_module_imports_no_framework():
    tree = ast.parse((ROOT / "multicritic" / "backend" / "foreign.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] in FRAMEWORKS]


def test_only_other_frameworks_arrays_are_foreign():
    from multicritic.backend.foreign import is_foreign

    array = np.ones(2, "float32")
    assert is_foreign(Producer(array)) and is_foreign(Unreadable())
    assert not any(map(is_foreign, (array, keras.ops.ones(2), keras.Variable(array), [1.0], 1.0, np.float32(1))))


def test_a_dlpack_producer_gives_what_its_numpy_array_gives():
    # The critic's call (converted before its compiled pass); the other entries convert through the same checks
    # (`real_values`, `as_float32`), and the cross-backend test below runs every entry.
    critic, _ = critic_and_trainer()
    out = call_gaps(lambda x: Producer(aligned(x)), critic)
    assert out == {name: 0.0 for name in out}
    h, z = inputs()
    # What DLPack cannot describe, or a layout an importer refuses: the same values by a copy.
    swapped, strided = h.astype(">f4"), np.asfortranarray(h)
    assert gap(critic(Producer(swapped), Producer(z)), critic(h, z)) == 0.0
    assert gap(critic(Producer(strided), Producer(z)), critic(h, z)) == 0.0


def test_float32_is_imported_without_a_copy():
    from multicritic.validation import real_tensor

    h = aligned(inputs()[0])
    tensor = real_tensor("h", Producer(h), "float32")
    assert keras.ops.is_tensor(tensor) and keras.backend.standardize_dtype(tensor.dtype) == "float32"
    assert np.from_dlpack(tensor).ctypes.data == h.ctypes.data  # the backend's tensor holds the producer's memory


def test_what_cannot_be_read_is_refused_by_name_before_a_step():
    critic, trainer = critic_and_trainer()
    h, z = inputs()
    before = [host(v) for v in trainer.state_variables]
    with pytest.raises(ValueError, match=r"^h: got a Unreadable whose data neither DLPack nor numpy could read"):
        trainer.train_step(Unreadable(), z, np.zeros(BATCH, "float32"), np.ones(BATCH, "float32"))
    with pytest.raises(ValueError, match=r"^h: got a Unreadable whose data neither DLPack nor numpy could read"):
        critic(Unreadable(), z)
    with pytest.raises(ValueError, match=r"^z: got an array of dtype complex64, expected real numbers"):
        critic(h, Producer(z.astype("complex64")))
    assert gap([host(v) for v in trainer.state_variables], before) == 0.0


# ---------------------------------------------------------------------------
# Subprocess body: this backend, the other two frameworks' arrays.


def _address(x) -> int:
    """Where an array's data lies, by its own framework (TensorFlow: through its DLPack export)."""
    framework = type(x).__module__.partition(".")[0]
    if framework == "torch":
        return x.data_ptr()
    if framework in ("jax", "jaxlib"):
        return x.unsafe_buffer_pointer()
    return np.from_dlpack(x).ctypes.data


def _report() -> dict:
    import jax

    backend = keras.backend.backend()
    if backend != "jax":
        jax.config.update("jax_enable_x64", True)  # float64 JAX arrays; the JAX backend runs as it is set
    import jax.numpy as jnp
    import tensorflow as tf
    import torch

    from multicritic.validation import real_tensor

    makers = {
        "torch": lambda x: torch.tensor(x),  # a copy: in the framework's own (aligned) memory
        "jax": lambda x: jnp.array(x, copy=True),
        "tensorflow": lambda x: tf.identity(tf.constant(x)),
    }
    critic, trainer = critic_and_trainer()
    h = inputs()[0]
    report = {}
    for framework, make in makers.items():
        if framework == backend:
            continue
        out = entry_gaps(make, critic, trainer)
        if framework == "torch":  # a tensor that records gradients (detached), a strided one (copied)
            out["requires_grad"] = gap(critic(torch.tensor(h, requires_grad=True), inputs()[1]), critic(*inputs()))
            out["strided"] = gap(critic(torch.tensor(h.T).T, inputs()[1]), critic(*inputs()))
        foreign = make(h)
        tensor = real_tensor("h", foreign, "float32")
        out["zero_copy"] = _address(tensor) == _address(foreign)
        report[framework] = out
    return report


# ---------------------------------------------------------------------------
# The cross-backend tests (parent process: whichever backend the session runs on).

INSTALLED = all(importlib.util.find_spec(b) is not None for b in BACKENDS)


@pytest.mark.cross_backend
@pytest.mark.skipif(not INSTALLED, reason="needs TensorFlow, PyTorch and JAX installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_takes_the_other_frameworks_arrays(backend):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.backend.test_foreign"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{backend} subprocess failed:\n{done.stderr[-3000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(report) == sorted(set(BACKENDS) - {backend})
    for framework, out in report.items():
        assert out.pop("zero_copy") is True, f"{framework} -> {backend}: copied"
        assert out == {name: 0.0 for name in out}, f"{framework} -> {backend}: differs from numpy"


if __name__ == "__main__":
    print(json.dumps(_report()))
