"""The backend contract: backend differences live in `multicritic/backend/` and nowhere else."""

import ast
import inspect
import pathlib

import keras
import pytest

import multicritic
from multicritic.backend import contract as backend
from multicritic.backend.contract import Backend, StepProgram

PACKAGE = pathlib.Path(multicritic.__file__).parent
FRAMEWORKS = ("torch", "tensorflow", "jax", "jaxlib", "optax")
# The command line chooses which backend runs, which is not how anything is computed.
CHOOSE_A_BACKEND = ("cli/__init__.py",)
# Exported files are served by their own runtimes (TensorFlow, ONNX Runtime, LiteRT), whatever backend Keras
# runs: framework imports, none of them in the critic's math.
SERVES_EXPORTS = ("files/runtimes.py",)


def relative(path):
    return path.relative_to(PACKAGE).as_posix()


def modules_outside_the_contract():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name != "backend" or path.parent.parent != PACKAGE:
            yield path


@pytest.mark.parametrize("path", list(modules_outside_the_contract()), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_framework_code_outside_the_backend_modules(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        for name in names:
            assert relative(path) in SERVES_EXPORTS or name.split(".")[0] not in FRAMEWORKS, (
                f"{path.name} imports {name}"
            )
        # No branching on the backend's name (reporting it is fine).
        if isinstance(node, ast.Compare) and relative(path) not in CHOOSE_A_BACKEND:
            text = ast.unparse(node)
            assert "backend()" not in text, f"{path.name}: {text}"


@pytest.mark.parametrize("name", backend.SUPPORTED)
def test_each_backend_implements_the_contract_without_trainer_internals(name):
    source = (PACKAGE / "backend" / f"{name}.py").read_text()
    assert "trainer." not in source and "critic._" not in source
    tree = ast.parse(source)
    classes = [
        n
        for n in tree.body
        if isinstance(n, ast.ClassDef) and any(getattr(b, "id", None) == "Backend" for b in n.bases)
    ]
    assert len(classes) == 1, "one Backend subclass per backend module"


def test_the_running_backend_is_a_complete_backend():
    current = backend.current()
    assert isinstance(current, Backend) and not inspect.isabstract(type(current))
    assert current.name == keras.backend.backend()
    fields = {f.name for f in StepProgram.__dataclass_fields__.values()}
    assert {"trainable", "state", "loss", "scale_loss", "apply", "jit_compile", "private"} <= fields


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.Adam(3e-3, epsilon=1e-5),
        lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(1e-2, 1, 0.5), beta_1=0.5),
        lambda: keras.optimizers.Adam(1e-3, amsgrad=True),
        lambda: keras.optimizers.Adam(1e-3, clipnorm=0.1),
        lambda: keras.optimizers.AdamW(1e-3),
    ],
    ids=["adam", "schedule", "amsgrad", "clipnorm", "adamw"],
)
def test_apply_gradients_is_keras_optimizer_apply(make):
    # A backend may run an optimizer through its own kernels (PyTorch: a plain Adam as its fused kernel): the
    # weights, slots and step count stay Keras's `optimizer.apply`'s, over several steps.
    import numpy as np

    rng = np.random.default_rng(0)
    start = [rng.normal(size=shape).astype("float32") for shape in ((6, 4), (4,), (3, 5))]
    grads = [[rng.normal(size=a.shape).astype("float32") * 10.0 ** (-i) for a in start] for i in range(4)]
    runs = []
    for via_backend in (True, False):
        variables = [keras.Variable(a) for a in start]
        optimizer = make()
        optimizer.build(variables)
        for step in grads:
            step = [keras.ops.convert_to_tensor(g) for g in step]
            if via_backend:
                backend.current().apply_gradients(optimizer, step, variables)
            else:
                optimizer.apply(step, variables)
        runs.append([keras.ops.convert_to_numpy(v.value) for v in list(variables) + list(optimizer.variables)])
    for ours, keras_own, before in zip(runs[0], runs[1], start + [None] * len(runs[0])):
        # Keras's rounding of each update, to a few ulps of the weight.
        slack = 0 if before is None else 4 * np.spacing(np.abs(keras_own).astype("float32"))
        np.testing.assert_allclose(ours, keras_own, rtol=1e-6, atol=np.max(slack, initial=0) + 1e-12)
    moved = [np.abs(w - a).max() for w, a in zip(runs[0], start)]
    assert min(moved) > 0  # the updates happened


def test_list_ops_compute_their_formulas():
    # Multi-tensor kernels on PyTorch, keras.ops elsewhere: the same numbers against float64.
    import keras
    import numpy as np

    current = backend.current()
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=shape).astype("float32") for shape in ((5, 3), (7,), (2, 2, 2))]
    want = np.sqrt(sum((a.astype(np.float64) ** 2).sum() for a in arrays))
    got = current.global_norm([keras.ops.convert_to_tensor(a) for a in arrays])
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(got)), want, rtol=1e-6)
    scaled = current.scale([keras.ops.convert_to_tensor(a) for a in arrays], 0.25)
    for a, s in zip(arrays, scaled):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(s), a * np.float32(0.25))
    for decay in (0.9, keras.ops.convert_to_tensor(0.9), 1.0, 0.0):
        targets = [keras.Variable(a, trainable=False) for a in arrays]
        sources = [a[::-1].copy() for a in arrays]
        current.blend(targets, [keras.ops.convert_to_tensor(s) for s in sources], decay)
        d = float(keras.ops.convert_to_numpy(decay))
        for t, a, s in zip(targets, arrays, sources):
            got = keras.ops.convert_to_numpy(t.value)
            if d in (0.0, 1.0):  # exactly the source, exactly unchanged
                np.testing.assert_array_equal(got, s if d == 0.0 else a)
            else:
                np.testing.assert_allclose(got, d * a.astype(np.float64) + (1 - d) * s, rtol=1e-6, atol=1e-7)


def test_functional_list_ops_compute_their_formulas_and_change_nothing():
    # An optimizer's update over all its tensors at once (multicritic.training.optimizers.LaProp): multi-tensor
    # kernels on PyTorch, keras.ops elsewhere; against float64, inputs (tensors and variables) unchanged.
    import numpy as np

    current = backend.current()
    rng = np.random.default_rng(1)
    shapes = ((5, 3), (7,), (2, 2, 2))
    a, b = ([rng.normal(size=s).astype("float32") for s in shapes] for _ in range(2))
    nu = [np.abs(x) + 0.1 for x in b]
    variables = [keras.Variable(x) for x in a]
    tensors = [keras.ops.convert_to_tensor(x) for x in b]
    as64 = [[x.astype(np.float64) for x in group] for group in (a, b, nu)]
    a64, b64, nu64 = as64

    def check(got, want, rtol=1e-6):
        for g, w in zip(got, want):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(g), w, rtol=rtol, atol=1e-7)

    check([current.norms(variables)], [np.array([np.sqrt((x**2).sum()) for x in a64])])
    factors = keras.ops.convert_to_tensor(np.array([0.5, 2.0, -1.0], "float32"))
    check(current.multiply(tensors, factors), [x * f for x, f in zip(b64, (0.5, 2.0, -1.0))])
    check(current.squares(tensors), [x * x for x in b64])
    check(current.blended(variables, tensors, 0.9), [0.9 * x + 0.1 * y for x, y in zip(a64, b64)])
    correction = keras.ops.convert_to_tensor(np.float32(0.25))
    check(
        current.rms_normalize(tensors, [keras.ops.convert_to_tensor(x) for x in nu], correction, 1e-3),
        [x / (np.sqrt(n / 0.25) + 1e-3) for x, n in zip(b64, nu64)],
        rtol=1e-5,
    )
    alpha = keras.ops.convert_to_tensor(np.float32(-0.5))
    check(current.add_scaled(variables, tensors, alpha), [x - 0.5 * y for x, y in zip(a64, b64)])
    for v, x in zip(variables, a):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v.value), x)
    for t, x in zip(tensors, b):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(t), x)
    # Norms stay finite where the squares overflow float32 (and scaled copies of ordinary tensors stay normal).
    huge = [keras.ops.convert_to_tensor(np.full((1000,), 1e30, "float32")), keras.ops.convert_to_tensor(b[0])]
    check([current.norms(huge)], [np.array([1e30 * np.sqrt(1000.0), np.sqrt((b64[0] ** 2).sum())])], rtol=1e-5)


@pytest.mark.skipif(multicritic.backend.keras.backend.backend() != "torch", reason="PyTorch's compiled update")
def test_torch_update_if_compiles_to_one_graph_without_a_host_sync():
    # Inside torch.compile (and on an accelerator) the skip is a select, not a host read of the flag:
    # fullgraph=True fails on any graph break.
    import keras
    import numpy as np
    import torch

    current = backend.current()
    v = keras.Variable(np.arange(3, dtype="float32"))

    def step(ok):
        current.update_if(ok, lambda: v.assign(v.value * 2.0 + 1.0), [v])
        return v.value.sum()

    compiled = torch.compile(step, fullgraph=True)
    compiled(torch.tensor(False))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(v.value), [0.0, 1.0, 2.0])
    compiled(torch.tensor(True))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(v.value), [1.0, 3.0, 5.0])


def test_constant_is_its_table_in_float32_made_once_per_device_on_eager_pytorch():
    import numpy as np

    current = backend.current()
    table = (0.1, -2.5, 3.0e38)
    got = current.constant(table)
    assert keras.backend.standardize_dtype(got.dtype) == "float32"
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), np.asarray(table, np.float32))
    if current.name == "torch":
        assert current.constant(table) is got  # no new tensor per use in an eager step


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch's traced step")
def test_a_constant_made_inside_a_trace_is_on_the_variables_device(monkeypatch):
    # A CPU table in a CUDA step's trace fails its compilation (found on a GPU); here the device Keras puts
    # the variables on is made "meta" so that a table left on the CPU shows on a CPU-only machine.
    import multicritic.backend.torch as torch_backend

    monkeypatch.setattr(torch_backend.keras_torch, "get_device", lambda: "meta")
    monkeypatch.setattr(torch_backend.torch_step, "tracing", lambda: True)
    got = backend.current().constant((0.5, 1.5))
    assert got.device.type == "meta" and tuple(got.shape) == (2,)


def test_blend_from_trainable_values_leaves_no_gradient_history():
    import numpy as np

    current = backend.current()
    fast = keras.Variable(np.full((3, 2), 2.0, "float32"), trainable=True)
    ema = keras.Variable(np.zeros((3, 2), "float32"), trainable=False)
    current.blend([ema], [fast.value], 0.75)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ema.value), np.full((3, 2), 0.5, "float32"))
    if current.name == "torch":
        assert ema.value.grad_fn is None and not ema.value.requires_grad


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch's inference mode")
@pytest.mark.parametrize("bin_scheme", ["uniform_symlog", "symexp"])
def test_a_first_forward_in_inference_mode_does_not_break_later_training(monkeypatch, bin_scheme):
    import numpy as np
    import torch

    import multicritic.backend.torch as torch_backend
    from multicritic import CriticNetwork, CriticTrainer

    monkeypatch.setattr(torch_backend, "_CONSTANTS", {})  # the tables are first made below
    critic = CriticNetwork(model_size="nano", bin_scheme=bin_scheme)
    h, z = np.zeros((4, 16), "float32"), np.zeros((4, 4, 4), "float32")
    with torch.inference_mode():
        critic(h, z)
    metrics = CriticTrainer(critic).train_step(h, z, np.ones(4, "float32"), np.ones(4, "float32"))
    assert np.isfinite(float(metrics["total"])) and float(metrics["step_skipped"]) == 0.0


@pytest.mark.parametrize("lead", [(5,), (2, 3), (2, 2, 3)])
def test_take_along_last_axis_is_numpys_with_a_scatter_gradient(lead):
    import numpy as np

    from tests.conftest import compiled, grads_of, to_np

    current = backend.current()
    rng = np.random.default_rng(0)
    x = rng.normal(size=lead + (7,)).astype("float32")
    indices = rng.integers(0, 7, size=lead + (4,)).astype("int32")
    weights = rng.normal(size=lead + (4,)).astype("float32")
    want = np.take_along_axis(x, indices, axis=-1)
    np.testing.assert_array_equal(to_np(current.take_along_last_axis(x, indices)), want)
    fn = compiled(lambda a, i: current.take_along_last_axis(a, i))
    np.testing.assert_array_equal(to_np(fn(keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(indices))), want)
    # d sum(w * picked) / dx: each pick's weight added at its position (repeats add up).
    w = keras.ops.convert_to_tensor(weights)
    grad = grads_of(lambda a: keras.ops.sum(current.take_along_last_axis(a, indices) * w), x)[0]
    expected = np.zeros_like(x)
    for pos in np.ndindex(*lead):
        for j in range(4):
            expected[pos + (indices[pos + (j,)],)] += weights[pos + (j,)]
    np.testing.assert_allclose(to_np(grad), expected, rtol=1e-6, atol=1e-6)


def test_softmax_and_log_softmax_are_the_references_eager_compiled_and_in_the_gradient():
    import numpy as np

    from tests.conftest import compiled, grads_of, to_np

    current = backend.current()
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(3, 4, 255)) * 5).astype("float32")
    x[0, 0] = 0.0  # a zero-initialised head's row: exactly uniform
    x[0, 1] *= 1e6  # far apart: probabilities underflow to 0, log-probabilities stay finite
    x[0, 2, :100] = -np.inf  # buckets that can never be chosen
    wide = x.astype(np.float64)
    shifted = wide - wide.max(-1, keepdims=True)
    want_logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    fn = compiled(lambda a: (current.softmax(a), current.log_softmax(a)))
    for probs, logp in (to_np((current.softmax(x), current.log_softmax(x))), to_np(fn(keras.ops.convert_to_tensor(x)))):
        np.testing.assert_allclose(probs, np.exp(want_logp), rtol=2e-6, atol=1e-30)
        np.testing.assert_array_equal(probs[0, 0], np.float32(1 / 255))
        finite = np.isfinite(want_logp)
        np.testing.assert_array_equal(np.isfinite(logp), finite)
        np.testing.assert_allclose(logp[finite], want_logp[finite], rtol=2e-6, atol=2e-6)
    # d sum(w * logp) / dx = w - sum(w) * softmax, for any shift of the rows.
    w = rng.normal(size=x.shape).astype("float32")
    w[0, 2, :100] = 0.0
    grad = to_np(grads_of(lambda a: keras.ops.sum(current.log_softmax(a) * keras.ops.convert_to_tensor(w)), x)[0])
    np.testing.assert_allclose(grad, w - w.sum(-1, keepdims=True) * np.exp(want_logp), rtol=1e-4, atol=1e-4)
