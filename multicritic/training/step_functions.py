"""Keras's step functions of a critic, wrapped: one per batch signature, and the state kept when one raises.

A mixin of `KerasTraining` (before `keras.Model` in a critic's bases: `super()` reaches Keras's own
`make_*_function`).
"""

from __future__ import annotations

from multicritic.backend import contract as backend


class StepFunctions:
    """`make_train_function`, `make_test_function` and `make_predict_function`: Keras's, wrapped so that a
    step traced for one batch signature is never reused for another, batches skipped on a resumed `fit` are
    skipped, and a step that raises leaves every variable as it was."""

    def make_train_function(self, force=False):
        super().make_train_function(force)
        inner = self.train_function
        if inner is not None and not getattr(inner, "multicritic", False):
            select = self._per_signature("train", inner)

            def train_function(*args):
                fit = getattr(self, "_fit", None)
                if fit is None or fit.skip_batches <= 0:
                    return self._keep_state_on_error(select(args[-1]), args, self._train_groups)
                fit.skip_batches -= 1
                source = args[-1]
                if hasattr(source, "__next__"):  # TF and JAX pass an iterator, PyTorch the fetched batch
                    next(source)
                return ({}, args[0]) if len(args) == 2 else {}

            train_function.multicritic = True
            self.train_function = train_function
        return self.train_function

    def make_test_function(self, force=False):
        super().make_test_function(force)
        inner = self.test_function
        if inner is not None and not getattr(inner, "multicritic", False):
            select = self._per_signature("test", inner)

            def test_function(*args):
                return self._keep_state_on_error(select(args[-1]), args, self._test_groups)

            test_function.multicritic = True
            self.test_function = test_function
        return self.test_function

    def make_predict_function(self, force=False):
        super().make_predict_function(force)
        inner = self.predict_function
        if inner is not None and not getattr(inner, "multicritic", False):

            def predict_function(*args):
                return self._keep_state_on_error(inner, args, self._predict_groups)

            predict_function.multicritic = True
            self.predict_function = predict_function
        return self.predict_function

    def _per_signature(self, kind, first):
        """`select(source)`: Keras's step function of `kind` (`"train"`, `"test"`) for a batch source, one
        per batch signature where the backend names one (`Backend.keras_batch_signature`): a step traced for
        one horizon is never relaxed to another (the dream loss unrolls over a static horizon)."""
        functions = {}

        def select(source):
            key = backend.current().keras_batch_signature(source)
            if key is None:
                return first
            if not functions:
                functions[key] = first
            if key not in functions:
                functions[key] = self._fresh_function(kind)
            return functions[key]

        return select

    def _fresh_function(self, kind):
        """A new Keras step function of `kind`, leaving `self.<kind>_function` (the wrapper) as it is."""
        attribute = f"{kind}_function"
        wrapper = getattr(self, attribute)
        if kind == "train":
            super().make_train_function(force=True)
        else:
            super().make_test_function(force=True)
        fresh = getattr(self, attribute)
        setattr(self, attribute, wrapper)
        return fresh

    def _train_groups(self):
        return (
            self.trainable_variables,
            self.non_trainable_variables,
            self.optimizer.variables,
            self.metrics_variables,
        )

    def _test_groups(self):
        return self.trainable_variables, self.non_trainable_variables, self.metrics_variables

    def _predict_groups(self):
        return self.trainable_variables, self.non_trainable_variables

    def _keep_state_on_error(self, fn, args, groups):
        """Runs Keras's step function; a stateless backend (JAX: `args = (state, data)`) has taken the
        variables' values out of them for the step, and gets them back when the step raises (a batch
        refused while tracing), so that nothing changes."""
        try:
            return fn(*args)
        except Exception:
            if len(args) == 2:
                for variables, values in zip(groups(), args[0]):
                    for var, value in zip(variables, values):
                        var.assign(value)
            raise
