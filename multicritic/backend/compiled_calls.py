"""A host's eager forward passes, compiled per input signature (JAX, TensorFlow).

A host calls the critic eagerly in its loops (`critic(h, z)`, `critic.on_latent`) on a few batch shapes: one
row per environment, a minibatch, the last observation. Eagerly, JAX and TensorFlow dispatch every op from
Python (1.7 ms and 3.8 ms for a two-layer critic at batch 4 on a 2-core CPU); compiled, the same pass is one
call (tens of µs). `CompiledCalls` runs a built owner's calls of each signature (`key` and the inputs' shapes
and dtypes) from the backend's compiled function of the same eager code (`jax.jit` over the variables'
values, a `tf.function` reading them), from the first call on: every call of a signature gives the same
bits (the compiler fuses ops, so its results can differ from the op-by-op pass's in the last bit, as a
compiled train step's do), and on JAX the first call is the cheaper one too (eagerly, JAX compiles each op
for a new shape: 1.5 s for the critic's first call at batch 4, against 0.3 s for the pass under `jax.jit`;
TensorFlow's trace of a new shape costs about 80 ms). The math stays one source, and a call
whose inputs or context the compiled function might not give the eager result for (tracers, symbolic tensors,
a Keras stateless or symbolic scope, a distribution, host data the eager pass would convert, an owner not
yet built) takes the eager path every time (`Backend.replay` says which). A compiled function is kept while
what its trace read is unchanged (`multicritic.backend.trace_reads`).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Callable, Hashable, Optional, Sequence

import numpy as np

from multicritic.backend import contract, trace_reads

# Signatures of one owner whose compiled functions are kept (the least recently used beyond go).
LIMIT = 64
# Host arrays whose conversion at a compiled function's boundary is the eager pass's: float32 and float16
# as they are, integers and booleans exactly (the pass casts them itself, in the compiled function too).
# float64 is not one: the boundary would round it before the eager pass's checks see it.
KEPT_HOST_DTYPES = ("float32", "float16", "int8", "int16", "int32", "int64", "uint8", "bool")

_LOCK = threading.Lock()


def assigned(scope, start) -> bool:
    """Whether a pass run in the Keras `StatelessScope` `scope` assigned a variable: its mapping differs from
    `start`, the copy taken on entering it. A compiled or traced pass records such an assignment in the scope
    and loses it, so a backend runs that pass eagerly, as it is written."""
    mapping = scope.state_mapping
    return mapping.keys() != start.keys() or any(mapping[k] is not v for k, v in start.items())


def host_array_kept(x) -> bool:
    """Whether `x` is a host array a compiled call takes as the eager pass would (`KEPT_HOST_DTYPES`, in the
    machine's byte order: a byte-swapped array's dtype has the same name)."""
    return isinstance(x, np.ndarray) and x.dtype.isnative and x.dtype.name in KEPT_HOST_DTYPES


def native_byte_order(inputs) -> Sequence:
    """`inputs` with each byte-swapped host array (`">f4"` on a little-endian machine) as the same values in
    the machine's byte order: a compiled function's boundary, and some frameworks' conversions, read the bytes
    as they lie."""
    if not any(isinstance(x, np.ndarray) and not x.dtype.isnative for x in inputs):
        return inputs
    return tuple(
        x.astype(x.dtype.newbyteorder("=")) if isinstance(x, np.ndarray) and not x.dtype.isnative else x for x in inputs
    )


class Entry:
    """A signature's compiled call with what its trace read (`trace_reads.Reads`) and how many times in a row it
    was found stale."""

    __slots__ = ("call", "reads", "stale")

    def __init__(self, call, reads, stale):
        self.call, self.reads, self.stale = call, reads, stale


# A signature whose trace is found stale this many times in a row runs eagerly from then on: something it reads
# changes at every call (a counter kept as a layer's attribute), and a retrace per call would cost far more.
STALE_LIMIT = 4
_EAGER = object()


class _Cache(OrderedDict):
    """An owner's compiled calls and the owner they read: a copy that carries the attribute along (Flax NNX's
    transforms merge one holding the transform's tracers, `copy.copy` one) has variables of its own, which these
    calls would not read."""

    def __init__(self, owner):
        super().__init__()
        self.owner = weakref.ref(owner)


class CompiledCalls:
    """`calls(owner, variables, key, fn, inputs, signature)`: `fn(*inputs)` from `compile(fn, variables)`,
    made at the first call of `(key, signature)` on `owner` and kept per owner for `LIMIT` signatures while what
    its trace read is unchanged (`trace_reads`); eagerly where `signature` is None or `owner` is not built.

    Args:
        compile: `(fn, variables) -> compiled`, where `compiled(*inputs)` gives what `fn(*inputs)` gives with
            the current values of `variables()`.
        attribute: where an owner keeps its compiled functions (past Keras's attribute tracking; a
            `trace_reads.CACHE_PREFIX` name, which what a trace read leaves out).
    """

    def __init__(self, compile: Callable[[Callable, Callable[[], Sequence]], Callable], attribute: str):
        self.compile = compile
        self.attribute = attribute

    def __call__(self, owner, variables, key: Hashable, fn: Callable, inputs: Sequence, signature: Optional[Hashable]):
        # An owner not yet built makes its variables in this call: only the eager pass may.
        if signature is None or not getattr(owner, "built", True) or contract.EAGER:
            return fn(*inputs)
        full = (key, signature)
        with _LOCK:
            cache = owner.__dict__.get(self.attribute)
            if cache is None or cache.owner() is not owner:
                cache = _Cache(owner)
                object.__setattr__(owner, self.attribute, cache)
            entry = cache.get(full)
            if entry is not None:
                cache.move_to_end(full)
        if entry is _EAGER:
            return fn(*inputs)
        stale = 0
        if entry is not None:
            if entry.reads.current():
                return entry.call(*inputs)
            stale = entry.stale + 1
        # Compiled outside the lock (a trace can take a while); two threads may both compile, one is kept. The
        # first call traces: what it reads is recorded there.
        call = self.compile(fn, variables)
        with trace_reads.recording() as recorder:
            out = call(*inputs)
        made = _EAGER if stale >= STALE_LIMIT else Entry(call, recorder.snapshot(owner), stale)
        with _LOCK:
            cache[full] = made
            while len(cache) > LIMIT:
                cache.popitem(last=False)
        return out
