"""The launch helpers themselves: a launch is run again only where the hosts' connections failed."""

import pytest

from tests.multihost.launch import Launch, retried

FAILED_CONNECTION = (
    "[host 0] Traceback (most recent call last):\n"
    "[host 0] torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to "
    "the C10d store has failed.\n"
)
FAILED_STEP = "[host 1] Traceback (most recent call last):\n[host 1] ValueError: batch: got 3 rows\n"


def launches(folder, *results):
    """A launch returning `results` in turn; `calls` records, for each call, whether `folder` held the file a
    launch writes when it started; each call writes it."""
    calls = []

    def launch():
        calls.append(folder.joinpath("written").exists())
        folder.mkdir(exist_ok=True)
        folder.joinpath("written").write_text("a checkpoint")
        return results[len(calls) - 1]

    return launch, calls


def test_a_launch_whose_connections_failed_runs_again_once_from_scratch_with_a_warning(tmp_path):
    folder = tmp_path / "run"
    launch, calls = launches(folder, Launch(1, FAILED_CONNECTION, {}), Launch(0, "ok", {}))
    with pytest.warns(UserWarning, match="(?s)connections failed.*host 0: first error.*RendezvousConnectionError"):
        assert retried(launch, [str(folder)]).code == 0
    assert calls == [False, False]  # the first attempt's files were removed before the second
    launch, calls = launches(folder, Launch(1, FAILED_CONNECTION, {}), Launch(1, FAILED_CONNECTION, {}))
    with pytest.warns(UserWarning):
        assert retried(launch, [str(folder)]).code == 1
    assert calls == [True, False]


@pytest.mark.parametrize("result", [Launch(1, FAILED_STEP, {}), Launch(0, FAILED_CONNECTION, {})])
def test_a_launch_that_failed_otherwise_or_succeeded_runs_once_and_keeps_its_files(tmp_path, result):
    launch, calls = launches(tmp_path / "run", result)
    assert retried(launch, [str(tmp_path / "run")]) is result and calls == [False]
    assert (tmp_path / "run" / "written").exists()


def test_the_report_shows_each_hosts_first_error_before_the_tail():
    output = "[host 1] starting\n" + FAILED_STEP + "[host 0] x\n" * 2000
    report = Launch(1, output, {}).report()
    assert "--- host 1: first error ---\n[host 1] Traceback" in report and "ValueError: batch" in report
    assert "host 0: first error" not in report and report.endswith("[host 0] x\n")
