"""What the demo's numbers depend on, and the settings that make them the same on every x86-64 CPU.

The demo is float32 arithmetic whose rounding the CPU could change in three ways on JAX (each found on
jaxlib 0.10.2, the test-suite's pin; issue 72):

- The size of XLA's CPU thread pool (one thread per schedulable CPU): a dot's contraction is split across
  the pool's threads and their partial sums are added, so the order of the sums follows the pool. Seed 0 at
  scale 1e6 ends at 1.90 / 1.59 / 1.59 / 1.76 / 1.80% relative RMSE with 1 / 2 / 4 / 8 / 16 threads (the
  reported 1.76% is what 8 threads give). `PJRT_NPROC` sets the pool's size.
- The instructions: XLA compiles its fusions for the CPU it runs on, and the dots YNNPACK does not take go to
  Eigen, which calls oneDNN's sgemm, whose kernels are picked per instruction set. `--xla_cpu_max_isa=AVX2`
  and `ONEDNN_MAX_CPU_ISA=AVX2` give an AVX-512 CPU the code an AVX2 one runs.
- The math library: by default XLA's rsqrt (the layer norms) starts from the CPU's own estimate
  (`rsqrtps`), whose bits the instruction set leaves to each implementation (an emulated Haswell's differ from
  the EPYC's); `--xla_cpu_enable_platform_dependent_math=false` computes it the same way everywhere.

With these set, five training steps of the demo end in the same bits on this project's AMD EPYC (AVX-512, 2
CPUs) as under an emulated Intel Haswell (AVX2, `qemu-x86_64 -cpu Haswell`), with 1 or 2 CPUs; without them
they do not. `pin` sets them before JAX starts its CPU client, which reads them once; the user's own
settings of the same names are kept. XLA aborts the process on a flag it does not know, so the flags are set
only on the jaxlib releases in `CHECKED_JAXLIB`, the rest of the pins everywhere.

Other backends are not pinned (their thread pools and kernels may move their numbers too; not measured);
`environment()` records what a run had on every backend.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from typing import Dict, List, Optional, Tuple

# Set where the user has not set them: variables the JAX CPU client reads when it starts.
PINNED_ENV = {"PJRT_NPROC": "2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
PINNED_XLA_FLAGS = ("--xla_cpu_max_isa=AVX2", "--xla_cpu_enable_platform_dependent_math=false")
# (major, minor) of the jaxlib releases whose XLA knows PINNED_XLA_FLAGS and on which the pins were checked.
CHECKED_JAXLIB: Tuple[Tuple[int, int], ...] = ((0, 10),)
# `MULTICRITIC_DEMO_PIN=0`: leave JAX as it is (all the CPUs' threads, the CPU's own kernels).
OPT_OUT = "MULTICRITIC_DEMO_PIN"
# The /proc/cpuinfo flags that pick kernels and code paths in XLA, oneDNN, YNNPACK and numpy.
ISA_FLAGS = re.compile(r"^(sse4_[12]|avx|avx2|fma|f16c|avx512\w*|avx_vnni\w*|amx\w*)$")

_last: Dict[str, object] = {"pinned": False, "reason": "the demo has not run in this process"}
_before_start: Optional[Dict[str, object]] = None  # this process's pin made before JAX started, if any


def _version_tuple(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def _jaxlib_version() -> Optional[str]:
    try:
        from importlib.metadata import version

        return version("jaxlib")
    except Exception:  # not installed, or metadata unreadable: no flag is known to be safe
        return None


def _jax_started() -> bool:
    """Whether JAX's backends (and so XLA's flags and thread pool) already exist in this process."""
    if "jax" not in sys.modules:
        return False
    # Read from the imported module, not imported here: no framework code outside multicritic.backend.
    bridge = sys.modules.get("jax._src.xla_bridge")
    try:
        return bool(bridge.backends_are_initialized())
    except Exception:  # a JAX without that function: assume the worst, that the settings come too late
        return True


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


def pin(backend: str, environ=None, jaxlib_version: Optional[str] = None, started: Optional[bool] = None) -> dict:
    """Sets the pins in `environ` (default `os.environ`) where they can still act and returns what the run
    has, also kept for `environment()`: `{"pinned": bool, "reason": str, "settings": {name: value}}`.

    `jaxlib_version` and `started` (whether JAX's backends exist) default to this process's."""
    global _before_start
    environ = os.environ if environ is None else environ
    record: Dict[str, object]
    if backend != "jax":
        record = {"pinned": False, "reason": f"backend {backend}: only JAX is pinned"}
    elif environ.get(OPT_OUT, "") == "0":
        record = {"pinned": False, "reason": f"{OPT_OUT}=0"}
    elif _jax_started() if started is None else started:
        # XLA kept what it read when it started: an earlier pin of this process, else the defaults.
        record = dict(_before_start or {"pinned": False, "reason": "JAX had already started in this process"})
    else:
        jaxlib = _jaxlib_version() if jaxlib_version is None else jaxlib_version
        for name, value in PINNED_ENV.items():
            environ.setdefault(name, value)
        flags_known = jaxlib is not None and _version_tuple(jaxlib) in CHECKED_JAXLIB
        if flags_known:
            present = environ.get("XLA_FLAGS", "").split()
            names = {_flag_name(f) for f in present}
            added = [f for f in PINNED_XLA_FLAGS if _flag_name(f) not in names]
            environ["XLA_FLAGS"] = " ".join(present + added)
        chosen = {name: environ[name] for name in PINNED_ENV} | {"XLA_FLAGS": environ.get("XLA_FLAGS", "")}
        own = [name for name, value in PINNED_ENV.items() if chosen[name] != value]
        own += [f for f in PINNED_XLA_FLAGS if flags_known and f not in chosen["XLA_FLAGS"].split()]
        if not flags_known:
            checked = ", ".join(f"{major}.{minor}" for major, minor in CHECKED_JAXLIB)
            record = {"pinned": False, "reason": f"jaxlib {jaxlib}: XLA flags checked on {checked} only"}
        elif own:
            record = {"pinned": False, "reason": "the environment sets " + ", ".join(own)}
        else:
            record = {"pinned": True, "reason": "threads, instruction set and math pinned"}
        record["settings"] = chosen
        if environ is os.environ:
            _before_start = dict(record)
    _last.clear()
    _last.update(record)
    return dict(record)


def describe(record: dict) -> str:
    """One line for the demo's output."""
    if record.get("pinned"):
        return f"numerics: pinned so that CPUs agree (2 XLA threads, AVX2 code, portable math; {OPT_OUT}=0 lifts it)"
    return f"numerics: not pinned ({record.get('reason')}); the numbers may differ between CPUs"


def cpu() -> dict:
    """This machine's processor: model, the instruction-set flags that pick kernels, schedulable CPUs."""
    info: Dict[str, object] = {"machine": platform.machine(), "model": platform.processor() or None, "isa": []}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:  # not Linux
        text = ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    if model:
        info["model"] = model.group(1).strip()
    if flags:
        info["isa"] = sorted(f for f in flags.group(1).split() if ISA_FLAGS.match(f))
    info["cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return info


def _versions(backend: str) -> Dict[str, Optional[str]]:
    from importlib.metadata import PackageNotFoundError, version

    names: List[str] = ["keras", "numpy"] + {
        "jax": ["jax", "jaxlib"],
        "torch": ["torch"],
        "tensorflow": ["tensorflow", "tensorflow-cpu"],
    }.get(backend, [])
    found: Dict[str, Optional[str]] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            if name != "tensorflow-cpu":
                found[name] = None
    return found


def environment(backend: str) -> dict:
    """What a demo run's numbers depend on: Python and package versions, the CPU, and what `pin` did."""
    return {
        "python": platform.python_version(),
        "versions": _versions(backend),
        "cpu": cpu(),
        "numerics": dict(_last),
    }
