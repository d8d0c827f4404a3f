"""A host's other networks (an actor, a world model's parts) called in its loops as the critic is: compiled."""

from __future__ import annotations

import keras

from multicritic.backend import contract as backend_lib


class CompiledForward:
    """`forward(*inputs)`: `model(*inputs, training=False)`, run from a compiled pass per input signature.

    A host calls its actor once per environment step, on a batch of one row per
    environment, next to the critic. Called eagerly (or through
    `predict_on_batch`), a Keras model runs its layers one by one from Python:
    on PyTorch that is about 0.5 ms for a three-layer 64-unit actor, 25
    times `torch.nn.Sequential`'s own call. `CompiledForward` runs a built
    model's inference pass the way the critic runs its own (`critic(h, z)`):
    under `jax.jit` on JAX, as a `tf.function`'s concrete function on
    TensorFlow, replayed from the ATen graph traced once per signature on
    PyTorch (the same kernels in the same order: the eager pass's values,
    bit for bit, and the same autograd record). Each is made at the first call
    of an input signature (shapes, dtypes with their byte order, device,
    strides, autocast; on TensorFlow the leading axes are left open, one
    function a rank) and kept per model (the least recently used beyond 64
    go). `MULTICRITIC_EAGER=1`, `jax.disable_jit()` and
    `tf.config.run_functions_eagerly(True)` run the op-by-op pass.

    A compiled pass is kept while everything its trace read is unchanged
    (`multicritic.backend.trace_reads`): every Keras layer whose code ran in
    it and every layer of the model, their attributes and the contents of
    their lists and dicts. Replacing a layer (`pop` / `add`), re-`adapt`ing or
    loading a `Normalization`, `quantize`, `enable_lora`, a new dtype policy
    (or a policy map changed in place) or a Python attribute set on a layer
    take a new trace. The variables are read at each call, so an optimizer's
    updates and assignments are what the next call sees; a variable the pass
    reads that the model does not hold (a layer reached through a `Lambda`)
    is passed in too on JAX, read as it is on TensorFlow, and runs the pass
    eagerly on PyTorch. What a trace cannot see is frozen at the first trace,
    as under `jax.jit` or `tf.function` themselves: attributes of Python
    objects that are not Keras layers, globals. Where a compiled pass could
    differ from the eager one the eager pass runs: inside a tracer or `jax.jit`, a Keras stateless
    or symbolic scope, a distribution, a torch.func transform, on float64 host
    data (which the eager pass converts), and on PyTorch for a pass that
    cannot be traced (a data-dependent op) or that assigns a variable. On JAX
    and TensorFlow the compiler fuses ops, so a result may differ from the
    op-by-op pass's in the last bit (as a compiled train step's does); every
    call of a signature gives the same bits.

    On PyTorch the pass reads the model's parameters as a torch module's call
    does: under `torch.func.functional_call` of a module holding the model (a
    host's agent that acts through this), the parameters given, replayed or
    eager, with `torch.func.grad` over them. (Keras's own call of the model
    reads its variables whatever a `functional_call` swapped.) Threads may
    call one `CompiledForward` at once; a `copy.deepcopy` or pickled copy
    holds a copy of the model and compiles its own passes.

    Args:
        model: a built `keras.Layer` (a `keras.Model`, a `keras.Sequential`):
            its variables exist. It is called positionally, with
            `training=False` (what `predict_on_batch` calls).

    Call arguments:
        *inputs: the model's inputs, positional: arrays, the backend's
            tensors, or another framework's arrays (DLPack; the values the
            same data gives as numpy: `multicritic.backend.foreign`).

    Returns:
        What `model(*inputs, training=False)` returns, as the backend's
        tensors (`keras.ops.convert_to_numpy` for the host).

    Examples:

    >>> import keras, numpy as np
    >>> from multicritic import CompiledForward
    >>> actor = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
    >>> act = CompiledForward(actor)
    >>> obs = np.ones((4, 4), "float32")
    >>> logits = keras.ops.convert_to_numpy(act(obs))
    >>> logits.shape
    (4, 2)
    >>> bool(np.allclose(logits, actor.predict_on_batch(obs), atol=1e-6))
    True

    Reference:
        Frostig et al., "Compiling machine learning programs via high-level
        tracing", SysML 2018 (JAX's tracing); Ansel et al., "PyTorch 2",
        ASPLOS 2024 (`make_fx`).
    """

    def __init__(self, model):
        if not isinstance(model, keras.Layer):
            raise ValueError(f"model: got {type(model).__name__}, expected a built keras.Layer or keras.Model.")
        if not model.built:
            raise ValueError(
                f"model: got the unbuilt {type(model).__name__} {model.name!r}, expected a built one (call it once "
                "on an input, or give it a keras.Input, so that its variables exist)."
            )
        self.model = model

    def _variables(self):
        return self.model.weights

    def _call(self, *inputs):
        return self.model(*inputs, training=False)

    def __call__(self, *inputs):
        if not inputs:
            raise ValueError("inputs: got none, expected the model's inputs, positional.")
        return backend_lib.current().replay(self.model, self._variables, "compiled_forward", self._call, inputs)
