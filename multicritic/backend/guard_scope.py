"""A trace-time switch under which the one-source layers leave out their overflow guards.

The MLP keeps every finite input's outputs finite with two guards: its first
Dense runs on the input times 2^-32, and a fused normalisation first brings
rows past 2^56 down to that (`multicritic.layers.layer_norm`). Neither
changes a value unless a row is far outside float32's working range, yet in
an eager PyTorch forward pass they cost a sixth of the time (the scaled
input is a fresh copy the matmul must read).

A runtime that can tell cheaply, after the fact, that no guard would have
acted traces the layers a second time with the guards left out and checks
each call (`torch_replay`: from the normalisations' own row statistics),
running the guarded pass for a batch that fails the check. The math stays
one source; only which guards are traced changes.
"""

from __future__ import annotations

import contextlib
import threading

_STATE = threading.local()


class Unguarded:
    """What the layers report while traced without guards: `normalizations`, the fused normalisations that
    left out their row guard (the runtime must check each one's row statistics), and `unchecked`, the
    normalisations that give the runtime no statistics to check (then it must not use the trace)."""

    def __init__(self):
        self.normalizations = 0
        self.unchecked = 0


def left_out():
    """The open `Unguarded` record while a runtime traces without guards, else None."""
    return getattr(_STATE, "record", None)


@contextlib.contextmanager
def without_guards():
    """Traces run inside leave the overflow guards out; yields the `Unguarded` record they fill."""
    previous, record = left_out(), Unguarded()
    _STATE.record = record
    try:
        yield record
    finally:
        _STATE.record = previous
