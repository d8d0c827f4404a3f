"""Keras-native training: compile / fit / evaluate / predict, callbacks, saving."""

import os

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from multicritic.training.callbacks import BackupAndRestore
from tests import numpy_reference as ref
from tests.conftest import BACKEND, CRITIC_KINDS, inputs_of, random_inputs, randomize, to_np


def critic(size="nano", seed=3, **kwargs):
    c = CriticNetwork(model_size=size, **kwargs)
    randomize(c, seed=seed, scale=0.2)
    return c


def direct_data(c, n=80, seed=0):
    """`(h, z, targets, weights)`, a features critic's `(x, targets, weights)`."""
    inputs = inputs_of(c, n, seed)
    rng = np.random.default_rng(seed + 1)
    return (*inputs, (30.0 * rng.normal(size=n)).astype(np.float32), rng.uniform(0.2, 1.0, size=n).astype(np.float32))


def dream_data(c, b=12, horizon=5, seed=0):
    """Batch-major dream data `[B, H+1, ...]`, as Keras batches it (a features critic's `x` in place of `h, z`)."""
    inputs = inputs_of(c, (b, horizon), seed)
    rng = np.random.default_rng(seed + 1)
    return (
        *inputs,
        (10.0 * rng.normal(size=(b, horizon))).astype(np.float32),
        (rng.uniform(size=(b, horizon)) > 0.1).astype(np.float32),
    )


def assert_same_weights(a, b, rtol=1e-6, what=""):
    for va, vb in zip(a.weights, b.weights):
        x, y = to_np(va), to_np(vb)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.abs(y).max(), err_msg=f"{what} {va.path}")


def assert_identical(a, b):
    for va, vb in zip(a.weights, b.weights):
        np.testing.assert_array_equal(to_np(va), to_np(vb), err_msg=va.path)
    for va, vb in zip(a.optimizer.variables, b.optimizer.variables):
        np.testing.assert_array_equal(to_np(va), to_np(vb), err_msg=va.path)


@pytest.mark.parametrize("jit_compile, kind", [(False, "h_z"), (True, "h_z"), (False, "features")])
def test_fit_equals_trainer_and_numpy_reference(jit_compile, kind):
    """5 `fit` steps == 5 `CriticTrainer` steps (same math) == the float64 numpy reference step (a features
    critic: `fit(x, y)`, the reference's `z` empty)."""
    a, b = critic("micro", **CRITIC_KINDS[kind]), critic("micro", **CRITIC_KINDS[kind])
    *inputs, targets, weights = direct_data(a, 80)
    numpy_trainer = ref.Trainer(ref.params_from(a), ref.params_from(a, ema=True))
    a.compile(jit_compile=jit_compile)
    x = tuple(inputs) if len(inputs) == 2 else inputs[0]
    history = a.fit(x, targets, sample_weight=weights, batch_size=16, shuffle=False, verbose=0)
    trainer = CriticTrainer(b)
    for i in range(5):
        part = slice(16 * i, 16 * (i + 1))
        trainer.train_step(*[x[part] for x in inputs], targets[part], weights[part])
        h, z = inputs if len(inputs) == 2 else (inputs[0], np.zeros((80, 0), "float32"))
        numpy_trainer.step(h[part], z[part], targets[part], weights[part])
    assert_same_weights(a, b)
    for got, want_w in zip(ref.flatten(ref.params_from(a)), numpy_trainer.w):
        np.testing.assert_allclose(got, want_w, atol=2e-6)
    for got, want_e in zip(ref.flatten(ref.params_from(a, ema=True)), numpy_trainer.e):
        np.testing.assert_allclose(got, want_e, atol=2e-6)
    assert int(to_np(a.optimizer.iterations)) == 5
    # History holds epoch means; the last step's numbers are the reference's.
    assert set(history.history) >= {
        "loss",
        "total",
        "value_nll",
        "ema_regularizer",
        "grad_norm",
        "ema_value_gap",
        "clipped_fraction",
        "step_skipped",
    }
    np.testing.assert_allclose(history.history["loss"], history.history["total"])
    assert history.history["step_skipped"] == [0.0]


@pytest.mark.parametrize("jit_compile, kind", [(False, "h_z"), (True, "h_z"), (True, "features")])
def test_fit_on_dreams_equals_trainer_with_ema_period(jit_compile, kind):
    """Dream batches (batch-major in fit, time-major in the trainer), EMA every 2nd step, over two epochs (a
    features critic: `fit((x, rewards, continues))`, a dict batch too)."""
    a, b = critic(**CRITIC_KINDS[kind]), critic(**CRITIC_KINDS[kind])
    *inputs, rewards, continues = dream_data(a, b=12)
    a.compile(ema_update_period=2, learning_rate=1e-3, jit_compile=jit_compile)
    a.fit((*inputs, rewards, continues), batch_size=4, epochs=2, shuffle=False, verbose=0)
    trainer = CriticTrainer(b, ema_update_period=2, learning_rate=1e-3)
    for _ in range(2):
        for i in range(3):
            p = slice(4 * i, 4 * (i + 1))
            trainer.train_on_dream(*[x[p].swapaxes(0, 1) for x in inputs], rewards[p].T, continues[p].T)
    assert_same_weights(a, b)
    assert int(to_np(a.optimizer.iterations)) == int(to_np(trainer.steps)) == 6
    if kind == "features":
        (x,) = inputs
        batches = {"x": x, "rewards": rewards, "continues": continues}
        logs = a.evaluate(batches, batch_size=4, verbose=0, return_dict=True)
        assert np.isfinite(logs["loss"])
        value, logits = a.predict(x[:, 0], batch_size=4, verbose=0)
        np.testing.assert_allclose(value, to_np(a(x[:, 0])[0]), rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match=r"x: got shape \[\w+, 9\], expected \[\.\.\., 10\] \(input_size=10\)"):
            a.fit(x[:, 0, :9], rewards[:, 0], verbose=0)


def test_evaluate_and_predict():
    a = critic()
    h, z, targets, weights = direct_data(a, 32)
    a.compile()
    logs = a.evaluate((h, z), targets, sample_weight=weights, batch_size=32, verbose=0, return_dict=True)
    trainer = CriticTrainer(critic())
    _, want = trainer.loss_parts(*[keras.ops.convert_to_tensor(x) for x in (h, z, targets, weights)])
    for key in ("total", "value_nll", "ema_regularizer", "clipped_fraction"):
        np.testing.assert_allclose(logs[key], to_np(want[key]), rtol=1e-5, err_msg=key)
    assert "grad_norm" not in logs
    value, logits = a.predict((h, z), batch_size=8, verbose=0)
    want_value, want_logits = a(h, z)
    np.testing.assert_allclose(value, to_np(want_value), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(logits, to_np(want_logits), rtol=1e-6, atol=1e-6)
    assert int(to_np(a.optimizer.iterations)) == 0  # evaluate and predict do not train


class Batches(keras.utils.PyDataset):
    def __init__(self, parts, **kwargs):
        super().__init__(**kwargs)
        self.parts = parts

    def __len__(self):
        return len(self.parts)

    def __getitem__(self, i):
        return self.parts[i]


def test_data_sources_train_alike():
    """numpy arrays, dict batches, a PyDataset, a generator, and this backend's own pipeline: the same steps."""
    base = critic()
    h, z, targets, weights = direct_data(base, 48)
    base.compile()
    base.fit((h, z), targets, sample_weight=weights, batch_size=16, shuffle=False, verbose=0)
    parts = [((h[p], z[p]), targets[p], weights[p]) for p in (slice(0, 16), slice(16, 32), slice(32, 48))]
    dicts = [{"h": x[0][0], "z": x[0][1], "value_targets": x[1], "loss_weights": x[2]} for x in parts]

    def generator():
        yield from parts

    sources = {"pydataset": Batches(parts), "dicts": Batches(dicts), "generator": generator()}
    if BACKEND == "tensorflow":
        import tensorflow as tf

        sources["tf.data"] = tf.data.Dataset.from_tensor_slices(((h, z), targets, weights)).batch(16)
    if BACKEND == "torch":
        import torch

        dataset = torch.utils.data.TensorDataset(*(torch.from_numpy(x) for x in (h, z, targets, weights)))
        sources["DataLoader"] = [((hb, zb), tb, wb) for hb, zb, tb, wb in torch.utils.data.DataLoader(dataset, 16)]
        sources["DataLoader"] = torch.utils.data.DataLoader(
            [((h[i], z[i]), targets[i], weights[i]) for i in range(48)], batch_size=16
        )
    for name, source in sources.items():
        other = critic()
        other.compile()
        other.fit(source, epochs=1, steps_per_epoch=3 if name == "generator" else None, shuffle=False, verbose=0)
        assert_same_weights(other, base, rtol=1e-6, what=name)


def test_logs_reach_the_progress_bar_and_history(capsys):
    a = critic()
    h, z, targets, _ = direct_data(a, 32)
    a.compile()
    a.fit((h, z), targets, batch_size=16, epochs=1, verbose=1)
    out = capsys.readouterr().out
    for key in ("loss", "value_nll", "ema_regularizer", "grad_norm", "ema_value_gap", "clipped_fraction"):
        assert key in out, key


def test_callbacks_checkpoint_stop_schedule(tmp_path):
    a = critic()
    h, z, targets, weights = direct_data(a, 32)
    a.compile(learning_rate=1e-3)
    calls = []

    def schedule(epoch, lr):
        calls.append(epoch)
        return 1e-3 * 0.5**epoch

    callbacks = [
        keras.callbacks.ModelCheckpoint(str(tmp_path / "full_{epoch}.keras")),
        keras.callbacks.ModelCheckpoint(str(tmp_path / "w_{epoch}.weights.h5"), save_weights_only=True),
        keras.callbacks.LearningRateScheduler(schedule),
        # The loss cannot improve by 1e9: stops after patience + 1 epochs.
        keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=1),
    ]
    history = a.fit((h, z), targets, sample_weight=weights, batch_size=16, epochs=10, verbose=0, callbacks=callbacks)
    assert len(history.history["loss"]) == 2 and calls == [0, 1]
    np.testing.assert_allclose(float(to_np(a.optimizer.learning_rate)), 5e-4, rtol=1e-6)
    full = keras.models.load_model(tmp_path / "full_2.keras")
    assert_identical(full, a)
    weights_only = critic(seed=9)
    weights_only.load_weights(tmp_path / "w_2.weights.h5")
    for va, vb in zip(weights_only.weights, a.weights):
        np.testing.assert_array_equal(to_np(va), to_np(vb))


def test_tensorboard_writes_the_logs(tmp_path):
    # Keras's TensorBoard callback writes through tf.summary: installed in the TensorFlow session.
    pytest.importorskip("tensorflow")
    pytest.importorskip("tensorboard")
    a = critic()
    h, z, targets, _ = direct_data(a, 32)
    a.compile()
    a.fit((h, z), targets, batch_size=16, epochs=1, verbose=0, callbacks=[keras.callbacks.TensorBoard(str(tmp_path))])
    events = [f for _, _, files in os.walk(tmp_path) for f in files if "tfevents" in f]
    assert events


def test_restored_keras_file_continues_fit_bit_identically(tmp_path):
    h, z, targets, weights = direct_data(critic(), 48)
    whole = critic()
    whole.compile(ema_update_period=2, learning_rate=1e-3, gamma=0.99)
    whole.fit((h, z), targets, sample_weight=weights, batch_size=16, epochs=2, shuffle=False, verbose=0)
    first = critic()
    first.compile(ema_update_period=2, learning_rate=1e-3, gamma=0.99)
    first.fit((h, z), targets, sample_weight=weights, batch_size=16, epochs=1, shuffle=False, verbose=0)
    first.save(tmp_path / "critic.keras")
    resumed = keras.models.load_model(tmp_path / "critic.keras")
    assert resumed.fit_trainer.ema_update_period == 2 and resumed.fit_trainer.gamma == 0.99
    resumed.fit((h, z), targets, sample_weight=weights, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert_identical(resumed, whole)


class Interrupt(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("interrupted")


def test_backup_and_restore_resumes_mid_epoch_exactly(tmp_path):
    h, z, targets, weights = direct_data(critic(), 64)

    def run(c, callbacks):
        c.fit(
            (h, z),
            targets,
            sample_weight=weights,
            batch_size=16,
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )

    whole = critic()
    whole.compile(ema_update_period=3, learning_rate=1e-3)
    run(whole, [])
    interrupted = critic()
    interrupted.compile(ema_update_period=3, learning_rate=1e-3)
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        run(interrupted, [BackupAndRestore(backup, save_freq=1), Interrupt(epoch=1, batch=1)])
    resumed = critic(seed=11)  # a new process: everything must come from the backup
    resumed.compile(ema_update_period=3, learning_rate=1e-3)
    run(resumed, [BackupAndRestore(backup, save_freq=1)])
    assert_identical(resumed, whole)
    assert int(to_np(resumed.optimizer.iterations)) == 8


def test_compiled_and_plain_weights_files_load_both_ways(tmp_path):
    trained = critic()
    h, z, targets, _ = direct_data(trained, 16)
    trained.compile()
    trained.fit((h, z), targets, verbose=0)
    trained.save_weights(tmp_path / "compiled.weights.h5")
    plain = critic(seed=5)
    plain.load_weights(tmp_path / "compiled.weights.h5")  # its optimizer slots are not the critic's
    for va, vb in zip(plain.weights, trained.weights):
        np.testing.assert_array_equal(to_np(va), to_np(vb))
    plain.save_weights(tmp_path / "plain.weights.h5")
    other = critic(seed=6)
    other.compile()
    other.load_weights(tmp_path / "plain.weights.h5")  # the optimizer keeps its own state
    assert int(to_np(other.optimizer.iterations)) == 0
    for va, vb in zip(other.weights, trained.weights):
        np.testing.assert_array_equal(to_np(va), to_np(vb))


def test_bad_compile_and_batches_are_refused():
    a = critic()
    with pytest.raises(ValueError, match="loss: got 'mse'"):
        a.compile(loss="mse")
    with pytest.raises(ValueError, match="metrics"):
        a.compile(metrics=["mae"])
    with pytest.raises(ValueError, match="lambda: not an option"):
        a.compile(**{"lambda": 0.9})
    with pytest.raises(ValueError, match="gamma"):
        a.compile(gamma=1.5)
    h, z, targets, _ = direct_data(a, 16)
    with pytest.raises(ValueError, match="compile"):
        a.fit((h, z), targets, verbose=0)
    a.compile()
    before = [to_np(v).copy() for v in a.weights + a.optimizer.variables]
    with pytest.raises(ValueError, match=r"y \(value_targets\): got shape \[(16|\?), 2\]"):
        a.fit((h, z), np.stack([targets, targets], -1), verbose=0)
    with pytest.raises(ValueError, match="z: got shape"):
        a.fit((h, z[:, :, :3]), targets, verbose=0)
    with pytest.raises(ValueError, match="y: got None"):
        a.fit((h, z), verbose=0)
    hd, zd, rewards, continues = dream_data(a, b=4)
    with pytest.raises(ValueError, match="rewards: got shape"):
        a.fit((hd, zd, rewards[:, :-1], continues), verbose=0)
    with pytest.raises(ValueError, match="data: got a dict"):
        a.evaluate({"h": h, "z": z, "targets": targets}, verbose=0)
    # Nothing changed, and the critic still trains.
    for var, value in zip(a.weights + a.optimizer.variables, before):
        np.testing.assert_array_equal(to_np(var), value, err_msg=var.path)
    a.fit((h, z), targets, verbose=0)
    assert int(to_np(a.optimizer.iterations)) == 1


def test_multi_critic_fits_as_its_trainer():
    from multicritic import MultiCritic

    def make():
        multi = MultiCritic(
            {"task": {"model_size": "nano"}, "explore": {"model_size": "nano", "ensemble_size": 2}},
            stream_weights={"explore": 0.5},
        )
        for seed, c in enumerate(multi.streams.values()):
            randomize(c, seed=seed + 1, scale=0.2)
        return multi

    a, b = make(), make()
    h, z, rewards, continues = dream_data(a.streams["task"], b=8)
    streams = {"task": rewards, "explore": rewards[:, ::-1].copy() * 0.1}
    a.compile(learning_rate=1e-3)
    history = a.fit((h, z, streams, continues), batch_size=4, shuffle=False, verbose=0)
    trainer = CriticTrainer(b, learning_rate=1e-3)
    for i in range(2):
        p = slice(4 * i, 4 * (i + 1))
        trainer.train_on_dream(
            h[p].swapaxes(0, 1), z[p].swapaxes(0, 1), {k: v[p].T for k, v in streams.items()}, continues[p].T
        )
    assert_same_weights(a, b)
    for stream in ("task", "explore"):
        norm_a, norm_b = a.normalizers[stream], b.normalizers[stream]
        for va, vb in zip(norm_a.weights, norm_b.weights):
            np.testing.assert_allclose(to_np(va), to_np(vb), rtol=1e-6)
    assert {"task/value_nll", "explore/member_spread", "grad_norm"} <= set(history.history)


# --- Refusals leave everything as it was (issue 31) ----------------------------------------------------------------


def snapshot(model):
    optimizer = getattr(model, "optimizer", None)
    return [to_np(v).copy() for v in model.weights + (optimizer.variables if optimizer else [])]


def assert_unchanged(model, before):
    after = snapshot(model)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("compiled", [False, True], ids=["uncompiled", "compiled"])
def test_predict_refusing_a_batch_keeps_every_variable(compiled):
    """Finding 1: on JAX `predict` took the variables' values out for its stateless step and lost them when
    the step refused the batch."""
    a = critic()
    if compiled:
        a.compile()
    h, z = random_inputs(a, 8)
    want = to_np(a(h, z))
    before = snapshot(a)
    with pytest.raises(ValueError, match=r"h: got shape \[\S+, 15\]"):
        a.predict((h[:, :15], z), verbose=0)
    assert_unchanged(a, before)
    got = to_np(a(h, z))
    np.testing.assert_array_equal(got[0], want[0])
    value, _ = a.predict((h, z), batch_size=4, verbose=0)
    np.testing.assert_allclose(value, want[0], rtol=1e-6, atol=1e-6)


def test_a_new_horizon_is_a_new_step():
    """Finding 10: TensorFlow relaxed the traced step to an unknown horizon once a second one came, and the
    dream loss (unrolled over a static horizon) failed; bad batches then gave graph errors."""
    a, b = critic(), critic()
    a.compile(learning_rate=1e-3)
    trainer = CriticTrainer(b, learning_rate=1e-3)
    for horizon in (5, 7, 4):
        h, z, rewards, continues = dream_data(a, b=4, horizon=horizon, seed=horizon)
        a.fit((h, z, rewards, continues), batch_size=4, verbose=0)
        trainer.train_on_dream(h.swapaxes(0, 1), z.swapaxes(0, 1), rewards.T, continues.T)
        logs = a.evaluate((h, z, rewards, continues), batch_size=4, verbose=0, return_dict=True)
        assert np.isfinite(logs["loss"])
    assert_same_weights(a, b, rtol=1e-5)
    h, z, rewards, continues = dream_data(a, b=4, horizon=3, seed=9)
    before = snapshot(a)
    with pytest.raises(ValueError, match=r"rewards: got shape \[(4|\?), 2\], expected \[(4|\?), 3\]"):
        a.fit((h, z, rewards[:, :2], continues), batch_size=4, verbose=0)
    with pytest.raises(ValueError, match=r"h, z: got shapes"):
        a.evaluate((h[:, 0], z, rewards, continues), batch_size=4, verbose=0)
    assert_unchanged(a, before)


def test_compile_and_fit_arguments_are_checked_first():
    """Finding 9 (and the rules of point 2): options that would be ignored or misused are refused, naming
    them, and the critic stays compiled as it was."""
    a = critic()
    a.compile(learning_rate=1e-3)
    trainer = a.fit_trainer
    h, z, targets, weights = direct_data(a, 16)
    cases = [
        (dict(optimizer=keras.optimizers.Adam(clipnorm=1.0)), "optimizer: got a Adam with clipnorm=1.0"),
        (dict(optimizer=keras.optimizers.Adam(global_clipnorm=1.0)), "global_clipnorm"),
        (dict(optimizer="adam", learning_rate=1e-2), "learning_rate: got 0.01 with an optimizer of its own"),
        (dict(optimizer="adam", epsilon=1e-3), "epsilon: got 0.001"),
        (dict(optimizer="nonsense"), "optimizer: got 'nonsense'"),
        (dict(steps_per_execution=-1), "steps_per_execution: got -1"),
        (dict(steps_per_execution=1.5), "steps_per_execution: got 1.5"),
        (dict(run_eagerly="yes"), "run_eagerly: got 'yes'"),
        (dict(jit_compile="always"), "jit_compile: got 'always'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            a.compile(**kwargs)
        assert a.fit_trainer is trainer, kwargs
    before = snapshot(a)
    with pytest.raises(ValueError, match="class_weight: got"):
        a.fit((h, z), targets, class_weight={0: 1.0}, verbose=0)
    with pytest.raises(ValueError, match="class_weight: got"):
        a.train_on_batch((h, z), targets, class_weight={0: 1.0})
    with pytest.raises(ValueError, match=r"x: got an array of shape \[0, 16\], expected at least one row"):
        a.fit((h[:0], z[:0]), targets[:0], verbose=0)
    with pytest.raises(ValueError, match=r"x: got an array of shape \[0, 16\]"):
        a.evaluate((h[:0], z[:0]), targets[:0], verbose=0)
    with pytest.raises(ValueError, match=r"x: got an array of shape \[0, 16\]"):
        a.predict((h[:0], z[:0]), verbose=0)
    with pytest.raises(ValueError, match=r"y \(value_targets\): got a dict with keys \['task'\], expected one array"):
        a.fit((h, z), {"task": targets}, verbose=0)
    with pytest.raises(ValueError, match="y: got an array of dtype <U1"):
        a.fit((h, z), np.array(["a"] * 16), verbose=0)
    with pytest.raises(ValueError, match=r"validation_data|z: got shape"):
        a.fit((h, z), targets, validation_data=((h, z[:, :, :3]), targets), verbose=0)
    assert_unchanged(a, before)
    # An optimizer that clips on its own trains when the step does not clip too.
    a.compile(optimizer=keras.optimizers.Adam(1e-3, clipnorm=1.0), grad_clip=None)
    a.fit((h, z), targets, sample_weight=weights, verbose=0)
    assert int(to_np(a.optimizer.iterations)) == 1


def test_evaluate_before_compile_names_compile():
    """Finding 11: PyTorch raised a raw AttributeError."""
    a = critic()
    h, z, targets, _ = direct_data(a, 8)
    for call in (
        lambda: a.evaluate((h, z), targets, verbose=0),
        lambda: a.test_on_batch((h, z), targets),
        lambda: a.train_on_batch((h, z), targets),
    ):
        with pytest.raises(ValueError, match=r"(evaluate|test_on_batch|train_on_batch): the critic is not compiled"):
            call()
