"""The official DreamerV3 agent's value critic and slow critic, served by multicritic inside its JAX train step.

The official code (danijar/dreamerv3, JAX, commit
e3f02248693a79dc8b0ebd62c93683888ddaccfe; its critic last changed in
2024-12) builds its critic in `dreamerv3/agent.py` as

    self.val = embodied.jax.MLPHead(scalar, **config.value, name='val')
    self.slowval = embodied.jax.SlowModel(
        embodied.jax.MLPHead(scalar, **config.value, name='slowval'), source=self.val, **config.slowvalue)

and trains it inside one `jax.jit`-ed ninjax train step. One line before the
agent is built hands both heads to a multicritic `CriticNetwork`:

    swap = dreamerv3_ninjax.swap_value_heads(embodied.jax, critic)

Every `MLPHead` named `val` or `slowval` is then a `CriticHead`: a ninjax
module whose parameters are ninjax state entries with the stock head's names,
shapes and `[in, out]` layout (`val/mlp/linear0/kernel`, ...,
`val/head/logits/bias`, the keys of `multicritic.interop.dreamerv3`), and
whose forward pass is the critic's pure function over them
(`critic.stateless_call`), traced into the host's step with the rest of it:
no host round trip, no Keras variable read or written while it trains. The
agent's other heads stay the official `MLPHead`. `CriticHead(space, output,
*, critic, initializer=None, distribution=None, **config.value)` is defined
on first use (ninjax is imported then); an agent's own code can build it in
place of `MLPHead`: `CriticHead(scalar, **config.value, critic=critic,
name='val')`.

What stays the host's: the value loss around the head (the lambda returns,
the slow regulariser, `valnorm`, the replay value loss, their weights and
scales), the optimizer (`embodied.jax.Optimizer` differentiates the `val/`
entries with `nj.grad`), the slow critic's copy and EMA update
(`SlowModel` over the `slowval/` entries), and the checkpoints
(`agent.save()` / `agent.load()`): a checkpoint written with the swap loads
into the stock agent and one written by the stock agent loads into the swap.

Exactness (measured by `tests/interop/test_official_agent.py` on the
official dummy task): with `initializer="host"` the initial parameters are
the stock agent's bit for bit (the official initialisers draw them, from the
same `nj.seed()` stream); with `distribution="host"` the value head's
`pred` / `loss` are the official `outs.TwoHot`'s, over the bins the official
`Head` computes. Under the official `jax.debug True` (XLA's optimisations
off) and `--jax.compute_dtype float32`, the swapped train step's metrics are
the stock step's bit for bit. What differs: with optimised XLA the fused
graphs round differently (from the same state, the total loss by 1e-6
relative; over steps the RMS-normalised update amplifies the rounding where
gradients are tiny); under bfloat16 the stock head computes in bfloat16 and
the critic in float32, unless its dtype policy is a bfloat16 one (below);
`distribution="critic"` (multicritic's own two-hot
over its symexp buckets, 23 of 255 bit-equal to the official bins, the rest
within 1.2e-6 relative) gives the same loss at the first step and float32
rounding differences in the returns after.

Dtypes: the head's entries in the host's state are float32 whatever the
critic's dtype policy (the stock head's are; the host's optimizer updates
them in place, where bfloat16 would round most of an update at the official
learning rate away). The forward pass computes in the critic's compute dtype:
float32 by default; with `dtype="mixed_bfloat16"` (or `"bfloat16"`) the trunk
computes in bfloat16, as the stock head does under the official
`--jax.compute_dtype bfloat16`, and the head in float32 (the critic's head
always is); gradients reach the float32 entries.

ninjax is imported on first use (`pip install "multicritic[dreamerv3]"`);
the official code itself is never imported: its `embodied.jax` module comes
in as an argument.
"""

from __future__ import annotations

import functools
import random
import re
from typing import Callable, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from keras import ops

from multicritic import heads, trunks
from multicritic.backend import contract
from multicritic.interop import _common, dreamerv3
from multicritic.math.bins import inverse_symlog
from multicritic.model import options as critic_options
from multicritic.validation import integer

NAMES = ("val", "slowval")
"""The official agent's value head and slow value head (`agent.py:65-67`)."""
INITIALIZERS = ("host", "critic")
"""`"host"`: the official initialisers draw the initial parameters (the stock agent's, bit for bit);
`"critic"`: the critic's own weights at the time the agent is built."""
DISTRIBUTIONS = ("host", "critic")
"""`"host"`: the official `outs.TwoHot` over the official bins; `"critic"`: `CriticOutput`, multicritic's head."""

# The architecture of the official value head: its names (multicritic.interop.dreamerv3's layout) hold no other.
_REQUIRED = dict(input_layout="h_z", **_common.ARCHITECTURE_2024)
_BUILDER = "multicritic.interop.dreamerv3_ninjax.official_critic(config.agent.value, config.agent.dyn.rssm)"
_SIZES = ("model_size", "num_dense_layers", "dense_hidden_units", "num_buckets", "gru_units", "num_z_categoricals",
          "num_z_classes")  # fmt: skip
_SWAPPED = "_multicritic_swap"  # set on the factory that stands in for the host's MLPHead
_NAME = re.compile(r"^[A-Za-z0-9_]+$")  # a ninjax module name


def _ninjax():
    try:
        import ninjax
    except ImportError as err:
        raise ImportError(
            "multicritic.interop.dreamerv3_ninjax needs ninjax, as the official code does: pip install "
            "'multicritic[dreamerv3]' (or ninjax==3.6.3)."
        ) from err
    return ninjax


def _check_critic(critic) -> None:
    """A `ValueError` naming `critic` unless it is a built single critic of the official architecture on JAX."""
    name = contract.current().name
    if name != "jax":
        raise ValueError(
            f"critic: got a critic on the {name} backend, expected one on JAX (KERAS_BACKEND=jax): the official "
            "agent's train step is one jax.jit of ninjax functions, which the critic's pure functions join."
        )
    _common.check_options(critic, "the official DreamerV3", _REQUIRED, _BUILDER)
    if critic.ensemble_size != 1:
        raise ValueError(
            f"critic: got an ensemble of {critic.ensemble_size}, expected a single critic (ensemble_size=1): the "
            "official value head is one network."
        )


def official_critic(value: Mapping, rssm: Mapping, **options):
    """A built `CriticNetwork` of the official value head's architecture and sizes.

    Call it before the host builds its agent: the official `Agent` turns on
    `jax_transfer_guard='disallow'` (`embodied/jax/internal.py`), after which
    Keras cannot create variables eagerly. Python's `random` state is left as
    it was (Keras seeds unseeded initialisers from it), so building the
    critic does not change the host's random stream.

    Args:
        value: the agent's `config.agent.value` (a mapping; `elements.Config`
            is one): `layers`, `units`, `bins`, and `output`, `act`, `norm`,
            `bias` where given, which must be the official
            `symexp_twohot`, `silu`, `rms` and `True`.
        rssm: `config.agent.dyn.rssm`: `deter` (the critic's `gru_units`),
            `stoch` (`num_z_categoricals`) and `classes` (`num_z_classes`).
        **options: `CriticNetwork` options in place of
            `multicritic.interop.dreamerv3.CRITIC_OPTIONS`' (e.g. the
            `"dreamerv3-2024"` preset's critic options, less its sizes); the
            sizes come from `value` and `rssm`.

    Returns:
        The built critic (its weights its own draw; `swap_value_heads` with
        `initializer="host"` replaces them by the official draw).

    Raises:
        ValueError: for a missing size or one that is not a whole number, an
            architecture the official names cannot hold (another `norm`,
            `norm_epsilon`, `use_bias`, `bin_scheme`, bounds,
            `input_layout`, head, trunk, or an ensemble), or a size given in
            `options`; nothing is built for them.

    Example:
        >>> critic = official_critic(config.agent.value, config.agent.dyn.rssm)   # size1m: 640 -> 3 x 64 -> 255
    """
    paths = {"value": "config.agent.value", "rssm": "config.agent.dyn.rssm"}
    for what, mapping in (("value", value), ("rssm", rssm)):
        if not isinstance(mapping, Mapping):
            raise ValueError(f"{what}: got a {type(mapping).__name__}, expected the agent's {paths[what]} (a mapping).")
    for key, want in (("output", "symexp_twohot"), ("act", "silu"), ("norm", "rms"), ("bias", True)):
        if key in value and value[key] != want:
            raise ValueError(
                f"value: got {key}={value[key]!r}, expected {key}={want!r}: the official value head that "
                "multicritic's critic reproduces (the layout of multicritic.interop.dreamerv3)."
            )
    sizes = {}
    for option, mapping, what, key, low in (
        ("num_dense_layers", value, "value", "layers", 1),
        ("dense_hidden_units", value, "value", "units", 1),
        ("num_buckets", value, "value", "bins", 2),
        ("gru_units", rssm, "rssm", "deter", 1),
        ("num_z_categoricals", rssm, "rssm", "stoch", 1),
        ("num_z_classes", rssm, "rssm", "classes", 1),
    ):
        if key not in mapping:
            raise ValueError(f"{what}: got no {key!r}, expected the agent's {paths[what]} with {key!r}.")
        try:
            sizes[option] = integer(key, mapping[key], low=low)
        except ValueError:
            raise ValueError(
                f"{what}: got {key}={mapping[key]!r}, expected an integer >= {low} (the agent's {paths[what]}.{key})."
            ) from None
    clash = sorted(set(options) & set(_SIZES))
    if clash:
        raise ValueError(
            f"{clash[0]}: got {options[clash[0]]!r}, expected no {clash[0]}: the sizes come from value and rssm "
            "(the host's config), so that the critic fits the host's features and checkpoints."
        )
    # At once, before anything is built (another head may be refused by the critic for its support first); a part
    # of the official kind with other options of its own, on the critic it makes, below.
    for option, want in {**_REQUIRED, "ensemble_size": 1}.items():
        if option in options and _given_kind(option, options[option]) != want:
            raise _not_official(option, options[option], want)
    from multicritic.model.critic import CriticNetwork

    python_random = random.getstate()
    try:
        critic = CriticNetwork(model_size=None, **sizes, **{**dreamerv3.CRITIC_OPTIONS, **options})
        found = _architecture_difference(critic)
        if found is not None:
            option, got, want = found
            raise _not_official(option, options.get(option, got), want)
        z = ops.zeros((1, sizes["num_z_categoricals"], sizes["num_z_classes"]))
        critic(ops.zeros((1, sizes["gru_units"])), z)
    finally:
        random.setstate(python_random)
    return critic


def _given_kind(option: str, given):
    """An option as given, but a part (`head`, `trunk`: a name, spec, class or instance) as its registered name."""
    registry = {"head": heads.HEADS, "trunk": trunks.TRUNKS}.get(option)
    if registry is None or isinstance(given, str):
        return given
    try:
        return given.get("class_name") if isinstance(given, Mapping) else registry.name_of(given)
    except (ValueError, TypeError):
        return given  # not a part at all: refused as it is


def _not_official(option, got, want) -> ValueError:
    return ValueError(
        f"{option}: got {got!r}, expected {want!r}: the official value head's parameter names "
        "(multicritic.interop.dreamerv3's layout, which the swap serves) hold no other architecture."
    )


def _architecture_difference(critic) -> Optional[Tuple[str, object, object]]:
    """`(option, the critic's value, the official one)` of the first architecture option the official value head
    cannot hold, or None."""
    config = critic.get_config()
    for option, want in _REQUIRED.items():
        if option == "head":
            same = config[option] == heads.HEADS.canonical(want, critic_options.support_of(config))
        elif option == "trunk":
            same = config[option] == trunks.TRUNKS.canonical(want, critic_options.trunk_options_of(config))
        else:
            same = getattr(critic, option) == want
        if not same:
            return option, config[option], want
    if critic.ensemble_size != 1:
        return "ensemble_size", critic.ensemble_size, 1
    return None


class CriticOutput:
    """multicritic's value distribution with the interface the official agent reads of `val` and `slowval`
    (`embodied.jax.outs.Output`): `pred()` and `loss(target)`, in real space, over the critic's own head and
    support (the 2024 symexp buckets, decoded in real space). In `keras.ops` (JAX arrays, traced into the host's
    step).

    Args:
        logits: `[..., num_buckets]` the critic's logits.
        head: the critic's head (`critic.return_layer`).
    """

    def __init__(self, logits, head):
        self.logits, self.head = ops.cast(logits, "float32"), head

    def pred(self):
        """The real-space value `[...]` (the official `TwoHot.pred()`'s place: the lambda returns' bootstrap)."""
        return inverse_symlog(self.head.decode(self.logits))

    def loss(self, target):
        """The head's value loss of real-space targets `target` (two-hot cross-entropy for the two-hot head), the
        target's gradient stopped as the official `TwoHot.loss` stops it. `target` and the logits' leading shape
        broadcast as there (numpy's rules: a scalar, `[T]` against `[B, T]`, ...); the loss has their broadcast
        shape.

        Raises:
            ValueError: for a `target` whose shape does not broadcast with the logits' leading shape.
        """
        target = ops.stop_gradient(ops.cast(target, "float32"))
        logits = self.logits
        lead, given = tuple(logits.shape[:-1]), tuple(target.shape)
        try:
            shape = tuple(np.broadcast_shapes(given, lead))
        except ValueError:
            raise ValueError(
                f"target: got shape {list(given)}, expected a shape that broadcasts with the logits' leading shape "
                f"{list(lead)} (as the official TwoHot.loss broadcasts its target)."
            ) from None
        if given != shape:
            target = ops.broadcast_to(target, shape)
        if lead != shape:
            logits = ops.broadcast_to(logits, (*shape, logits.shape[-1]))
        value_term, _ = self.head.position_losses(logits, target, None, None, regularizer="two_hot_mean")
        return value_term


def host_distribution(namespace, bins: int = 255) -> Callable:
    """The official value distribution over logits: `logits -> namespace.outs.TwoHot(logits, table)`, the bins
    `table` computed by the official `namespace.heads.Head` itself (a probe head run once, under `ninjax.pure`).

    With it, the value head's `pred()` and `loss()` are the host's own code, and `CriticHead` reproduces the stock
    head exactly. Call it before the host builds its agent (the probe runs eagerly, which the official
    `jax_transfer_guard='disallow'` refuses afterwards).

    Args:
        namespace: the host's `embodied.jax` module.
        bins: the number of bins (`config.agent.value.bins`).

    Returns:
        `distribution(logits)`, with the table as `distribution.bins` (float32 numpy).

    Raises:
        ValueError: when `namespace` has no `heads.Head` and `outs.TwoHot`, or `bins` is not an int >= 2.
    """
    heads, outs = getattr(namespace, "heads", None), getattr(namespace, "outs", None)
    if not callable(getattr(heads, "Head", None)) or not callable(getattr(outs, "TwoHot", None)):
        raise ValueError(
            f"namespace: got {namespace!r}, expected the host's embodied.jax module (with heads.Head and outs.TwoHot)."
        )
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise ValueError(f"bins: got {bins!r}, expected the number of the value head's bins (an int >= 2).")

    def probe(x):
        return heads.Head((), "symexp_twohot", bins=bins, outscale=0.0, name="multicritic_bins")(x).bins

    # The official Head takes its input in the compute dtype (`nets.ensure_dtypes` asserts it).
    dtype = getattr(getattr(namespace, "nets", None), "COMPUTE_DTYPE", np.float32)
    _, table = _ninjax().pure(probe)({}, np.zeros((1, 1), dtype), create=True, seed=0)
    table = np.asarray(table, np.float32)  # a host array: the step embeds it as a constant, nothing is transferred

    def distribution(logits):
        return outs.TwoHot(logits, table)

    distribution.bins = table
    return distribution


def _check_hkw(critic, space, output, hkw, name) -> None:
    """What the host asks of the head (its `config.value`), against the critic."""
    shape = space if isinstance(space, tuple) else getattr(space, "shape", None)  # the official Head takes both
    if shape is None or tuple(shape) != ():
        raise ValueError(
            f"space: got {space!r} for {name}, expected a scalar space (the value head's elements.Space(np.float32, "
            "())): a CriticHead serves value heads only."
        )
    if output != "symexp_twohot":
        raise ValueError(f"output: got {output!r} for {name}, expected 'symexp_twohot' (the official value head's).")
    for key, want in (
        ("layers", critic.num_dense_layers),
        ("units", critic.dense_hidden_units),
        ("bins", critic.num_buckets),
        ("act", "silu"),
        ("norm", "rms"),
        ("bias", True),
    ):
        if key in hkw and hkw[key] != want:
            raise ValueError(
                f"{key}: got {hkw[key]!r} for {name} (the host's config.value), expected {want!r}, the critic's. "
                f"Build the critic with {_BUILDER}."
            )


class _Layout(NamedTuple):
    """Where the critic's variables sit in the official head's state."""

    keys: Tuple[str, ...]  # each trainable variable's official name, in `trainable_variables` order
    shapes: Tuple[Tuple[int, ...], ...]  # their shapes
    ema_keys: Tuple[Optional[str], ...]  # each non-trainable variable's: the EMA copy of that name, or None
    created: Tuple[str, ...]  # the names in the stock head's creation order (layer by layer, then the head)


def _layout(critic) -> _Layout:
    entries = _common.entries(critic, dreamerv3.ADAPTER.key, transpose=False)
    fast = {id(f): key for key, f, _, _ in entries}
    ema = {id(e): key for key, _, e, _ in entries}
    keys = []
    for var in critic.trainable_variables:
        if id(var) not in fast:
            raise ValueError(f"critic: got the variable {var.path!r}, which the official value head has no name for.")
        keys.append(fast[id(var)])
    trained = set(keys)
    for key, var, _, _ in entries:
        if key not in trained:
            dtype = str(var.dtype)
            why = "quantized" if not dtype.startswith(("float", "bfloat")) else "frozen (trainable=False)"
            raise ValueError(
                f"critic: got {key!r} ({var.path}, {dtype}) not trainable, a {why} critic; expected every weight of "
                f"the official value head trainable ({len(entries)} of them): the host's optimizer trains each as "
                "a ninjax entry of the head (nj.grad), in float32. Swap a trainable float critic (quantize or freeze "
                "it after training, outside the agent)."
            )
    return _Layout(
        keys=tuple(keys),
        shapes=tuple(tuple(int(d) for d in var.shape) for var in critic.trainable_variables),
        ema_keys=tuple(ema.get(id(v)) for v in critic.non_trainable_variables),
        created=tuple(key for key, _, _, _ in entries),
    )


def _serve(head, x, bdims):
    """`CriticHead.__call__`: the critic's logits over the head's ninjax entries, in the host's distribution."""
    critic = head.critic
    shape = tuple(x.shape)
    if isinstance(bdims, bool) or not isinstance(bdims, int) or not 0 <= bdims < len(shape):
        raise ValueError(f"bdims: got {bdims!r} for input shape {list(shape)}, expected an int in [0, {len(shape)}).")
    lead = shape[:bdims]
    width = 1
    for d in shape[bdims:]:
        width *= int(d)
    if width != critic.latent_size:
        raise ValueError(
            f"x: got {head.path}'s features of width {width} (shape {list(shape)}, {bdims} batch dims), expected "
            f"{critic.latent_size}: the critic's gru_units={critic.gru_units} + num_z_categoricals * num_z_classes "
            f"= {critic.num_z_categoricals} * {critic.num_z_classes} (the host's deter, stoch and classes)."
        )
    context = _ninjax().context()
    layout = head.layout
    if head.host is not None and any(f"{head.path}/{k}" not in context for k in layout.keys):
        head.host(x, bdims)  # the creation pass: the official MLPHead draws its parameters at this path
    # The critic's current weights make missing entries (`initializer="critic"`): constants of the host's
    # initialisation, read on device (a Keras variable's value is a JAX array), in the stock head's order. Always
    # float32, as the stock head's: the host's optimizer updates them in place, and a bfloat16 entry would round
    # most of an update away; the critic's dtype policy sets what its forward pass computes in (below).
    variables = dict(zip(layout.keys, critic.trainable_variables))
    params = {k: head.value(k, lambda v=variables[k]: ops.cast(v.value, "float32")) for k in layout.created}
    for key, want in zip(layout.keys, layout.shapes):
        if tuple(params[key].shape) != want:
            raise ValueError(
                f"{key}: got shape {list(params[key].shape)} for {head.path} in the host's state, expected "
                f"{list(want)} (the critic's): the host's config.value and the critic differ."
            )
    fast = [params[k] for k in layout.keys]
    # Only the fast half runs: the EMA copy's slots take the fast values (unused), other non-trainable state its own.
    rest = [params[k] if k is not None else v.value for k, v in zip(layout.ema_keys, critic.non_trainable_variables)]
    flat = ops.cast(ops.reshape(x, (-1, width)), critic.compute_dtype)
    h = flat[:, : critic.gru_units]
    z = ops.reshape(flat[:, critic.gru_units :], (-1, critic.num_z_categoricals, critic.num_z_classes))
    (_, logits), _ = critic.stateless_call(fast, rest, h, z)
    return head.distribution(ops.reshape(logits, (*lead, logits.shape[-1])))


@functools.lru_cache(maxsize=None)
def _critic_head_class():
    nj = _ninjax()

    class CriticHead(nj.Module):
        """The official `embodied.jax.MLPHead(scalar, **config.value, name=...)` for a value head, served by a
        multicritic critic: a ninjax module (`head(x, bdims)` returns the head's distribution).

        Its parameters are ninjax state entries under the module's path, named, shaped and laid out as the stock
        head's (`mlp/linear{i}/kernel` `[in, out]`, `mlp/linear{i}/bias`, `mlp/norm{i}/scale`,
        `head/logits/kernel`, `head/logits/bias`): the host's optimizer, `SlowModel` and checkpoints see the
        stock layout. The forward pass is `critic.stateless_call` over them, inside the host's trace.

        Args:
            space: the head's space: a scalar one, the value head's `elements.Space(np.float32, ())` (or `()`).
            output: the head's output kind (`"symexp_twohot"`, the official value head's).
            critic: a built single `CriticNetwork` of the official architecture on JAX (`official_critic`).
            initializer: the official `MLPHead` at this same path (`name=`), called on the creation pass to draw
                the parameters with the official initialisers; `None`: the critic's weights.
            distribution: `logits -> output` (`host_distribution(embodied.jax, bins)` for the official one);
                `None`: `CriticOutput`.
            **hkw: the rest of the host's `config.value` (`layers`, `units`, `bins`, `act`, `norm`, `outscale`,
                `winit`, ...), checked against the critic where it has them.
        """

        def __init__(self, space, output="symexp_twohot", *, critic, initializer=None, distribution=None, **hkw):
            _check_critic(critic)
            _check_hkw(critic, space, output, hkw, self.path)
            if distribution is not None and not callable(distribution):
                raise ValueError(f"distribution: got {distribution!r}, expected None or a function of the logits.")
            if initializer is not None and not callable(initializer):
                raise ValueError(
                    f"initializer: got {initializer!r}, expected None or the host's MLPHead at {self.path}."
                )
            self.critic, self.host, self.layout = critic, initializer, _layout(critic)
            self.distribution = distribution or (lambda logits: CriticOutput(logits, critic.return_layer))

        def __call__(self, x, bdims):
            return _serve(self, x, bdims)

    CriticHead.__module__, CriticHead.__qualname__ = __name__, "CriticHead"
    return CriticHead


def __getattr__(name):
    # The ninjax module class, defined on first use: importing this module needs no ninjax.
    if name == "CriticHead":
        return _critic_head_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ValueHeadSwap:
    """The host's `MLPHead` replaced for the value heads (`swap_value_heads`): a context manager, and `restore()`.

    Attributes:
        critic: the critic serving the heads.
        names: the served heads' names.
        heads: `{name: CriticHead}` of the heads built so far (the agent's `val` and `slowval` once it is built).
        initializer: as given to `swap_value_heads`.
        distribution: the function of the logits the heads use (`None`: `CriticOutput`).
    """

    def __init__(self, namespace, critic, names, initializer, distribution):
        self.namespace, self.critic, self.names = namespace, critic, names
        self.initializer, self.distribution = initializer, distribution
        self.heads: Dict[str, object] = {}
        self.original = namespace.MLPHead
        critic_head = _critic_head_class()
        original = self.original

        def factory(space, *args, name, **kwargs):
            if name not in names:
                return original(space, *args, name=name, **kwargs)
            host = original(space, *args, name=name, **kwargs) if initializer == "host" else None
            head = critic_head(
                space, *args, critic=critic, initializer=host, distribution=distribution, name=name, **kwargs
            )
            self.heads[name] = head
            return head

        setattr(factory, _SWAPPED, self)
        factory.__doc__ = f"embodied.jax.MLPHead, with {', '.join(names)} served by multicritic (swap_value_heads)."
        namespace.MLPHead = factory

    def restore(self) -> None:
        """Puts the host's `MLPHead` back (heads built meanwhile stay as they are)."""
        if getattr(getattr(self.namespace, "MLPHead", None), _SWAPPED, None) is self:
            self.namespace.MLPHead = self.original

    def __enter__(self) -> "ValueHeadSwap":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def swap_value_heads(
    namespace,
    critic,
    *,
    names: Sequence[str] = NAMES,
    initializer: str = "host",
    distribution: Union[str, Callable] = "host",
) -> ValueHeadSwap:
    """Serves the official agent's value heads with `critic`: the one line before the agent is built.

    Replaces `namespace.MLPHead` (the host's `embodied.jax` module) with a
    factory that builds a `CriticHead` for the heads named in `names` and the
    official `MLPHead` for every other head, until `restore()` (or the end of
    a `with` block; heads built meanwhile keep serving). The host's loss,
    optimizer, slow-critic update and checkpoints are unchanged; see the
    module's docstring for what is exact.

    Call it, and build `critic`, before the host builds its agent: the
    official `Agent` turns on `jax_transfer_guard='disallow'`, after which
    the eager steps here (building a critic, `host_distribution`'s probe)
    are refused; or call them inside `with jax.transfer_guard("allow"):`.

    Args:
        namespace: the host's `embodied.jax` module (`import embodied.jax`),
            whose `MLPHead` the agent calls.
        critic: a built single `CriticNetwork` on JAX of the official value
            head's architecture and sizes (`official_critic(config.agent.value,
            config.agent.dyn.rssm)`), with trainable weights. Its dtype policy
            sets what its forward pass computes in; the host's entries are
            float32 whatever it is (see the module's docstring).
        names: the heads to serve (`"val"`, `"slowval"`; `("val",)` keeps the
            official slow head, which `SlowModel` keeps in step either way).
        initializer: `"host"`: the official initialisers draw the initial
            parameters, consuming `nj.seed()` as the stock agent does (its
            whole initial state bit for bit); `"critic"`: the critic's own
            weights, which draw nothing from the host's seeds.
        distribution: `"host"`: the official `outs.TwoHot` over the official
            bins (`host_distribution`; the value loss is then the host's own
            code); `"critic"`: `CriticOutput`, the critic's head (any
            multicritic two-hot support); or a function of the logits.

    Returns:
        A `ValueHeadSwap` (`restore()`, a context manager; `heads` once built).

    Raises:
        ValueError: for a critic that is not on JAX, not built, an ensemble,
            of another architecture, or whose value-head weights are not all
            trainable (frozen, quantized, LoRA); a `namespace` without `MLPHead` (or
            already swapped); bad `names`; an unknown `initializer` or
            `distribution`. A head whose `config.value` or features do not fit
            the critic raises one when the agent builds or traces it.

    Example:
        In `dreamerv3/main.py` (or the agent's own code), before `Agent(...)`:

        >>> import embodied.jax
        >>> from multicritic.interop import dreamerv3_ninjax
        >>> critic = dreamerv3_ninjax.official_critic(config.agent.value, config.agent.dyn.rssm)
        >>> dreamerv3_ninjax.swap_value_heads(embodied.jax, critic)   # val and slowval served by multicritic
        >>> agent = Agent(obs_space, act_space, elements.Config(**config.agent, ...))

    Reference:
        Hafner et al., "Mastering Diverse Domains through World Models" (2023-2024; the code at commit e3f0224).
    """
    _check_critic(critic)
    _layout(critic)  # a LoRA, frozen or quantized critic: refused now, not when the agent builds its heads
    if not callable(getattr(namespace, "MLPHead", None)):
        raise ValueError(f"namespace: got {namespace!r}, expected the host's embodied.jax module (with its MLPHead).")
    if getattr(namespace.MLPHead, _SWAPPED, None) is not None:
        raise ValueError(
            "namespace: got a namespace whose MLPHead is swapped already, expected the host's own MLPHead: "
            "restore() that swap first."
        )
    if isinstance(names, str) or not isinstance(names, Sequence) or not names:
        raise ValueError(f"names: got {names!r}, expected a non-empty sequence of head names such as {NAMES}.")
    for name in names:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"names: got {name!r}, expected a ninjax module name (letters, digits, underscores).")
    if len(set(names)) != len(names):
        raise ValueError(f"names: got {list(names)!r}, expected each name once.")
    if initializer not in INITIALIZERS:
        raise ValueError(f"initializer: got {initializer!r}, expected one of {list(INITIALIZERS)}.")
    if distribution == "host":
        distribution = host_distribution(namespace, critic.num_buckets)
    elif distribution == "critic":
        distribution = None
    elif isinstance(distribution, str) or not callable(distribution):
        raise ValueError(
            f"distribution: got {distribution!r}, expected one of {list(DISTRIBUTIONS)} or a function of the logits."
        )
    return ValueHeadSwap(namespace, critic, tuple(names), initializer, distribution)
