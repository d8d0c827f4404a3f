"""Two tensorflow hosts on this machine (examples/multihost/), checked as `scenarios` says."""

import pytest

from tests.multihost.launch import require
from tests.multihost.scenarios import check_a_killed_host_stops_the_others
from tests.multihost.scenarios import *  # noqa: F401,F403 (the shared tests, run for this engine)


@pytest.fixture(scope="module")
def engine():
    require("tensorflow")
    return "tensorflow"


@pytest.fixture(scope="module")
def ending():
    return "kill"


def test_a_killed_host_stops_the_others_with_an_error(engine, runs):
    check_a_killed_host_stops_the_others(engine, runs)
