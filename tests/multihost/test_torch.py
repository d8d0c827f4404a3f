"""PyTorch DDP on two hosts of this machine, under torchrun and under Ray Train (examples/multihost/).

The shared `scenarios` run with torchrun; Ray Train runs the same DDP step on a two-node local Ray cluster
(`ray start --head`, `ray start --address=...`, one CPU per node), so its run is checked against the same
launches: the one-process step, and torchrun's uninterrupted two-host run.
"""

import re

import pytest

from tests.distributed.test_data_parallel import METRIC_RTOL, WEIGHT_ATOL
from tests.multihost.launch import (
    KINDS,
    RUN,
    global_metrics,
    hosts,
    largest_state_gap,
    metric_gaps,
    outputs,
    require,
    retried,
    same_state,
    succeeded,
)
from tests.multihost.scenarios import LOST_PEER, check_different_checkpoints_are_refused, out
from tests.multihost.scenarios import *  # noqa: F401,F403 (the shared tests, run for this engine)

# From the kill to both hosts' restored processes: the peer's error at once, then the launcher's restart (a
# new rendezvous round or Ray's health check every 2 s) and two new processes (imports included); measured
# 24-28 s on 2 busy cores. The collectives' own timeout is far above it in these runs (`--timeout 600`).
RESTART_LIMIT_S = 120.0


@pytest.fixture(scope="module")
def engine():
    require("torch")
    return "torch"


@pytest.fixture(scope="module")
def ending():
    return "refusal"


def test_hosts_with_different_checkpoints_are_refused_before_training(runs):
    check_different_checkpoints_are_refused(runs)


def restarted_within_the_limit(launch):
    """The kill time, and that every host restored the step-2 checkpoint within `RESTART_LIMIT_S` of it."""
    killed = launch.lines(r"killing itself before step 3 at time ([\d.]+)")
    # (Ray may echo a worker's line more than once: counted by host.)
    assert {re.search(r"\[host (\d)/2\]", line).group(1) for line in killed} == {"1"}, launch.report()
    restored = launch.lines(r"multi: restored step 2 .*saved on 2 host\(s\), restored on 2\) at time ([\d.]+)")
    assert {re.search(r"\[host (\d)/2\]", line).group(1) for line in restored} == {"0", "1"}, launch.report()
    at = float(re.search(r"at time ([\d.]+)", killed[0]).group(1))
    back = max(float(re.search(r"at time ([\d.]+)", line).group(1)) for line in restored)
    assert 0 < back - at < RESTART_LIMIT_S, f"every host restored {back - at:.1f} s after the kill"


def test_a_killed_host_makes_torchrun_restart_every_host_from_the_last_checkpoint(runs, tmp_path):
    # Host 1's process is killed before step 3. Host 0's process stops with gloo's error for the lost peer;
    # torchrun (--max-restarts=1) restarts both hosts' processes, which resume from the checkpoint of step 2
    # and finish with the uninterrupted run's state, bit for bit.
    out_dir, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    launch = succeeded(
        retried(
            lambda: hosts(
                "torch",
                "--critic",
                "multi",
                *RUN,
                "--kill-host",
                "1",
                "--kill-at-step",
                "3",
                "--timeout",
                "600",
                "--out",
                out_dir,
                "--checkpoint-dir",
                ckpt,
                launcher_args=["--max-restarts", "1"],
            ),
            [out_dir, ckpt],
        )
    )
    assert [line for line in launch.lines(LOST_PEER["torch"]) if line.startswith("[host 0]")], launch.report()
    restarted_within_the_limit(launch)
    restarted, uninterrupted = outputs(out_dir, "multi"), out(runs, "two", "multi")
    for host in range(2):
        assert int(restarted[host]["start"]) == 2
        assert same_state(restarted[host], uninterrupted[host]) is None


@pytest.fixture(scope="module")
def ray_run(runs, tmp_path_factory):
    """Ray Train, one job: the MultiCritic (its worker on the second node killed before step 3, restarted by
    `FailureConfig(max_failures=1)`), then the single critic and the ensemble."""
    require("ray")
    folder = tmp_path_factory.mktemp("ray")
    launch = succeeded(
        hosts(
            "ray",
            "--critic",
            "multi,single,ensemble",
            *RUN,
            "--kill-critic",
            "multi",
            "--kill-host",
            "1",
            "--kill-at-step",
            "3",
            "--max-failures",
            "1",
            "--timeout",
            "600",
            "--out",
            str(folder),
        )
    )
    return folder, launch


@pytest.mark.parametrize("kind", KINDS)
def test_ray_workers_on_two_nodes_step_as_one_process(runs, ray_run, kind):
    folder, _ = ray_run
    ray, one, two = outputs(str(folder), kind), out(runs, "one", kind), out(runs, "two", kind)
    assert [int(r["hosts"]) for r in ray] == [2, 2]
    assert len({str(r["node"]) for r in ray}) == 2  # one worker per node
    # As torchrun's hosts (scenarios): the one process stepped from the same state from step `first` on.
    first = int(one[0]["start"])
    gaps = {}
    for step in range(max(first, int(ray[0]["start"])), 4):
        got, want = global_metrics(ray, step, per_host=True), global_metrics(one, step, per_host=False)
        for name, gap in metric_gaps(got, want).items():
            gaps[name] = max(gaps.get(name, 0.0), gap)
    assert {"total", "grad_norm"} <= set(gaps) and not {k: g for k, g in gaps.items() if g >= METRIC_RTOL}, gaps
    assert largest_state_gap(ray[0], one[0]) < WEIGHT_ATOL
    assert same_state(ray[0], ray[1]) is None
    # The same DDP step as torchrun's, on the same data: the same state, bit for bit.
    assert same_state(ray[0], two[0]) is None


def test_ray_restarts_a_killed_worker_group_from_the_last_checkpoint(runs, ray_run):
    folder, launch = ray_run
    restarted_within_the_limit(launch)
    restarted, uninterrupted = outputs(str(folder), "multi"), out(runs, "two", "multi")
    for host in range(2):
        assert int(restarted[host]["start"]) == 2
        # The uninterrupted two-host DDP run's state (torchrun's: the same step), bit for bit.
        assert same_state(restarted[host], uninterrupted[host]) is None
