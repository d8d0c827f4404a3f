import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer, inverse_symlog
from tests import numpy_reference as ref
from tests import rllib_golden as spec
from tests.conftest import BACKEND, CRITIC_KINDS, copy_features_into_h_z, inputs_of, random_inputs, randomize, to_np


def direct_batch(critic, n=64, seed=0, scale=30.0):
    """`(h, z, targets, weights)`, a features critic's `(x, targets, weights)`."""
    inputs = inputs_of(critic, n, seed)
    rng = np.random.default_rng(seed + 1)
    targets = (scale * rng.normal(size=n)).astype(np.float32)
    weights = rng.uniform(0.2, 1.0, size=n).astype(np.float32)
    return (*inputs, targets, weights)


def with_z(batch):
    """A batch for the numpy reference: a features critic's `x` is `h` with an empty `z`."""
    return batch if len(batch) == 4 else (batch[0], np.zeros((len(batch[0]), 0), "float32"), *batch[1:])


def snapshot(variables):
    return [to_np(v).copy() for v in variables]


# Batches below and above the latent's width (96): the first Dense takes a concatenated input, then the parts
# by their kernel rows.
@pytest.mark.parametrize("n, kind", [(32, "h_z"), (128, "h_z"), (32, "features")])
def test_step_matches_numpy_reference_for_three_steps(n, kind):
    critic = CriticNetwork(model_size="micro", **CRITIC_KINDS[kind])
    randomize(critic, seed=3, scale=0.2)
    trainer = CriticTrainer(critic)
    numpy_trainer = ref.Trainer(ref.params_from(critic), ref.params_from(critic, ema=True))
    for step in range(3):
        batch = direct_batch(critic, n, seed=step)
        got = to_np(trainer.train_step(*batch))
        want = numpy_trainer.step(*with_z(batch))
        for key in ("total", "value_nll", "ema_regularizer", "grad_norm"):
            np.testing.assert_allclose(got[key], want[key], rtol=2e-5, err_msg=key)
    want_fast = ref.flatten(ref.params_from(critic))
    want_ema = ref.flatten(ref.params_from(critic, ema=True))
    for got, want in zip(want_fast, numpy_trainer.w):
        np.testing.assert_allclose(got, want, atol=2e-6)
    for got, want in zip(want_ema, numpy_trainer.e):
        np.testing.assert_allclose(got, want, atol=2e-6)


def test_ema_after_a_step_is_the_ema_of_the_new_fast_weights():
    critic = CriticNetwork(model_size="nano", ema_decay=0.9)
    randomize(critic, seed=1)
    rng = np.random.default_rng(2)
    for v in critic.ema_weights:  # EMA != fast, so the formula is visible
        v.assign(rng.normal(size=tuple(v.shape)).astype("float32"))
    trainer = CriticTrainer(critic, learning_rate=1e-2)
    ema_before = snapshot(critic.ema_weights)
    trainer.train_step(*direct_batch(critic))
    fast_after = snapshot(critic.fast_weights)
    for before, fast, ema in zip(ema_before, fast_after, critic.ema_weights):
        want = np.float32(0.9) * before + np.float32(1.0 - 0.9) * fast
        np.testing.assert_allclose(to_np(ema), want, rtol=0, atol=np.spacing(np.abs(want)).max())


def test_optimizer_holds_no_slot_for_ema_weights():
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic)
    ema_ids = {id(v) for v in critic.ema_weights}
    assert not any(id(v) in ema_ids for v in trainer.optimizer.variables)
    slots = [v for v in trainer.optimizer.variables if len(v.shape)]
    assert len(slots) == 2 * len(critic.trainable_variables)
    assert sorted(tuple(v.shape) for v in slots) == sorted(2 * [tuple(v.shape) for v in critic.trainable_variables])


def test_loss_decreases_on_a_fixed_batch():
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic, learning_rate=3e-3)
    batch = direct_batch(critic, 128)
    losses = [float(to_np(trainer.train_step(*batch)["value_nll"])) for _ in range(60)]
    assert losses[-1] < 0.75 * losses[0] and losses[-1] < losses[len(losses) // 2]
    assert np.all(np.isfinite(losses))


def test_no_recompilation_across_steps():
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic)
    for step in range(3):
        trainer.train_step(*direct_batch(critic, 16, seed=step))
    fn = trainer._compiled["direct"]
    if BACKEND == "tensorflow":
        (traced,) = fn.compiled.values()
        assert traced.experimental_get_tracing_count() == 1
        trainer.train_step(*direct_batch(critic, 40))  # another batch size: same trace
        assert traced.experimental_get_tracing_count() == 1
    elif BACKEND == "jax":
        assert fn.compiled._cache_size() == 1
    assert int(to_np(trainer.steps)) == 3 + (BACKEND == "tensorflow")


def test_clipping_engages_for_large_gradients():
    critic = CriticNetwork(model_size="nano")
    randomize(critic)
    trainer = CriticTrainer(critic, keras.optimizers.SGD(learning_rate=1.0), grad_clip=0.5)
    before = snapshot(critic.fast_weights)
    metrics = to_np(trainer.train_step(*direct_batch(critic, scale=1e4)))
    assert metrics["grad_norm"] > 0.5
    moved = np.sqrt(sum(((to_np(v) - b) ** 2).sum() for v, b in zip(critic.fast_weights, before)))
    np.testing.assert_allclose(moved, 0.5, rtol=1e-4)
    # Below the threshold nothing is scaled: SGD moves by exactly the gradient norm.
    trainer = CriticTrainer(critic, keras.optimizers.SGD(learning_rate=1.0), grad_clip=1e6)
    before = snapshot(critic.fast_weights)
    metrics = to_np(trainer.train_step(*direct_batch(critic, scale=1e4)))
    moved = np.sqrt(sum(((to_np(v) - b) ** 2).sum() for v, b in zip(critic.fast_weights, before)))
    np.testing.assert_allclose(moved, metrics["grad_norm"], rtol=1e-4)


def test_train_on_dream_matches_hand_computed_targets_and_weights():
    critic = CriticNetwork(model_size="micro")
    randomize(critic, seed=5, scale=0.1)
    h, z, rewards, continues = spec.dream_batch(0)
    fast_h, fast_z = h.reshape(-1, h.shape[-1]), z.reshape((-1,) + z.shape[2:])
    values = to_np(inverse_symlog(critic(fast_h, fast_z)[0])).reshape(rewards.shape)
    targets = ref.lambda_returns(rewards, continues, values)
    weights = ref.dream_loss_weights(continues)[:-1]
    value, logits = critic(fast_h, fast_z)
    ema_value, _ = critic(fast_h, fast_z, use_ema=True)
    lp = ref.log_softmax(to_np(logits).astype(np.float64).reshape(rewards.shape + (255,))[:-1])
    nll = -(lp * ref.two_hot(ref.symlog(targets))).sum(-1)
    reg = -(lp * ref.two_hot(to_np(ema_value).reshape(rewards.shape)[:-1])).sum(-1)
    metrics = to_np(CriticTrainer(critic).train_on_dream(h, z, rewards, continues))
    np.testing.assert_allclose(metrics["total"], np.mean((nll + reg) * weights), rtol=1e-5)
    np.testing.assert_allclose(metrics["value_target_mean"], targets.mean(), rtol=1e-4, atol=1e-5)


def test_ema_update_period():
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic, learning_rate=1e-2, ema_update_period=3)
    batch = direct_batch(critic)
    history = []
    for _ in range(6):
        before = snapshot(critic.ema_weights)
        trainer.train_step(*batch)
        history.append(any(np.any(to_np(v) != b) for v, b in zip(critic.ema_weights, before)))
    assert history == [False, False, True, False, False, True]


def test_regularizer_weight_zero_and_distribution_form():
    critic = CriticNetwork(model_size="nano")
    randomize(critic, seed=2)
    h, z, targets, weights = direct_batch(critic)
    lp = ref.log_softmax(to_np(critic(h, z)[1]).astype(np.float64))
    nll = -(lp * ref.two_hot(ref.symlog(targets))).sum(-1)
    metrics = to_np(CriticTrainer(critic, ema_regularizer_weight=0.0).train_step(h, z, targets, weights))
    np.testing.assert_allclose(metrics["total"], np.mean(nll * weights), rtol=1e-5)
    assert "ema_value_gap" not in metrics

    critic = CriticNetwork(model_size="nano")
    randomize(critic, seed=2)
    rng = np.random.default_rng(9)
    for v in critic.ema_weights:
        v.assign(rng.normal(scale=0.3, size=tuple(v.shape)).astype("float32"))
    lp = ref.log_softmax(to_np(critic(h, z)[1]).astype(np.float64))
    ema_p = ref.softmax(to_np(critic(h, z, use_ema=True)[1]).astype(np.float64))
    ema_v = to_np(critic(h, z, use_ema=True)[0])
    fast_v = to_np(critic(h, z)[0])
    trainer = CriticTrainer(critic, ema_regularizer="distribution", ema_regularizer_weight=0.5)
    metrics = to_np(trainer.train_step(h, z, targets, weights))
    want = np.mean((nll - 0.5 * (ema_p * lp).sum(-1)) * weights)
    np.testing.assert_allclose(metrics["total"], want, rtol=1e-5)
    np.testing.assert_allclose(metrics["ema_value_gap"], np.abs(fast_v - ema_v).mean(), rtol=1e-5)


def test_ema_critic_as_target_source():
    critic = CriticNetwork(model_size="micro")
    randomize(critic, seed=4, scale=0.1)
    rng = np.random.default_rng(4)
    for v in critic.ema_weights:
        v.assign(rng.normal(scale=0.1, size=tuple(v.shape)).astype("float32"))
    h, z, rewards, continues = spec.dream_batch(1)
    flat_h, flat_z = h.reshape(-1, h.shape[-1]), z.reshape((-1,) + z.shape[2:])
    ema_values = to_np(inverse_symlog(critic(flat_h, flat_z, use_ema=True)[0])).reshape(rewards.shape)
    metrics = to_np(CriticTrainer(critic, ema_targets=True).train_on_dream(h, z, rewards, continues))
    want = ref.lambda_returns(rewards, continues, ema_values).mean()
    np.testing.assert_allclose(metrics["value_target_mean"], want, rtol=1e-4, atol=1e-5)


def test_metrics_diagnostics():
    critic = CriticNetwork(model_size="nano")
    h, z, targets, weights = direct_batch(critic)
    targets[:8] = 1e12  # beyond symexp(20) ~ 4.9e8
    metrics = to_np(CriticTrainer(critic).train_step(h, z, targets, weights))
    assert metrics["clipped_fraction"] == pytest.approx(8 / 64)
    assert metrics["ema_value_gap"] == 0.0  # fresh critic: fast == EMA
    for key in ("total", "value_nll", "ema_regularizer", "grad_norm", "nonfinite_targets", "nonfinite_grads"):
        assert key in metrics


def test_nonfinite_numpy_targets_raise_before_any_change():
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic)
    before = snapshot(critic.weights)
    h, z, targets, weights = direct_batch(critic)
    targets[3] = np.nan
    with pytest.raises(ValueError, match=r"value_targets: got 1 non-finite value\(s\) in an array of shape \[64\]"):
        trainer.train_step(h, z, targets, weights)
    for b, v in zip(before, critic.weights):
        np.testing.assert_array_equal(to_np(v), b)
    assert int(to_np(trainer.steps)) == 0


def test_nonfinite_tensor_targets_are_dropped_inside_the_compiled_step():
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic)
    h, z, targets, weights = direct_batch(critic)
    targets[:4] = [np.nan, np.inf, -np.inf, np.nan]
    metrics = to_np(trainer.train_step(h, z, keras.ops.convert_to_tensor(targets), weights))
    assert metrics["nonfinite_targets"] == 4.0 and metrics["nonfinite_grads"] == 0.0
    assert all(np.all(np.isfinite(to_np(v))) for v in critic.weights)


def test_nonfinite_inputs_do_not_poison_weights():
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic)
    h, z, targets, weights = direct_batch(critic)
    h[0, 0] = np.inf
    metrics = to_np(trainer.train_step(keras.ops.convert_to_tensor(h), z, targets, weights))
    assert metrics["invalid_inputs"] == 1.0 and metrics["step_skipped"] == 1.0
    assert all(np.all(np.isfinite(to_np(v))) for v in critic.weights)


@pytest.mark.parametrize(
    "args, match",
    [
        ({"h": (64, 15)}, r"h: got shape \[64, 15\], expected \[64, 16\]"),
        ({"z": (64, 4, 5)}, r"z: got shape \[64, 4, 5\], expected \[64, 4, 4\]"),
        ({"value_targets": (63,)}, r"value_targets: got shape \[63\], expected \[64\]"),
        ({"loss_weights": (64, 1)}, r"loss_weights: got shape \[64, 1\], expected \[64\]"),
    ],
)
def test_bad_step_inputs(args, match):
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic)
    batch = dict(zip(("h", "z", "value_targets", "loss_weights"), direct_batch(critic)))
    for name, shape in args.items():
        batch[name] = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match=match):
        trainer.train_step(**batch)


def test_features_critic_entries_train_it_as_the_h_z_critic_with_a_zero_z():
    """A features critic's three entries take `x` where the `(h, z)` critic's take `h, z` (one positional
    argument fewer, or by name) and train it as the `(h, z)` critic of `gru_units=D` and a one-class `z = 0`
    trains the same network (its `z` row 0, never moved: its gradient is 0), step for step: metrics and
    weights agree to float32 rounding. Bad inputs name `x` before anything changes."""
    options = dict(model_size="nano", head="hl_gauss")
    features = CriticNetwork(**options, input_size=6)
    h_z = CriticNetwork(**options, gru_units=6, num_z_categoricals=1, num_z_classes=1)
    randomize(features, seed=5, scale=0.3)
    copy_features_into_h_z(features, h_z)
    trainers = {"x": CriticTrainer(features, learning_rate=1e-2), "h_z": CriticTrainer(h_z, learning_rate=1e-2)}
    rng = np.random.default_rng(0)
    length, size, dreams = 2, 3, 6  # replay [T, B] = [2, 3]: one dream from each replay step
    x, rewards = rng.normal(size=(4, dreams, 6)).astype("float32"), rng.normal(size=(4, dreams)).astype("float32")
    replay_x = rng.normal(size=(length, size, 6)).astype("float32")
    flags = np.zeros((length, size), "float32")
    steps = {
        "x": [
            lambda t: t.train_step(x[0], rewards[0] * 10, np.ones(dreams, "float32")),
            lambda t: t.train_on_dream(x=x, rewards=rewards, continues=np.ones_like(rewards)),
            lambda t: t.train_on_dream_and_replay(
                x, rewards, np.ones_like(rewards), replay_x, rewards[:length, :size], flags, flags
            ),
        ],
        "h_z": [
            lambda t: t.train_step(x[0], np.zeros((dreams, 1, 1)), rewards[0] * 10, np.ones(dreams, "float32")),
            lambda t: t.train_on_dream(x, np.zeros((4, dreams, 1, 1)), rewards, np.ones_like(rewards)),
            lambda t: t.train_on_dream_and_replay(
                x,
                np.zeros((4, dreams, 1, 1)),
                rewards,
                np.ones_like(rewards),
                replay_x,
                np.zeros((length, size, 1, 1)),
                rewards[:length, :size],
                flags,
                flags,
            ),
        ],
    }
    for entry in range(3):
        got, want = (to_np(steps[kind][entry](trainers[kind])) for kind in ("x", "h_z"))
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=f"entry {entry}: {key}")
    expected = CriticNetwork(**options, gru_units=6, num_z_categoricals=1, num_z_classes=1)
    copy_features_into_h_z(features, expected)
    for a, b in zip(expected.weights, h_z.weights):
        np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-5, atol=1e-6, err_msg=a.path)
    before = [to_np(v) for v in features.weights]
    with pytest.raises(ValueError, match=r"^x: got shape \[6, 5\], expected \[6, 6\]\.$"):
        trainers["x"].train_step(x[0, :, :5], rewards[0], np.ones(dreams, "float32"))
    with pytest.raises(ValueError, match=r"^x: got shape \[6, 6\], expected \[H\+1, B, input_size\] with input_size=6"):
        trainers["x"].train_on_dream(x[0], rewards, np.ones_like(rewards))
    with pytest.raises(TypeError, match=r"train_step\(x, value_targets, loss_weights\): missing a required argument"):
        trainers["x"].train_step(x[0], rewards[0])
    for a, b in zip(before, features.weights):
        np.testing.assert_array_equal(a, to_np(b))


def test_bad_dream_inputs():
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic)
    h = np.zeros((5, 3, 16), np.float32)
    z = np.zeros((5, 3, 4, 4), np.float32)
    with pytest.raises(ValueError, match=r"rewards: got shape \[4, 3\], expected \[5, 3\]"):
        trainer.train_on_dream(h, z, np.zeros((4, 3)), np.ones((5, 3)))
    with pytest.raises(ValueError, match=r"expected \[H\+1, B, \.\.\.\] with H >= 1"):
        trainer.train_on_dream(h[:1], z[:1], np.zeros((1, 3)), np.ones((1, 3)))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"gamma": 1.5}, "gamma: got 1.5"),
        ({"lambda_": -0.1}, "lambda_: got -0.1"),
        ({"grad_clip": 0.0}, "grad_clip: got 0.0"),
    ],
)
def test_bad_trainer_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CriticTrainer(CriticNetwork(model_size="nano"), **kwargs)


def test_trainer_needs_a_built_critic():
    with pytest.raises(ValueError, match="critic: not built yet"):
        CriticTrainer(CriticNetwork(model_size=None, num_dense_layers=1, dense_hidden_units=4))


def _tiny_critic():
    return CriticNetwork(
        model_size=None,
        num_dense_layers=1,
        dense_hidden_units=8,
        gru_units=4,
        num_z_categoricals=2,
        num_z_classes=2,
        num_buckets=15,
    )


def _run_shapes(trainer, critic, sizes):
    for i, n in enumerate(sizes):
        trainer.train_step(*direct_batch(critic, n, seed=i))


def test_issue_73_the_default_step_on_a_cpu_compiles_only_at_a_signatures_first_call(monkeypatch):
    """Checked on the trainer's state, not by timing: with `"auto"` switching at the 2nd call (were it to
    switch on a CPU), every compilation of 12 calls over three batch sizes is the first call of its size."""
    from multicritic.backend import contract

    monkeypatch.setattr(contract, "AUTO_COMPILE_AFTER_STEPS", 2)
    critic = _tiny_critic()
    trainer = CriticTrainer(critic)
    sizes = [8, 16, 8, 8, 24, 16, 8, 24, 16, 8, 8, 16]
    _run_shapes(trainer, critic, sizes)
    (events,) = trainer.compilations.values()
    first_calls = {n: sizes.index(n) for n in sizes}
    for event in events:
        assert event.call == first_calls[event.signature[0][0][0]], event
    forms = {e.form for e in events}
    # PyTorch runs eagerly (nothing compiled); TensorFlow traces one plain graph for every size; JAX jits each.
    assert forms == {"torch": set(), "tensorflow": {"graph"}, "jax": {"jit"}}[BACKEND]
    assert len(events) == {"torch": 0, "tensorflow": 1, "jax": 3}[BACKEND]


@pytest.mark.skipif(BACKEND == "jax", reason="JAX steps are always jitted: no switch")
def test_issue_73_on_an_accelerator_auto_switches_at_its_call_and_says_so_once(monkeypatch, caplog):
    from multicritic.backend import contract

    monkeypatch.setattr(contract, "AUTO_COMPILE_AFTER_STEPS", 2)
    monkeypatch.setattr(contract, "auto_compiles", lambda device_type: True)  # as on a GPU
    if BACKEND == "torch":
        import multicritic.backend.torch as torch_backend

        monkeypatch.setattr(torch_backend, "COMPILER", "aten")  # the switch, without inductor's code generation
    critic = _tiny_critic()
    trainer = CriticTrainer(critic)
    with caplog.at_level("WARNING", logger="multicritic"):
        _run_shapes(trainer, critic, [8, 8, 8, 16, 8])
    (events,) = trainer.compilations.values()
    switched = [e for e in events if e.form != "graph"]
    assert [e.call for e in switched] == [2, 3]  # the switch, then the next size's own first compilation
    assert switched[0].seconds > 0
    messages = [r.getMessage() for r in caplog.records if "compiled" in r.getMessage()]
    assert len(messages) == 1 and "at call 2" in messages[0], messages


@pytest.mark.skipif(BACKEND == "jax", reason="JAX steps are always jitted")
def test_jit_compile_matches_the_default_step():
    # TensorFlow: XLA; PyTorch: torch.compile of the update.
    results = []
    for jit_compile in (False, True):
        critic = CriticNetwork(model_size="nano")
        randomize(critic, seed=8)
        trainer = CriticTrainer(critic, learning_rate=1e-3, jit_compile=jit_compile)
        metrics = [to_np(trainer.train_step(*direct_batch(critic, 32, seed=s))) for s in range(2)]
        results.append((metrics, snapshot(critic.weights)))
    for a, b in zip(results[0][0], results[1][0]):
        for key in ("total", "grad_norm"):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5)
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_issue_74_per_task_return_statistics_in_the_step(tmp_path, monkeypatch):
    """A MultiCritic stream with a per-task normaliser, dreams of tasks 0 and 1 (returns 1e4 apart; task 2 has
    none) with `task_ids`, under a data-parallel gather (a second replica: the dreams reversed): the step's
    statistics are numpy's percentiles per task of the gathered lambda-returns, the EMAs follow them per task (task
    2 keeps its state, debias included), a scalar stream beside it the whole batch's. Refused ids change nothing,
    a tensor id outside [0, N) skips the step; the replay entry takes them too; checkpoints and configs keep them.
    """
    from multicritic import MultiCritic, ReturnNormalizer

    multi = MultiCritic(
        {"task": {"model_size": "nano"}, "explore": {"model_size": "nano"}},
        normalizers={"task": {"impl": "perc", "rate": 0.5, "debias": True, "num_tasks": 3}},
    )
    task, norm = multi.critics["task"], multi.normalizers["task"]
    assert isinstance(norm, ReturnNormalizer)
    randomize(task, seed=4, scale=0.3)
    task.init_ema()
    trainer = CriticTrainer(multi)

    class TwoReplicas:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def all_gather(self, x):
            return keras.ops.concatenate([x, keras.ops.flip(x, axis=-1)], axis=0)

    monkeypatch.setattr(trainer, "_backend", TwoReplicas(trainer._backend))
    rng = np.random.default_rng(0)
    length, dreams = 4, 6
    h, z = random_inputs(task, (length + 1) * dreams, seed=2)
    h, z = h.reshape(length + 1, dreams, -1), z.reshape((length + 1, dreams) + z.shape[1:])
    ids = np.array([0, 1, 0, 1, 1, 0])
    rewards = (rng.normal(size=(length + 1, dreams)) * np.where(ids == 1, 1e4, 1.0)).astype("float32")
    continues = (rng.random((length + 1, dreams)) > 0.1).astype("float32")

    def gathered_returns():
        values = to_np(inverse_symlog(task(h.reshape(-1, h.shape[-1]), z.reshape((-1,) + z.shape[2:]))[0]))
        targets = ref.lambda_returns(rewards, continues, values.reshape(rewards.shape))
        full = np.broadcast_to(ids, targets.shape)
        return np.concatenate([targets, targets[:, ::-1]], 0), np.concatenate([full, full[:, ::-1]], 0)

    def check(metrics, targets, tasks):
        for t in range(3):
            want = np.percentile(targets[tasks == t], [5, 95]) if (tasks == t).any() else [np.nan, np.nan]
            got = [metrics["task/return_low"][t], metrics["task/return_high"][t]]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"task {t}")
        np.testing.assert_allclose(metrics["explore/return_low"], np.percentile(targets, 5), rtol=1e-4, atol=1e-4)

    targets, tasks = gathered_returns()
    metrics = to_np(trainer.train_on_dream(h, z, {"task": rewards, "explore": rewards}, continues, task_ids=ids))
    assert metrics["step_skipped"] == 0.0 and metrics["task/return_low"].shape == (3,)
    check(metrics, targets, tasks)
    np.testing.assert_allclose(to_np(norm.low)[:2], 0.5 * metrics["task/return_low"][:2], rtol=1e-6)
    assert to_np(norm.low)[2] == 0.0 and to_np(norm.corr).tolist() == [0.5, 0.5, 0.0]
    state = snapshot(trainer.state_variables)
    for bad, match in (
        (None, r"task_ids: got None, expected each dream's task, \[B\] integers in \[0, 3\): the normalisers of the "),
        (np.array([0, 1, 0, 3, 1, 0]), r"task_ids: got 3, expected integers in \[0, 3\)"),
        (ids.astype("float32"), r"task_ids: got dtype float32, expected integers"),
        (ids[:4], r"task_ids: got shape \[4\], expected \[B\] = \[6\]"),
    ):
        with pytest.raises(ValueError, match=match):
            trainer.train_on_dream(h, z, {"task": rewards, "explore": rewards}, continues, task_ids=bad)
    tensor_ids = keras.ops.convert_to_tensor(np.array([0, 1, 0, 7, 1, 0], "int32"))
    metrics = to_np(trainer.train_on_dream(h, z, {"task": rewards, "explore": rewards}, continues, task_ids=tensor_ids))
    assert metrics["step_skipped"] == 1.0 and metrics["invalid_inputs"] == length + 1  # a column of id 7
    for a, b in zip(state, trainer.state_variables):
        np.testing.assert_array_equal(a, to_np(b), err_msg=b.path)
    # The official agent's entry: the dreams start at the replay steps (dream b * T + t at step t of sequence b).
    replay_h = h[0].reshape(3, 2, -1).swapaxes(0, 1)  # [T, B] = [2, 3]
    replay_z = z[0].reshape((3, 2) + z.shape[2:]).swapaxes(0, 1)
    replay_rewards = rewards[1:3, :3].copy()
    targets, tasks = gathered_returns()
    metrics = trainer.train_on_dream_and_replay(
        h,
        z,
        {"task": rewards, "explore": rewards},
        continues,
        replay_h,
        replay_z,
        {"task": replay_rewards, "explore": replay_rewards},
        np.zeros((2, 3), "float32"),
        np.zeros((2, 3), "float32"),
        task_ids=ids,
    )
    check(to_np(metrics), targets, tasks)
    assert to_np(norm.corr).tolist() == [0.75, 0.75, 0.0]
    # Checkpoints and configs carry the per-task statistics; a trainer of one set of statistics refuses them.
    path = trainer.save(tmp_path / "per_task")
    again = MultiCritic.from_config(multi.get_config())
    assert again.normalizers["task"].num_tasks == 3 and "num_tasks" not in again.normalizers["explore"].get_config()
    CriticTrainer(again).restore(path)
    np.testing.assert_array_equal(to_np(again.normalizers["task"].corr), [0.75, 0.75, 0.0])
    scalar = MultiCritic({"task": {"model_size": "nano"}, "explore": {"model_size": "nano"}})
    with pytest.raises(ValueError, match="holds another critic configuration: normalizers"):
        CriticTrainer(scalar).restore(path)
    with pytest.raises(ValueError, match=r"task_ids: got task ids, expected None: no return normaliser"):
        CriticTrainer(scalar).train_on_dream(h, z, {"task": rewards, "explore": rewards}, continues, task_ids=ids)
