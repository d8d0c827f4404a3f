"""The official DreamerV3 (2024) optimizer: per-tensor AGC, then LaProp, with a linear warmup.

Written once against `keras.ops`; the same code runs on TensorFlow, PyTorch
and JAX, eagerly and compiled. `official_optimizer()` gives the settings of
`danijar/dreamerv3` (`dreamerv3/agent.py` `_make_opt` with
`embodied/jax/opt.py`, commit e3f02248693a79dc8b0ebd62c93683888ddaccfe).
"""

from __future__ import annotations

import keras
from keras import ops

from multicritic.backend import contract as backend_lib
from multicritic.validation import integer, number

OFFICIAL_COMMIT = "e3f02248693a79dc8b0ebd62c93683888ddaccfe"


def _beta(name, value):
    value = number(name, value, low=0.0, high=1.0)
    if value == 1.0:
        raise ValueError(f"{name}: got {value!r}, expected a finite number in [0, 1) (1 would divide by zero).")
    return value


def _learning_rate(value):
    """A schedule or callable as it is; a number as a non-negative Python float."""
    if isinstance(value, keras.optimizers.schedules.LearningRateSchedule) or callable(value):
        return value
    return number("learning_rate", value, low=0.0)


@keras.saving.register_keras_serializable(package="multicritic")
class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """A learning rate that ramps linearly from 0 to `learning_rate`, then stays.

    `lr(step) = learning_rate * min(step / warmup_steps, 1)`, where `step` is
    the optimizer's iteration count as Keras passes it: the number of updates
    applied before this one (0 for the first). With `warmup_steps > 0` the
    first update therefore has learning rate 0 (a no-op on the parameters;
    the optimizer's moments still move), as in the official DreamerV3 code
    (`optax.linear_schedule(0, lr, warmup)` joined with a constant).
    `warmup_steps=0` gives the constant `learning_rate`.

    Args:
        learning_rate: float >= 0. The learning rate after the warmup.
            Defaults to `4e-5` (DreamerV3).
        warmup_steps: int >= 0. The number of updates the ramp lasts.
            Defaults to `1000` (DreamerV3).

    Examples:

    ```python
    schedule = multicritic.training.optimizers.LinearWarmup(4e-5, warmup_steps=1000)
    float(schedule(500))  # 2e-05
    optimizer = multicritic.training.optimizers.LaProp(learning_rate=schedule)
    ```

    Reference:
     - [Hafner et al., 2024](https://github.com/danijar/dreamerv3)
       (DreamerV3 code, `dreamerv3/agent.py` `_make_opt`)
    """

    def __init__(self, learning_rate=4e-5, warmup_steps=1000):
        self.learning_rate = number("learning_rate", learning_rate, low=0.0)
        self.warmup_steps = integer("warmup_steps", warmup_steps, low=0)

    def __call__(self, step):
        lr = ops.convert_to_tensor(self.learning_rate, "float32")
        if self.warmup_steps == 0:
            return lr
        if step is None or isinstance(step, (str, bytes)):  # (Keras passes its `iterations` variable)
            raise ValueError(f"step: got {step!r}, expected the optimizer's update count (a number or tensor).")
        step = ops.cast(ops.convert_to_tensor(step), "float32")
        return lr * ops.minimum(step / float(self.warmup_steps), 1.0)

    def get_config(self):
        return {"learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps}


@keras.saving.register_keras_serializable(package="multicritic")
class LaProp(keras.optimizers.Optimizer):
    """The DreamerV3 optimizer: adaptive gradient clipping, then LaProp.

    Per parameter tensor `p` with gradient `g`, at update `t = 1, 2, ...`:

    1. Adaptive gradient clipping per tensor (norms over the whole tensor):
       `g <- g / max(1, ||g|| / (agc * max(agc_min_norm, ||p||)))`.
    2. RMS normalisation: `nu <- beta_2 * nu + (1 - beta_2) * g^2`,
       `u = g / (sqrt(nu / (1 - beta_2^t)) + epsilon)`.
    3. Momentum on the normalised update (LaProp, unlike Adam's momentum on
       the raw gradient): `mu <- beta_1 * mu + (1 - beta_1) * u`,
       `u = mu / (1 - beta_1^t)`.
    4. `p <- p - learning_rate * u`.

    This is the chain of the official DreamerV3 code (`clip_by_agc`,
    `scale_by_rms`, `scale_by_momentum`, `scale_by_learning_rate` in
    `embodied/jax/opt.py`); `official_optimizer()` adds its learning-rate
    warmup. `t` is the optimizer's `iterations + 1` (with
    `gradient_accumulation_steps`, the number of applied updates). The
    gradient norms are finite for any finite gradient (a sum of squares past
    float32's range is recomputed on a scaled copy).

    Decoupled weight decay (the official `wd`, off by default) is the Keras
    base `weight_decay` argument, which Keras applies itself, before this
    update, as `p <- p - learning_rate * weight_decay * p` (the official code
    adds `wd * p` to the update after the momentum, so its AGC sees the
    undecayed `p`; the two differ by a factor `1 - lr * wd` in that norm).

    Args:
        learning_rate: float >= 0, a
            `keras.optimizers.schedules.LearningRateSchedule` (e.g.
            `LinearWarmup`), or a callable returning the learning rate.
            Defaults to `4e-5` (DreamerV3, which also warms up over 1000
            updates: see `official_optimizer`).
        beta_1: float in `[0, 1)`. Decay of the momentum `mu` of the
            normalised updates. Defaults to `0.9`.
        beta_2: float in `[0, 1)`. Decay of the second moment `nu` of the
            gradients. Defaults to `0.999`.
        epsilon: float > 0. Added to the bias-corrected RMS, outside the
            square root. Defaults to `1e-20` (DreamerV3; Adam's usual `1e-7`
            would dominate the RMS of small gradients).
        agc: float > 0 or `None`. The adaptive clipping ratio: a tensor's
            gradient norm is limited to `agc` times its parameter norm.
            `None` disables the clipping. Defaults to `0.3`.
        agc_min_norm: float > 0. The parameter norm used in place of smaller
            ones (zero-initialised tensors) by the clipping. Defaults to
            `1e-3`.
        name: string. The optimizer's name, the prefix of its variables.
            Defaults to `"laprop"`.
        **kwargs: the `keras.optimizers.Optimizer` arguments
            (`weight_decay`, `clipnorm`, `global_clipnorm`, `use_ema`,
            `loss_scale_factor`, `gradient_accumulation_steps`, ...).

    Examples:

    ```python
    critic = multicritic.CriticNetwork(model_size="S")
    trainer = multicritic.CriticTrainer(
        critic,
        optimizer=multicritic.training.optimizers.official_optimizer(),
        grad_clip=None,  # DreamerV3 clips per tensor (AGC), not globally
    )

    # Or on its own, as any Keras optimizer.
    optimizer = multicritic.training.optimizers.LaProp(learning_rate=1e-4)
    optimizer.apply(grads, variables)
    ```

    Reference:
     - [Ziyin et al., 2020](https://arxiv.org/abs/2002.04839)
       ("LaProp: Separating Momentum and Adaptivity in Adam")
     - [Brock et al., 2021](https://arxiv.org/abs/2102.06171)
       (adaptive gradient clipping)
     - [Hafner et al., 2024](https://github.com/danijar/dreamerv3)
       (DreamerV3 code, commit e3f02248693a79dc8b0ebd62c93683888ddaccfe)
    """

    def __init__(
        self,
        learning_rate=4e-5,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-20,
        agc=0.3,
        agc_min_norm=1e-3,
        name="laprop",
        **kwargs,
    ):
        learning_rate = _learning_rate(learning_rate)
        beta_1 = _beta("beta_1", beta_1)
        beta_2 = _beta("beta_2", beta_2)
        epsilon = number("epsilon", epsilon, low=0.0, low_open=True)
        agc = number("agc", agc, low=0.0, low_open=True, allow_none=True)
        agc_min_norm = number("agc_min_norm", agc_min_norm, low=0.0, low_open=True)
        for clip in ("clipnorm", "clipvalue", "global_clipnorm"):
            number(clip, kwargs.get(clip), low=0.0, low_open=True, allow_none=True)
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.agc = agc
        self.agc_min_norm = agc_min_norm

    def build(self, var_list):
        """Creates the slots: `velocity` (`nu`) and `momentum` (`mu`) per variable, zeros."""
        if self.built:
            return
        super().build(var_list)
        self.velocity_slots, self.momentum_slots = self.add_optimizer_variables(var_list, ["velocity", "momentum"])

    def update_step(self, gradient, variable, learning_rate):
        """One update of `variable` (and its slots) from `gradient`."""
        self._update_all([gradient], [variable], learning_rate)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # With multi-tensor kernels (PyTorch), every tensor at once: a few kernels in place of a dozen ops per
        # tensor. Elsewhere Keras's loop over `update_step` (TensorFlow's distribution strategies hook into it).
        variables = list(trainable_variables)
        if backend_lib.current().has_list_kernels and len({v.dtype for v in variables}) == 1:
            self._update_all(list(grads), variables, learning_rate)
        else:
            super()._backend_update_step(grads, trainable_variables, learning_rate)

    def _update_all(self, grads, variables, learning_rate):
        """The update of `variables` (one dtype) and their slots from `grads`, through the backend's list ops."""
        lists = backend_lib.current()
        dtype = variables[0].dtype
        lr = ops.cast(learning_rate, dtype)
        t = ops.cast(self.iterations + 1, dtype)
        grads = [ops.cast(g, dtype) for g in grads]
        slots = [self._get_variable_index(v) for v in variables]
        nus = [self.velocity_slots[i] for i in slots]
        mus = [self.momentum_slots[i] for i in slots]
        if self.agc is not None:
            upper = self.agc * ops.maximum(self.agc_min_norm, lists.norms(variables))
            grads = lists.multiply(grads, 1.0 / ops.maximum(1.0, lists.norms(grads) / upper))
        new_nus = lists.blended(nus, lists.squares(grads), self.beta_2)
        u = lists.rms_normalize(grads, new_nus, 1.0 - ops.power(ops.cast(self.beta_2, dtype), t), self.epsilon)
        new_mus = lists.blended(mus, u, self.beta_1)
        step = -lr / (1.0 - ops.power(ops.cast(self.beta_1, dtype), t))
        for var, nu, mu, new_var, new_nu, new_mu in zip(
            variables, nus, mus, lists.add_scaled(variables, new_mus, step), new_nus, new_mus
        ):
            self.assign(nu, new_nu)
            self.assign(mu, new_mu)
            self.assign(var, new_var)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "agc": self.agc,
                "agc_min_norm": self.agc_min_norm,
            }
        )
        return config


def official_optimizer(learning_rate=4e-5, warmup_steps=1000) -> LaProp:
    """The official DreamerV3 (2024) critic optimizer.

    `LaProp(LinearWarmup(learning_rate, warmup_steps))` with AGC 0.3
    (minimum parameter norm 1e-3), `epsilon=1e-20`, `beta_1=0.9`,
    `beta_2=0.999` and no weight decay: `dreamerv3/agent.py` `_make_opt` at
    commit e3f02248693a79dc8b0ebd62c93683888ddaccfe. Pair it with
    `CriticTrainer(..., grad_clip=None)`: the official code clips per tensor
    only.

    Args:
        learning_rate: float >= 0. The learning rate after the warmup.
            Defaults to `4e-5`.
        warmup_steps: int >= 0. Updates of the linear warmup from 0 (the
            first update is a no-op on the parameters). Defaults to `1000`.
    """
    return LaProp(
        learning_rate=LinearWarmup(learning_rate, warmup_steps),
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-20,
        agc=0.3,
        agc_min_norm=1e-3,
    )
