"""TensorFlow: gradients with `tf.GradientTape`, the step compiled by `tf.function` (optionally XLA)."""

from __future__ import annotations

import tensorflow as tf


def batch_signature(batch, batch_axis):
    """TensorSpecs with the batch axis left open, so a new batch size does not retrace."""
    specs = []
    for x in batch:
        shape = list(x.shape)
        shape[batch_axis] = None
        specs.append(tf.TensorSpec(shape, x.dtype))
    return specs


def apply_gradients(optimizer, grads, variables):
    optimizer.apply(grads, variables)


def make_train_function(trainer, loss_fn, batch_axis):
    trainable = trainer.critic.trainable_variables
    compiled = {}

    def step(*batch):
        with tf.GradientTape() as tape:
            loss, losses = loss_fn(*batch)
            scaled = trainer._scaled_loss(loss)
        grads = tape.gradient(scaled, trainable)
        return trainer._apply(grads, losses)

    def run(*batch):
        signature = tuple((tuple(s.shape), s.dtype) for s in batch_signature(batch, batch_axis))
        fn = compiled.get(signature)
        if fn is None:
            fn = compiled[signature] = tf.function(
                step,
                input_signature=batch_signature(batch, batch_axis),
                jit_compile=trainer.jit_compile,
            )
        return fn(*batch)

    run.compiled = compiled
    return run


def make_predict_function(critic, use_ema):
    """`tf.function` traced once for every batch size (`[None, ...]` signature, as the reference)."""
    signature = [
        tf.TensorSpec([None, critic.gru_units], tf.float32),
        tf.TensorSpec([None, critic.num_z_categoricals, critic.num_z_classes], tf.float32),
    ]
    compiled = tf.function(lambda h, z: critic(h, z, use_ema=use_ema), input_signature=signature)

    def run(h, z):
        return compiled(h, z)

    run.compiled = compiled
    return run
