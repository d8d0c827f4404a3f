"""Shape checks that raise clear `ValueError`s before any state changes."""

from __future__ import annotations

from typing import Dict, Optional, Tuple


def shape_of(x) -> Tuple[Optional[int], ...]:
    return tuple(None if d is None else int(d) for d in x.shape)


def fmt(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def compatible(a, b) -> bool:
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def check_same_shapes(tensors: Dict[str, object]) -> None:
    """All named tensors must have the shape of the first one."""
    items = [(name, shape_of(x)) for name, x in tensors.items() if x is not None]
    first, want = items[0]
    for name, got in items[1:]:
        if not compatible(got, want):
            raise ValueError(f"{name}: got shape {fmt(got)}, expected {fmt(want)} (the shape of {first}).")
