"""`multicritic.backend.torch_step`: a train step traced once per batch signature into one graph and run on the
variables' own tensors; what it refuses (host syncs, variables outside the state)."""

import keras
import numpy as np
import pytest

from tests.conftest import BACKEND, to_np

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="PyTorch backend only")

if BACKEND == "torch":
    import torch

    from multicritic.backend import torch_step
    from multicritic.backend.contract import StepProgram


def regression(host_sync=False, outside=None):
    """Least squares on `w` with plain gradient descent and a step counter: the update assigns `w` through
    Keras and bumps the counter in place (the two ways a step writes state)."""
    w = keras.Variable(np.linspace(-1, 1, 6).reshape(3, 2).astype("float32"), name="w")
    steps = keras.Variable(0.0, trainable=False, name="steps")

    def loss(x, y):
        err = keras.ops.matmul(x, w) - y
        if host_sync:
            err = err * float(err.abs().max())  # reads a tensor on the host
        if outside is not None:
            err = err + outside.value
        value = keras.ops.mean(err * err)
        return value, {"loss": value}

    def apply(grads, metrics):
        w.assign(w - 0.1 * grads[0])
        steps.value.add_(1.0)
        return dict(metrics, grad_norm=torch.linalg.vector_norm(grads[0]))

    program = StepProgram(
        trainable=[w], state=[w, steps], loss=loss, scale_loss=lambda x: x, apply=apply, jit_compile=True
    )
    return program, w, steps


def eager_step(program, x, y):
    w = program.trainable[0].value
    w.grad = None
    loss, metrics = program.loss(x, y)
    loss.backward()
    with torch.no_grad():
        return program.apply([w.grad], metrics)


def data(seed, rows=5):
    rng = np.random.default_rng(seed)
    # On Keras's device, where the variables are (a GPU when there is one).
    return (
        keras.ops.convert_to_tensor(rng.normal(size=(rows, 3)).astype("float32")),
        keras.ops.convert_to_tensor(rng.normal(size=(rows, 2)).astype("float32")),
    )


@pytest.mark.parametrize("compiler", ["aten", "inductor"])
def test_steps_match_eager_and_update_the_variables_in_place(compiler):
    want_program, want_w, want_steps = regression()
    program, w, steps = regression()
    step = torch_step.WholeStep(program, compiler)
    tensor = w.value
    for seed in range(4):
        want = eager_step(want_program, *data(seed))
        got = step(*data(seed))
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_allclose(to_np(got[name]), to_np(want[name].detach()), rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(w.numpy(), want_w.numpy(), rtol=1e-6)
    assert float(steps.numpy()) == float(want_steps.numpy()) == 4.0
    assert w.value is tensor  # the same storage, written in place
    assert step.compilations == 1 and len(step.graphs) == 1


def test_one_graph_per_batch_signature_and_eager_past_the_limit(monkeypatch):
    monkeypatch.setattr(torch_step, "MAX_SIGNATURES", 2)
    program, _, steps = regression()
    step = torch_step.WholeStep(program, "aten")
    assert step(*data(0, rows=5)) is not None
    assert step(*data(1, rows=5)) is not None
    assert step(*data(2, rows=7)) is not None
    assert step.compilations == 2
    assert step(*data(3, rows=9)) is None  # a third signature: the caller runs it eagerly
    assert step(*data(4, rows=7)) is not None
    assert step.compilations == 2 and float(steps.numpy()) == 4.0


def test_a_host_sync_fails_the_compilation_before_any_change():
    program, w, steps = regression(host_sync=True)
    before = w.numpy().copy()
    with pytest.raises(Exception, match="data-dependent|Data dependent|item|symbolic|fake"):
        torch_step.WholeStep(program, "aten")(*data(0))
    np.testing.assert_array_equal(w.numpy(), before)
    assert float(steps.numpy()) == 0.0


def test_a_variable_outside_the_state_is_refused():
    outside = keras.Variable(np.zeros((5, 2), "float32"), trainable=False, name="outside")
    program, w, _ = regression(outside=outside)
    with pytest.raises(ValueError, match="in neither its state nor its batch"):
        torch_step.WholeStep(program, "aten")(*data(0))


def test_the_state_must_start_with_the_trainable_variables():
    program, w, steps = regression()
    import dataclasses

    with pytest.raises(ValueError, match="start with the trainable"):
        torch_step.WholeStep(dataclasses.replace(program, state=[steps, w]), "aten")
    with pytest.raises(ValueError, match="compiler: got 'xla'"):
        torch_step.WholeStep(program, "xla")


def test_a_non_contiguous_batch_takes_the_graph_of_its_values():
    program, w, _ = regression()
    step = torch_step.WholeStep(program, "inductor")  # inductor's graphs assert their inputs' strides
    x = torch.linspace(-1, 1, 15).reshape(5, 3)
    y = torch.linspace(0, 1, 10).reshape(5, 2)
    step(x, y)  # compiled for contiguous inputs
    x_t = x.t().contiguous().t()  # the same values, column-major
    assert not x_t.is_contiguous()
    eager_w = w.value.detach().clone()
    eager_w -= 0.1 * torch.autograd.functional.jacobian(lambda v: ((x @ v - y) ** 2).mean(), eager_w)
    step(x_t, y)
    torch.testing.assert_close(w.value.detach(), eager_w, rtol=1e-6, atol=1e-7)
    assert step.compilations == 1  # copied contiguous: the same graph


def test_autocast_selects_its_own_compiled_graph():
    program, _, _ = regression()
    step = torch_step.WholeStep(program, "aten")
    x, y = torch.ones(4, 3), torch.zeros(4, 2)
    step(x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        step(x, y)
    step(x, y)
    assert step.compilations == 2


@pytest.mark.parametrize("ema_regularizer", [0.0, 1.0])
def test_the_eager_step_replaying_its_forward_passes_is_the_keras_ops_step_bit_for_bit(monkeypatch, ema_regularizer):
    """The eager step's forward passes replay the critic's traced graph (`TorchBackend.forward_function`): the
    same kernels in the same order, so the weights after several steps are those of the step that runs the
    Keras ops (replay switched off)."""
    from multicritic import CriticNetwork, CriticTrainer
    from multicritic.backend import torch_replay

    def train(replay):
        monkeypatch.setattr(torch_replay, "ENABLED", replay)
        keras.utils.set_random_seed(0)
        critic = CriticNetwork(
            model_size=None,
            gru_units=4,
            num_z_categoricals=1,
            num_z_classes=1,
            num_dense_layers=2,
            dense_hidden_units=16,
        )
        critic(np.zeros((1, 4), "float32"), np.ones((1, 1, 1), "float32"))
        trainer = CriticTrainer(critic, learning_rate=1e-3, seed=0, ema_regularizer_weight=ema_regularizer)
        rng = np.random.default_rng(0)
        for _ in range(6):
            h = rng.normal(size=(32, 4)).astype("float32")
            trainer.train_step(
                h, np.ones((32, 1, 1), "float32"), rng.normal(size=32).astype("float32") * 50, np.ones(32, "float32")
            )
        return [to_np(v) for v in critic.weights], torch_replay.graphs(critic)

    replayed, graphs = train(True)
    assert any(g is not None for g in graphs.values())  # the step's passes did replay
    keras_ops, _ = train(False)
    for got, want in zip(replayed, keras_ops):
        np.testing.assert_array_equal(got, want)
