"""Writes the committed cross-backend checkpoint goldens (run once, on any backend):

    KERAS_BACKEND=jax python tests/data/make_portable_goldens.py

- golden_critic.weights.h5 / golden_critic.keras: a micro critic with
  non-default options and distinct random fast and EMA weights;
- golden_trainer.npz: a trainer checkpoint after 3 steps;
- golden_outputs.npz: inputs, the critic's fast and EMA outputs, and the
  metrics and weights of one more step from the trainer checkpoint.
"""

import pathlib
import sys

import keras
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from multicritic import CriticNetwork, CriticTrainer  # noqa: E402
from tests.portable import OPTIONS, TRAINER_OPTIONS, golden_batch  # noqa: E402

HERE = pathlib.Path(__file__).parent


def main():
    keras.utils.set_random_seed(7)
    critic = CriticNetwork(**OPTIONS)
    rng = np.random.default_rng(7)
    for v in critic.weights:
        v.assign(rng.normal(scale=0.1, size=tuple(v.shape)).astype("float32"))
    critic.save_weights(HERE / "golden_critic.weights.h5")
    critic.save(HERE / "golden_critic.keras")
    h, z, targets, weights = golden_batch(critic, 0)
    out = {"h": h, "z": z}
    for use_ema in (False, True):
        value, logits = critic(h, z, use_ema=use_ema)
        tag = "ema" if use_ema else "fast"
        out[f"{tag}_value"] = keras.ops.convert_to_numpy(value)
        out[f"{tag}_logits"] = keras.ops.convert_to_numpy(logits)
    trainer = CriticTrainer(critic, learning_rate=1e-3, **TRAINER_OPTIONS)
    for step in range(3):
        trainer.train_step(*golden_batch(critic, step))
    trainer.save(HERE / "golden_trainer.npz")
    metrics = trainer.train_step(*golden_batch(critic, 3))
    for k, v in metrics.items():
        out[f"next_{k}"] = keras.ops.convert_to_numpy(v)
    for i, v in enumerate(critic.weights):
        out[f"next_weight_{i}"] = keras.ops.convert_to_numpy(v.value)
    out["backend"] = np.array(keras.backend.backend())
    np.savez(HERE / "golden_outputs.npz", **out)
    print("wrote goldens under", HERE, "with", keras.backend.backend())


if __name__ == "__main__":
    main()
