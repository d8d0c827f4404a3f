"""A critic's file methods: sealed `.weights.h5` files and exports, kept out of the model's class.

`CriticNetwork` inherits them; the work is `multicritic.files.weights`'s and `multicritic.files.export`'s.
"""

from __future__ import annotations

from multicritic.files import export as export_lib
from multicritic.files import weights


class FileMethods:
    """`save_weights`, `load_weights` and `export` of a critic (a mixin of `CriticNetwork`, before
    `keras.Model` in its bases: `super()` reaches Keras's own methods)."""

    def save_weights(self, filepath, overwrite=True, **kwargs):
        """Keras's `save_weights` (`.weights.h5`), plus this critic's config and a SHA-256 seal.

        The file is written atomically; Keras and h5py read it as any
        `.weights.h5`. `load_weights` refuses it when it was corrupted,
        or into a critic of another configuration.
        """
        return weights.save_weights(
            self, filepath, overwrite, lambda tmp: super(FileMethods, self).save_weights(tmp, **kwargs)
        )

    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """Keras's `load_weights`, all or nothing.

        Everything is checked before the first weight changes: the file's
        seal (files this critic wrote), its saved config against this
        critic's (bins, sizes, options: a `ValueError` lists what differs),
        the set of arrays (none missing, none extra), every shape and dtype,
        and that every value is finite. A `.weights.h5` written by plain
        Keras (no config, no seal) gets every check but those two.
        """
        weights.load_weights(
            self,
            filepath,
            skip_mismatch,
            lambda tmp: super(FileMethods, self).save_weights(tmp),
            lambda tmp: super(FileMethods, self).load_weights(tmp, **kwargs),
        )

    @classmethod
    def from_weights_file(cls, filepath, **overrides):
        """The critic a file holds: built from the configuration saved in it, its weights loaded.

        `filepath`: a `.weights.h5` written by `save_weights` (its root attribute
        `multicritic_config` holds the critic's `get_config()`) or a `.keras`
        archive (`critic.save`; `keras.models.load_model` reads it too, and
        restores the compiled state). The weights load with every check of
        `load_weights`. A `.weights.h5` written by plain Keras has no
        configuration: a `ValueError` says so (build the critic, then
        `load_weights`).

        Args:
            filepath: the file, a str or os.PathLike.
            **overrides: options to build with instead of the saved ones,
                e.g. `dtype="mixed_bfloat16"` or `name`; an architecture
                option that differs from the file's makes `load_weights`
                refuse it, naming the difference.

        Returns:
            The critic, built, with the file's fast and EMA weights.

        Examples:
            >>> critic.save_weights("critic.weights.h5")
            >>> same = CriticNetwork.from_weights_file("critic.weights.h5")
        """
        return weights.from_file(cls, filepath, overrides)

    def export(
        self,
        filepath,
        format="tf_saved_model",
        verbose=None,
        input_signature=None,
        use_ema=False,
        compute_dtype="float32",
        **kwargs,
    ):
        """Exports the critic for serving: `(h, z) -> (value_real, value_symlog, logits)`, any batch size.

        A SavedModel's `serving_default` signature names its inputs `h` and `z` and its outputs
        `value_real`, `value_symlog` and `logits`.

        Through Keras's `Model.export`, from the backends where Keras supports
        the format with a dynamic batch: `"tf_saved_model"` (TensorFlow, JAX),
        `"onnx"` (all three), `"litert"` (TensorFlow) and `"torch"` (PyTorch: a
        `torch.export` program, `torch.export.load` reads it); other pairs raise a
        `ValueError` naming the supported ones. `multicritic.files.export.load_exported`
        runs an export with its own runtime (TensorFlow, onnxruntime, LiteRT, PyTorch).

        Args:
            filepath: a directory (`tf_saved_model`), a `.onnx`, a `.tflite` or a
                `.pt2` file, in an existing directory (a path of the other kind is
                refused).
            format: `"tf_saved_model"`, `"onnx"`, `"litert"` or `"torch"`.
            use_ema: True or False: export the EMA (slow) critic instead of
                the fast one.
            compute_dtype: `"float32"` (default): a critic trained under a
                mixed precision policy is exported computing in float32 with
                its (float32) weights, which every runtime runs as Keras
                does; `None`: the critic's own policy (ONNX Runtime and LiteRT
                have no CPU kernels for some bfloat16 / float16 ops).
            verbose: as Keras's `Model.export` (True, False or None); False also
                silences the converters' warnings (PyTorch's tracer's), so nothing
                is printed.
            input_signature: as Keras's `Model.export` (default: `h [None,
                gru_units]`, `z [None, cats, classes]`, float32; a features
                critic's `x [None, input_size]`).
            **kwargs: passed to Keras's `Model.export`; options the format
                does not take are refused (`tf_saved_model`: `is_static`,
                `jax2tf_kwargs`; `onnx`: `opset_version`; `litert`: the
                TFLite converter's attributes, which Keras checks; `torch`:
                `strict`, `dynamic_shapes`, by default a dynamic batch).
        """
        if input_signature is not None:
            kwargs["input_signature"] = input_signature
        return export_lib.export(
            self, filepath, format=format, verbose=verbose, use_ema=use_ema, compute_dtype=compute_dtype, **kwargs
        )
