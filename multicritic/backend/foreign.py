"""Other frameworks' arrays taken as the running backend's tensors, by DLPack.

One process runs one Keras backend, but a host's data often comes from another framework: a JAX environment
(Brax, MJX, gymnax) feeding a PyTorch agent, a PyTorch simulator feeding a JAX one. The critic's calls, its
trainer's entries and the losses take any object with `__dlpack__` that is neither a numpy array nor the
backend's own tensor ("foreign"), with the values the same data gives as a numpy array:

- float32, float16 and bfloat16 arrays become the backend's tensor by its own DLPack import
  (`Backend.from_dlpack`: `jax.dlpack.from_dlpack`, `torch.from_dlpack`, `tf.experimental.dlpack.from_dlpack`),
  which shares the array's memory where the two frameworks can (the same device, a layout the importer reads);
- every other dtype (float64, integers, booleans), a strided array (compact row-major, as numpy's default
  arrays are: PyTorch's kernels round a strided tensor differently) and an array the importer refuses (memory
  TensorFlow's kernels would read misaligned; another device) is copied to the host as a numpy array, which the
  entries then convert as they convert numpy's: float64 rounded and integers converted on the host, exactly
  (JAX without x64 would wrap int64 on import).

A foreign array is recognised by its type (it has `__dlpack__` and the backend does not take it as a tensor),
never by importing its framework. A PyTorch tensor that records gradients is detached first: gradients do not
cross frameworks. An imported tensor may share the producer's memory: writing to the array while the critic
reads it is a race, as with any DLPack view.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract

# Dtypes imported by DLPack as they are: the entries keep a float16 or float32 input's dtype (numpy's too).
SHARED_DTYPES = frozenset({"float32", "float16", "bfloat16"})


def is_foreign(x) -> bool:
    """Whether `x` is another framework's array: it has `__dlpack__` and is neither a numpy array nor the
    backend's own tensor (or a Keras variable or symbolic tensor)."""
    # No cache by type: a host's `torch.compile` traces the critic's call through this, and a plain test of the
    # object it traces as it is (~0.3 µs per input eagerly).
    if isinstance(x, (np.ndarray, keras.KerasTensor, keras.Variable)) or ops.is_tensor(x):
        return False
    return hasattr(type(x), "__dlpack__")


def dtype_name(x) -> str:
    """The name of a foreign array's dtype as numpy spells it (`torch.float32`, TensorFlow's `DType` and numpy's
    dtype all give `"float32"`), read from its `dtype` without importing its framework; `""` where it has none."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return ""
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).rpartition(".")[2]


def adopt(name: str, x):
    """The foreign array `x` (the argument `name`) as the backend's tensor (float32, float16 and bfloat16, by
    DLPack: sharing its memory where the devices and layout allow) or a numpy array (any other dtype, or what the
    backend's import refuses: a copy on the host); a `ValueError` naming `name` where neither can read it."""
    if type(x).__module__.partition(".")[0] == "torch" and getattr(x, "requires_grad", False):
        x = x.detach()  # DLPack refuses a tensor that records gradients, which could not cross frameworks anyway
    if dtype_name(x) in SHARED_DTYPES and _row_major(x):
        try:
            return contract.current().from_dlpack(x)
        except Exception:  # noqa: BLE001 - each framework raises its own errors; the host copy below is exact
            pass
    return host_array(name, x)


def _row_major(x) -> bool:
    """Whether `x` exports a compact row-major array. Another layout is copied to one, as numpy's default
    arrays are: PyTorch computes on a strided tensor as it lies, and its kernels then round differently."""
    try:
        return row_major(x.__dlpack__())  # not consumed: the capsule frees its export when it goes
    except Exception:  # noqa: BLE001 - an export the producer refuses: the host copy reads it another way
        return False


def host_array(name: str, x) -> np.ndarray:
    """`x`, another framework's array, as a compact row-major numpy array: its own memory where it is one on the
    CPU, else a copy (strided; from another device; a byte-swapped array's through its `__array__`)."""
    errors = []
    for read in (np.from_dlpack, _copied_to_host, np.asarray):
        try:
            array = read(x)
        except Exception as err:  # noqa: BLE001 - the next way is tried; all the errors are reported
            errors.append(f"{read.__name__}: {err}")
            continue
        if array.dtype != object:
            return np.ascontiguousarray(array)  # a copy only where strided (see `_row_major`)
        errors.append(f"{read.__name__}: an object array")
    raise ValueError(
        f"{name}: got a {type(x).__name__} whose data neither DLPack nor numpy could read ({'; '.join(errors)}); "
        "expected an array, a backend tensor or another framework's array."
    )


def _copied_to_host(x) -> np.ndarray:
    return np.from_dlpack(x, device="cpu", copy=True)


def adopted(inputs: Sequence) -> Sequence:
    """`inputs` with each foreign array adopted (`adopt`), for a forward pass's compiled call to take as it takes
    the backend's tensors and numpy's arrays; one that cannot be read is left as it is, for the pass's own checks to
    refuse with its argument's name."""
    if not any(is_foreign(x) for x in inputs):
        return inputs
    out = []
    for x in inputs:
        if is_foreign(x):
            try:
                x = adopt("inputs", x)
            except ValueError:
                pass
        out.append(x)
    return tuple(out)


class _DLTensor(ctypes.Structure):
    """The head of DLPack's `DLTensor` (and of `DLManagedTensor`, which starts with one), up to `byte_offset`."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_uint32),  # DLDataType: code, bits (uint8 each), lanes (uint16)
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


_GET_POINTER = ctypes.pythonapi.PyCapsule_GetPointer
_GET_POINTER.restype, _GET_POINTER.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def capsule_address(capsule) -> int:
    """The address of the first element of the array a DLPack capsule (`__dlpack__()`'s, not yet consumed)
    holds: an importer that assumes an alignment it does not check (TensorFlow) is given only aligned memory."""
    head = _DLTensor.from_address(_GET_POINTER(capsule, b"dltensor"))
    return (head.data or 0) + head.byte_offset


def row_major(capsule) -> bool:
    """Whether a DLPack capsule (not yet consumed) holds a compact row-major array (its strides, where given,
    are those of its shape's, sizes of 1 aside)."""
    head = _DLTensor.from_address(_GET_POINTER(capsule, b"dltensor"))
    if not head.strides:
        return True  # DLPack's compact row-major layout
    shape = (ctypes.c_int64 * head.ndim).from_address(head.shape)
    strides = (ctypes.c_int64 * head.ndim).from_address(head.strides)
    if 0 in shape:
        return True  # no element: any strides describe it
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
