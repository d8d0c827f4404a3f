"""What a traced pass read besides its inputs, found from the trace itself, and whether it is still the same.

A compiled pass (a `jax.jit` function, a TensorFlow concrete function, a replayed ATen graph) bakes in whatever
Python its trace met: which layers a model holds, a layer's dtype policy, a tensor a layer keeps outside its
weights (a `Normalization`'s statistics), a variable it was not given. Keying the pass on a list of such
things misses the next one. Instead the first trace is watched (`recording`), and the pass is reused only
while everything it could have read is as it was (`Reads.current`):

- every Keras layer whose Python ran during the trace (a profile hook sees each method's `self`, a layer
  reached through a `Lambda` or a closure included) and every layer of the owner's tree: each one's attributes,
  by identity, and the contents of its lists, dicts and sets (`Sequential.pop`/`add`, `adapt`, `load_weights`,
  `quantize`, `enable_lora`, a new dtype policy or a Python attribute set on the layer all show there);
- the variables the trace read that the pass was not given (`unmapped`): a backend passes them in too, or
  runs that pass eagerly.

What it cannot see is a Python object that is not a Keras layer, read by the pass (a plain object's attribute,
a global): those are frozen at the first trace, as under `jax.jit` or `tf.function` themselves.
"""

from __future__ import annotations

import contextlib
import operator
import sys
from collections.abc import Mapping, MutableSequence, MutableSet
from itertools import chain

import keras
from keras import StatelessScope

# Every attribute set on any Keras layer through `setattr` counts here (`_watched_setattr`): a `Reads` checked
# again at the same count is current without looking (what a Keras edit changes, it changes by `setattr`).
_EPOCH = [0]

# Attributes named so are run-time caches kept on a layer by multicritic (compiled calls, module slots):
# they never change what a pass computes, and they change as passes are compiled.
CACHE_PREFIX = "_cache_"

# Set by a backend whose compiler traces Python (PyTorch's Dynamo: `torch.compiler.is_compiling`): a `setattr`
# inside a region it compiles is not counted, or the compiled code would be guarded on the count and compiled
# again at every change of it. (Keras's own calls set no attribute to a new object.)
compiling = None


def _watched_setattr(self, name, value, _setattr=keras.Layer.__setattr__):
    _setattr(self, name, value)
    # A framework module's parameter slot (PyTorch's `_parameters`, what `torch.func.functional_call` swaps at
    # every call) is not what the Keras pass reads: it reads the variables.
    if name not in getattr(self, "_parameters", ()) and not (compiling is not None and compiling()):
        _EPOCH[0] += 1


keras.Layer.__setattr__ = _watched_setattr


class ReadingScope(StatelessScope):
    """A `StatelessScope` (`state_mapping` as Keras's) that notes in `unmapped` (by id) each variable read that
    the mapping does not hold: a traced pass would bake its value in as a constant."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unmapped = {}

    def get_current_value(self, variable):
        value = super().get_current_value(variable)
        if value is None:
            self.unmapped.setdefault(id(variable), variable)
        return value


class _Recorder:
    def __init__(self):
        self.layers = {}  # id -> layer, in the order first seen

    def profile(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_argcount and code.co_varnames[0] == "self":
                owner = frame.f_locals.get("self")
                if isinstance(owner, keras.Layer) and id(owner) not in self.layers:
                    self.layers[id(owner)] = owner

    def snapshot(self, owner, skip=frozenset()) -> "Reads":
        """The `Reads` of the layers seen and, where `owner` is a layer, of every layer of its tree; attributes
        named in `skip` (a framework's own bookkeeping on every layer) are left out."""
        return watch(owner, skip, self.layers.values())


def watch(owner, skip=frozenset(), more=()) -> "Reads":
    """The `Reads` of every layer of `owner`'s tree (a layer) and of the layers `more`."""
    layers = {id(layer): layer for layer in more}
    if isinstance(owner, keras.Layer):
        for layer in owner._flatten_layers(include_self=True):
            layers.setdefault(id(layer), layer)
    return Reads([_LayerState(layer, skip) for layer in layers.values()])


@contextlib.contextmanager
def recording():
    """Watches a trace run inside it (this thread's): yields a recorder whose `snapshot(owner, skip)` is the
    `Reads` of what ran."""
    recorder = _Recorder()
    outer_profile = sys.getprofile()

    def profile(frame, event, arg):
        recorder.profile(frame, event, arg)
        if outer_profile is not None:
            outer_profile(frame, event, arg)

    sys.setprofile(profile)
    try:
        yield recorder
    finally:
        sys.setprofile(outer_profile)


def _contents(value):
    """Live views of what a container attribute holds (its items; a dict's keys and values; a dtype policy
    map's policies), or None for anything else."""
    if isinstance(value, Mapping):
        return (value.keys(), value.values())
    if isinstance(value, (MutableSequence, MutableSet, list, set)):
        return (value,)
    inner = getattr(value, "_policy_map", None)  # a DTypePolicyMap changes in place
    if isinstance(value, keras.dtype_policies.DTypePolicyMap) and isinstance(inner, Mapping):
        return (inner.keys(), inner.values())
    return None


class _LayerState:
    """One layer's attributes as a trace saw them: the objects by identity, containers by their contents."""

    __slots__ = ("attributes", "size", "read", "values", "views", "held")

    def __init__(self, layer, skip):
        attributes = layer.__dict__
        self.attributes = attributes
        self.size = len(attributes)
        keys = tuple(k for k in attributes if not k.startswith(CACHE_PREFIX) and k not in skip)
        self.read = operator.itemgetter(*keys, *keys[:1])  # two keys at least: always a tuple
        self.values = self.read(attributes)
        views = []
        for value in self.values:
            found = _contents(value)
            if found is not None:
                views.extend(found)
        self.views = tuple(views)
        # The objects themselves, kept: an identity compared later cannot be a freed object's reused address.
        self.held = tuple(chain.from_iterable(self.views))

    def current(self) -> bool:
        attributes = self.attributes
        if len(attributes) != self.size:
            return False
        try:
            now = self.read(attributes)
        except KeyError:
            return False
        if not all(map(operator.is_, now, self.values)):
            return False
        held = tuple(chain.from_iterable(self.views))
        return len(held) == len(self.held) and all(map(operator.is_, held, self.held))


class Reads:
    """What a trace read (`recording`): `current()` is whether every layer it saw is as it was then."""

    __slots__ = ("states", "epoch", "maps")

    def __init__(self, states):
        self.states = tuple(states)
        self.epoch = _EPOCH[0]
        # A dtype policy map changes in place, without a `setattr`: with one, every check looks.
        self.maps = any(
            isinstance(v, keras.dtype_policies.DTypePolicyMap) for state in self.states for v in state.values
        )

    def current(self) -> bool:
        epoch = _EPOCH[0]
        if epoch == self.epoch and not self.maps:
            return True
        for state in self.states:
            if not state.current():
                return False
        self.epoch = epoch
        return True

    @property
    def layers(self) -> int:
        return len(self.states)
