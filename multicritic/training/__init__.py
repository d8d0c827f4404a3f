"""Training a critic outside Keras's `fit`: `CriticTrainer` (its steps and checkpoints), the step's math
(`multicritic.training.step`), checkpoints (`checkpoint`) and several hosts (`hosts`).

`CriticTrainer` and `predict_function` are `multicritic.training.trainer`'s, reached from here when first
used (PEP 562): the step's modules are imported by the critic's own (`critic.fit`), and the trainer imports
the critic.
"""

__all__ = ["CriticTrainer", "predict_function"]


def __getattr__(name):
    if name in __all__:
        from multicritic.training import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'multicritic.training' has no attribute {name!r}")
