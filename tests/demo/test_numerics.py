"""Issue 72: the demo's numbers on JAX moved with the CPU (1.76% instead of the README's 1.59% at scale 1e6 on an
8-CPU machine). `multicritic.demo.numerics` pins what they took from it, and the result file records the rest."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from multicritic.demo import numerics
from tests.conftest import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKED = "0.10.2"
FLAGS = "--xla_cpu_max_isa=AVX2 --xla_cpu_enable_platform_dependent_math=false"


def test_pin_sets_threads_instruction_set_and_math_before_jax_starts():
    env = {}
    record = numerics.pin("jax", env, jaxlib_version=CHECKED, started=False)
    assert env == {"PJRT_NPROC": "2", "ONEDNN_MAX_CPU_ISA": "AVX2", "XLA_FLAGS": FLAGS}
    assert record == {"pinned": True, "reason": "threads, instruction set and math pinned", "settings": env}


def test_pin_keeps_the_users_flags_and_adds_its_own_after_them():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    assert numerics.pin("jax", env, jaxlib_version=CHECKED, started=False)["pinned"]
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4 " + FLAGS


def test_the_users_own_setting_of_a_pinned_name_wins_and_the_run_says_it_is_not_pinned():
    env = {"PJRT_NPROC": "8", "XLA_FLAGS": "--xla_cpu_max_isa=AVX512"}
    record = numerics.pin("jax", env, jaxlib_version=CHECKED, started=False)
    assert env["PJRT_NPROC"] == "8"
    assert env["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX512 --xla_cpu_enable_platform_dependent_math=false"
    assert record["pinned"] is False
    assert record["reason"] == "the environment sets PJRT_NPROC, --xla_cpu_max_isa=AVX2"


def test_no_xla_flag_reaches_a_jaxlib_the_flags_were_not_checked_on():
    # jaxlib 0.4.34's XLA knows neither flag's name, and XLA aborts the process on an unknown flag.
    env = {}
    record = numerics.pin("jax", env, jaxlib_version="0.4.34", started=False)
    assert "XLA_FLAGS" not in env and env == {"PJRT_NPROC": "2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert record["pinned"] is False and record["reason"] == "jaxlib 0.4.34: XLA flags checked on 0.10 only"


def test_a_pin_made_before_jax_started_holds_for_the_later_runs_of_the_process(monkeypatch):
    earlier = {"pinned": True, "reason": "threads, instruction set and math pinned", "settings": {"PJRT_NPROC": "2"}}
    monkeypatch.setattr(numerics, "_before_start", earlier)
    env = {}
    assert numerics.pin("jax", env, jaxlib_version=CHECKED, started=True) == earlier and env == {}
    assert numerics.environment("jax")["numerics"] == earlier


@pytest.mark.parametrize(
    "backend, env, started, reason",
    [
        ("jax", {}, True, "JAX had already started in this process"),
        ("jax", {"MULTICRITIC_DEMO_PIN": "0"}, False, "MULTICRITIC_DEMO_PIN=0"),
        ("torch", {}, False, "backend torch: only JAX is pinned"),
    ],
)
def test_pin_changes_nothing_where_it_cannot_act(backend, env, started, reason):
    before = dict(env)
    assert numerics.pin(backend, env, jaxlib_version=CHECKED, started=started) == {"pinned": False, "reason": reason}
    assert env == before


def test_the_test_suites_jaxlib_is_one_the_flags_were_checked_on():
    """Moving the JAX pin means checking the flags on the new jaxlib (and adding it to CHECKED_JAXLIB)."""
    matrix = yaml.safe_load(open(os.path.join(ROOT, "backends_matrix.yaml")))
    [pin] = [p for p in matrix["packages"]["jax"] if p.startswith("jaxlib==")]
    version = pin.split("==")[1]
    assert tuple(int(x) for x in version.split(".")[:2]) in numerics.CHECKED_JAXLIB


def test_the_record_names_the_cpu_and_the_versions():
    record = numerics.environment(BACKEND)
    import keras
    import numpy

    assert record["versions"]["keras"] == keras.__version__ and record["versions"]["numpy"] == numpy.__version__
    if BACKEND == "jax":
        import jax
        import jaxlib

        assert record["versions"]["jax"] == jax.__version__ and record["versions"]["jaxlib"] == jaxlib.__version__
    cpu = record["cpu"]
    if os.path.exists("/proc/cpuinfo"):
        text = open("/proc/cpuinfo").read()
        assert cpu["model"] == re.search(r"^model name\s*:\s*(.+)$", text, re.M).group(1).strip()
        flags = set(re.search(r"^flags\s*:\s*(.+)$", text, re.M).group(1).split())
        assert set(cpu["isa"]) == {f for f in flags if numerics.ISA_FLAGS.match(f)}
        assert ("avx2" in cpu["isa"]) == ("avx2" in flags)
    assert cpu["cpus"] >= 1


def _demo(tmp_path, name, env=None, one_cpu=False):
    """`multicritic demo` for 3 steps at scale 1e6 in a fresh process: the learned values and the environment."""
    out = tmp_path / f"{name}.json"
    full = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "ONEDNN_MAX_CPU_ISA", "XLA_FLAGS")}
    full.update(env or {}, KERAS_BACKEND="jax")
    first = min(os.sched_getaffinity(0))
    result = subprocess.run(
        [sys.executable, "-m", "multicritic", "demo", "--steps", "3", "--scales", "1e6", "--no-progress"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        env=full,
        timeout=600,
        preexec_fn=(lambda: os.sched_setaffinity(0, {first})) if one_cpu else None,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    return data["scales"][0]["learned_values"], data["environment"], result.stdout


def _checked_jaxlib() -> bool:
    version = numerics._jaxlib_version()
    return version is not None and numerics._version_tuple(version) in numerics.CHECKED_JAXLIB


@pytest.mark.skipif(
    BACKEND != "jax" or not hasattr(os, "sched_setaffinity") or not _checked_jaxlib(),
    reason="JAX's pins, on a jaxlib they were checked on; Linux affinity",
)
def test_the_demos_numbers_do_not_move_with_the_number_of_cpus(tmp_path):
    pinned, record, stdout = _demo(tmp_path, "all_cpus")
    assert record["numerics"]["pinned"] is True, record
    assert "numerics: pinned so that CPUs agree" in stdout
    one_cpu, record_one, _ = _demo(tmp_path, "one_cpu", one_cpu=True)
    assert record_one["cpu"]["cpus"] == 1
    assert one_cpu == pinned
    # The control: unpinned, XLA's thread pool alone moves them (as 1 and 8 threads did the README's 1e6 row).
    few, _, _ = _demo(tmp_path, "one_thread", env={"MULTICRITIC_DEMO_PIN": "0", "PJRT_NPROC": "1"})
    many, record_many, _ = _demo(tmp_path, "eight_threads", env={"MULTICRITIC_DEMO_PIN": "0", "PJRT_NPROC": "8"})
    assert record_many["numerics"] == {"pinned": False, "reason": "MULTICRITIC_DEMO_PIN=0"}
    assert few != many
