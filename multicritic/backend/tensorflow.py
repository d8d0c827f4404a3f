"""TensorFlow: gradients with `tf.GradientTape`, the step compiled by `tf.function` (optionally XLA).

Data parallelism: when the critic and trainer were created inside a
`tf.distribute.Strategy` scope (e.g. `MirroredStrategy`), each replica takes
its slice of the batch and computes gradients of its share of the mean loss;
the gradients are summed across replicas, then clipped, applied and
EMA-averaged once, in cross-replica context, on the mirrored variables.
"""

from __future__ import annotations

import tensorflow as tf

from multicritic.backend import Backend, StepProgram


def batch_signature(batch, batch_axis):
    """TensorSpecs with the batch axis left open, so a new batch size does not retrace."""
    specs = []
    for x in batch:
        shape = list(x.shape)
        shape[batch_axis] = None
        specs.append(tf.TensorSpec(shape, x.dtype))
    return specs


def _distributed_train_function(program: StepProgram, batch_axis, strategy):
    replicas = strategy.num_replicas_in_sync
    sum_, mean = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN

    def replica_step(*batch):
        with tf.GradientTape() as tape:
            loss, metrics = program.loss(*batch)
            scaled = program.scale_loss(loss) / replicas
        return tape.gradient(scaled, list(program.trainable)), metrics

    @tf.function(jit_compile=program.jit_compile, reduce_retracing=True)
    def step(*batch):
        grads, metrics = strategy.run(replica_step, args=batch)
        grads = [strategy.reduce(sum_, g, axis=None) for g in grads]
        # Per-replica means average; counts add up.
        metrics = {
            k: strategy.reduce(sum_ if k.split("/")[-1] in program.sum_metrics else mean, v, axis=None)
            for k, v in metrics.items()
        }
        return program.apply(grads, metrics)

    def run(*batch):
        if batch[0].shape[batch_axis] % replicas:
            raise ValueError(
                f"batch: got {batch[0].shape[batch_axis]} rows on axis {batch_axis}, expected a multiple "
                f"of the {replicas} replicas of the distribution strategy."
            )
        parts = [tf.split(x, replicas, axis=batch_axis) for x in batch]
        local = [
            strategy.experimental_distribute_values_from_function(lambda ctx, p=p: p[ctx.replica_id_in_sync_group])
            for p in parts
        ]
        return step(*local)

    run.compiled = {"distributed": step}
    return run


class TensorFlowBackend(Backend):
    name = "tensorflow"
    lazy_fallbacks = True

    def global_norm(self, tensors):
        # `tf.clip_by_global_norm`'s norm (the reference's clipping): one fused `l2_loss` pass per tensor, where
        # `sum(t * t)` is a square and a sum.
        return tf.linalg.global_norm(list(tensors))

    def take_along_last_axis(self, x, indices):
        # One batched gather: Keras's `take_along_axis` first broadcasts `x` to the indices' leading shape, a
        # copy of it (and a reduction in the gradient) when the batch size is open, as in the trainer's steps.
        x = tf.convert_to_tensor(x)
        return tf.gather(x, tf.convert_to_tensor(indices), batch_dims=x.shape.rank - 1)

    def update_if(self, ok, update, variables):
        """A `tf.cond`: the update's assignments run only in the taken branch."""

        def run():
            update()
            return tf.constant(True)

        tf.cond(ok, run, lambda: tf.constant(False))

    def all_gather(self, x):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return x
        return context.all_gather(x, axis=0)

    def train_step(self, program, batch):
        with tf.GradientTape() as tape:
            loss, metrics = program.loss(*batch)
            scaled = program.scale_loss(loss)
        return program.apply(tape.gradient(scaled, list(program.trainable)), metrics)

    def make_train_function(self, program, batch_axis):
        trainable = list(program.trainable)
        # The strategy the critic's variables were created under (mirrored
        # variables remember it), whether or not its scope is open now.
        strategy = getattr(trainable[0].value, "_distribute_strategy", None)
        if strategy is None and tf.distribute.has_strategy():
            strategy = tf.distribute.get_strategy()
        if strategy is not None and strategy.num_replicas_in_sync > 1:
            return _distributed_train_function(program, batch_axis, strategy)
        compiled = {}

        def step(*batch):
            return self.train_step(program, batch)

        def run(*batch):
            signature = batch_signature(batch, batch_axis)
            key = tuple((tuple(s.shape), s.dtype) for s in signature)
            fn = compiled.get(key)
            if fn is None:
                fn = compiled[key] = tf.function(step, input_signature=signature, jit_compile=program.jit_compile)
            return fn(*batch)

        run.compiled = compiled
        return run

    def make_predict_function(self, critic, use_ema):
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


BACKEND = TensorFlowBackend()
