"""The DreamerV3 critic and its slow (EMA) copy."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from multicritic.bins import check_bin_args
from multicritic.layers.mlp import MLP
from multicritic.losses import EMA_REGULARIZERS
from multicritic.layers.reward_predictor import RewardPredictorLayer
from multicritic.sizes import get_model_dims
from multicritic.validation import integer, number
from multicritic import weights_file



def _shape(x) -> Tuple:
    return tuple(None if d is None else int(d) for d in x)


def check_critic_options(ema_decay, ema_update_period, ema_regularizer_weight, ema_regularizer):
    """Raises a `ValueError` for slow-critic options outside their range."""
    number("ema_decay", ema_decay, low=0.0, high=1.0)
    integer("ema_update_period", ema_update_period)
    number("ema_regularizer_weight", ema_regularizer_weight, low=0.0)
    if not isinstance(ema_regularizer, str) or ema_regularizer not in EMA_REGULARIZERS:
        raise ValueError(f"ema_regularizer: got {ema_regularizer!r}, expected one of {list(EMA_REGULARIZERS)}.")


def _real_tensor(name, x, dtype):
    """`x` as a backend tensor; integer and boolean inputs become `dtype`, anything else non-real is refused."""
    if isinstance(x, keras.KerasTensor):
        return x
    if x is None or isinstance(x, (str, bytes)):
        raise ValueError(f"{name}: got {x!r}, expected a real-valued array.")
    if not ops.is_tensor(x):
        try:
            x = np.asarray(x)
        except Exception as err:
            raise ValueError(f"{name}: got a {type(x).__name__} that is not an array ({err}).") from None
        if x.dtype.kind not in "fiub":
            raise ValueError(f"{name}: got an array of dtype {x.dtype}, expected real numbers.")
        if x.dtype.kind == "f" and x.dtype != np.float64:
            return ops.convert_to_tensor(x)
        return ops.convert_to_tensor(x.astype(dtype))
    kind = keras.backend.standardize_dtype(x.dtype)
    if "float" in kind:
        return x
    if kind.startswith(("int", "uint", "bool")):
        return ops.cast(x, dtype)
    raise ValueError(f"{name}: got a tensor of dtype {kind}, expected real numbers.")


@keras.saving.register_keras_serializable(package="multicritic")
class CriticNetwork(keras.Model):
    """The DreamerV3 critic: a distributional value network plus its EMA copy.

    The state `x = concat([h, flatten(z)])` goes through an `MLP` and a
    `RewardPredictorLayer` (255 buckets over symlog returns, zero-initialised
    head). A second, structurally identical network (`mlp_ema`,
    `return_layer_ema`) holds an exponential moving average of the weights;
    its variables are never trainable (`critic.trainable_variables` holds only
    the fast critic's weights, in the same order as
    `critic.non_trainable_variables` holds their EMA copies). The EMA copy is
    initialised from the fast weights when the critic is built; call
    `update_ema()` after every optimizer step (`CriticTrainer` does).

    The sub-layer names are those of RLlib's TensorFlow critic so weights map
    one to one (see `multicritic.rllib`).

    Args:
        model_size: DreamerV3 size, `"nano"` ... `"XL"` (see
            `get_model_dims`), or `None` with explicit dimensions below.
        num_buckets: buckets of the value distribution (>= 2).
        lower_bound: symlog-space lower end of the support.
        upper_bound: symlog-space upper end of the support.
        ema_decay: `d` in `ema <- d * ema + (1 - d) * fast`, in [0, 1].
        bin_scheme: `"uniform_symlog"` (2023, the reference) or `"symexp"`
            (2024).
        num_dense_layers, dense_hidden_units: MLP overrides.
        gru_units, num_z_categoricals, num_z_classes: input-size overrides;
            with `model_size=None` any left out are taken from the first call.
        ema_update_period: update the EMA every this many optimizer steps.
        ema_regularizer_weight: weight of the slow-critic regulariser in the
            loss (1.0 in the reference).
        ema_regularizer: `"two_hot_mean"` (cross-entropy to the two-hot of
            the EMA critic's expected value, the reference) or
            `"distribution"` (cross-entropy to the EMA critic's bucket
            distribution).
        ema_targets: compute lambda-return targets from the EMA critic's
            values instead of the fast critic's.
        **kwargs: passed to `keras.Model` (`name`, `dtype`, ...).

    Call arguments:
        h: deterministic recurrent state `[B, gru_units]`.
        z: stochastic categorical state `[B, num_z_categoricals, num_z_classes]`.
        use_ema: Python bool; run the EMA copy instead of the fast critic.

    Returns:
        `(value_symlog, logits)`: expected value in symlog space `[B]`
        (apply `inverse_symlog` for real returns) and float32 logits
        `[B, num_buckets]`.

    Example:
        >>> critic = CriticNetwork(model_size="XS")
        >>> value, logits = critic(np.zeros((8, 256), "float32"),
        ...                        np.zeros((8, 32, 32), "float32"))
        >>> value.shape, logits.shape
        ((8,), (8, 255))

    Reference:
        Hafner et al., "Mastering Diverse Domains through World Models",
        arXiv 2301.04104; RLlib's `dreamerv3/tf/models/critic_network.py`.
    """

    def __init__(
        self,
        *,
        model_size: Optional[str] = "XS",
        num_buckets: int = 255,
        lower_bound: float = -20.0,
        upper_bound: float = 20.0,
        ema_decay: float = 0.98,
        bin_scheme: str = "uniform_symlog",
        num_dense_layers: Optional[int] = None,
        dense_hidden_units: Optional[int] = None,
        gru_units: Optional[int] = None,
        num_z_categoricals: Optional[int] = None,
        num_z_classes: Optional[int] = None,
        ema_update_period: int = 1,
        ema_regularizer_weight: float = 1.0,
        ema_regularizer: str = "two_hot_mean",
        ema_targets: bool = False,
        **kwargs,
    ):
        dims = get_model_dims(
            model_size,
            gru_units=gru_units,
            dense_hidden_units=dense_hidden_units,
            num_dense_layers=num_dense_layers,
            num_z_categoricals=num_z_categoricals,
            num_z_classes=num_z_classes,
        )
        check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme)
        check_critic_options(ema_decay, ema_update_period, ema_regularizer_weight, ema_regularizer)
        kwargs.setdefault("name", "critic")
        super().__init__(**kwargs)
        self.model_size = model_size
        self.num_buckets = int(num_buckets)
        self.lower_bound = float(lower_bound)
        self.upper_bound = float(upper_bound)
        self.ema_decay = float(ema_decay)
        self.bin_scheme = bin_scheme
        self.num_dense_layers = dims["num_dense_layers"]
        self.dense_hidden_units = dims["dense_hidden_units"]
        self.gru_units = dims["gru_units"]
        self.num_z_categoricals = dims["num_z_categoricals"]
        self.num_z_classes = dims["num_z_classes"]
        self.ema_update_period = int(ema_update_period)
        self.ema_regularizer_weight = float(ema_regularizer_weight)
        self.ema_regularizer = ema_regularizer
        self.ema_targets = bool(ema_targets)

        def mlp(name):
            return MLP(
                model_size=model_size,
                num_dense_layers=self.num_dense_layers,
                dense_hidden_units=self.dense_hidden_units,
                dtype=self.dtype_policy,
                name=name,
            )

        def head(name):
            return RewardPredictorLayer(
                num_buckets=num_buckets,
                lower_bound=lower_bound,
                upper_bound=upper_bound,
                bin_scheme=bin_scheme,
                dtype="float32",
                name=name,
            )

        self.mlp = mlp("mlp")
        self.return_layer = head("return_layer")
        self.mlp_ema = mlp("mlp_ema")
        self.return_layer_ema = head("return_layer_ema")
        if None not in (self.gru_units, self.num_z_categoricals, self.num_z_classes):
            self.build(
                (None, self.gru_units),
                (None, self.num_z_categoricals, self.num_z_classes),
            )

    # Keras 3 only passes `trainable` down to variables that exist when it is
    # set, and `critic.trainable = True` would reach the EMA copy: keep it
    # frozen whatever the critic's own flag.
    @property
    def trainable(self):
        return self._trainable

    @trainable.setter
    def trainable(self, value):
        keras.layers.Layer.trainable.fset(self, value)
        for layer in (getattr(self, "mlp_ema", None), getattr(self, "return_layer_ema", None)):
            if layer is not None:
                layer.trainable = False

    def _check_inputs(self, h_shape, z_shape):
        h_shape, z_shape = _shape(h_shape), _shape(z_shape)
        want_h = (None, self.gru_units)
        want_z = (None, self.num_z_categoricals, self.num_z_classes)

        def fmt(shape):
            return "[" + ", ".join("B" if d is None else str(d) for d in shape) + "]"

        if len(h_shape) != 2 or (self.gru_units is not None and h_shape[1] != self.gru_units):
            raise ValueError(f"h: got shape {list(h_shape)}, expected {fmt(want_h)} (gru_units={self.gru_units}).")
        if len(z_shape) != 3 or any(w is not None and d != w for d, w in zip(z_shape[1:], want_z[1:])):
            raise ValueError(
                f"z: got shape {list(z_shape)}, expected {fmt(want_z)} "
                f"(num_z_categoricals={self.num_z_categoricals}, num_z_classes={self.num_z_classes})."
            )
        if h_shape[0] is not None and z_shape[0] is not None and h_shape[0] != z_shape[0]:
            raise ValueError(
                f"h, z: batch sizes differ: h has shape {list(h_shape)}, z has shape {list(z_shape)}; "
                "expected the same leading dimension B."
            )

    def build(self, h_shape, z_shape):
        self._check_inputs(h_shape, z_shape)
        self.gru_units = int(h_shape[-1])
        self.num_z_categoricals, self.num_z_classes = int(z_shape[-2]), int(z_shape[-1])
        in_shape = (None, self.gru_units + self.num_z_categoricals * self.num_z_classes)
        hidden_shape = (None, self.dense_hidden_units)
        for mlp, head in ((self.mlp, self.return_layer), (self.mlp_ema, self.return_layer_ema)):
            mlp.build(in_shape)
            head.build(hidden_shape)
        for layer in (self.mlp_ema, self.return_layer_ema):
            layer.trainable = False
        self.built = True
        self.init_ema()

    def __call__(self, h, z, *args, **kwargs):
        # Before Keras's own checks, which refuse lists and name no argument.
        dtype = self.compute_dtype
        return super().__call__(_real_tensor("h", h, dtype), _real_tensor("z", z, dtype), *args, **kwargs)

    def call(self, h, z, use_ema=False):
        h = _real_tensor("h", h, self.compute_dtype)
        z = _real_tensor("z", z, self.compute_dtype)
        self._check_inputs(h.shape, z.shape)
        z = ops.reshape(ops.cast(z, h.dtype), (-1, self.num_z_categoricals * self.num_z_classes))
        x = ops.concatenate([h, z], axis=-1)
        mlp, head = (self.mlp_ema, self.return_layer_ema) if use_ema else (self.mlp, self.return_layer)
        # The MLP shares this layer's dtype policy (and autocast scope), so its
        # `call` is what its `__call__` would run, minus Keras's per-call
        # bookkeeping (most of a small step's time on PyTorch). The float32
        # head needs its own autocast scope only under a mixed policy.
        x = mlp.call(x)
        return head.call(x) if self._plain_dtypes else head(x)

    @property
    def _plain_dtypes(self) -> bool:
        return self.compute_dtype == self.variable_dtype == "float32"

    def apply_network(self, h, z, use_ema: bool = False):
        """`self(h, z, use_ema)` for compiled steps: skips Keras's per-call
        bookkeeping where the dtype policy makes it a no-op (float32 tensors
        in, float32 policy)."""
        # Dtypes compared as Keras names: a torch.dtype never equals "float32".
        dtype = keras.backend.standardize_dtype
        if self._plain_dtypes and dtype(h.dtype) == dtype(z.dtype) == self.compute_dtype:
            return self.call(h, z, use_ema=use_ema)
        return self(h, z, use_ema=use_ema)

    def compute_output_shape(self, h_shape, z_shape, use_ema=False):
        return (h_shape[0],), (h_shape[0], self.num_buckets)

    @property
    def fast_weights(self) -> List:
        """The fast critic's variables, in the order of `ema_weights`."""
        return self.mlp.weights + self.return_layer.weights

    @property
    def ema_weights(self) -> List:
        """The EMA copy's variables, pairwise matching `fast_weights`."""
        return self.mlp_ema.weights + self.return_layer_ema.weights

    def compute_ema(self, fast_values: Sequence, ema_values: Sequence, decay: Optional[float] = None) -> List:
        """Pure EMA step: returns `[d * e + (1 - d) * f for f, e in pairs]`.

        Takes and returns plain tensors, so it can run inside `jax.jit` on
        the values of a stateless step (`fast_values` in the order of
        `trainable_variables`, `ema_values` in that of
        `non_trainable_variables`). Not differentiable by design: call it
        outside the loss.
        """
        d = self.ema_decay if decay is None else decay
        return [d * e + (1.0 - d) * f for f, e in zip(fast_values, ema_values)]

    def init_ema(self) -> None:
        """Copies every fast variable (LayerNorm scale and centre included) into the EMA copy."""
        if not self.built:
            raise ValueError("init_ema: the critic has no variables yet; call it once or build it first.")
        for fast, ema in zip(self.fast_weights, self.ema_weights):
            # A copy: the two must never share storage (JAX donates buffers).
            ema.assign(ops.copy(fast.value))

    def update_ema(self, decay: Optional[float] = None) -> None:
        """`ema <- d * ema + (1 - d) * fast` for every variable, through `Variable.assign`."""
        if not self.built:
            raise ValueError("update_ema: the critic has no variables yet; call it once or build it first.")
        if decay is not None and not ops.is_tensor(decay):
            decay = number("decay", decay, low=0.0, high=1.0)
        fast, ema = self.fast_weights, self.ema_weights
        fast_values = [ops.stop_gradient(v.value) for v in fast]
        for var, value in zip(ema, self.compute_ema(fast_values, [v.value for v in ema], decay)):
            var.assign(value)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        """Keras's `save_weights` (`.weights.h5`), plus this critic's config and a SHA-256 seal.

        The file is written atomically; Keras and h5py read it as any
        `.weights.h5`. `load_weights` refuses it when it was corrupted,
        or into a critic of another configuration.
        """
        path = os.fspath(filepath)
        if not overwrite and os.path.exists(path):
            raise ValueError(f"filepath: {path!r} exists and overwrite=False.")
        return weights_file.save(self, path, lambda tmp: super(CriticNetwork, self).save_weights(tmp, **kwargs))

    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """Keras's `load_weights`, all or nothing.

        Everything is checked before the first weight changes: the file's
        seal (files this critic wrote), its saved config against this
        critic's (bins, sizes, options: a `ValueError` lists what differs),
        the set of arrays (none missing, none extra), every shape and dtype,
        and that every value is finite. A `.weights.h5` written by plain
        Keras (no config, no seal) gets every check but those two.
        """
        if not self.built:
            raise ValueError("load_weights: the critic has no variables yet; call it once or give its input sizes first.")
        if skip_mismatch:
            raise ValueError("skip_mismatch: got True, expected False (a critic loads whole or not at all).")
        saved = [np.array(ops.convert_to_numpy(v.value)) for v in self.weights]
        try:
            weights_file.load(
                self,
                filepath,
                lambda tmp: super(CriticNetwork, self).save_weights(tmp),
                lambda tmp: super(CriticNetwork, self).load_weights(tmp, **kwargs),
            )
        except ValueError as err:  # raised by the checks, before any assignment
            raise ValueError(
                f"load_weights: could not load {str(filepath)!r} into this critic; its weights are unchanged. {err}"
            ) from err
        except Exception as err:  # a failure inside Keras after the checks: put everything back
            for var, value in zip(self.weights, saved):
                var.assign(value)
            raise ValueError(
                f"load_weights: could not load {str(filepath)!r} into this critic; its weights are unchanged. "
                f"Cause: {err}"
            ) from err

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "model_size": self.model_size,
                "num_buckets": self.num_buckets,
                "lower_bound": self.lower_bound,
                "upper_bound": self.upper_bound,
                "ema_decay": self.ema_decay,
                "bin_scheme": self.bin_scheme,
                "num_dense_layers": self.num_dense_layers,
                "dense_hidden_units": self.dense_hidden_units,
                "gru_units": self.gru_units,
                "num_z_categoricals": self.num_z_categoricals,
                "num_z_classes": self.num_z_classes,
                "ema_update_period": self.ema_update_period,
                "ema_regularizer_weight": self.ema_regularizer_weight,
                "ema_regularizer": self.ema_regularizer,
                "ema_targets": self.ema_targets,
            }
        )
        return config
