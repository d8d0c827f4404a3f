"""The benchmarks run (at a tiny size) so they cannot rot; no timing is asserted."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_train_step_benchmark_runs(tmp_path):
    # The uncompiled implementations (compiled steps are tested in tests/backend/test_torch.py and
    # tests/benchmarks/test_native_baselines.py; compiling them here would only add minutes).
    ours = "multicritic_eager" if BACKEND == "torch" else "multicritic"
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "ours", "train_step.py"),
            "--backend",
            BACKEND,
            "--size",
            "nano",
            "--batch",
            "8",
            "16",
            "--repeats",
            "2",
            "--block-seconds",
            "0.01",
            "--impls",
            ours,
            "native",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads(out.read_text())
    peak = [r for r in records if r["impl"] == "matmul_peak"]
    assert len(peak) == 1 and peak[0]["gflops"] > 0
    steps = [r for r in records if r["impl"] != "matmul_peak"]
    assert sorted((r["impl"], r["batch"]) for r in steps) == [(ours, 8), (ours, 16), ("native", 8), ("native", 16)]
    for r in steps:
        assert r["backend"] == BACKEND and r["size"] == "nano"
        assert r["step_ms"] > 0 and r["samples_per_s"] > 0 and 0 < r["utilization"] and r["first_call_s"] > 0
        assert 0 < r["host_ms"] < 100 * r["step_ms"]
    assert f"native/{ours} " in result.stdout


def test_baseline_variants_benchmark_runs(tmp_path):
    sys.path.insert(0, ROOT)
    from benchmarks import variants

    native = __import__(f"benchmarks.native.native_{BACKEND}", fromlist=["VARIANTS"])
    out = tmp_path / "variants.json"
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "ours", "baseline_variants.py"),
            "--backend",
            BACKEND,
            "--size",
            "nano",
            "--batch",
            "8",
            "--repeats",
            "1",
            "--block-seconds",
            "0.01",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads(out.read_text())
    assert len(records) == len(variants(native)) >= 4 and all(r["step_ms"] > 0 for r in records)
    # The variant the benchmarks run at batch 8 is one of those timed.
    assert sum(r["chosen"] for r in records) == 1


def test_step_flops_formula():
    sys.path.insert(0, ROOT)
    from benchmarks.ours.train_step import step_flops

    # XS, one row: fast forward, EMA forward and weight gradients are 2 flops
    # per weight each; input gradients for every layer but the first one.
    weights = 1280 * 256 + 256 * 255
    assert step_flops(1280, 256, 1, 255, 1) == 3 * 2 * weights + 2 * 256 * 255


def test_export_latency_benchmark_runs(tmp_path):
    from multicritic.files.export import SUPPORTED

    out = tmp_path / "latency.json"
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "ours", "export_latency.py"),
            "--backend",
            BACKEND,
            "--size",
            "nano",
            "--batch",
            "1",
            "4",
            "--repeats",
            "2",
            "--block-seconds",
            "0.01",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads(out.read_text())
    assert sorted((r["format"], r["batch"]) for r in records) == sorted(
        (f, b) for f in ("keras",) + SUPPORTED[BACKEND] for b in (1, 4)
    )
    assert all(r["ms"] > 0 for r in records)


def test_compiled_forward_benchmark_runs_and_its_native_actor_gives_the_keras_actors_outputs(tmp_path):
    """The benchmark checks each variant's outputs against the Keras actor's before it times (it fails
    otherwise), and its table renders."""
    from benchmarks.render_tables import RENDERERS

    out = tmp_path / "compiled_forward.json"
    script = os.path.join(ROOT, "benchmarks", "ours", "compiled_forward.py")
    command = [sys.executable, script, "--backends", BACKEND, "--blocks", "1", "--calls", "20", "--json", str(out)]
    subprocess.run(command, check=True, cwd=ROOT)
    results = json.loads(out.read_text())
    variants = {"keras_call", "predict_on_batch", "compiled_forward", "native"}
    assert {r["variant"] for r in results["records"]} == variants
    assert all(r["us_median"] > 0 for r in results["records"])
    rows = [line for line in RENDERERS["compiled_forward"]([results]) if line.startswith(f"| {BACKEND} ")]
    assert len(rows) == (2 if BACKEND == "torch" else 1)


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch forward views")
def test_forward_views_benchmark_runs(tmp_path):
    out = tmp_path / "views.json"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "ours", "forward_views.py"),
            "--case",
            "nano:2",
            "--repeats",
            "1",
            "--block-seconds",
            "0.01",
            "--json",
            str(out),
        ],
        check=True,
        cwd=ROOT,
        env={**os.environ, "KERAS_BACKEND": "torch"},
    )
    records = json.loads(out.read_text())
    assert {r["entry"] for r in records} >= {"fast_module(latent)", "critic(h, z)"}
    assert all(r["ours_us"] > 0 and r["native_us"] > 0 for r in records)


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch forward views")
def test_overflow_guard_variants_compute_the_same_values():
    # Each guard changes no value of an ordinary input: the variants timed differ only in their cost.
    import torch

    from benchmarks.ours.overflow_guard_cost import variants

    with torch.no_grad():
        outputs = {name: fn() for name, fn in variants(8).items()}
    for name, out in outputs.items():
        torch.testing.assert_close(out, outputs["no guard"], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch forward views")
def test_decode_cost_variants_are_the_library_decode_and_its_neighbours():
    # The timed "ours" is the library's decode to the bit; the others decode the same probabilities to within
    # the default support's float32 asymmetry and the sums' rounding (below 4e-6 in symlog units: two float32
    # ulps at 20).
    import torch

    from benchmarks.ours.decode_cost import decoders, variants
    from multicritic.math.bins import expected_value

    torch.manual_seed(1)
    probs = torch.softmax(torch.randn(64, 255) * 3.0, -1)
    decoded = {name: fn(probs) for name, fn in decoders().items()}
    torch.testing.assert_close(decoded["linear, whole rows (ours)"], expected_value(probs), rtol=0, atol=0)
    for name, value in decoded.items():
        torch.testing.assert_close(value, decoded["plain"], rtol=0, atol=4e-6, msg=name)
    with torch.no_grad():
        assert {name: fn().shape for name, fn in variants(4).items()} == {name: (4,) for name in decoded}


def test_first_input_benchmark_runs_and_both_ways_compute_the_same_loss(tmp_path):
    # 64 rows: past the nano input's width (32), where the overflow scale goes on the kernel and the parts
    # are split or concatenated by the benchmark's switch; the plain graph / eager step (no compilation here).
    out = tmp_path / "first_input.json"
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "ours", "first_input.py"),
            "--backend",
            BACKEND,
            "--size",
            "nano",
            "--batch",
            "64",
            "--repeats",
            "2",
            "--block-seconds",
            "0.01",
            "--graph",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = json.loads(out.read_text())
    assert record["backend"] == BACKEND and record["batch"] == 64
    assert record["split_ms"] > 0 and record["concatenated_ms"] > 0 and record["concatenated_over_split"] > 0
    split, concatenated = record["first_loss"]["split"], record["first_loss"]["concatenated"]
    assert abs(concatenated - split) <= 1e-6 * abs(split), record["first_loss"]
    assert "| concatenated / split |" in result.stdout


def test_targets_benchmark_runs_rounds_and_reads_each_against_its_bound(tmp_path):
    # One step target of this backend at batch 256, nano, one round of one short block (two processes: ours and
    # the native step; more rounds repeat the same code).
    out = tmp_path / "targets.json"
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "ours", "targets.py"),
            "--only",
            f"{BACKEND}-256",
            "--rounds",
            "1",
            "--repeats",
            "1",
            "--size",
            "nano",
            "--block-seconds",
            "0.01",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["command"].startswith(f"python benchmarks/ours/targets.py --only {BACKEND}-256 --rounds 1")
    (record,) = data["targets"]
    assert record["target"] == f"{BACKEND}-256" and record["backend"] == BACKEND and record["size"] == "nano"
    assert len(record["ratios"]) == len(record["ours_ms"]) == len(record["native_ms"]) == 1
    for ratio, ours, native in zip(record["ratios"], record["ours_ms"], record["native_ms"]):
        assert ours > 0 and native > 0 and ratio == pytest.approx(native / ours)
    assert record["rounds_met"] == sum(r >= record["bound"] for r in record["ratios"])
    assert f"| {BACKEND}-256 | >= {record['bound']} |" in result.stdout


def test_targets_read_a_step_as_native_over_ours_and_an_ensemble_as_ours_over_native():
    sys.path.insert(0, ROOT)
    from benchmarks.ours import targets

    step, ensemble = targets.TARGETS["jax-4096"], targets.TARGETS["tensorflow-ensemble-4096"]
    assert targets._ratio(step, ours=2.0, native=1.9) == pytest.approx(0.95) and targets._meets(step, 0.95)
    assert not targets._meets(step, 0.94)
    assert targets._ratio(ensemble, ours=2.1, native=2.0) == pytest.approx(1.05) and targets._meets(ensemble, 1.05)
    assert not targets._meets(ensemble, 1.06)
    assert set(targets.TARGETS["tensorflow-4096"]["natives"]) == {"native", "native_xla"}
    with pytest.raises(SystemExit):
        targets.main(["--rounds", "0"])


@pytest.mark.skipif(BACKEND == "torch", reason="extras_cost.py: steps traced once per shape (TensorFlow, JAX)")
def test_extras_cost_benchmark_runs_and_each_variant_trains_to_the_same_first_loss(tmp_path):
    out = tmp_path / "extras.json"
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "ours", "extras_cost.py"),
            "--backend",
            BACKEND,
            "--size",
            "nano",
            "--batch",
            "16",
            "--members",
            "2",
            "--repeats",
            "1",
            "--block-seconds",
            "0.01",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = json.loads(out.read_text())
    assert record["backend"] == BACKEND and record["members"] == 2 and record["batch"] == 16
    natives = {"native", "native_xla"} if BACKEND == "tensorflow" else {"native"}
    assert set(record["step_ms"]) == {"full", "guards", "diagnostics", "pairs", "all"} | natives
    assert all(ms > 0 for ms in record["step_ms"].values()) and record["over_full"]["full"] == 1.0
    # What is left out changes no loss of finite data (the plain decode moves the EMA's targets by rounding).
    full = record["first_loss"]["full"]
    for name, loss in record["first_loss"].items():
        assert abs(loss - full) <= 1e-5 * abs(full), (name, record["first_loss"])
    assert "| without guards |" in result.stdout


def test_step_kernels_counts_the_entry_computations_launching_instructions():
    sys.path.insert(0, ROOT)
    from benchmarks.ours.step_kernels import entry_ops, entry_sources, source_table

    hlo = """HloModule step

%fused_computation (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%p)
}

ENTRY %main (a: f32[8], b: f32[8,8]) -> (f32[8], f32[8]) {
  %a = f32[8]{0} parameter(0)
  %b = f32[8,8]{1,0} parameter(1)
  %c = f32[] constant(1)
  %fusion = f32[8]{0} fusion(%a), kind=kLoop, calls=%fused_computation, metadata={op_name="jit(step)/jvp()/neg"}
  %gemm = (f32[8]{0}, s8[0]{0}) custom-call(%b, %a), custom_call_target="__cublas$gemm"
  %gte = f32[8]{0} get-tuple-element(%gemm), index=0
  %r = f32[8]{0} bitcast(%gte)
  ROOT %t = (f32[8]{0}, f32[8]{0}) tuple(%fusion, %r)
}
"""
    assert entry_ops(hlo) == {"fusion": 1, "custom-call": 1}  # the fused computation's negate is not counted
    # By source: the outer jit's name dropped; an instruction without metadata under "?".
    assert entry_sources(hlo) == {"jvp()/neg": 1, "?": 1}
    # The compared steps (`multicritic_core` and the native one); the third is in the counts' table only.
    records = [
        {"backend": "jax", "batch": 8, "impl": "multicritic", "sources": {"jvp()/neg": 9}},
        {"backend": "jax", "batch": 8, "impl": "multicritic_core", "sources": {"jvp()/neg": 4, "?": 1, "adam/add": 2}},
        {"backend": "jax", "batch": 8, "impl": "native", "sources": {"jvp()/neg": 1, "?": 1, "add": 4}},
    ]
    rows = source_table(records).splitlines()[2:]
    assert rows == [
        "| jax | 8 | `jvp()/neg` | 4 | 1 |",
        "| jax | 8 | `adam/add` | 2 | 0 |",
        "| jax | 8 | `add` | 0 | 4 |",
    ]


def test_step_kernels_profile_sums_each_instructions_time_by_source():
    sys.path.insert(0, ROOT)
    from benchmarks.ours.step_kernels import module_name, op_times, source_times, step_op_times, time_table

    hlo = """HloModule jit_step, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %fusion = f32[8]{0} fusion(%a), kind=kLoop, calls=%f, metadata={op_name="jit(step)/jvp()/neg"}
  %fusion.1 = f32[8]{0} fusion(%fusion), kind=kLoop, calls=%g, metadata={op_name="jit(step)/adam/add"}
  ROOT %copy = f32[8]{0} copy(%fusion.1)
}
"""
    assert module_name(hlo) == "jit_step"
    # Two steps of a trace: events that name no HLO instruction (the host's) are left out; per module.
    trace = {
        "traceEvents": [
            {"ph": "X", "name": "fusion", "dur": 10.0, "args": {"hlo_module": "jit_step", "hlo_op": "fusion"}},
            {"ph": "X", "name": "fusion", "dur": 14.0, "args": {"hlo_module": "jit_step", "hlo_op": "fusion"}},
            {"ph": "X", "name": "k", "dur": 6.0, "args": {"hlo_module": "jit_step", "hlo_op": "fusion.1"}},
            {"ph": "X", "name": "k", "dur": 4.0, "args": {"hlo_module": "jit_step", "hlo_op": "while.body.3"}},
            {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 99.0},
            {"ph": "X", "name": "fusion", "dur": 50.0, "args": {"hlo_module": "jit_other", "hlo_op": "fusion"}},
            {"ph": "M", "name": "process_name", "args": {"name": "/host:CPU"}},
        ]
    }
    times = op_times(trace, steps=2)
    assert times == {"jit_step": {"fusion": 12.0, "fusion.1": 3.0, "while.body.3": 2.0}, "jit_other": {"fusion": 25.0}}
    both = {"jit_step(2)": {"fusion": 1.0}, "jit_stepper": {"fusion": 5.0}}
    assert step_op_times(dict(times, **both), "jit_step") == {"fusion": 13.0, "fusion.1": 3.0, "while.body.3": 2.0}
    assert source_times(hlo, times["jit_step"]) == {"jvp()/neg": 12.0, "adam/add": 3.0, "(not in entry)": 2.0}
    records = [
        {
            "backend": "jax",
            "batch": 8,
            "impl": "multicritic_core",
            "profile": {"wall_us": 30.0, "total_us": 17.0, "op_us": {"jvp()/neg": 12.0, "adam/add": 3.0}},
        },
        {
            "backend": "jax",
            "batch": 8,
            "impl": "native",
            "profile": {"wall_us": 20.0, "total_us": 9.0, "op_us": {"jvp()/neg": 2.0, "add": 7.0}},
        },
    ]
    assert time_table(records).splitlines()[2:] == [
        "| jax | 8 | wall time a step | 30.0 | 20.0 |",
        "| jax | 8 | instructions' time, summed | 17.0 | 9.0 |",
        "| jax | 8 | `jvp()/neg` | 12.0 | 2.0 |",
        "| jax | 8 | `adam/add` | 3.0 | 0.0 |",
        "| jax | 8 | `add` | 0.0 | 7.0 |",
    ]
    # A machine whose profiler failed still gets its counts; the table says which step was not profiled.
    records[1]["profile"] = {"wall_us": 20.0, "total_us": 0.0, "op_us": {}, "error": "RuntimeError: no CUPTI"}
    assert "| jax | 8 | native: not profiled (RuntimeError: no CUPTI) | | |" in time_table(records).splitlines()


def test_step_kernels_reads_inductors_launches_from_its_wrapper_code():
    sys.path.insert(0, ROOT)
    from benchmarks.ours.step_kernels import _LAUNCH

    lines = {
        "    cpp_fused_add_mul_3(buf0, arg1_1)": "cpp_fused_add_mul_3",
        "    triton_poi_fused_add_0.run(buf1, xnumel, stream=stream0)": "triton_poi_fused_add_0",
        "    extern_kernels.mm(buf0, arg2_1, out=buf1)": "extern_kernels.mm",
        "    buf4 = torch.ops.aten.gather.default(buf3, 1, buf2)": "torch.ops.aten.gather",
        "    del buf0": None,
        "    buf1 = empty_strided_cpu((8, 8), (8, 1), torch.float32)": None,
    }
    for line, kernel in lines.items():
        found = _LAUNCH.match(line)
        assert (found and next(g for g in found.groups() if g)) == kernel, line


@pytest.mark.skipif(BACKEND == "torch", reason="XLA's dumps (JAX, TensorFlow); inductor's count is reported only")
def test_xla_step_has_at_most_a_tenth_more_instructions_than_the_native_step(tmp_path):
    # Issue 52: on a GPU every top-level instruction is a kernel launch. With `metrics="core"` (what the native
    # steps return), ours may add at most 10% to the native XLA step's (the guards' and the pair decode's
    # cost); the default step's diagnostics are the rest. XS, batch 256 (a launch-bound size on a GPU).
    out = tmp_path / "kernels.json"
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "ours", "step_kernels.py"),
            "--backend",
            BACKEND,
            "--size",
            "XS",
            "--batch",
            "256",
            "--by-source",
            "--json",
            str(out),
        ]
        + (["--profile", "--profile-steps", "2"] if BACKEND == "jax" else []),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads(out.read_text())
    native = "native" if BACKEND == "jax" else "native_xla"
    assert [r["impl"] for r in records] == ["multicritic", "multicritic_core", native]
    count = {r["impl"]: sum(r["ops"].values()) for r in records}
    assert count["multicritic_core"] <= 1.10 * count[native], (count, result.stdout)
    assert count["multicritic_core"] < count["multicritic"]  # the diagnostics are reductions of their own
    for r in records:
        assert r["batch"] == 256 and r["ops"].get("fusion", 0) > 0 and "parameter" not in r["ops"]
        assert sum(r["sources"].values()) == sum(r["ops"].values())  # the same instructions, grouped otherwise
        if BACKEND == "jax":  # profiled: the step's instructions took time, and most of it is in the entry
            profile = r["profile"]
            assert "error" not in profile and profile["wall_us"] > 0
            assert profile["total_us"] == pytest.approx(sum(profile["op_us"].values()))
            assert profile["op_us"].get("(not in entry)", 0.0) < 0.5 * profile["total_us"]
    assert "| launches |" in result.stdout and "| source |" in result.stdout


def test_device_profile_counts_the_gpus_kernels_and_busy_time():
    sys.path.insert(0, ROOT)
    from benchmarks.device_profile import busy_and_count, device_events

    # PyTorch's Chrome trace: device events by category; host events (cuda runtime calls, ops) left out.
    torch_trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0.0, "dur": 10.0},
            {"ph": "X", "cat": "kernel", "name": "add", "ts": 5.0, "dur": 10.0},  # overlaps: busy 0-15
            {"ph": "X", "cat": "gpu_memcpy", "name": "copy", "ts": 20.0, "dur": 2.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0.0, "dur": 3.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 30.0},
        ]
    }
    events = device_events(torch_trace)
    assert [e["name"] for e in events] == ["gemm", "add", "copy"]
    assert busy_and_count(events, steps=2) == (1.5, 8.5)
    # JAX's perfetto trace: the events of the GPU's process.
    jax_trace = [
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
        {"ph": "X", "pid": 7, "name": "fusion.3", "ts": 100.0, "dur": 4.0},
        {"ph": "X", "pid": 1, "name": "ThunkExecutor::Execute", "ts": 100.0, "dur": 40.0},
    ]
    assert busy_and_count(device_events(jax_trace), steps=1) == (1.0, 4.0)


def test_slowest_call_benchmark_records_a_run_and_its_compilations():
    """Issue 73: the run's record (in process, a few calls) and its table row."""
    from benchmarks.ours.slowest_call import child
    from benchmarks.render_tables import slowest_call

    record = child("nano", 8, 6)
    assert record["calls"] == 6 and record["first_call_s"] > 0 and 1 <= record["slowest_later_call"] <= 5
    # The defaults on a CPU: only the first call of the one shape compiles (PyTorch: eager, nothing).
    assert all(e["call"] == 0 for e in record["compilations"])
    assert len(record["compilations"]) == (0 if BACKEND == "torch" else 1)
    row = slowest_call([{"records": [dict(record, caches="cold")]}])[2]
    assert row.startswith(f"| {BACKEND} | cold |") and row.endswith("| 0 |")
