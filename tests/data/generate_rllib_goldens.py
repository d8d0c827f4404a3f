"""Writes tests/data/rllib_goldens.npz: outputs of RLlib's own TensorFlow DreamerV3 code.

Not run by the test-suite. It needs an environment with ray[rllib]==2.48.0,
tensorflow-cpu and tf_keras (RLlib's TF DreamerV3 is Keras 2 code):

    TF_USE_LEGACY_KERAS=1 python tests/data/generate_rllib_goldens.py

Weights and inputs are drawn from numpy generators with fixed seeds (see
`tests/rllib_golden.py`, which draws the same ones), so the file holds only
inputs that are cheap to store and RLlib's outputs. What it records:

- forward passes of RLlib's critic sub-layers (fast and EMA) for several sizes;
- `two_hot`, `symlog`, `inverse_symlog` of edge-case values;
- value targets (`DreamerV3TfLearner._compute_value_targets`) and the critic
  loss (`DreamerV3TfLearner._compute_critic_loss`);
- a 5-step training trajectory: critic loss, tape gradients,
  `clip_gradients(global_norm, 100)`, Keras-2 Adam(lr 3e-5, eps 1e-5),
  `critic.update_ema()` — RLlib's critic update, step by step.
"""

from __future__ import annotations

import os
import pathlib
import sys
import types

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import tensorflow as tf
from ray.rllib.algorithms.dreamerv3.tf.dreamerv3_tf_learner import DreamerV3TfLearner
from ray.rllib.algorithms.dreamerv3.tf.models.critic_network import CriticNetwork
from ray.rllib.utils.tf_utils import clip_gradients, inverse_symlog, symlog, two_hot

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tests import rllib_golden as spec  # noqa: E402

OUT = pathlib.Path(__file__).with_name("rllib_goldens.npz")


def build(size):
    critic = CriticNetwork(model_size=size)
    dims = spec.DIMS[size]
    x = tf.zeros((1, dims[0] + dims[1] * dims[2]))
    critic.return_layer(critic.mlp(x))
    critic.return_layer_ema(critic.mlp_ema(x))
    return critic


def forward(critic, h, z, use_ema):
    # RLlib's `CriticNetwork.call`, through its own sub-layers (the tf.function
    # wrapper of `call` returns symbolic tensors under tf_keras 2.21).
    x = tf.concat([h, tf.reshape(z, (z.shape[0], -1))], -1)
    if use_ema:
        return critic.return_layer_ema(critic.mlp_ema(x))
    return critic.return_layer(critic.mlp(x))


class _Metrics:
    def __init__(self):
        self.logged = {}

    def log_dict(self, d, **kwargs):
        self.logged.update(d)


def critic_loss(logits_flat, targets, ema_symlog_h1, weights_h1, h1, b):
    fake = types.SimpleNamespace(metrics=_Metrics())
    dream = {
        "rewards_dreamed_t0_to_H_BxT": tf.zeros((h1, b)),
        "values_symlog_dreamed_logits_t0_to_HxBxT": logits_flat,
        "v_symlog_dreamed_ema_t0_to_H_BxT": ema_symlog_h1,
        "dream_loss_weights_t0_to_H_BxT": weights_h1,
    }
    total = DreamerV3TfLearner._compute_critic_loss(
        fake, module_id="m", config=types.SimpleNamespace(report_individual_batch_item_stats=False), dream_data=dream, value_targets_t0_to_Hm1_BxT=targets
    )
    logged = fake.metrics.logged
    return total, logged["CRITIC_L_neg_logp_of_value_targets"], logged["CRITIC_L_slow_critic_regularization"]


def value_targets(rewards, continues, values):
    config = types.SimpleNamespace(gamma=spec.GAMMA, gae_lambda=spec.LAMBDA)
    return DreamerV3TfLearner._compute_value_targets(
        None,
        config=config,
        rewards_t0_to_H_BxT=rewards,
        intrinsic_rewards_t1_to_H_BxT=None,
        continues_t0_to_H_BxT=continues,
        value_predictions_t0_to_H_BxT=values,
    )


def main():
    out = {}
    for size in spec.FORWARD_SIZES:
        critic = build(size)
        critic.set_weights(spec.rllib_weights(size))
        h, z = spec.forward_inputs(size)
        for use_ema in (False, True):
            v, logits = forward(critic, tf.constant(h), tf.constant(z), use_ema)
            tag = f"{size}_{'ema' if use_ema else 'fast'}"
            out[f"forward_{tag}_value"] = v.numpy()
            out[f"forward_{tag}_logits"] = logits.numpy()
        # A fresh critic (zero head) predicts about 0.
        fresh = build(size)
        out[f"fresh_{size}_value"] = forward(fresh, tf.constant(h), tf.constant(z), False)[0].numpy()

    values = spec.two_hot_values()
    out["two_hot"] = two_hot(tf.constant(values)).numpy()
    out["two_hot_11"] = two_hot(tf.constant(values / 4.0), num_buckets=11, lower_bound=-5.0, upper_bound=5.0).numpy()
    big = spec.symlog_values()
    out["symlog"] = symlog(tf.constant(big)).numpy()
    out["inverse_symlog"] = inverse_symlog(tf.constant(out["symlog"])).numpy()

    rewards, continues, vals = spec.return_inputs()
    targets = value_targets(tf.constant(rewards), tf.constant(continues), tf.constant(vals))
    out["value_targets"] = targets.numpy()
    logits, ema_symlog, weights = spec.loss_inputs()
    h1, b = rewards.shape
    total, nll, reg = critic_loss(
        tf.constant(logits.reshape(h1 * b, -1)), targets, tf.constant(ema_symlog), tf.constant(weights), h1, b
    )
    out["loss_total"], out["loss_value_nll"], out["loss_ema_regularizer"] = total.numpy(), nll.numpy(), reg.numpy()
    with tf.GradientTape() as tape:
        lt = tf.constant(logits.reshape(h1 * b, -1))
        tape.watch(lt)
        total, _, _ = critic_loss(lt, targets, tf.constant(ema_symlog), tf.constant(weights), h1, b)
    out["loss_grad_logits"] = tape.gradient(total, lt).numpy().reshape(logits.shape)

    # The critic update of RLlib's learner, 5 steps on dreamed batches.
    size = spec.TRAJECTORY_SIZE
    critic = build(size)
    critic.set_weights(spec.rllib_weights(size, ema_equals_fast=True))
    optimizer = tf.keras.optimizers.Adam(learning_rate=3e-5, epsilon=1e-5)
    for step in range(spec.TRAJECTORY_STEPS):
        h, z, rewards, continues = spec.dream_batch(step)
        h1, b = rewards.shape
        hf = tf.constant(h.reshape(h1 * b, -1))
        zf = tf.constant(z.reshape((h1 * b,) + z.shape[2:]))
        c = tf.constant(continues)
        weights = tf.math.cumprod(spec.GAMMA * c, axis=0) / spec.GAMMA
        with tf.GradientTape() as tape:
            v, logits = forward(critic, hf, zf, False)
            v_ema, _ = forward(critic, hf, zf, True)
            values_real = inverse_symlog(tf.reshape(v, (h1, b)))
            targets = value_targets(tf.constant(rewards), c, values_real)
            total, nll, reg = critic_loss(logits, targets, tf.reshape(v_ema, (h1, b)), weights, h1, b)
        variables = critic.trainable_variables
        grads = dict(zip([v.ref() for v in variables], tape.gradient(total, variables)))
        norm = clip_gradients(grads, grad_clip=100.0, grad_clip_by="global_norm")
        optimizer.apply_gradients(zip(grads.values(), variables))
        critic.update_ema()
        out[f"traj_{step}_total"], out[f"traj_{step}_value_nll"] = total.numpy(), nll.numpy()
        out[f"traj_{step}_ema_regularizer"], out[f"traj_{step}_grad_norm"] = reg.numpy(), norm.numpy()
    for i, w in enumerate(critic.get_weights()):
        out[f"traj_final_{i}"] = w
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(out)} arrays)")


if __name__ == "__main__":
    main()
