"""PyTorch: gradients with autograd (`loss.backward()`); the whole step optionally through `torch.compile`."""

from __future__ import annotations

import torch


def apply_gradients(optimizer, grads, variables):
    optimizer.apply(grads, variables)


def make_train_function(trainer, loss_fn, batch_axis):
    trainable = trainer.critic.trainable_variables

    def step(*batch):
        params = [v.value for v in trainable]
        for p in params:
            p.grad = None
        loss, losses = loss_fn(*batch)
        trainer._scaled_loss(loss).backward()
        grads = [p.grad for p in params]
        with torch.no_grad():
            losses = {k: v.detach() for k, v in losses.items()}
            return trainer._apply(grads, losses)

    if trainer.jit_compile:
        # As Keras's own torch trainer does with jit_compile=True; dynamic
        # shapes, so a new batch size does not recompile.
        return torch.compile(step, dynamic=True)
    return step


def make_predict_function(critic, use_ema):
    """Eager forward pass without autograd (nothing to trace, nothing to recompile)."""

    def run(h, z):
        with torch.no_grad():
            return critic(h, z, use_ema=use_ema)

    return run
