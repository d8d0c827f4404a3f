"""One nox session per entry of backends_matrix.yaml: the test-suite on each backend, and the tool sessions.

`nox` runs them all but those marked `default: false` (the `oldest` session: the
declared lower bounds); `nox -s torch` runs one, such a session too; `nox -s jax -- -k two_hot` passes
arguments to pytest. An entry with a `command` (the `docs` and `package`
sessions), or `commands` (several, `lint`), installs only its own `packages` and
runs them instead.
Each session's virtualenv is deleted when the session ends, so the disk
holds one session's packages at a time;
`MULTICRITIC_KEEP_VENVS=1` keeps them under `.nox/` to rerun a test by hand.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import urllib.parse

import nox
import yaml

ROOT = pathlib.Path(__file__).parent
MATRIX = yaml.safe_load((ROOT / "backends_matrix.yaml").read_text())

nox.options.default_venv_backend = "virtualenv"  # pip-based: see backends_matrix.yaml
nox.options.reuse_existing_virtualenvs = False
KEEP_VENVS = os.environ.get("MULTICRITIC_KEEP_VENVS", "") not in ("", "0")


def _flat(items):
    for item in items:
        if isinstance(item, list):
            yield from _flat(item)
        else:
            yield item


def _reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether a connection to `url`'s host opens within `timeout` seconds."""
    parts = urllib.parse.urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _name(requirement) -> str:
    """The project name a pip requirement (`keras==3.15.1`, `ray[rllib]==2.60.0`) installs, lower case."""
    return re.split(r"[\[<>=!~ ;]", str(requirement), maxsplit=1)[0].lower()


def _with_own_pins(common, own) -> list:
    """`common`'s requirements less those of a package that `own` also pins (pip refuses two pins of one
    package), then `own`'s."""
    own = list(own)
    names = {_name(r) for r in own}
    return [r for r in common if _name(r) not in names] + own


def _install_from_their_indexes(s: nox.Session, packages) -> None:
    """Installs each of `packages` that `package_indexes` names from that index (the pin, nothing else), where
    the index can be reached; the session's install that follows then finds it satisfied."""
    for requirement in packages:
        url = MATRIX.get("package_indexes", {}).get(_name(requirement))
        if url is None:
            continue
        if _reachable(url):
            s.install(requirement, "--index-url", url)
        else:
            s.warn(f"{url} cannot be reached: {requirement} is taken from this machine's package indexes instead.")


def _make_session(name: str, spec: dict):
    def session(s: nox.Session) -> None:
        try:
            _run_suite(s)
        finally:
            if not KEEP_VENVS and not spec.get("no_venv"):
                shutil.rmtree(s.virtualenv.location, ignore_errors=True)

    commands = spec.get("commands", [spec["command"]] if "command" in spec else [])

    def _run_suite(s: nox.Session) -> None:
        common = MATRIX.get("common", {})
        env = {**common.get("env", {}), **spec.get("env", {}), "KERAS_BACKEND": spec["backend"]}
        env = {k: str(v).replace("{venv}", str(s.virtualenv.location)) for k, v in env.items()}
        if commands:  # a tool session: its packages, its commands (the checkout is not installed)
            s.install(*_flat(spec["packages"]))
            for command in commands:
                s.run(
                    *(str(a).replace("{venv}", str(s.virtualenv.location)) for a in _flat(command)),
                    *s.posargs,
                    env=env,
                )
            return
        _install_from_their_indexes(s, _flat(spec["packages"]))
        s.install(*_with_own_pins(_flat(common.get("packages", [])), _flat(spec["packages"])))
        s.install("-e", ".[test]")
        # Fail early if Keras does not really run on this session's backend.
        s.run(
            "python",
            "-c",
            "import keras, sys; b = keras.backend.backend(); print('keras', keras.__version__, 'backend', b); "
            f"sys.exit(0 if b == {spec['backend']!r} else 'wrong backend: ' + b)",
            env=env,
        )
        args = [*_flat(common.get("pytest_args", [])), *_flat(spec.get("pytest_args", []))]
        s.run("pytest", *args, *s.posargs, env=env)

    session.__name__ = name.replace("-", "_")
    session.__doc__ = (
        "; ".join(" ".join(map(str, _flat(c))) for c in commands) + f" (Keras backend {spec['backend']!r})"
        if commands
        else f"Test-suite on Keras backend {spec['backend']!r} ({', '.join(_flat(spec['packages']))})."
    )
    return nox.session(name=name, python=False if spec.get("no_venv") else None)(session)


for _session, _spec in MATRIX["sessions"].items():
    globals()[_session.replace("-", "_")] = _make_session(_session, _spec)

# A bare `nox` runs these; `nox -s NAME` any session. (`nox.options.sessions`, not nox.session's `default`:
# it works with every nox release.)
nox.options.sessions = [name for name, spec in MATRIX["sessions"].items() if spec.get("default", True)]
