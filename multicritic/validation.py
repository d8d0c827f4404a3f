"""Input checks that raise clear `ValueError`s before any state changes, and the float32 conversion."""

from __future__ import annotations

import functools
import inspect
import json
import math
from typing import Dict, Optional, Tuple

import keras
import numpy as np
from keras import ops

from multicritic.backend import foreign
from multicritic.registry import KERAS_KEYS


class FixedOptionError(AttributeError, ValueError):
    """An assignment to an option fixed when its object was built (a `ValueError` and an `AttributeError`, as
    assigning a read-only attribute is): the compiled steps of every backend read the options once, so a
    changed value would be taken by one path and not another."""


class FixedOptions:
    """Makes an object's options read-only once its constructor has returned (a mixin, first among the bases).

    An object's options are its constructor's arguments, kept as attributes of the same names (as a Keras
    layer's are, and its `get_config` stores): the keyword arguments of every `__init__` of its class and
    bases, plus any named in `fixed_options` (for options taken as `**kwargs`), so a new part is fixed with no
    list to keep. Each must be what a config can hold (JSON, or a Keras object whose config is), else the
    constructor raises a `ValueError` naming it. Assigning an option raises `FixedOptionError`, with
    `fixed_option_hint(name)` saying what to do instead.

    The options are fixed when the outermost constructor returns (a subclass sets its own after its base's
    constructor): every subclass's `__init__` calls `fix_options()` on the way out.
    """

    fixed_options: Tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_fixes_options", False):
            cls.__init__ = _fixing_options(init)

    def fixed_option_hint(self, name: str) -> str:
        return f"build a new {type(self).__name__} with {name}=... (and a new critic with it)"

    def fix_options(self) -> None:
        names = [n for n in _constructor_options(type(self)) if hasattr(self, n)]
        if isinstance(self, keras.layers.Layer):  # its options travel in its config
            for name in names:
                _check_serialisable(type(self).__name__, name, getattr(self, name))
        self.__dict__["_fixed_names"] = frozenset(names)

    def __setattr__(self, name, value):
        if name in self.__dict__.get("_fixed_names", ()):
            kind = type(self).__name__
            raise FixedOptionError(
                f"{name}: got an assignment of {value!r} to {kind}.{name}, expected none: the option is fixed when "
                f"the {kind} is built (every backend's compiled step reads it once); "
                f"{self.fixed_option_hint(name)}."
            )
        super().__setattr__(name, value)


# Arguments of a Keras layer's constructor that are Keras's, not the layer's options.
_NOT_OPTIONS = frozenset(KERAS_KEYS)


@functools.lru_cache(maxsize=None)
def _constructor_options(cls) -> Tuple[str, ...]:
    """The keyword arguments of the constructors of `cls` and its `FixedOptions` bases, and their
    `fixed_options`, in that order (each once)."""
    names = []
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, FixedOptions)) or klass is FixedOptions:
            continue
        init = klass.__dict__.get("__init__")
        if init is not None:
            for param in inspect.signature(init).parameters.values():
                if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY) and param.name != "self":
                    names.append(param.name)
        names += list(klass.__dict__.get("fixed_options", ()))
    return tuple(dict.fromkeys(n for n in names if n not in _NOT_OPTIONS))


def _check_serialisable(kind: str, name: str, value) -> None:
    """A `ValueError` naming option `name` unless its value is what a config holds: JSON, or a Keras object
    (an initializer) whose config is. (Not Keras's `serialize_keras_object`, which imports TensorFlow.)"""
    if isinstance(value, keras.layers.Layer):
        return  # a configured part: saved by its own config
    plain = value.get_config() if hasattr(value, "get_config") and not isinstance(value, type) else value
    if not _is_plain(plain):
        raise ValueError(
            f"{name}: got {value!r}, expected a value a config can hold (a {kind}'s options travel in its config: "
            "a name, a number, a string, or a Keras object with a config)."
        )


def _is_plain(value) -> bool:
    try:
        json.dumps(value, allow_nan=True)
        return True
    except (TypeError, ValueError):
        return False


def _fixing_options(init):
    """`init`, which fixes the options when it is the outermost constructor call on the object."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        depth = self.__dict__.get("_init_depth", 0)
        self.__dict__["_init_depth"] = depth + 1
        try:
            init(self, *args, **kwargs)
        finally:
            self.__dict__["_init_depth"] = depth
        if depth == 0:
            self.fix_options()

    # Keras reads a layer's constructor arguments with `inspect.getfullargspec`, which ignores `__wrapped__`.
    __init__.__signature__ = inspect.signature(init)
    __init__._fixes_options = True
    return __init__


# A dict, not `functools.lru_cache`: a host's `torch.compile` traces the critic's call through these checks, and
# Dynamo warns at every cache wrapper it traces (it runs the wrapped function; a user reads that as a correctness
# warning). A dict lookup it traces silently, the same values.
_DTYPE_NAMES: Dict[object, str] = {}


def dtype_name(dtype) -> str:
    """`keras.backend.standardize_dtype(dtype)`, cached: a step checks every input's dtype, and the standard
    name of a backend's dtype object never changes."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = keras.backend.standardize_dtype(dtype)
    return name


def as_float32(x, name: str = "x"):
    """`x` (the argument `name`) as a float32 backend tensor; a float32 tensor is returned as it is (see
    `cast_to`), another framework's array imported first (`multicritic.backend.foreign`)."""
    if not ops.is_tensor(x):
        x = foreign.adopt(name, x) if foreign.is_foreign(x) else x
        x = x if ops.is_tensor(x) else ops.convert_to_tensor(x)
    return cast_to(x, "float32")


def cast_to(x, dtype: str):
    """`ops.cast(x, dtype)`, except that a backend tensor already of `dtype` is returned as it is, without a
    Keras op: on eager PyTorch each op call costs tens of µs."""
    if ops.is_tensor(x) and dtype_name(x.dtype) == dtype:
        return x
    return ops.cast(x, dtype)


def shape_of(x) -> Tuple[Optional[int], ...]:
    return tuple(None if d is None else int(d) for d in x.shape)


def fmt(shape, unknown: str = "?") -> str:
    """`[2, ?, 5]`: a shape as error messages print it, `unknown` for a dimension not known (the critic's
    inputs name it `B`, the batch)."""
    return "[" + ", ".join(unknown if d is None else str(d) for d in shape) + "]"


def compatible(a, b) -> bool:
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def check_same_shapes(tensors: Dict[str, object]) -> None:
    """All named tensors must have the shape of the first one."""
    items = [(name, shape_of(x)) for name, x in tensors.items() if x is not None]
    first, want = items[0]
    for name, got in items[1:]:
        if not compatible(got, want):
            raise ValueError(f"{name}: got shape {fmt(got)}, expected {fmt(want)} (the shape of {first}).")


def number(name: str, value, *, low=None, high=None, low_open=False, allow_none=False) -> Optional[float]:
    """`value` as a finite Python float within `[low, high]` (`(low, high]` with `low_open`),
    else a `ValueError` naming `name`. Booleans and strings are refused."""
    if value is None and allow_none:
        return None
    if low is not None and high is not None:
        span = f" in {'(' if low_open else '['}{low:g}, {high:g}]"
    elif low is not None:
        span = f" {'>' if low_open else '>='} {low:g}"
    else:
        span = ""
    want = f"a finite number{span}" + (" or None" if allow_none else "")
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ValueError(f"{name}: got {value!r}, expected {want}.")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: got {value!r}, expected {want}.") from None
    if (
        not math.isfinite(x)
        or (low is not None and (x <= low if low_open else x < low))
        or (high is not None and x > high)
    ):
        raise ValueError(f"{name}: got {value!r}, expected {want}.")
    return x


def integer(name: str, value, *, low: int = 1, high: Optional[int] = None) -> int:
    """`value` as a Python int >= `low` (and <= `high`), else a `ValueError` naming `name`."""
    want = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ValueError(f"{name}: got {value!r}, expected {want}.")
    try:
        ok = int(value) == value and int(value) >= low and (high is None or int(value) <= high)
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"{name}: got {value!r}, expected {want}.")
    return int(value)


def real_values(name: str, x):
    """`x` as a numpy array (host data: numbers, lists, arrays) or the backend tensor it is, after
    checking that it holds real numbers (floats, integers or booleans); a `ValueError` naming `name` else.
    Another framework's array (`__dlpack__`) is the backend's tensor or numpy array `multicritic.backend.foreign`
    makes of it."""
    if x is None or isinstance(x, (str, bytes)):
        raise ValueError(f"{name}: got {x!r}, expected a real-valued array.")
    if ops.is_tensor(x) or isinstance(x, keras.KerasTensor):
        kind = dtype_name(x.dtype)
        if not kind.startswith(("float", "bfloat", "int", "uint", "bool")):
            raise ValueError(f"{name}: got a tensor of dtype {kind}, expected real numbers.")
        return x
    if foreign.is_foreign(x):
        return real_values(name, foreign.adopt(name, x))
    if not isinstance(x, (np.ndarray, list, tuple, float, int, np.generic)):
        raise ValueError(
            f"{name}: got a {type(x).__name__}, expected an array, a backend tensor or another framework's array "
            "(an object with __dlpack__)."
        )
    try:
        array = np.asarray(x)
    except ValueError as err:  # ragged nested lists
        raise ValueError(f"{name}: got a {type(x).__name__} that is not a rectangular array ({err}).") from None
    if array.dtype.kind not in "fiub":
        raise ValueError(f"{name}: got an array of dtype {array.dtype}, expected real numbers.")
    return array


def real_tensor(name: str, x, dtype: str):
    """`x` as a backend tensor of real numbers: floating tensors and float16/32 host arrays keep their dtype,
    integers, booleans and float64 host data become `dtype`; another framework's array is taken as its numpy
    twin is, the same values (`multicritic.backend.foreign`: by DLPack where it can)."""
    x = real_values(name, x)
    if isinstance(x, np.ndarray):
        # A byte-swapped array (`">f4"`) is its values in the machine's order: frameworks read raw bytes.
        keep = x.dtype.kind == "f" and x.dtype.itemsize < 8
        return ops.convert_to_tensor(x.astype(x.dtype.newbyteorder("=") if keep else dtype, copy=False))
    if isinstance(x, keras.KerasTensor) or "float" in dtype_name(x.dtype):
        return x
    return ops.cast(x, dtype)


def h_z_pair(h, z):
    """`(h, z)` from two arguments or one `(h, z)` pair (Keras's `predict` passes `x` as one argument)."""
    if z is None and isinstance(h, (tuple, list)) and len(h) == 2:
        return h[0], h[1]
    if z is None:
        raise ValueError("z: missing; call the critic as critic(h, z) or critic((h, z)).")
    return h, z


def _dim(d):
    """A static size as an int; None for an unknown or symbolic one (jax2tf's polymorphic batch, a
    `torch.SymInt` under `torch.export`: reading one as an int would fix the exported batch size; known by its
    type's name, as this module imports no framework). A traced size (TorchScript's 0-d tensor) reads as an int."""
    if d is None or type(d).__name__ == "SymInt":
        return None
    try:
        return int(d)
    except Exception:
        return None


def static_shape(x) -> Tuple:
    """A shape as a tuple of ints, None where a size is unknown or symbolic."""
    return tuple(_dim(d) for d in x)
