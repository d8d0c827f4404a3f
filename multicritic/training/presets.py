"""Presets: one argument builds a critic, its trainer and its return normaliser as a published recipe does.

- `"rllib-2023"`: RLlib's TensorFlow DreamerV3 critic (the 2023 paper),
  multicritic's defaults: LayerNorm MLP without biases, two-hot over uniform
  symlog buckets, Adam 3e-5 (epsilon 1e-5) with global-norm clip 100, EMA
  regulariser (decay 0.98), gamma 0.997, lambda 0.95, the "perc_ema" return
  normaliser.
- `"dreamerv3-2024"`: the official code (github.com/danijar/dreamerv3,
  checked at commit e3f02248): RMSNorm (epsilon 1e-4) MLP of 3 layers with
  biases, truncated-normal fan-in initialisers, two-hot over 255 symexp bins
  interpolated in real space, a zero-initialised output layer, the slow
  critic (rate 0.02 every step, copied on first use, regulariser weight 1,
  targets from the fast critic), the replay value loss (weight 0.3,
  discount 1 - 1/333), LaProp with adaptive gradient clipping (lr 4e-5,
  1000 warm-up steps) and the "perc" return normaliser (rate 0.01, limit 1).
  Its dreams' `continues` are the world model's discounted continue
  probabilities (the official `contdisc`), so the dream discount `gamma` is 1.
"""

from __future__ import annotations

import collections
import inspect
import warnings
from typing import Dict, Mapping, Optional

import keras

from multicritic.model.sizes import OFFICIAL_2024_SIZES, official_2024_dims

PRESETS = ("rllib-2023", "dreamerv3-2024")

Preset = collections.namedtuple("Preset", ["critic", "trainer", "normalizer"])

_UNSET = object()


def _model_size(model_size, size, caller):
    """`model_size`, or the value of its deprecated spelling `size` (with a DeprecationWarning)."""
    if size is _UNSET:
        return model_size
    if model_size is not None:
        raise ValueError(
            f"size: got {size!r} with model_size={model_size!r}, expected model_size alone "
            "(size is its deprecated name)"
        )
    warnings.warn(
        f"presets.{caller}(size=...) is deprecated: use presets.{caller}(model_size=...), the keyword "
        "CriticNetwork takes",
        DeprecationWarning,
        stacklevel=3,
    )
    return size


def options(name: str, model_size: Optional[str] = None, *, size=_UNSET) -> Dict[str, Dict]:
    """The preset's `{"critic": ..., "trainer": ..., "normalizer": ...}` keyword arguments (the trainer's
    `optimizer` is a fresh instance).

    Args:
        name: `"rllib-2023"` or `"dreamerv3-2024"`.
        model_size: the model size, as in `build`.
        size: deprecated spelling of `model_size` (a `DeprecationWarning`).
    """
    size = _model_size(model_size, size, "options")
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"preset: got {name!r}, expected one of {list(PRESETS)}.")
    if name == "rllib-2023":
        return {
            "critic": {"model_size": size or "XS"},
            "trainer": {},
            "normalizer": {"impl": "perc_ema", "decay": 0.99, "limit": 1.0},
        }
    if name == "dreamerv3-2024":
        from multicritic.training.optimizers import official_optimizer

        size = "200m" if size is None else size
        if size not in OFFICIAL_2024_SIZES:
            raise ValueError(
                f"model_size: got {size!r}, expected one of the official code's sizes {list(OFFICIAL_2024_SIZES)}."
            )
        critic = dict(official_2024_dims(size), model_size=None)
        critic.update(
            bin_scheme="symexp",
            num_buckets=255,
            lower_bound=-20.0,
            upper_bound=20.0,
            norm="rms",
            norm_epsilon=1e-4,
            use_bias=True,
            kernel_initializer=keras.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal"),
            ema_decay=0.98,
        )
        trainer = {
            "optimizer": official_optimizer(),
            "grad_clip": None,
            "gamma": 1.0,
            "lambda_": 0.95,
            "ema_update_period": 1,
            "ema_regularizer": "two_hot_mean",
            "ema_regularizer_weight": 1.0,
            "ema_targets": False,
            "value_loss_weight": 1.0,
            "replay_loss_weight": 0.3,
            "replay_discount": 1.0 - 1.0 / 333,
        }
        return {"critic": critic, "trainer": trainer, "normalizer": {"impl": "perc", "rate": 0.01, "limit": 1.0}}
    raise ValueError(f"preset: got {name!r}, expected one of {list(PRESETS)}.")


def build(
    name: str, model_size: Optional[str] = None, critic_options=None, trainer_options=None, *, size=_UNSET
) -> Preset:
    """`Preset(critic, trainer, normalizer)` built as preset `name` says, on the running backend.

    Args:
        name: `"rllib-2023"` or `"dreamerv3-2024"`.
        model_size: the model size: multicritic's (`"XS"` ...) for
            `"rllib-2023"`, the official code's (`"1m"` ... `"400m"`, default
            `"200m"`) for `"dreamerv3-2024"`.
        critic_options: overrides of the preset's critic options (e.g. input
            sizes).
        trainer_options: overrides of the preset's trainer options (e.g.
            `learning_rate`).
        size: deprecated spelling of `model_size` (a `DeprecationWarning`).

    Examples:
        >>> critic, trainer, normalizer = presets.build("dreamerv3-2024", model_size="12m")
        >>> trainer.train_on_dream_and_replay(h, z, r, c, rh, rz, rr, last, term)
    """
    from multicritic.model.critic import CriticNetwork
    from multicritic.model.normalizer import ReturnNormalizer
    from multicritic.training.options import TrainerOptions
    from multicritic.training.trainer import CriticTrainer

    accepted = {
        "critic_options": set(inspect.signature(CriticNetwork.__init__).parameters) - {"self", "kwargs"}
        | {"name", "dtype"},
        "trainer_options": {"optimizer", *TrainerOptions.names()},
    }
    for what, given in (("critic_options", critic_options), ("trainer_options", trainer_options)):
        if given is None:
            continue
        if not isinstance(given, Mapping):
            raise ValueError(f"{what}: got a {type(given).__name__}, expected a dict of overrides or None.")
        unknown = sorted(str(k) for k in given if k not in accepted[what])
        if unknown:
            raise ValueError(f"{what}: got the option {unknown[0]!r}, expected some of {sorted(accepted[what])}.")
    opts = options(name, _model_size(model_size, size, "build"))
    critic = CriticNetwork(**{**opts["critic"], **(critic_options or {})})
    trainer = CriticTrainer(critic, **{**opts["trainer"], **(trainer_options or {})})
    return Preset(critic, trainer, ReturnNormalizer(**opts["normalizer"]))
