"""The official DreamerV3 optimizer (AGC + LaProp + linear warmup) as a Keras optimizer."""

import json
import os

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from multicritic.training.optimizers import LaProp, LinearWarmup, official_optimizer
from tests.conftest import random_inputs, to_np

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "official")
GOLDEN = "critic/lr1e-3_nowarmup/"
PARAMS = (
    "mlp/linear0/kernel",
    "mlp/linear0/bias",
    "mlp/norm0/scale",
    "mlp/linear1/kernel",
    "mlp/linear1/bias",
    "mlp/norm1/scale",
    "mlp/linear2/kernel",
    "mlp/linear2/bias",
    "mlp/norm2/scale",
    "head/logits/kernel",
    "head/logits/bias",
)


def variables_of(arrays, prefix="p"):
    return [keras.Variable(np.asarray(a, "float32"), name=f"{prefix}{i}") for i, a in enumerate(arrays)]


def reference(params, grad_steps, lr=1e-3, lrs=None, beta_1=0.9, beta_2=0.999, eps=1e-20, agc=0.3, pmin=1e-3):
    """The official chain, transcribed in float64 numpy. Returns [(params, nu, mu)] after each update."""
    p = [np.asarray(x, np.float64) for x in params]
    nu = [np.zeros_like(x) for x in p]
    mu = [np.zeros_like(x) for x in p]
    out = []
    for n, grads in enumerate(grad_steps):
        t = n + 1
        lr_t = lr if lrs is None else lrs[n]
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            if agc is not None:
                upper = agc * max(pmin, np.linalg.norm(p[i].ravel()))
                g = g / max(1.0, np.linalg.norm(g.ravel()) / upper)
            nu[i] = beta_2 * nu[i] + (1 - beta_2) * g**2
            u = g / (np.sqrt(nu[i] / (1 - beta_2**t)) + eps)
            mu[i] = beta_1 * mu[i] + (1 - beta_1) * u
            p[i] = p[i] - lr_t * mu[i] / (1 - beta_1**t)
        out.append(([x.copy() for x in p], [x.copy() for x in nu], [x.copy() for x in mu]))
    return out


# ----------------------------------------------------------------------------- official numbers


def test_official_golden_manifest_names_nu_and_mu():
    with open(os.path.join(DATA, "official_goldens_manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["commit"] == "e3f02248693a79dc8b0ebd62c93683888ddaccfe"
    # Chain (clip_by_agc, scale_by_rms, scale_by_momentum, lr): state 1 is (step, nu), state 2 is (step, mu).
    gold = np.load(os.path.join(DATA, "official_goldens.npz"))
    g = gold[GOLDEN + "step0/grad/val/mlp/linear0/kernel"]
    nu = gold[GOLDEN + "step0/state/opt/state/1/1/val/mlp/linear0/kernel"]
    np.testing.assert_allclose(nu, 1e-3 * g.astype(np.float64) ** 2, rtol=1e-5)  # not AGC-clipped here


def test_matches_the_official_code_for_three_updates():
    gold = np.load(os.path.join(DATA, "official_goldens.npz"))
    init = [gold[GOLDEN + "init/val/" + k] for k in PARAMS]
    # The zero-initialised head bias is clipped through the pmin floor: the golden covers both AGC branches.
    assert np.linalg.norm(init[-1]) == 0 and np.linalg.norm(gold[GOLDEN + "step0/grad/val/head/logits/bias"]) > 1e-3
    variables = variables_of(init)
    optimizer = LaProp(learning_rate=1e-3)
    for step in range(3):
        grads = [gold[f"{GOLDEN}step{step}/grad/val/{k}"] for k in PARAMS]
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
        assert int(to_np(optimizer.iterations)) == step + 1
        for k, v, nu, mu in zip(PARAMS, variables, optimizer.velocity_slots, optimizer.momentum_slots):
            where = f"update {step + 1}, {k}"
            want = gold[f"{GOLDEN}step{step}/state/val/{k}"]
            np.testing.assert_allclose(to_np(v), want, rtol=1e-5, atol=1e-7, err_msg=where)
            want_nu = gold[f"{GOLDEN}step{step}/state/opt/state/1/1/val/{k}"]
            np.testing.assert_allclose(to_np(nu), want_nu, rtol=1e-5, atol=0, err_msg="nu, " + where)
            want_mu = gold[f"{GOLDEN}step{step}/state/opt/state/2/1/val/{k}"]
            np.testing.assert_allclose(to_np(mu), want_mu, rtol=1e-5, atol=1e-7, err_msg="mu, " + where)


# ----------------------------------------------------------------------------- float64 transcription


def edge_case_problem(seed=0, steps=5):
    rng = np.random.default_rng(seed)
    params = [
        rng.normal(size=(6, 5)),  # gradient far above the AGC limit (0.3 * ||p||)
        rng.normal(size=(7,)),  # gradient far below it
        rng.normal(size=(3, 4)),  # zero gradient
        np.zeros((5,)),  # zero parameters: the limit is 0.3 * pmin
        rng.normal(size=()),  # a scalar
    ]
    params = [np.asarray(p, np.float32) for p in params]
    grads = []
    for _ in range(steps):
        grads.append(
            [
                (100.0 * rng.normal(size=(6, 5))).astype(np.float32),
                (1e-4 * rng.normal(size=(7,))).astype(np.float32),
                np.zeros((3, 4), np.float32),
                rng.normal(size=(5,)).astype(np.float32),
                np.asarray(rng.normal(), np.float32),
            ]
        )
    return params, grads


def test_agc_cases_are_exercised():
    params, grads = edge_case_problem()
    limit = [0.3 * max(1e-3, np.linalg.norm(p)) for p in params]
    assert np.linalg.norm(grads[0][0]) > 10 * limit[0]
    assert np.linalg.norm(grads[0][1]) < 0.1 * limit[1]
    assert np.linalg.norm(grads[0][3]) > 100 * limit[3]


@pytest.mark.parametrize("agc", [0.3, None])
def test_matches_a_float64_transcription_for_five_updates(agc):
    params, grads = edge_case_problem()
    variables = variables_of(params)
    optimizer = LaProp(learning_rate=1e-2, agc=agc)
    want = reference(params, grads, lr=1e-2, agc=agc)
    for step in range(5):
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads[step]], variables)
        want_p, want_nu, want_mu = want[step]
        for i, v in enumerate(variables):
            where = f"update {step + 1}, tensor {i}"
            np.testing.assert_allclose(to_np(v), want_p[i], rtol=1e-5, atol=1e-6, err_msg=where)
            np.testing.assert_allclose(to_np(optimizer.velocity_slots[i]), want_nu[i], rtol=1e-4, atol=0, err_msg=where)
            np.testing.assert_allclose(
                to_np(optimizer.momentum_slots[i]), want_mu[i], rtol=1e-4, atol=2e-6, err_msg=where
            )
    # The zero gradient leaves its tensor and slots exactly as they were.
    np.testing.assert_array_equal(to_np(variables[2]), params[2])
    assert not np.any(to_np(optimizer.velocity_slots[2])) and not np.any(to_np(optimizer.momentum_slots[2]))
    assert np.all(np.isfinite(to_np(variables[3])))


def test_agc_is_finite_for_gradients_whose_squares_overflow():
    p = np.linspace(-1.0, 1.0, 8).astype(np.float32)
    direction = np.random.default_rng(0).normal(size=8).astype(np.float32)
    huge, modest = variables_of([p, p])
    optimizer = LaProp(learning_rate=1e-2)
    # Both far above the AGC limit: clipped to the same gradient, however large.
    grads = [direction * np.float32(1e30), direction]
    optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], [huge, modest])
    assert np.all(np.isfinite(to_np(huge)))
    np.testing.assert_allclose(to_np(huge), to_np(modest), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(to_np(optimizer.velocity_slots[0]), to_np(optimizer.velocity_slots[1]), rtol=1e-4)


# ----------------------------------------------------------------------------- warmup and config


def test_linear_warmup_values():
    schedule = LinearWarmup(4e-5, warmup_steps=1000)
    for step, want in ((0, 0.0), (1, 4e-8), (500, 2e-5), (1000, 4e-5), (5000, 4e-5)):
        np.testing.assert_allclose(float(to_np(schedule(step))), want, rtol=1e-6, atol=0)
    constant = LinearWarmup(1e-3, warmup_steps=0)
    assert float(to_np(constant(0))) == pytest.approx(1e-3)
    assert float(to_np(constant(7))) == pytest.approx(1e-3)


def test_warmup_first_update_is_a_no_op_then_ramps():
    params, grads = edge_case_problem(seed=1, steps=6)
    variables = variables_of(params)
    optimizer = LaProp(learning_rate=LinearWarmup(1e-2, warmup_steps=4))
    optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads[0]], variables)
    for v, p in zip(variables, params):
        np.testing.assert_array_equal(to_np(v), p)
    assert np.any(to_np(optimizer.velocity_slots[0])) and np.any(to_np(optimizer.momentum_slots[0]))
    lrs = [1e-2 * min(n / 4, 1.0) for n in range(6)]
    want = reference(params, grads, lrs=lrs)
    for step in range(1, 6):
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads[step]], variables)
        for i, v in enumerate(variables):
            np.testing.assert_allclose(to_np(v), want[step][0][i], rtol=1e-5, atol=1e-6, err_msg=f"update {step + 1}")


def test_official_optimizer_settings_and_serialization():
    optimizer = official_optimizer()
    assert isinstance(optimizer, LaProp) and isinstance(optimizer._learning_rate, LinearWarmup)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.999, 1e-20)
    assert (optimizer.agc, optimizer.agc_min_norm, optimizer.weight_decay) == (0.3, 1e-3, None)
    assert (optimizer._learning_rate.learning_rate, optimizer._learning_rate.warmup_steps) == (4e-5, 1000)
    config = optimizer.get_config()

    restored = keras.optimizers.deserialize(json.loads(json.dumps(keras.optimizers.serialize(optimizer))))
    assert type(restored) is LaProp and isinstance(restored._learning_rate, LinearWarmup)
    assert restored.get_config() == config

    again = LaProp.from_config(optimizer.get_config())
    assert type(again) is LaProp and again.get_config() == config

    schedule = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(LinearWarmup(1e-3, 10)))
    assert isinstance(schedule, LinearWarmup) and schedule.get_config() == {"learning_rate": 1e-3, "warmup_steps": 10}


def test_constant_learning_rate_and_base_arguments_round_trip():
    optimizer = LaProp(3e-4, beta_1=0.8, beta_2=0.99, epsilon=1e-8, agc=None, agc_min_norm=1e-2, weight_decay=0.1)
    config = optimizer.get_config()
    assert config["learning_rate"] == pytest.approx(3e-4)
    assert (config["agc"], config["agc_min_norm"], config["weight_decay"]) == (None, 1e-2, 0.1)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is LaProp and restored.get_config() == config


# ----------------------------------------------------------------------------- inside the trainer


def test_trains_a_critic_inside_the_compiled_trainer_step():
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic, optimizer=LaProp(1e-3), grad_clip=None)
    h, z = random_inputs(critic, 16)
    rng = np.random.default_rng(1)
    targets = (10.0 * rng.normal(size=16)).astype(np.float32)
    weights = np.ones(16, np.float32)
    before = [to_np(v).copy() for v in critic.trainable_variables]
    for _ in range(2):
        metrics = to_np(trainer.train_step(h, z, targets, weights))
        for key, value in metrics.items():
            assert np.all(np.isfinite(value)), key
    after = [to_np(v) for v in critic.trainable_variables]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))
    assert all(np.all(np.isfinite(a)) for a in after)
    assert int(to_np(trainer.optimizer.iterations)) == 2


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"learning_rate": -1e-3}, "learning_rate"),
        ({"learning_rate": "fast"}, "learning_rate"),
        ({"beta_1": 1.0}, "beta_1"),
        ({"beta_1": -0.1}, "beta_1"),
        ({"beta_2": 1.5}, "beta_2"),
        ({"beta_2": float("nan")}, "beta_2"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": None}, "epsilon"),
        ({"agc": 0.0}, "agc"),
        ({"agc": True}, "agc"),
        ({"agc_min_norm": 0.0}, "agc_min_norm"),
        ({"agc_min_norm": None}, "agc_min_norm"),
        ({"clipnorm": -1.0}, "clipnorm"),
        ({"global_clipnorm": float("nan")}, "global_clipnorm"),
    ],
)
def test_laprop_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}: "):
        LaProp(**kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"learning_rate": -1.0}, "learning_rate"),
        ({"learning_rate": float("inf")}, "learning_rate"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"warmup_steps": 2.5}, "warmup_steps"),
        ({"warmup_steps": True}, "warmup_steps"),
    ],
)
def test_linear_warmup_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}: "):
        LinearWarmup(**kwargs)
    with pytest.raises(ValueError, match=rf"^{name}: "):
        official_optimizer(**kwargs)


def test_linear_warmup_names_a_step_that_is_not_a_count():
    for bad in ("x", None):
        with pytest.raises(ValueError, match="^step: got"):
            LinearWarmup(1e-3, warmup_steps=10)(bad)


def test_all_tensors_at_once_is_the_per_tensor_update(monkeypatch):
    # With multi-tensor kernels (PyTorch) every tensor is updated at once through the backend's list ops;
    # that is the per-tensor `update_step` loop Keras runs elsewhere (weights and slots, three updates).
    from multicritic.backend import contract as backend

    rng = np.random.default_rng(5)
    params = [rng.normal(size=s).astype("float32") for s in ((6, 4), (4,), (4, 3))]
    grads = [[rng.normal(size=p.shape).astype("float32") * 3.0**i for p in params] for i in range(3)]
    runs = []
    for all_at_once in (True, False):
        monkeypatch.setattr(type(backend.current()), "has_list_kernels", all_at_once)
        variables = variables_of(params)
        optimizer = LaProp(learning_rate=1e-2)
        optimizer.build(variables)
        for step in grads:
            optimizer.apply([keras.ops.convert_to_tensor(g) for g in step], variables)
        runs.append([to_np(v) for v in variables + optimizer.velocity_slots + optimizer.momentum_slots])
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    assert not np.allclose(runs[0][0], params[0])
