"""Old import paths of modules that moved, kept working for one release with a `DeprecationWarning`.

0.1.0 had 22 flat modules; 0.2.0 lays the package out by role (`math/`,
`model/`, `training/`, `files/`, `backend/`, `cli/`). `import multicritic.bins`
(and `from multicritic.bins import symlog`) still gives the moved module
itself, `multicritic.math.bins`, the same object, after a warning that names
the new path and the release that removes the old one. The names of the
package's top level (`multicritic.CriticNetwork`, ...) are unchanged and
never warn.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

REMOVED_IN = "0.3.0"

# old module -> where it lives now (the two legacy shims of 0.1.0 included: `multicritic.rllib` and the
# two-hot head's first home).
MOVED = {
    "multicritic.bins": "multicritic.math.bins",
    "multicritic.returns": "multicritic.math.returns",
    "multicritic.losses": "multicritic.math.losses",
    "multicritic.ema": "multicritic.math.ema",
    "multicritic.draws": "multicritic.math.draws",
    "multicritic.sizes": "multicritic.model.sizes",
    "multicritic.critic": "multicritic.model.critic",
    "multicritic.critic_options": "multicritic.model.options",
    "multicritic.members": "multicritic.model.members",
    "multicritic.multi_critic": "multicritic.model.multi_critic",
    "multicritic.normalizer": "multicritic.model.normalizer",
    "multicritic.keras_training": "multicritic.training.fit",
    "multicritic.callbacks": "multicritic.training.callbacks",
    "multicritic.optimizers": "multicritic.training.optimizers",
    "multicritic.presets": "multicritic.training.presets",
    "multicritic.weights_file": "multicritic.files.weights",
    "multicritic.integrity": "multicritic.files.integrity",
    "multicritic.export": "multicritic.files.export",
    "multicritic.backend.runtimes": "multicritic.files.runtimes",
    "multicritic.backend_default": "multicritic.backend.selection",
    "multicritic.check": "multicritic.cli.check",
    "multicritic.rllib": "multicritic.interop.rllib",
    "multicritic.layers.reward_predictor": "multicritic.heads.two_hot",
}


def message(old: str) -> str:
    return (
        f"{old} moved to {MOVED[old]}; the old path is removed in multicritic {REMOVED_IN}: "
        f"import {MOVED[old]} (or the name from `multicritic` itself)"
    )


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old path to the moved module: after `exec_module`, the import system returns what
    `sys.modules` holds under the old name, which is the moved module itself."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return None  # a placeholder module; exec_module swaps it for the moved one

    def exec_module(self, module):
        warnings.warn(message(module.__name__), DeprecationWarning, stacklevel=2)
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


def install() -> None:
    """Puts the finder on `sys.meta_path` (once)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
