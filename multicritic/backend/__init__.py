"""How each framework runs the critic's math: the `Backend` contract and its switches (`contract`), one
implementation per framework (`jax`, `tensorflow`, `torch` with its `nn.Module` views, compiled step and
replay), and which Keras backend `import multicritic` picks (`selection`, imported before Keras). Nothing
outside this folder imports torch, jax or tensorflow for the critic's math.

0.1.0 kept the contract in this package's own module: `multicritic.backend.EAGER = True` and
`multicritic.backend.current()` still reach `multicritic.backend.contract` (a write too, so the switch is
not silently inert), with a `DeprecationWarning`, until `multicritic.moved.REMOVED_IN`.
"""

import importlib
import pathlib
import sys
import types
import warnings

# This package's modules: `from multicritic.backend import selection` asks the package for the name before it
# imports the module, which must not import the contract (and Keras) first.
MODULES = frozenset(path.stem for path in pathlib.Path(__file__).parent.glob("*.py"))


class ContractForwarding(types.ModuleType):
    """This package's module type: names it does not hold are read from and written to `contract`."""

    def __getattr__(self, name):
        if name.startswith("__") or name in MODULES:
            raise AttributeError(name)
        contract = importlib.import_module("multicritic.backend.contract")
        if not hasattr(contract, name):
            raise AttributeError(f"module 'multicritic.backend' has no attribute {name!r}")
        warnings.warn(moved_message(name), DeprecationWarning, stacklevel=2)
        return getattr(contract, name)

    def __setattr__(self, name, value):
        if name.startswith("__") or isinstance(value, types.ModuleType) or name in self.__dict__:
            return super().__setattr__(name, value)  # the import system's submodules, the package's own names
        contract = importlib.import_module("multicritic.backend.contract")
        if not hasattr(contract, name):
            return super().__setattr__(name, value)
        warnings.warn(moved_message(name), DeprecationWarning, stacklevel=2)
        setattr(contract, name, value)


def moved_message(name: str) -> str:
    from multicritic.moved import REMOVED_IN

    return (
        f"multicritic.backend.{name} moved to multicritic.backend.contract.{name}; the old spelling is "
        f"removed in multicritic {REMOVED_IN}"
    )


sys.modules[__name__].__class__ = ContractForwarding
