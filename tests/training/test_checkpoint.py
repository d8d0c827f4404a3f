import os

import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from tests.conftest import to_np
from tests.portable import OPTIONS, TRAINER_OPTIONS, golden_batch

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")
GOLDEN = dict(np.load(os.path.join(DATA, "golden_outputs.npz")))


def make(seed=0, **kwargs):
    critic = CriticNetwork(**dict(OPTIONS, **kwargs))
    rng = np.random.default_rng(seed)
    for v in critic.weights:
        v.assign(rng.normal(scale=0.2, size=tuple(v.shape)).astype("float32"))
    return critic, CriticTrainer(critic, learning_rate=1e-3, **TRAINER_OPTIONS)


def test_resumed_run_continues_exactly(tmp_path):
    critic, trainer = make()
    for step in range(3):
        trainer.train_step(*golden_batch(critic, step))
    path = trainer.save(tmp_path / "state")
    assert path.endswith(".npz")
    straight = [to_np(trainer.train_step(*golden_batch(critic, step))) for step in (3, 4)]
    final = [to_np(v) for v in trainer.state_variables]

    other_critic, resumed = make(seed=99)  # different weights: all must come from the file
    resumed.restore(path)
    assert int(to_np(resumed.steps)) == 3
    again = [to_np(resumed.train_step(*golden_batch(other_critic, step))) for step in (3, 4)]
    for a, b in zip(straight, again):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    for a, v in zip(final, resumed.state_variables):
        np.testing.assert_array_equal(a, to_np(v))


def test_golden_trainer_checkpoint_resumes_on_this_backend():
    critic, trainer = make(seed=5)
    trainer.restore(os.path.join(DATA, "golden_trainer.npz"))
    metrics = to_np(trainer.train_step(*golden_batch(critic, 3)))
    for key in ("total", "value_nll", "ema_regularizer", "grad_norm"):
        np.testing.assert_allclose(metrics[key], GOLDEN[f"next_{key}"], rtol=1e-5, err_msg=key)
    for i, v in enumerate(critic.weights):
        np.testing.assert_allclose(to_np(v), GOLDEN[f"next_weight_{i}"], atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"model_size": "nano"}, "gru_units: saved 32, this one 16"),
        ({"num_buckets": 255}, "num_buckets: saved 101, this one 255"),
    ],
)
def test_restoring_another_critic_fails_and_changes_nothing(kwargs, match):
    critic, trainer = make(**kwargs)
    before = [to_np(v) for v in trainer.state_variables]
    with pytest.raises(ValueError, match=match):
        trainer.restore(os.path.join(DATA, "golden_trainer.npz"))
    for b, v in zip(before, trainer.state_variables):
        np.testing.assert_array_equal(to_np(v), b)


def test_restoring_a_truncated_or_foreign_file_fails(tmp_path):
    critic, trainer = make()
    data = open(os.path.join(DATA, "golden_trainer.npz"), "rb").read()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match="is not a readable multicritic trainer checkpoint"):
        trainer.restore(tmp_path / "cut.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match="is not a readable multicritic trainer checkpoint"):
        trainer.restore(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="is not a readable"):
        trainer.restore(tmp_path / "missing.npz")


def test_a_mixed_float16_trainer_saves_and_resumes_exactly(tmp_path):
    """Finding 16: the loss-scale optimizer and the optimizer it wraps both hold an `iteration` (and a
    `learning_rate`): saving refused as 'two state variables share the key'. The wrapped optimizer's
    variables are keyed under `optimizer/inner/`."""
    import keras

    from multicritic.training import checkpoint

    keras.config.set_dtype_policy("mixed_float16")
    critic, trainer = make()
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    keys = checkpoint.keyed_variables(trainer)
    assert {"optimizer/iteration", "optimizer/inner/iteration", "optimizer/dynamic_scale"} <= set(keys)
    for step in range(2):
        trainer.train_step(*golden_batch(critic, step))
    path = trainer.save(tmp_path / "mixed")
    straight = [to_np(trainer.train_step(*golden_batch(critic, step))) for step in (2, 3)]
    final = [to_np(v) for v in trainer.state_variables]

    other_critic, resumed = make(seed=99)
    resumed.train_step(*golden_batch(other_critic, 7))  # another state, all of it replaced by the file
    resumed.restore(path)
    again = [to_np(resumed.train_step(*golden_batch(other_critic, step))) for step in (2, 3)]
    for a, b in zip(straight, again):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    for a, v in zip(final, resumed.state_variables):
        np.testing.assert_array_equal(a, to_np(v), err_msg=v.path)
