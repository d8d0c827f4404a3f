"""What every engine's multi-host example must show: the tests `test_jax.py`, `test_torch.py` and
`test_tensorflow.py` import (each with its own `engine` fixture and its own launches).

Three launches per engine, shared by the tests of its module (`runs`):

1. two hosts train the three critics from scratch, 4 steps, a checkpoint every 2;
2. one host trains the single critic from scratch, and resumes the ensemble and the MultiCritic from the
   two hosts' checkpoint of step 2 (2 -> 1 hosts);
3. two hosts resume the single critic from the one host's checkpoint of step 2 (1 -> 2) and the MultiCritic
   from their own (2 -> 2), then turn to the ensemble, which ends this launch by design (`ending`):
   - "kill" (JAX, TensorFlow): it starts from scratch and host 1 kills itself before its step 1: host 0 must
     stop with the engine's error for a lost peer, within `KILLED_HOST_EXIT_LIMIT_S`;
   - "refusal" (PyTorch, whose lost host its torchrun restart test covers): each host is given another
     checkpoint of it, which both refuse before any step.

Then `guards` (five launches the hosts refuse or stop cleanly) and `disagreements` (four launches where host 1
asks for another HL-Gauss sigma, dtype policy or checkpoint schedule: refused on both hosts before any step,
within `REFUSAL_LIMIT_S` of both starting, the critics compared as the configs they resolve to).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from multicritic.files import integrity
from tests.distributed.test_data_parallel import METRIC_RTOL, WEIGHT_ATOL
from tests.multihost.launch import (
    KINDS,
    RUN,
    copy_checkpoint,
    global_metrics,
    hosts,
    largest_state_gap,
    metric_gaps,
    one_host,
    outputs,
    retried,
    same_state,
    succeeded,
)

pytestmark = pytest.mark.multihost

# PyTorch's DDP reports each host's metrics over its own rows (their mean over hosts is the global batch's);
# JAX's GSPMD step and TensorFlow's reduced metrics are the global batch's on every host.
PER_HOST_METRICS = {"jax": False, "torch": True, "tensorflow": False}
# A killed host: the others see the closed connection in their next collective at once (measured 1-6 s
# until they exit, process teardown included); JAX's coordinator also waits for the heartbeat timeout
# (`--timeout`) before its process exits. Without these the wait would last the collective's default.
KILL_TIMEOUT_S = 10
KILLED_HOST_EXIT_LIMIT_S = KILL_TIMEOUT_S + 20.0
# What each engine says when a peer is lost.
LOST_PEER = {
    "jax": r"Gloo .* failed|Connection reset by peer|heartbeat timeout",
    "torch": r"Connection reset by peer|Connection closed by peer",
    "tensorflow": r"UnavailableError|Connection reset by peer|Socket closed",
}


@pytest.fixture(scope="module")
def runs(engine, ending, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"{engine}-hosts")
    two, one, again = (str(base / name) for name in ("two", "one", "again"))
    launches = {}
    launches["two"] = succeeded(
        retried(
            lambda: hosts(
                engine,
                "--critic",
                "single,ensemble,multi",
                *RUN,
                "--out",
                f"{two}/out",
                "--checkpoint-dir",
                f"{two}/ckpt",
            ),
            [two],
        )
    )
    for kind in ("ensemble", "multi"):
        copy_checkpoint(f"{two}/ckpt", kind, 2, f"{one}/ckpt")
    launches["one"] = succeeded(
        one_host(
            engine, "--critic", "single,ensemble,multi", *RUN, "--out", f"{one}/out", "--checkpoint-dir", f"{one}/ckpt"
        )
    )
    for host in ("host0", "host1"):  # each host reads its own copy of the files
        copy_checkpoint(f"{one}/ckpt", "single", 2, f"{again}/{host}")
        copy_checkpoint(f"{two}/ckpt", "multi", 2, f"{again}/{host}")
    args = ["--critic", "multi,single,ensemble", *RUN, "--out", f"{again}/out", "--checkpoint-dir", f"{again}/host0"]
    if ending == "kill":
        args += [
            "--kill-critic",
            "ensemble",
            "--kill-host",
            "1",
            "--kill-at-step",
            "1",
            "--timeout",
            str(KILL_TIMEOUT_S),
        ]
    else:
        # The ensemble: the same critic and step on both, other weights (the one host's step 4 on host 1).
        copy_checkpoint(f"{two}/ckpt", "ensemble", 2, f"{again}/host0")
        copy_checkpoint(f"{one}/ckpt", "ensemble", 4, f"{again}/host1", as_step=2)
    launches["again"] = hosts(engine, *args, launcher_args=["--host-args", "1", f"--checkpoint-dir {again}/host1"])
    return {"folders": {"two": two, "one": one, "again": again}, **launches}


def out(runs, which, kind):
    return outputs(os.path.join(runs["folders"][which], "out"), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_two_hosts_step_as_one_host_on_the_global_batch(engine, runs, kind):
    two, one = out(runs, "two", kind), out(runs, "one", kind)
    assert [int(r["hosts"]) for r in two] == [2, 2] and int(one[0]["hosts"]) == 1
    # The single critic trained from the same weights on both; the others stepped from the same state (the two
    # hosts' checkpoint of step 2) from step 2 on.
    first = int(one[0]["start"])
    assert first == (0 if kind == "single" else 2)
    gaps = {}
    for step in range(first, 4):
        want = global_metrics(one, step, per_host=False)
        for name, gap in metric_gaps(global_metrics(two, step, PER_HOST_METRICS[engine]), want).items():
            gaps[name] = max(gaps.get(name, 0.0), gap)
    expected = {"total", "grad_norm", "value_nll", "ema_regularizer", "ema_value_gap", "nonfinite_targets"}
    if kind == "ensemble":
        expected |= {"member_spread"}
    if kind == "multi":  # the percentile normaliser's statistics, from the global batch on every host
        expected = {
            "task/return_low",
            "task/return_high",
            "explore/return_mean",
            "explore/member_spread",
            "task/total",
            "grad_norm",
        }
    assert expected <= set(gaps), sorted(gaps)
    assert not {k: g for k, g in gaps.items() if g >= METRIC_RTOL}, gaps
    # Weights, EMA weights, normaliser, optimizer slots and step counters.
    assert any(k.startswith("state/optimizer/") for k in two[0]) and any("_ema" in k for k in two[0])
    assert largest_state_gap(two[0], one[0]) < WEIGHT_ATOL


@pytest.mark.parametrize("kind", KINDS)
def test_every_host_holds_the_same_state(runs, kind):
    two = out(runs, "two", kind)
    assert same_state(two[0], two[1]) is None


def test_checkpoints_are_sealed_and_record_the_hosts(runs):
    folder = os.path.join(runs["folders"]["two"], "ckpt")
    for kind in KINDS:
        names = sorted(os.listdir(os.path.join(folder, kind)))
        # Written atomically by one host: the two files, no temporary file left behind.
        assert names == ["step-000002.npz", "step-000004.npz"], names
        for name in names:
            content, sealed = integrity.read_file(os.path.join(folder, kind, name), "path")
            assert sealed is True
            with np.load(os.path.join(folder, kind, name)) as archive:
                meta = str(archive["meta"][()])
            assert '"hosts": 2' in meta


def test_restart_on_the_same_hosts_is_bit_for_bit(runs):
    again, two = out(runs, "again", "multi"), out(runs, "two", "multi")
    assert int(again[0]["start"]) == 2
    assert runs["again"].lines(r"multi: restored step 2 .*saved on 2 host\(s\), restored on 2\)")
    for host in range(2):
        assert same_state(again[host], two[host]) is None


def test_restoring_on_another_host_count_works_and_says_so(runs):
    # 2 -> 1: the ensemble and the MultiCritic; 1 -> 2: the single critic.
    for kind in ("ensemble", "multi"):
        assert runs["one"].lines(rf"{kind}: restored step 2 .*saved on 2 host\(s\), restored on 1\)")
        assert largest_state_gap(out(runs, "one", kind)[0], out(runs, "two", kind)[0]) < WEIGHT_ATOL
    assert len(runs["one"].lines(r"was saved by a run on 2 host\(s\) and is restored on 1")) == 2
    assert len(runs["again"].lines(r"single: restored step 2 .*saved on 1 host\(s\), restored on 2\)")) == 2
    assert len(runs["again"].lines(r"was saved by a run on 1 host\(s\) and is restored on 2")) == 2
    assert largest_state_gap(out(runs, "again", "single")[0], out(runs, "two", "single")[0]) < WEIGHT_ATOL


def check_a_killed_host_stops_the_others(engine, runs):
    """The third launch, ending "kill": host 1 killed itself before the ensemble's step 1 (no restart)."""
    launch = runs["again"]
    assert len(launch.lines(r"(single|multi): trained steps 2\.\.3")) == 4, launch.report()
    killed = launch.lines(r"ensemble: killing itself before step 1 at time ([\d.]+)")
    assert len(killed) == 1, launch.report()
    at = float(re.search(r"at time ([\d.]+)", killed[0]).group(1))
    code, exited = launch.exits["host 0"]
    assert code != 0 and launch.exits["host 1"][0] != 0, launch.exits
    assert 0 < exited - at < KILLED_HOST_EXIT_LIMIT_S, f"host 0 exited {exited - at:.1f} s after host 1 was killed"
    assert [line for line in launch.lines(LOST_PEER[engine]) if line.startswith("[host 0]")], launch.report()
    assert not launch.lines(r"ensemble: trained steps")


def check_different_checkpoints_are_refused(runs):
    """The third launch, ending "refusal": each host was given another checkpoint of the ensemble."""
    launch = runs["again"]
    # The single critic and the MultiCritic resumed and finished; the ensemble's two files were refused on both
    # hosts, before any step (and its collectives) ran.
    assert len(launch.lines(r"(single|multi): trained steps 2\.\.3")) == 4, launch.report()
    assert launch.code != 0 and all(code != 0 for code, _ in launch.exits.values()), launch.exits
    refused = launch.lines(
        r"(ValueError|DifferentCheckpoints): path: got another checkpoint on host 1 .* "
        r"no host restored it"
    )
    assert {line.split("]")[0] for line in refused} == {"[host 0", "[host 1"}, launch.report()
    assert not launch.lines(r"ensemble: (trained steps|restored step)")


@pytest.fixture(scope="module")
def guards(engine, runs, tmp_path_factory):
    """Five more launches: another learning rate on host 1; a global batch of 15 over 2 hosts; host 1 preempted
    (SIGTERM) before step 3; one host resuming from a folder whose newest checkpoint is damaged and which holds a
    killed write's leftover; two hosts that find different checkpoints."""
    base = tmp_path_factory.mktemp(f"{engine}-guards")
    launches = {
        "rate": hosts(engine, "--critic", "single", *RUN, launcher_args=["--host-args", "1", "--learning-rate 1e-4"]),
        "uneven": hosts(engine, "--critic", "single", *RUN, "--batch", "15"),
    }
    pre = str(base / "pre")
    launches["preempt"] = retried(
        lambda: hosts(
            engine,
            "--critic",
            "single,ensemble",
            "--steps",
            "8",
            "--checkpoint-every",
            "100",
            "--batch",
            "16",
            "--horizon",
            "6",
            "--checkpoint-dir",
            pre,
            "--preempt-host",
            "1",
            "--preempt-at-step",
            "3",
        ),
        [pre],
    )
    damaged = base / "damaged"
    copy_checkpoint(os.path.join(runs["folders"]["two"], "ckpt"), "single", 2, str(damaged))
    copy_checkpoint(os.path.join(runs["folders"]["two"], "ckpt"), "single", 4, str(damaged))
    newest = damaged / "single" / "step-000004.npz"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    (damaged / "single" / ".multicritic-killed.npz").write_bytes(b"half a write")
    launches["damaged"] = one_host(engine, "--critic", "single", *RUN, "--checkpoint-dir", str(damaged))
    # Host 0 finds a checkpoint, host 1 (its copy not arrived) none.
    copy_checkpoint(os.path.join(runs["folders"]["two"], "ckpt"), "single", 2, str(base / "host0"))
    launches["resume"] = hosts(
        engine,
        "--critic",
        "single",
        *RUN,
        "--checkpoint-dir",
        str(base / "host0"),
        "--timeout",
        "30",
        launcher_args=["--host-args", "1", f"--checkpoint-dir {base}/host1"],
    )
    return {"folders": {"pre": pre, "damaged": str(damaged)}, **launches}


def test_a_host_asking_for_another_learning_rate_is_refused_by_every_host(guards):
    launch = guards["rate"]
    refused = launch.lines(
        r"ValueError: CriticTrainer: hosts disagree on optimizer 'default Adam\.learning_rate': host 0 has 0\.001, "
        r"host 1 has 0\.0001;"
    )
    assert {line.split("]")[0] for line in refused} == {"[host 0", "[host 1"}, launch.report()
    assert not launch.lines(r"trained steps")


def test_a_preempted_host_makes_every_host_checkpoint_one_step_and_exit_cleanly(guards):
    launch = guards["preempt"]
    assert launch.code == 0 and all(code == 0 for code, _ in launch.exits.values()), launch.report()
    assert launch.lines(r"^\[host 1\].*single: preempted \(SIGTERM\) before step 3"), launch.report()
    assert launch.lines(r"^\[host 0\].*single: preempted \(another host\) before step 3"), launch.report()
    assert sorted(os.listdir(os.path.join(guards["folders"]["pre"], "single"))) == ["step-000003.npz"]
    assert not launch.lines(r"trained steps|ensemble")  # stopped: the next critic is not started


def test_a_damaged_newest_checkpoint_is_passed_over_and_leftovers_removed(guards):
    launch = guards["damaged"]
    assert launch.code == 0, launch.report()
    assert launch.lines(r"single: removed .*\.multicritic-killed\.npz, left by a write that was killed")
    assert launch.lines(r"single: WARNING: skipping checkpoint .*step-000004\.npz")
    assert launch.lines(r"single: restored step 2 from .*step-000002\.npz")
    folder = os.path.join(guards["folders"]["damaged"], "single")
    assert not [n for n in os.listdir(folder) if n.startswith(".multicritic-")]


def test_a_global_batch_that_splits_unevenly_is_refused_by_every_host(guards):
    launch = guards["uneven"]
    refused = launch.lines(
        r"ValueError: h: got per-host batch shapes \[7, 8, \d+\] on host 0, \[7, 7, \d+\] on host 1 "
        r"for a dream step \(a global batch of 15 along axis 1\)"
    )
    assert {line.split("]")[0] for line in refused} == {"[host 0", "[host 1"}, launch.report()
    assert not launch.lines(r"trained steps")


def test_hosts_that_find_different_checkpoints_are_refused_before_any_restore(guards):
    launch = guards["resume"]
    refused = launch.lines(r"ValueError: resume step: got \[2\] on host 0, \[\] on host 1; expected the same")
    assert {line.split("]")[0] for line in refused} == {"[host 0", "[host 1"}, launch.report()
    assert not launch.lines(r"trained steps|restored step")


# From both hosts started (`common.train`'s first line) to both refused and exited.
REFUSAL_LIMIT_S = 10.0
HL_GAUSS = '{"head": {"class_name": "hl_gauss", "config": {"sigma": %s}}}'
# Host 1's other options, and the words of the refusal, the same on every host.
DISAGREEMENTS = {
    # Host 0 gives the head by name (HL-Gauss's default sigma, 0.75), host 1 as a spec: compared resolved.
    "sigma": (
        ["--critic-options", HL_GAUSS % 1.0],
        "critic option 'head.sigma': host 0 has 0.75, host 1 has 1.0;",
    ),
    "global dtype": (
        ["--dtype-policy", "mixed_bfloat16"],
        "dtype policy 'global': host 0 has 'float32', host 1 has 'mixed_bfloat16';",
    ),
    # Host 0 leaves the critic's dtype at its default.
    "critic dtype": (
        ["--critic-options", '{"dtype": "mixed_bfloat16"}'],
        "dtype policy 'critic': host 0 has 'float32', host 1 has 'mixed_bfloat16';",
    ),
    "schedule": (["--checkpoint-every", "4"], "run option 'checkpoint_every': host 0 has 2, host 1 has 4;"),
}


@pytest.fixture(scope="module")
def disagreements(engine, tmp_path_factory):
    """Two hosts, host 1 given another HL-Gauss sigma, dtype policy (global, or the critic's own) or checkpoint
    schedule; each launch with a checkpoint folder of its own."""
    base = tmp_path_factory.mktemp(f"{engine}-disagreements")
    launches = {}
    for name, (theirs, _) in DISAGREEMENTS.items():
        ours = ["--critic-options", '{"head": "hl_gauss"}'] if name == "sigma" else []
        folder = str(base / name.replace(" ", "-"))
        host1 = " ".join(f"'{arg}'" for arg in theirs)
        launches[name] = (
            hosts(
                engine,
                "--critic",
                "single",
                *RUN,
                *ours,
                "--checkpoint-dir",
                folder,
                launcher_args=["--host-args", "1", host1],
            ),
            folder,
        )
    return launches


def check_refused_before_any_step_within_seconds(engine, launch, folder, message):
    """Both hosts refused with `message`, before any step or checkpoint, within `REFUSAL_LIMIT_S` of both
    starting; returns that time."""
    refused = launch.lines(r"ValueError: critic 'single': hosts disagree on " + re.escape(message))
    assert {line.split("]")[0] for line in refused} == {"[host 0", "[host 1"}, launch.report()
    assert launch.code != 0 and all(code != 0 for code, _ in launch.exits.values()), launch.exits
    assert not launch.lines(r"trained steps|TypeError"), launch.report()
    assert not [n for n in os.listdir(os.path.join(folder, "single"))], os.listdir(os.path.join(folder, "single"))
    started = max(float(t) for t in re.findall(r"started at time ([\d.]+)", launch.output))
    took = max(at for _, at in launch.exits.values()) - started
    print(f"{engine}: refused {took:.1f} s after both hosts started")
    assert 0 < took < REFUSAL_LIMIT_S, f"{engine}: refused {took:.1f} s after both hosts started"
    return took


def test_finding_8_another_hl_gauss_sigma_is_refused_naming_it_and_each_hosts_value(engine, disagreements):
    check_refused_before_any_step_within_seconds(engine, *disagreements["sigma"], DISAGREEMENTS["sigma"][1])


@pytest.mark.parametrize("which", ["global dtype", "critic dtype"])
def test_finding_6_another_dtype_policy_is_refused_before_any_step(engine, disagreements, which):
    # (Before: both hosts trained, exited with 0 and wrote checkpoints.)
    check_refused_before_any_step_within_seconds(engine, *disagreements[which], DISAGREEMENTS[which][1])


@pytest.mark.parametrize("which", ["sigma", "critic dtype"])
def test_issue_71_finding_19_the_hosts_compare_resolved_critics_naming_the_option_and_both_values(
    engine, disagreements, which
):
    """A head given by name on host 0 and as a spec on host 1 (both used to show `'hl_gauss'`, never the sigma);
    an option host 0 leaves at its default (`host 0 has no such option` before): both hosts' values named."""
    launch, _ = disagreements[which]
    assert not launch.lines(r"has no such option|host 0 has 'hl_gauss', host 1 has 'hl_gauss'"), launch.report()
    check_refused_before_any_step_within_seconds(engine, *disagreements[which], DISAGREEMENTS[which][1])


def test_finding_7_another_checkpoint_schedule_is_refused_before_any_step(engine, disagreements):
    # (Before: host 1 read host 0's checkpoint message as a preemption flag, a TypeError; a checkpoint was left.)
    check_refused_before_any_step_within_seconds(engine, *disagreements["schedule"], DISAGREEMENTS["schedule"][1])
