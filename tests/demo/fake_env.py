"""Fake environments for subprocess tests of the `multicritic` command.

- `noisy_site(dir)`: a `keras` that exits with code 99 and a line on stderr
  when imported, and a `tensorflow` that prints the absl/oneDNN start-up
  lines some CPUs get. On PYTHONPATH, a command that refuses its arguments
  before importing Keras still prints exactly one line, on any CPU.
- `blocking_site(dir)`: a `sitecustomize` that makes the top-level modules
  named in MULTICRITIC_TEST_BLOCK (comma-separated) not installed, as far as
  `importlib.util.find_spec` and `import` can tell (None in sys.modules): a
  backend can be "uninstalled" in any nox session.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

FAKE_KERAS_LINE = "FAKE KERAS IMPORTED"
NOISY_TF_LINES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1700000000.000000    1234 port.cc:153] oneDNN custom operations are on.",
)

# None in sys.modules: `import X` raises ModuleNotFoundError and
# `importlib.util.find_spec("X")` returns None, as for an absent package.
_BLOCKER = """
import os, sys

for _name in filter(None, os.environ.get("MULTICRITIC_TEST_BLOCK", "").split(",")):
    sys.modules[_name] = None
"""


def noisy_site(root: pathlib.Path) -> pathlib.Path:
    (root / "keras").mkdir(parents=True, exist_ok=True)
    (root / "keras" / "__init__.py").write_text(
        f"import sys\nsys.stderr.write({FAKE_KERAS_LINE + chr(10)!r})\nraise SystemExit(99)\n"
    )
    (root / "tensorflow").mkdir(exist_ok=True)
    (root / "tensorflow" / "__init__.py").write_text(
        f"import sys\nsys.stderr.write({chr(10).join(NOISY_TF_LINES) + chr(10)!r})\n"
    )
    return root


def blocking_site(root: pathlib.Path) -> pathlib.Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "sitecustomize.py").write_text(_BLOCKER)
    return root


def run(cmd, env=None, timeout=600, unset=()):
    """Runs `cmd` with os.environ updated by `env`, less the names in `unset`."""
    full = dict(os.environ, **(env or {}))
    for name in unset:
        full.pop(name, None)
    return subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=timeout)


def run_cli(*args, env=None, timeout=600, unset=()):
    return run([sys.executable, "-m", "multicritic", *args], env=env, timeout=timeout, unset=unset)


def with_pythonpath(path: pathlib.Path) -> str:
    old = os.environ.get("PYTHONPATH")
    return str(path) + (os.pathsep + old if old else "")
