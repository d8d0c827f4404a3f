"""PyTorch: the whole train step compiled as one graph (no host sync, no recompilation over new data), the same
values as the eager step, and `jit_compile="auto"`; the forward passes captured whole by `torch.compile`."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from multicritic.backend import contract as backend_contract
from multicritic.model.multi_critic import MultiCritic
from tests.conftest import BACKEND, randomize, to_np

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="torch.compile: PyTorch backend only")

if BACKEND == "torch":
    import torch

    from multicritic.backend import torch as torch_backend
    from multicritic.backend import torch_step

STEPS = ("direct", "dream", "dream_replay")


def make_critic(kind):
    """A single critic, or a MultiCritic whose second stream is a "min_of_random" ensemble (its draws, its
    percentile normaliser's quantiles and its statistics update all inside the step)."""
    if kind == "single":
        critic = CriticNetwork(model_size="nano")
        randomize(critic, seed=1)
        return critic
    task = CriticNetwork(model_size="nano", name="task")
    explore = CriticNetwork(model_size="nano", ensemble_size=3, aggregation="min_of_random", name="explore")
    for i, c in enumerate((task, explore)):
        randomize(c, seed=i + 2)
    return MultiCritic({"task": task, "explore": explore})


def batches(critic, count, seed=0):
    """`count` fresh batches of one shape for each step kind: `{kind: [args, ...]}`."""
    rng = np.random.default_rng(seed)
    streams = critic.stream_names if isinstance(critic, MultiCritic) else None
    member = critic.streams["task"] if streams else critic
    g, c, k = member.gru_units, member.num_z_categoricals, member.num_z_classes

    def per(x):
        return x if streams is None else {s: x * (i + 1) for i, s in enumerate(streams)}

    def states(*lead):
        h = np.tanh(rng.normal(size=lead + (g,))).astype("float32")
        z = np.eye(k, dtype="float32")[rng.integers(0, k, size=lead + (c,))]
        return torch.tensor(h), torch.tensor(z)

    out = {kind: [] for kind in STEPS}
    for _ in range(count):
        h, z = states(6)
        out["direct"].append(
            (
                h,
                z,
                per(torch.tensor(rng.normal(size=6).astype("float32") * 10)),
                torch.tensor(rng.uniform(0.5, 1, size=6).astype("float32")),
            )
        )
        dream = states(4, 6) + (
            per(torch.tensor(rng.normal(size=(4, 6)).astype("float32"))),
            torch.tensor((rng.random((4, 6)) > 0.1).astype("float32")),
        )
        out["dream"].append(dream)
        rh, rz = states(2, 3)
        out["dream_replay"].append(
            dream
            + (
                rh,
                rz,
                per(torch.tensor(rng.normal(size=(2, 3)).astype("float32"))),
                torch.zeros(2, 3),
                torch.zeros(2, 3),
            )
        )
    return out


def run_steps(trainer, kind, data):
    fn = {
        "direct": trainer.train_step,
        "dream": trainer.train_on_dream,
        "dream_replay": trainer.train_on_dream_and_replay,
    }[kind]
    return [{k: float(v) for k, v in fn(*args).items()} for args in data]


def state_of(trainer):
    return [to_np(v).copy() for v in trainer.state_variables]


def assert_same_state(got, want, start, of_change=1e-5):
    """Weights, EMA weights, slots and counters equal to 1e-6 relative, or to `of_change` of the largest
    change of their variable: compiled gradients come from AOTAutograd's decomposed backward (the same math,
    other roundings, ~1e-7 relative), and Adam divides each gradient by its own RMS, so for an element whose
    gradient is near epsilon's scale a last-bit difference moves its update by up to ~1e-5 of a step."""
    for g, w, s in zip(got, want, start):
        change = np.max(np.abs(w.astype(np.float64) - s), initial=0.0)
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=max(of_change * change, 1e-7))


@pytest.fixture
def aot_eager(monkeypatch):
    """Compiled steps run as their traced ATen graphs (no code generation: a capture test need not wait for
    inductor); `torch.compile` of the forward passes through "aot_eager"."""
    monkeypatch.setattr(torch_backend, "COMPILER", "aten")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_frames():
    return sum(torch._dynamo.utils.counters["frames"].values())


@pytest.mark.parametrize("critic_kind", ["single", "multi"])
def test_every_step_kind_compiles_whole_and_matches_eager(critic_kind, aot_eager):
    # One traced graph per step: a host sync (`.item()`, `.tolist()`, `bool(t)`) or an untraceable op fails
    # the compilation (jit_compile=True raises), so an op that brings one back fails here.
    data = batches(make_critic(critic_kind), 3)
    for kind in STEPS:
        results = {}
        for jit in (False, True):
            critic = make_critic(critic_kind)
            trainer = CriticTrainer(critic, learning_rate=1e-2, seed=5, jit_compile=jit)
            results[jit] = (run_steps(trainer, kind, data[kind]), state_of(trainer))
        (eager_metrics, eager_state), (jit_metrics, jit_state) = results[False], results[True]
        for step, (a, b) in enumerate(zip(eager_metrics, jit_metrics)):
            assert set(a) == set(b)
            for name in a:
                np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7, err_msg=f"{kind} {step} {name}")
        assert_same_state(jit_state, eager_state, state_of(CriticTrainer(make_critic(critic_kind), seed=5)))
        fn = trainer._compiled[kind]
        assert fn.compiled is not None and fn.eager_steps == 0 and fn.compiled.compilations == 1


def test_no_recompilation_over_100_steps_of_new_data(aot_eager):
    critic = make_critic("multi")
    trainer = CriticTrainer(critic, seed=3, jit_compile=True)
    data = batches(critic, 100, seed=7)["dream"]
    frames = compiled_frames()
    for args in data:
        trainer.train_on_dream(*args)
    fn = trainer._compiled["dream"]
    assert fn.eager_steps == 0 and fn.compiled.compilations == 1 and len(fn.compiled.graphs) == 1
    assert compiled_frames() == frames  # and nothing went through dynamo


def test_inductor_step_matches_eager_for_three_steps(monkeypatch):
    # The default compiler (inductor's generated kernels may order float sums differently; the other tests
    # run the traced graphs op by op, see tests/conftest.py).
    monkeypatch.setattr(torch_backend, "COMPILER", "inductor")
    torch._dynamo.reset()
    data = batches(make_critic("single"), 3)["dream"]
    out = {}
    for jit in (False, True):
        trainer = CriticTrainer(make_critic("single"), learning_rate=1e-2, jit_compile=jit)
        out[jit] = run_steps(trainer, "dream", data), state_of(trainer)
    for a, b in zip(out[False][0], out[True][0]):
        for name in a:
            # atol: `ema_value_gap` is a difference of two decoded values, each a sum of terms up to about 1
            # here, and carries their rounding.
            np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=4e-7, err_msg=name)
    # The loss's targets are decoded values (the lambda-returns, and the EMA regulariser's two-hot target),
    # whose sums inductor may order otherwise: a last-bit target moves the two-hot weights (by ~6x as much:
    # the bucket spacing is 0.157), so every gradient, and Adam turns that into up to ~1e-3 of a step for an
    # element whose gradient is that small.
    assert_same_state(out[True][1], out[False][1], state_of(CriticTrainer(make_critic("single"))), of_change=1e-3)


def test_auto_runs_eagerly_then_compiles_at_a_fixed_step(monkeypatch, aot_eager):
    # A fixed step count, not a time: two runs switch at the same step and compute the same numbers.
    critic = make_critic("single")
    data = batches(critic, 4)["direct"]
    monkeypatch.setattr(backend_contract, "AUTO_COMPILE_AFTER_STEPS", 3)
    monkeypatch.setattr(backend_contract, "AUTO_COMPILE_DEVICES", ("cpu",))  # as on an accelerator
    trainer = CriticTrainer(critic, jit_compile="auto")
    assert trainer.jit_compile == "auto"
    for args in data[:3]:
        trainer.train_step(*args)
    fn = trainer._compiled["direct"]
    assert fn.compiled is None and fn.eager_steps == 3
    trainer.train_step(*data[3])
    assert fn.compiled is not None and fn.eager_steps == 3


def test_auto_falls_back_to_eager_when_compilation_fails(monkeypatch, aot_eager):
    def broken(self, values, batch):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(backend_contract, "AUTO_COMPILE_AFTER_STEPS", 0)
    monkeypatch.setattr(backend_contract, "AUTO_COMPILE_DEVICES", ("cpu",))  # as on an accelerator
    monkeypatch.setattr(torch_step.WholeStep, "_compile", broken)
    data = batches(make_critic("single"), 2)["direct"]
    reference = CriticTrainer(make_critic("single"), jit_compile=False)
    want = run_steps(reference, "direct", data)
    trainer = CriticTrainer(make_critic("single"), jit_compile="auto")
    with pytest.warns(RuntimeWarning, match="compiling the train step failed"):
        got = run_steps(trainer, "direct", data)
    assert got == want  # each step ran once, eagerly
    for a, b in zip(state_of(reference), state_of(trainer)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(RuntimeError, match="no compiler here"):
        CriticTrainer(make_critic("single"), jit_compile=True).train_step(*data[0])


def test_auto_stays_eager_under_a_loss_scale_optimizer(monkeypatch):
    monkeypatch.setattr(backend_contract, "AUTO_COMPILE_AFTER_STEPS", 0)
    monkeypatch.setattr(backend_contract, "AUTO_COMPILE_DEVICES", ("cpu",))  # (else it stays eager on a CPU anyway)
    critic = make_critic("single")
    trainer = CriticTrainer(critic, keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3)))
    for args in batches(critic, 2)["direct"]:
        trainer.train_step(*args)
    assert trainer._compiled["direct"].compiled is None


def test_fit_step_compiles_whole_and_matches_eager(aot_eager):
    rng = np.random.default_rng(0)
    h = rng.normal(size=(32, 16)).astype("float32")
    z = rng.random(size=(32, 4, 4)).astype("float32")
    y = (rng.normal(size=32) * 5).astype("float32")
    out = {}
    for jit in (False, True):
        critic = make_critic("single")
        critic.compile(jit_compile=jit, learning_rate=1e-2)
        history = critic.fit((h, z), y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        out[jit] = history.history, [to_np(v) for v in critic.weights], critic
    for name, values in out[False][0].items():
        np.testing.assert_allclose(out[True][0][name], values, rtol=1e-6, atol=1e-7, err_msg=name)
    start = make_critic("single")
    assert_same_state(out[True][1], out[False][1], [to_np(v) for v in start.weights])
    program = out[True][2]._fit.programs["direct"]
    assert program.cache["train"].compiled is not None


@pytest.mark.parametrize("entry", ["fast_module", "ema_module", "torch_module", "call", "on_latent"])
def test_forward_passes_compile_to_one_graph_without_recompiling(entry, aot_eager):
    critic = CriticNetwork(model_size="nano", ensemble_size=1)
    randomize(critic)
    latent = keras.ops.convert_to_tensor(np.random.default_rng(0).normal(size=(5, critic.latent_size)), "float32")
    h, z = latent[:, :16], latent[:, 16:].reshape(5, 4, 4)
    if entry in ("fast_module", "ema_module"):
        module = getattr(critic, entry)()
        fn, args, again = module, (latent,), (latent * 0.5,)
    elif entry == "torch_module":
        fn, args, again = critic.torch_module(), (h, z), (h * 0.5, z)
    elif entry == "call":
        fn, args, again = (lambda h, z: critic(h, z)), (h, z), (h * 0.5, z)
    else:
        fn, args, again = (lambda x: critic.on_latent(x)), (latent,), (latent * 0.5,)
    explanation = torch._dynamo.explain(fn)(*args)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    want = fn(*again)
    compiled(*args)
    frames = compiled_frames()
    got = compiled(*again)
    assert compiled_frames() == frames
    for a, b in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)):
        np.testing.assert_allclose(to_np(b), to_np(a), rtol=1e-6, atol=1e-7)
