"""`TrainerOptions`: the trainer's options and their defaults, defined once.

`CriticTrainer`, its step (`CriticStep`), `critic.compile()` and the
checkpoints read the names and defaults from here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class TrainerOptions:
    """How a critic is trained (see `CriticTrainer` for what each option does).

    `TrainerOptions.from_kwargs(options)` refuses a name that is not an
    option; each option's range is checked by the step that reads it (some
    depend on the critic and the optimizer).

    Attributes:
        gamma: discount for lambda-returns and dream loss weights.
        lambda_: TD(lambda) parameter.
        grad_clip: global-norm clip (100 in the reference); `None` for none.
        ema_update_period: update the EMA every this many optimizer steps.
        ema_update_first: with a period above 1, update at the first step
            of each period (steps 1, 1 + period, ...: the official code's
            slow critic `every`) instead of its last (period, 2 * period,
            ...: RLlib's).
        ema_regularizer_weight: weight of the slow-critic regulariser in the
            loss (1.0 in the reference).
        ema_regularizer: `"two_hot_mean"` (cross-entropy to the head's
            target encoding of the EMA critic's value, the reference) or
            `"distribution"` (cross-entropy to the EMA critic's bucket
            distribution).
        ema_targets: compute lambda-return targets from the EMA critic's
            values instead of the fast critic's.
        seed: seed of the member draws of `aggregation="min_of_random"`; the
            members drawn at a step are a function of the seed and the step
            count (no random state to carry or checkpoint).
        learning_rate: of the default Adam (3e-5).
        epsilon: of the default Adam (1e-5).
        jit_compile: True, False or `"auto"` (the default). True compiles
            at a batch signature's first call, False never. `"auto"` keeps
            each backend's default way on a CPU for the whole run (there a
            compilation does not pay back within a typical run); on an
            accelerator it compiles after a step kind's first
            `multicritic.backend.contract.AUTO_COMPILE_AFTER_STEPS` calls
            (1000), logging one warning on the `multicritic` logger with the
            seconds it took (`CriticTrainer.compilations` lists every
            compilation). TensorFlow: compile the `tf.function` step with
            XLA, traced once per batch size (the plain graph: one trace for
            all sizes; `"auto"` not under a loss-scale optimizer or a
            distribution strategy). PyTorch: compile the whole step into
            one graph per batch shape (forward, backward and update, no host
            sync; inductor's kernels, a CUDA graph on a GPU); the default way
            is eager autograd (see `multicritic.backend.torch.TrainFunction`).
            JAX: always jitted.
        check_finite: raise a `ValueError` for non-finite numpy inputs before
            any state changes. Backend tensors are not inspected on the host;
            inside the compiled step non-finite targets are dropped from the
            loss (counted in `nonfinite_targets`), and a batch with
            non-finite gradients (`nonfinite_grads` = 1) or invalid inputs
            (`invalid_inputs` > 0: negative weights, continues outside
            [0, 1], non-finite states) is skipped whole (`step_skipped` = 1).
        metrics: `"all"` (the default: every diagnostic `CriticTrainer` lists) or `"core"`
            (the loss, the gradient norm and the guards' verdicts only; see
            `CriticTrainer`). The same update either way.
        step_counter: the optimizer's own `iterations` to count steps with,
            or `None` (the trainer's own counter).
        value_loss_weight: weight of the value loss of dream steps (1.0).
        replay_loss_weight: weight of the replay loss (0.3, the official
            code's).
        replay_discount: discount of the replay returns (1 - 1/333).
    """

    gamma: float = 0.997
    lambda_: float = 0.95
    grad_clip: Optional[float] = 100.0
    ema_update_period: int = 1
    ema_update_first: bool = False
    ema_regularizer_weight: float = 1.0
    ema_regularizer: str = "two_hot_mean"
    ema_targets: bool = False
    seed: Optional[int] = None
    learning_rate: float = 3e-5
    epsilon: float = 1e-5
    jit_compile: Any = "auto"
    check_finite: bool = True
    step_counter: Any = None
    value_loss_weight: float = 1.0
    replay_loss_weight: float = 0.3
    replay_discount: float = 1.0 - 1.0 / 333
    metrics: str = "all"

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def defaults(cls, names=None) -> Dict[str, Any]:
        """`{name: default}` for `names` (every option by default)."""
        every = {f.name: f.default for f in dataclasses.fields(cls)}
        return every if names is None else {name: every[name] for name in names}

    @classmethod
    def from_kwargs(cls, options: Mapping[str, Any], where: str = "CriticTrainer") -> "TrainerOptions":
        """The options given by keyword, the defaults for the rest; a `ValueError` names an unknown one."""
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise ValueError(
                f"{unknown[0]}: got {options[unknown[0]]!r}, expected one of {where}'s options {list(cls.names())}."
            )
        return cls(**options)
