"""The DreamerV3 critic and its slow (EMA) copy."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from multicritic import heads, trunks
from multicritic.backend import contract as backend_lib
from multicritic.files.methods import FileMethods
from multicritic.math import ema as ema_lib
from multicritic.model import inputs as inputs_lib
from multicritic.model import members
from multicritic.model.views import ModuleViews
from multicritic.model.options import (  # noqa: F401  (the critic's option names, also read from here)
    AGGREGATIONS,
    FEATURES,
    INPUT_LAYOUTS,
    TRAINING_OPTIONS,
    call_inputs,
    check_ensemble_fits,
    check_ensemble_options,
    check_options,
    latent_size,
    upgrade_config,
)
from multicritic.training.fit import KerasTraining
from multicritic.layers import part_hooks
from multicritic.layers.dispatch import call_layer
from multicritic.validation import FixedOptions, cast_to, real_tensor, static_shape


# What `on_latent` returns: both outputs, or one of them.
_OUTPUTS = ("both", "logits", "value")


class _OnLatent:
    """`critic.on_latent` with its options bound: a function of the latent alone (what a replay traces)."""

    def __init__(self, critic, use_ema, outputs):
        self.critic, self.use_ema, self.outputs = critic, use_ema, outputs

    def __call__(self, latent):
        return self.critic._on_latent(latent, self.use_ema, self.outputs)


@keras.saving.register_keras_serializable(package="multicritic")
class CriticNetwork(FixedOptions, FileMethods, ModuleViews, KerasTraining, keras.Model):
    """The DreamerV3 critic: a distributional value network plus its EMA copy, optionally an ensemble.

    The state `x = concat([h, flatten(z)])` (or z first: `input_layout`; or, for a model-free agent, one
    flat feature vector `x`: `input_size`) goes through a trunk
    (`trunk="mlp"`: an `MLP`; see `multicritic.trunks`) and a value head
    (`head="two_hot"`: a `TwoHotHead` with 255 buckets over symlog returns,
    zero-initialised; see `multicritic.heads` for the others). A second, structurally identical network (`mlp_ema`,
    `return_layer_ema`) holds an exponential moving average of the weights;
    its variables are never trainable (`critic.trainable_variables` holds only
    the fast critic's weights, in the same order as
    `critic.non_trainable_variables` holds their EMA copies). The EMA copy is
    initialised from the fast weights when the critic is built; `update_ema()`
    moves it (`CriticTrainer` calls it after optimizer steps).

    With `ensemble_size=K > 1` the critic holds K independently initialised
    members (each with its own EMA copy) as stacked weights, computed with
    one batched matmul per layer; outputs get a leading member axis and
    `aggregate` reduces it. `ensemble_size=1` is the single critic, with the
    reference's weight layout.

    The model holds the model: how it is trained (update period, regulariser,
    targets, optimizer) is `CriticTrainer`'s. The sub-layer names are those of
    RLlib's TensorFlow critic so weights map one to one (see
    `multicritic.interop.rllib`). Every sub-layer's own `call` runs, so Keras's
    `quantize`, LoRA and dtype policies apply.

    As a Keras model it also trains with `compile()` / `fit()` (the
    reference's step, EMA update inside; see `KerasTraining`) and exports
    for serving with `export()`.

    Args:
        model_size: DreamerV3 size, `"nano"` ... `"XL"` (see
            `get_model_dims`), or `None` with explicit dimensions below.
        num_buckets: buckets of the value distribution (>= 2).
        lower_bound: symlog-space lower end of the support.
        upper_bound: symlog-space upper end of the support.
        ema_decay: `d` in `ema <- d * ema + (1 - d) * fast`, in [0, 1].
        bin_scheme: `"uniform_symlog"` (2023, the reference) or `"symexp"`
            (2024).
        num_dense_layers: MLP override: number of hidden layers.
        dense_hidden_units: MLP override: units per hidden layer.
        gru_units: input-size override: width of `h`; with `model_size=None`
            any input size left out is taken from the first call.
        num_z_categoricals: input-size override: categoricals of `z`.
        num_z_classes: input-size override: classes per categorical of `z`.
        head: the value head: a registered name (`multicritic.heads.HEADS`:
            `"two_hot"`, the reference; `"hl_gauss"`, `"mse"`,
            `"quantile"`) or a configured head (`HLGaussHead(sigma=0.5)`),
            whose own options the critic keeps. The support above is the
            critic's: a head given with another support is refused.
        hl_gauss_sigma: the 0.1 spelling of `head=HLGaussHead(sigma=...)`,
            with `head="hl_gauss"`.
        trunk: the network between the state and the head: a registered name
            (`multicritic.trunks.TRUNKS`: `"mlp"`, the reference;
            `"residual"`) or a configured trunk. Its sizes and norm are the
            critic's options above.
        ensemble_size: number of members `K` (1: a single critic).
        aggregation: how `aggregate` reduces the members: `"mean"`, `"min"`,
            `"min_of_random"` (the minimum over `aggregation_subset` members
            drawn at random, as REDQ and TD-MPC2) or `"members"` (no
            reduction: each member keeps its own value).
        aggregation_subset: members drawn by `"min_of_random"` (2).
        norm: the MLP's normalisation: `"layer"` (the reference) or
            `"rms"` (the official 2024 code); see `MLP`.
        norm_epsilon: the normalisation's epsilon (1e-3 for `"layer"`, the
            reference; 1e-4 in the official 2024 code).
        use_bias: whether the MLP's Dense layers have a bias (the official
            2024 code's do).
        kernel_initializer: of the MLP's Dense kernels (glorot-uniform, the
            reference; the official 2024 code's `trunc_normal_in` is
            `VarianceScaling(1.0, "fan_in", "truncated_normal")`).
        input_layout: the order of the MLP's input: `"h_z"`
            (`concat([h, flatten(z)])`, RLlib, TorchRL and the official
            code) or `"z_h"` (sheeprl, NM512); see `multicritic.interop`.
            Or `"features"`: one flat input `x` (a model-free agent's
            observation, any backbone's features), no `(h, z)`. `None`
            (default): `"features"` when `input_size` is given, else `"h_z"`.
        input_size: a features critic's input width `D` (its call takes
            `x [..., D]`; `gru_units` and the `z` sizes are not given then);
            with `input_layout="features"` and `None`, taken from the first
            call. `model_size` still picks the trunk's sizes.
        **kwargs: passed to `keras.Model` (`name`, `dtype`, ...).

    Call arguments:
        h: deterministic recurrent state `[B, gru_units]` (or `[..., gru_units]`:
            any leading dims, kept in the outputs).
        z: stochastic categorical state `[B, num_z_categoricals, num_z_classes]`.
            `critic.on_latent(latent)` takes the two as one flat latent.
        x: a features critic's one input `[..., input_size]` (in place of
            `h` and `z`: `critic(x)`, `critic(x, use_ema=True)`).
        use_ema: Python bool; run the EMA copy instead of the fast critic.

        The inputs may be numpy arrays, the backend's tensors or another framework's arrays (JAX, PyTorch,
        TensorFlow, anything with `__dlpack__`: imported by DLPack, the values numpy's give; see
        `multicritic.backend.foreign`), in `critic(...)`, `stateless_call` and `on_latent` alike.

    Returns:
        The backend's own tensors. `(value_symlog, logits)`: expected value in symlog space `[B]`
        (apply `inverse_symlog` for real returns) and float32 logits
        `[B, units]` (the head's width: `num_buckets` for the bucket heads);
        with an ensemble `[K, B]` and `[K, B, units]`.

    Examples:
        >>> critic = CriticNetwork(model_size="XS")
        >>> value, logits = critic(np.zeros((8, 256), "float32"),
        ...                        np.zeros((8, 32, 32), "float32"))
        >>> value.shape, logits.shape
        ((8,), (8, 255))
        >>> ensemble = CriticNetwork(model_size="XS", ensemble_size=5, aggregation="min_of_random")
        >>> values, _ = ensemble(np.zeros((8, 256), "float32"), np.zeros((8, 32, 32), "float32"))
        >>> values.shape, ensemble.aggregate(values, seed=0).shape
        ((5, 8), (8,))
        >>> features = CriticNetwork(input_size=17, model_size="S")  # a model-free agent's observations
        >>> value, logits = features(np.zeros((8, 17), "float32"))
        >>> value.shape
        (8,)

    Reference:
        Hafner et al., "Mastering Diverse Domains through World Models",
        arXiv 2301.04104; RLlib's `dreamerv3/tf/models/critic_network.py`;
        Chen et al., "Randomized Ensembled Double Q-Learning" (REDQ), ICLR 2021;
        Hansen et al., "TD-MPC2", ICLR 2024; Farebrother et al., "Stop
        Regressing", ICML 2024.
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
        head="two_hot",
        hl_gauss_sigma: Optional[float] = None,
        trunk="mlp",
        ensemble_size: int = 1,
        aggregation: str = "mean",
        aggregation_subset: int = 2,
        norm: str = "layer",
        norm_epsilon: float = 1e-3,
        use_bias: bool = False,
        kernel_initializer="glorot_uniform",
        input_layout: Optional[str] = None,
        input_size: Optional[int] = None,
        **kwargs,
    ):
        dims, (head_class, head_options), (trunk_class, trunk_options), kernel_initializer = check_options(
            kwargs,
            model_size=model_size,
            num_buckets=num_buckets,
            lower_bound=lower_bound,
            upper_bound=upper_bound,
            ema_decay=ema_decay,
            bin_scheme=bin_scheme,
            num_dense_layers=num_dense_layers,
            dense_hidden_units=dense_hidden_units,
            gru_units=gru_units,
            num_z_categoricals=num_z_categoricals,
            num_z_classes=num_z_classes,
            head=head,
            hl_gauss_sigma=hl_gauss_sigma,
            trunk=trunk,
            ensemble_size=ensemble_size,
            aggregation=aggregation,
            aggregation_subset=aggregation_subset,
            norm=norm,
            norm_epsilon=norm_epsilon,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            input_layout=input_layout,
            input_size=input_size,
        )
        kwargs.setdefault("name", "critic")
        backend_lib.current()  # imported now, not first inside a host's torch.compile (a graph break)
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
        self.ensemble_size = int(ensemble_size)
        self.aggregation = aggregation
        self.aggregation_subset = int(aggregation_subset)
        self.norm = norm
        self.norm_epsilon = float(norm_epsilon)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.input_layout = dims["input_layout"]
        self.input_size = dims["input_size"]
        members = None if self.ensemble_size == 1 else self.ensemble_size

        def mlp(name):
            return trunk_class(
                **trunk_options,
                model_size=model_size,
                num_dense_layers=self.num_dense_layers,
                dense_hidden_units=self.dense_hidden_units,
                members=members,
                norm=norm,
                norm_epsilon=norm_epsilon,
                use_bias=use_bias,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name=name,
            )

        def value_head(name):
            return head_class(
                **head_options,
                num_buckets=num_buckets,
                lower_bound=lower_bound,
                upper_bound=upper_bound,
                bin_scheme=bin_scheme,
                members=members,
                dtype="float32",
                name=name,
            )

        self.mlp = mlp("mlp")
        self.return_layer = value_head("return_layer")
        self.mlp_ema = mlp("mlp_ema")
        self.return_layer_ema = value_head("return_layer_ema")
        # The parts' registered names; the parts themselves, with their options, are `return_layer` and `mlp`.
        self.head = heads.HEADS.name_of(self.return_layer)
        self.trunk = trunks.TRUNKS.name_of(self.mlp)
        shapes = self.input_row_shapes()
        if not any(None in shape for shape in shapes.values()):
            self.build(*[(None,) + shape for shape in shapes.values()])

    # One critic: no reward streams (`multicritic.protocols.CriticLike`).
    stream_names = None

    def stream_critics(self) -> Dict[Optional[str], "CriticNetwork"]:
        """`{None: self}`: the one stream a single critic is (`CriticLike`). (A method: Keras's saving walks
        properties, and this one holds the critic itself.)"""
        return {None: self}

    def fixed_option_hint(self, name):
        if name == "ema_decay":
            return "pass decay= to update_ema for another decay at one update"
        return "build a new critic with it: CriticNetwork.from_config({**critic.get_config(), ...})"

    @classmethod
    def from_config(cls, config):
        return super().from_config(upgrade_config(config)[0])

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

    def input_row_shapes(self) -> Dict[str, Tuple[Optional[int], ...]]:
        """The critic's inputs by name, in call order, each with one row's shape (see
        `multicritic.model.inputs.row_shapes`): `{"h": ..., "z": ...}`, or a features critic's `{"x": ...}`."""
        return inputs_lib.row_shapes(self)

    def check_inputs(self, h_shape, z_shape=None):
        """A `ValueError` naming the input unless shapes `h [B, gru_units]` and `z [B, cats, classes]` (a
        features critic: one shape, `x [B, input_size]`) are what the network takes."""
        inputs_lib.check(self, h_shape, z_shape)

    def build(self, h_shape, z_shape=None):
        self.check_inputs(h_shape, z_shape)
        if self.built:  # (built when its sizes were given: a second build only checks the shapes)
            return
        if self.input_layout == FEATURES:
            sizes = {"input_size": h_shape[-1]}
        else:
            sizes = {"gru_units": h_shape[-1], "num_z_categoricals": z_shape[-2], "num_z_classes": z_shape[-1]}
        check_ensemble_fits(
            self.ensemble_size,
            latent_size=latent_size(dict(sizes, input_layout=self.input_layout)),
            num_dense_layers=self.num_dense_layers,
            dense_hidden_units=self.dense_hidden_units,
            output_units=self.return_layer.units,
            use_bias=self.use_bias,
            norm=self.norm,
        )
        # The input sizes, from the first call where they were left out (past the options' lock).
        for name, size in sizes.items():
            object.__setattr__(self, name, int(size))
        in_shape = (None, self.latent_size)
        for mlp, head in ((self.mlp, self.return_layer), (self.mlp_ema, self.return_layer_ema)):
            mlp.build(in_shape)
            head.build(mlp.compute_output_shape(in_shape))
        for layer in (self.mlp_ema, self.return_layer_ema):
            layer.trainable = False
        self.built = True
        self.init_ema()

    def __call__(self, h, z=None, *args, **kwargs):
        inputs = call_inputs(self.input_layout, h, z)
        if not args and set(kwargs) <= {"use_ema"} and isinstance(kwargs.get("use_ema", False), (bool, np.bool_)):
            use_ema = bool(kwargs.get("use_ema", False))  # numpy's bool too: the same pass as Python's
            return backend_lib.current().replay(
                self,
                self._variables,
                ("call", use_ema),
                self._call_ema if use_ema else self._call_fast,
                inputs,
            )
        return self._keras_call(inputs, *args, **kwargs)

    def _variables(self):
        return self.weights

    def _call_fast(self, *inputs):
        return self._keras_call(inputs)

    def _call_ema(self, *inputs):
        return self._keras_call(inputs, use_ema=True)

    def _call_form(self) -> str:
        if self.input_layout == FEATURES:
            return "critic(x) or critic(x, use_ema=True or False)"
        return "critic(h, z) or critic(h, z, use_ema=True or False)"

    def _keras_call(self, inputs, *args, **kwargs):
        # Before Keras's own checks, which refuse lists and name no argument.
        unknown = sorted(set(kwargs) - {"use_ema", "training", "mask"})
        if unknown:
            raise ValueError(f"{unknown[0]}: not an argument of the critic's call, expected {self._call_form()}.")
        if not isinstance(kwargs.get("use_ema", False), (bool, np.bool_)):
            raise ValueError(f"use_ema: got {kwargs['use_ema']!r}, expected True or False.")
        if args and self.input_layout == FEATURES:
            # (A features critic's second positional argument is `call`'s `z`.)
            raise ValueError(f"args: got {len(args)} more positional argument(s), expected {self._call_form()}.")
        inputs = self._real_inputs(inputs)
        lead = inputs_lib.leading_dims(self, inputs)
        if lead is None:
            return super().__call__(*inputs, *args, **kwargs)
        # Leading dims ([T, B, ...]): one flat batch through the network, then the host's shape back.
        return inputs_lib.unflatten(self, super().__call__(*inputs_lib.flatten(self, inputs), *args, **kwargs), lead)

    def _real_inputs(self, inputs):
        return tuple(real_tensor(name, x, self.compute_dtype) for name, x in zip(self.input_row_shapes(), inputs))

    def stateless_call(self, trainable_variables, non_trainable_variables, h, z=None, *args, **kwargs):
        """Keras's `stateless_call` (the pass over the given variables' values; nothing assigned), taking what
        `critic(h, z)` takes: `h [..., gru_units]` and `z [..., num_z_categoricals, num_z_classes]` (a features
        critic: `x [..., input_size]` alone) with any leading dims (`[T, B, ...]`), kept in the outputs as
        `critic(h, z)` keeps them."""
        inputs = self._real_inputs(call_inputs(self.input_layout, h, z))
        if args and self.input_layout == FEATURES:
            raise ValueError(f"args: got {len(args)} more positional argument(s), expected {self._call_form()}.")
        lead = inputs_lib.leading_dims(self, inputs)
        if lead is None:
            return super().stateless_call(trainable_variables, non_trainable_variables, *inputs, *args, **kwargs)
        # Keras's `stateless_call` runs `call`, which takes one batch axis: flattened as `critic(h, z)` flattens.
        outputs, *state = super().stateless_call(
            trainable_variables, non_trainable_variables, *inputs_lib.flatten(self, inputs), *args, **kwargs
        )
        return (inputs_lib.unflatten(self, outputs, lead), *state)

    @property
    def latent_size(self) -> Optional[int]:
        """The width of one flat latent, `gru_units + num_z_categoricals * num_z_classes` (a features critic:
        `input_size`); None before the sizes are known."""
        sizes = ("input_layout", "input_size", "gru_units", "num_z_categoricals", "num_z_classes")
        return latent_size({name: getattr(self, name) for name in sizes}) or None

    def on_latent(self, latent, use_ema=False, outputs="both"):
        """The critic on one flat latent `[..., latent_size]`, as sheeprl, NM512, TorchRL and the official code
        pass it: `h` then `flatten(z)` (`input_layout="h_z"`) or `flatten(z)` then `h` (`"z_h"`); a features
        critic's latent is its `x`.

        Any leading dims (`[T, B, D]`, `[D]`); returns `(value_symlog [...], logits [..., num_buckets])`
        (an ensemble: `[K, ...]`, `[K, ..., num_buckets]`), or with `outputs="logits"` / `"value"` that one
        alone (the other is not computed). On PyTorch it runs on the device of `latent`, eagerly from a graph
        traced once per input signature (see `multicritic.backend.torch_replay`).
        """
        if outputs not in _OUTPUTS:
            raise ValueError(f"outputs: got {outputs!r}, expected one of {list(_OUTPUTS)}.")
        if not isinstance(use_ema, (bool, np.bool_)):
            raise ValueError(f"use_ema: got {use_ema!r}, expected True or False.")
        return backend_lib.current().replay(
            self,
            self._variables,
            ("on_latent", bool(use_ema), outputs),
            _OnLatent(self, bool(use_ema), outputs),
            (latent,),
        )

    def _on_latent(self, latent, use_ema, outputs):
        if not self.built:
            raise ValueError("on_latent: the critic has no variables yet; call it once or give its input sizes first.")
        latent = real_tensor("latent", latent, self.compute_dtype)
        inputs_lib.check_latent(self, static_shape(latent.shape))
        with backend_lib.current().device_scope(latent):
            x = ops.cast(ops.reshape(latent, (-1, self.latent_size)), self.compute_dtype)
            value, logits = inputs_lib.unflatten(self, self._forward(x, use_ema), ops.shape(latent)[:-1])
        return {"both": (value, logits), "logits": logits, "value": value}[outputs]

    def decode(self, logits):
        """The symlog-space value `[...]` of the head's output `[..., units]` (`expected_value` for the
        bucket heads), e.g. of a target critic's logits."""
        return self.return_layer.decode(logits)

    def call(self, h, z=None, use_ema=False, training=None):
        if self.input_layout == FEATURES:
            (x,) = call_inputs(self.input_layout, h, z)
            x = cast_to(x, self.compute_dtype)
            self.check_inputs(x.shape)
            return self._forward(x, use_ema, training)
        h, z = call_inputs(self.input_layout, h, z)
        h = cast_to(h, self.compute_dtype)
        self.check_inputs(h.shape, z.shape)
        z = ops.reshape(cast_to(z, self.compute_dtype), (-1, self.num_z_categoricals * self.num_z_classes))
        # The parts in the latent's order, not concatenated: the first Dense takes each by its rows.
        return self._forward([h, z] if self.input_layout == "h_z" else [z, h], use_ema, training)

    def _forward(self, x, use_ema, training=None):
        mlp, head = (self.mlp_ema, self.return_layer_ema) if use_ema else (self.mlp, self.return_layer)
        # `training` reaches the parts that normalise by the batch (`multicritic.layers.part_hooks`) only.
        for part in (mlp, head):
            kwargs = {"training": training} if training is not None and part_hooks.uses_batch_statistics(part) else {}
            x = call_layer(part, x, **kwargs)
        return x

    def after_update(self) -> None:
        """The parts' hook after an optimizer update (`multicritic.layers.part_hooks`): SimbaV2's and XQC's
        trunks project their kernels back onto the unit sphere. The trainer's steps call it after every
        update; a host training the critic with its own optimizer calls it after each of its updates (before
        `update_ema`). Assigns through `Variable.assign` (inside JAX's `StatelessScope` too)."""
        for fast, slow in ((self.mlp, self.mlp_ema), (self.return_layer, self.return_layer_ema)):
            part_hooks.after_update(fast, slow)

    def compute_output_shape(self, h_shape, z_shape=None):
        lead = tuple(h_shape[:-1]) if self.ensemble_size == 1 else (self.ensemble_size,) + tuple(h_shape[:-1])
        return lead, lead + (self.return_layer.units,)

    def compute_output_spec(self, h, z=None, use_ema=False):
        # Both outputs are the head's, float32 under every policy: symbolically as eagerly.
        shapes = self.compute_output_shape(call_inputs(self.input_layout, h, z)[0].shape)
        return tuple(keras.KerasTensor(shape, dtype="float32") for shape in shapes)

    # ------------------------------------------------------------------
    # Ensembles.

    def aggregate(self, values, seed=None):
        """Reduces member values `[K, ...]` to `[...]` as `aggregation` says (`"members"`: unchanged).

        With one member, `values` (`[...]`, no member axis) come back as they
        are. `seed`: for `"min_of_random"`, an int in [0, 2^32), or a pair
        `(seed, counter)` of int32 scalars (tensors inside a compiled step):
        the members drawn are a pure function of it (`multicritic.math.draws`), the
        same for every position of the batch, as REDQ / TD-MPC2 draw per
        update; `None` draws from Keras's global random state.

        `values` must hold one row per member (`[K, ...]`, K = `ensemble_size`): another leading size
        raises a `ValueError`.
        """
        return members.aggregate(self, values, seed)

    def get_member_weights(self, member: int) -> List[np.ndarray]:
        """Member `member`'s weights (fast, then EMA), shaped as a single critic's `get_weights()`."""
        return members.get_weights(self, member)

    def set_member_weights(self, member: int, weights: Sequence) -> None:
        """Sets member `member` from a single critic's `get_weights()` list; the other members are unchanged.

        All or nothing: the count, every shape and finiteness are checked first.
        """
        members.set_weights(self, member, weights)

    def loss_options(self) -> Dict[str, object]:
        """The `critic_loss` arguments that describe this critic's head (the head itself: its support and
        options)."""
        return {"head": self.return_layer}

    @property
    def fast_weights(self) -> List:
        """The fast critic's variables, in the order of `ema_weights`."""
        return self.mlp.weights + self.return_layer.weights

    @property
    def ema_weights(self) -> List:
        """The EMA copy's variables, pairwise matching `fast_weights`."""
        return self.mlp_ema.weights + self.return_layer_ema.weights

    def compute_ema(self, fast_values: Sequence, ema_values: Sequence, decay: Optional[float] = None) -> List:
        """Pure EMA step on tensors (see `multicritic.math.ema.compute`); `decay` defaults to `ema_decay`."""
        return ema_lib.compute(fast_values, ema_values, self.ema_decay if decay is None else decay)

    def ema_pairs(self, what: str = "ema") -> List[Tuple]:
        """`(fast, ema)` variable pairs, checked to match one to one (see `multicritic.math.ema.pairs`)."""
        return ema_lib.pairs(self, what)

    def init_ema(self) -> None:
        """Copies every fast variable (LayerNorm scale and centre included) into the EMA copy."""
        ema_lib.init(self)

    def update_ema(
        self, decay: Optional[float] = None, *, tau: Optional[float] = None, step=None, period: int = 1
    ) -> None:
        """`ema <- d * ema + (1 - d) * fast` for every variable (see `multicritic.math.ema.update` for the
        arguments: `decay` or `tau`, and the host's `step` and `period`)."""
        ema_lib.update(self, decay, tau=tau, step=step, period=period)

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
                "head": heads.HEADS.spec(self.return_layer),
                "trunk": trunks.TRUNKS.spec(self.mlp),
                "ensemble_size": self.ensemble_size,
                "aggregation": self.aggregation,
                "aggregation_subset": self.aggregation_subset,
                "norm": self.norm,
                "norm_epsilon": self.norm_epsilon,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "input_layout": self.input_layout,
                "input_size": self.input_size,
            }
        )
        return config
