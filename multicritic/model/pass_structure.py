"""What a Keras pass's ops depend on besides its inputs and its variables' values, read once per change."""

from __future__ import annotations

from typing import Sequence, Tuple

import keras


class PassStructure:
    """`structure(owner, layers)`: the dtype policy of `owner` and, per layer, its compute dtype, quantization
    mode and LoRA state: what selects a compiled pass (`quantize`, `enable_lora` and a new dtype policy change
    it; nothing else a Keras layer has does).

    A host reads it at every call of a compiled pass. The properties behind it cost a few microseconds per layer
    (a tenth of a small actor's replayed call), so it is read again only when a policy object (`_dtype_policy`,
    Keras's attribute behind `dtype_policy`) or a LoRA flag is replaced, which is what those three do. A policy
    map can change in place: with one, nothing is kept. The kept pair is one attribute, so a thread reading it
    never sees one call's state with another's structure.
    """

    def __init__(self):
        self._kept = None

    def __call__(self, owner: keras.Layer, layers: Sequence[keras.Layer]) -> Tuple:
        try:
            state = (
                owner._dtype_policy,
                *[layer._dtype_policy for layer in layers],
                *[getattr(layer, "lora_enabled", False) for layer in layers],
            )
        except AttributeError:
            state = None
        kept = self._kept
        if state is not None and kept is not None and kept[0] == state:
            return kept[1]
        structure = (owner.dtype_policy.name,) + tuple(
            (layer.compute_dtype, getattr(layer, "quantization_mode", None), getattr(layer, "lora_enabled", False))
            for layer in layers
        )
        if state is not None and not any(isinstance(p, keras.dtype_policies.DTypePolicyMap) for p in state):
            self._kept = (state, structure)
        return structure
