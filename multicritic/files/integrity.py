"""What every loader shares: sealed files, config comparison and array checks, all before any assignment.

A file written by multicritic (`.weights.h5`, trainer `.npz`) ends with a
seal: one line holding the SHA-256 of every byte before it. HDF5 and zip
readers ignore trailing bytes, so a sealed file stays a valid file for Keras,
h5py and numpy; a loader reads the bytes once, checks the seal, and parses
those same bytes (never the file again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np

SEAL_PREFIX = b"\n#multicritic-sha256:"
_SEAL = re.compile(rb"\n#multicritic-sha256:([0-9a-f]{64})\n\Z")
_SEAL_LENGTH = len(SEAL_PREFIX) + 64 + 1


def sealed_bytes(data: bytes) -> bytes:
    return data + SEAL_PREFIX + hashlib.sha256(data).hexdigest().encode() + b"\n"


def write_sealed(path: str, write: Callable[[str], None], suffix: str) -> str:
    """Calls `write(tmp_path)`, seals what it wrote and moves it to `path` in one step.

    A crash leaves either the old file or the new one, never half of one.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".multicritic-", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            data = f.read()
        with open(tmp, "wb") as f:
            f.write(sealed_bytes(data))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def read_file(path, what: str) -> Tuple[bytes, Optional[bool]]:
    """`(content, sealed)`: the bytes before the seal and whether a seal was found.

    `sealed` is True for an intact seal, None for a file with no seal.
    Raises a `ValueError` naming `what` for an unreadable file or a seal that
    does not match (a corrupted or altered file).
    """
    try:
        with open(os.fspath(path), "rb") as f:
            data = f.read()
    except (OSError, TypeError) as err:
        raise ValueError(f"{what}: {path!r} is not a readable file ({err}).") from err
    match = _SEAL.search(data[-_SEAL_LENGTH:])
    if match is None:
        if SEAL_PREFIX in data[-4 * _SEAL_LENGTH :]:
            raise ValueError(f"{what}: {path!r} has a damaged multicritic seal; the file is corrupted.")
        return data, None
    content = data[: len(data) - _SEAL_LENGTH]
    if hashlib.sha256(content).hexdigest().encode() != match.group(1):
        raise ValueError(
            f"{what}: {path!r} fails its SHA-256 check (the file was corrupted or altered after it was written)."
        )
    return content, True


def config_differences(saved: Mapping, current: Mapping, ignore: Iterable[str] = ()) -> List[str]:
    """`["key: saved X, this one Y", ...]` for every key whose values differ (JSON-normalised)."""
    ignore = set(ignore)
    out = []
    for key in sorted((set(saved) | set(current)) - ignore):
        a, b = saved.get(key, "<missing>"), current.get(key, "<missing>")
        if json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            out.append(f"{key}: saved {a!r}, this one {b!r}")
    return out


def check_arrays(
    what: str,
    arrays: Mapping[str, object],
    expected: Mapping[str, Tuple[Tuple[int, ...], str]],
) -> Dict[str, np.ndarray]:
    """Checks named arrays against `{name: (shape, dtype)}` and returns them as numpy arrays.

    Every name must be there and nothing else; shapes must be equal, dtypes
    convertible without loss of meaning (numeric to the variable's dtype),
    floats finite. Raises a `ValueError` for the first problem, so a caller
    that assigns only after this returns changes nothing on bad input.
    """
    missing = [k for k in expected if k not in arrays]
    extra = [k for k in arrays if k not in expected]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if extra:
            parts.append(f"unexpected {extra[:5]}{' ...' if len(extra) > 5 else ''}")
        raise ValueError(
            f"{what}: holds {len(arrays)} arrays, expected {len(expected)}: {'; '.join(parts)} (another architecture?)."
        )
    out = {}
    for name, (shape, dtype) in expected.items():
        try:
            array = np.asarray(arrays[name])
        except Exception as err:  # a ragged or otherwise unconvertible object
            raise ValueError(f"{what}: {name}: got an object that is not an array ({err}).") from err
        if tuple(array.shape) != tuple(shape):
            raise ValueError(f"{what}: {name}: got shape {list(array.shape)}, expected {list(shape)}.")
        want = np.dtype(dtype)
        numeric = array.dtype.kind in "fiu"
        if array.dtype != want and not (numeric and (want.kind == "f" or array.dtype.kind in "iu")):
            raise ValueError(f"{what}: {name}: got dtype {array.dtype}, expected {want} (a number array).")
        with np.errstate(over="ignore", invalid="ignore"):
            converted = array.astype(want)
        if want.kind == "f" and not np.isfinite(converted).all():
            bad = int((~np.isfinite(converted)).sum())
            raise ValueError(f"{what}: {name}: got {bad} non-finite value(s) (as {want}), expected finite values.")
        if want.kind in "iu" and not np.array_equal(converted, array):
            raise ValueError(f"{what}: {name}: got values that do not fit dtype {want}.")
        out[name] = converted
    return out
