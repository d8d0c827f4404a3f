"""Registries of the critic's parts: a name for each head and trunk class, imported on first use.

A part is a Keras layer class registered under a name (`multicritic.heads.HEADS`,
`multicritic.trunks.TRUNKS`). The critic takes a part as that name, as a
configured instance or as its saved spec `{"class_name": name, "config":
own_options}`. A part's options are split in two: the *shared* options the
critic gives every part of the kind (a head's support, a trunk's sizes and
norm), and the part's *own* options (`HLGaussHead`'s `sigma`), which live in
the part's `get_config` and travel in the critic's config as the spec.

No Keras here: the names (and a part's keras-free traits, such as the bin
schemes a head supports) are read by the command line before Keras is
imported.
"""

from __future__ import annotations

import contextlib
import importlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Tuple

# Keys of every Keras layer's config (Keras's, not the layer's options).
KERAS_KEYS = ("name", "trainable", "dtype")
# Those, and the ensemble size the critic sets: neither is a part's own option.
LAYER_KEYS = KERAS_KEYS + ("members",)


@dataclass(frozen=True)
class Declaration:
    """Where a registered part's class lives (`"module:Class"`), and what can be known of it without Keras."""

    path: str
    traits: Dict[str, Any] = field(default_factory=dict)
    cls: Any = None  # the class itself, for a part registered at run time


def declare(path: str, **traits) -> Declaration:
    """A registry entry: the class at `path` (`"package.module:Class"`) with keras-free `traits`."""
    return Declaration(path, dict(traits))


@contextlib.contextmanager
def _python_random_kept():
    # Keras seeds a new layer's unseeded initializers from Python's `random`: the parts built here only to be
    # compared are thrown away, and a host's random stream is left as it was.
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


class Registry(Mapping):
    """`name -> part class`, each class imported when it is first looked up.

    Args:
        kind: what the parts are (`"head"`, `"trunk"`): the argument named in errors.
        declarations: `{name: declare("module:Class", **traits)}`.
        shared: the options the critic gives every part of this kind.
    """

    def __init__(self, kind: str, declarations: Mapping[str, Declaration], shared: Tuple[str, ...]):
        self.kind = kind
        self.shared = tuple(shared)
        self._declared = dict(declarations)
        self._loaded: Dict[str, type] = {}  # classes imported once (a traced step looks them up as constants)

    def __getitem__(self, name):
        loaded = self._loaded.get(name)
        if loaded is not None:
            return loaded
        declared = self._declared[name]
        if declared.cls is not None:
            return declared.cls
        module, _, attr = declared.path.partition(":")
        loaded = self._loaded[name] = getattr(importlib.import_module(module), attr)
        return loaded

    def register(self, name: str, part, **traits) -> None:
        """Registers `part` (a class, or a `"module:Class"` path) as `name`, for a part defined outside the
        package (the package's own parts are declared where the registry is made)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: got {name!r}, expected a non-empty string.")
        if name in self._declared:
            raise ValueError(f"name: got {name!r}, expected a name not registered yet ({list(self)}).")
        if isinstance(part, str):
            self._declared[name] = Declaration(part, dict(traits))
        elif isinstance(part, type):
            self._declared[name] = Declaration(f"{part.__module__}:{part.__qualname__}", dict(traits), part)
        else:
            raise ValueError(f"part: got {part!r}, expected a class or a 'module:Class' path.")

    def unregister(self, name: str) -> None:
        """Removes a part `register` added."""
        self._declared.pop(self.checked_name(name))
        self._loaded.pop(name, None)

    def __contains__(self, name) -> bool:
        return name in self._declared  # (Mapping's would import the class)

    def __iter__(self) -> Iterator[str]:
        return iter(self._declared)

    def __len__(self) -> int:
        return len(self._declared)

    def path(self, name: str) -> str:
        """Where `name`'s part is defined, `"module.Class"` (the name it is declared under)."""
        return self._declared[self.checked_name(name)].path.replace(":", ".")

    def modules(self) -> Dict[str, str]:
        """`{class name: module}` of every registered part (what the kind's package exports, imported on first
        use)."""
        return {d.path.partition(":")[2]: d.path.partition(":")[0] for d in self._declared.values()}

    def traits(self, name: str) -> Dict[str, Any]:
        """The keras-free traits registered with `name`."""
        return dict(self._declared[self.checked_name(name)].traits)

    def checked_name(self, name) -> str:
        """`name` if registered, else a `ValueError` naming this registry's argument."""
        if not isinstance(name, str) or name not in self._declared:
            raise ValueError(
                f"{self.kind}: got {name!r}, expected one of {list(self)}, a registered class or a configured "
                "instance of one."
            )
        return name

    def name_of(self, part) -> str:
        """The name a part (an instance or a class) is registered under, else a `ValueError`."""
        cls = part if isinstance(part, type) else type(part)
        for name in self._declared:
            if self[name] is cls:
                return name
        raise ValueError(
            f"{self.kind}: got a {cls.__name__}, which is not registered; expected one of {list(self)} (a new "
            f"{self.kind} is registered in multicritic.{self.kind}s)."
        )

    def own_options(self, part) -> Dict[str, Any]:
        """The options of `part`'s config that are its own: neither Keras's, the ensemble's, nor shared."""
        skip = set(LAYER_KEYS) | set(self.shared)
        return {k: v for k, v in part.get_config().items() if k not in skip}

    def spec(self, part) -> Dict[str, Any]:
        """`{"class_name": registered name, "config": own options}`: how the critic's config stores a part."""
        return {"class_name": self.name_of(part), "config": self.own_options(part)}

    def resolve(self, part, shared: Mapping[str, Any]) -> Tuple[type, Dict[str, Any]]:
        """`(class, own options)` of a part given as a name, a registered class, a spec or an instance.

        The shared options are the critic's (`shared`). An instance's shared
        options must be its class's defaults (then the critic's apply) or the
        critic's own, and a spec's config may name only the critic's own:
        anything else is a `ValueError` naming the option, as the critic
        cannot hold two supports or two sizes at once.
        """
        if isinstance(part, str):
            return self[self.checked_name(part)], {}
        if isinstance(part, type):  # a registered class, as its name: built with the critic's shared options
            return self[self.name_of(part)], {}
        if isinstance(part, Mapping):
            if set(part) - {"class_name", "config"} or not isinstance(part.get("config", {}), Mapping):
                raise ValueError(
                    f"{self.kind}: got {dict(part)!r}, expected a name, an instance or a spec "
                    "{'class_name': name, 'config': {...}}."
                )
            cls = self[self.checked_name(part.get("class_name"))]
            options = dict(part.get("config", {}))
            for key in sorted(set(options) & set(self.shared) & set(shared)):
                if options.pop(key) != shared[key]:
                    raise self._not_the_critics("a spec whose config has", key, part["config"][key], shared[key])
            with _python_random_kept():
                cls(**options, **shared)  # checks the options now, each naming itself
            return cls, options
        cls = self[self.name_of(part)]
        options = self.own_options(part)
        with _python_random_kept():
            given, default = part.get_config(), cls(**options).get_config()
            wanted = cls(**options, **shared).get_config()
        for key in self.shared:
            if given.get(key) != default.get(key) and given.get(key) != wanted.get(key):
                raise self._not_the_critics(f"a {cls.__name__} with", key, given.get(key), wanted.get(key))
        return cls, options

    def _not_the_critics(self, what: str, key: str, got, critic) -> ValueError:
        """The error for a part given a shared option other than the critic's, `what` saying how it was given."""
        return ValueError(
            f"{self.kind}: got {what} {key}={got!r}, while the critic has {key}={critic!r}; give {key} to the "
            "critic (it is shared by its parts)."
        )

    def canonical(self, part, shared: Mapping[str, Any]) -> Dict[str, Any]:
        """The spec the critic would store for `part` (a name, a spec or an instance)."""
        cls, options = self.resolve(part, shared)
        with _python_random_kept():
            return self.spec(cls(**options, **shared))
