"""The launch helpers themselves: a launch is run again only where the hosts' connections failed."""

import pytest

from tests.multihost.launch import Launch, retried

FAILED_CONNECTION = ("[host 0] Traceback (most recent call last):\n"
                     "[host 0] torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to "
                     "the C10d store has failed.\n")
FAILED_STEP = "[host 1] Traceback (most recent call last):\n[host 1] ValueError: batch: got 3 rows\n"


def launches(*results):
    calls = []

    def launch_again():
        calls.append(len(calls))
        return results[len(calls) - 1]

    return launch_again, calls


def test_a_launch_whose_connections_failed_runs_again_once_with_a_warning():
    launch_again, calls = launches(Launch(1, FAILED_CONNECTION, {}), Launch(0, "ok", {}))
    with pytest.warns(UserWarning, match="(?s)connections failed.*host 0: first error.*RendezvousConnectionError"):
        assert retried(launch_again).code == 0
    assert calls == [0, 1]
    launch_again, calls = launches(Launch(1, FAILED_CONNECTION, {}), Launch(1, FAILED_CONNECTION, {}))
    with pytest.warns(UserWarning):
        assert retried(launch_again).code == 1
    assert calls == [0, 1]


@pytest.mark.parametrize("launch", [Launch(1, FAILED_STEP, {}), Launch(0, FAILED_CONNECTION, {})])
def test_a_launch_that_failed_otherwise_or_succeeded_runs_once(launch):
    launch_again, calls = launches(launch)
    assert retried(launch_again) is launch and calls == [0]


def test_the_report_shows_each_hosts_first_error_before_the_tail():
    output = "[host 1] starting\n" + FAILED_STEP + "[host 0] x\n" * 2000
    report = Launch(1, output, {}).report()
    assert "--- host 1: first error ---\n[host 1] Traceback" in report and "ValueError: batch" in report
    assert "host 0: first error" not in report and report.endswith("[host 0] x\n")
