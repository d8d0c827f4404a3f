"""Two hosts that disagree are refused on both, before any collective of training (multicritic.training.hosts).

Two torch.distributed (gloo) processes as the hosts; the checks are the same on every engine (only
`Backend.gather_hosts` differs, which the examples' tests run on each engine).
"""

import json

import pytest

from tests.multihost.launch import require

pytestmark = pytest.mark.multihost


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    require("torch")
    from tests.multihost.agreement import launch

    folder = tmp_path_factory.mktemp("agreement")
    launch(str(folder))
    return folder, [json.loads((folder / f"host{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize(
    "case, part",
    [
        ("critic", "critic config"),
        ("options", "trainer options"),
        ("optimizer", "optimizer"),
        ("seed", "trainer options"),
    ],
)
def test_a_host_with_another_trainer_is_refused_on_every_host(seen, case, part):
    _, hosts = seen
    for host in hosts:
        error = host[case].get("error", "")
        assert error.startswith(f"CriticTrainer: got another {part} on host 1 (sha256 "), host[case]
        assert "expected the same on every host" in error


def test_agree_names_what_differs(seen):
    _, hosts = seen
    assert all(h["agree"].get("error", "").startswith("config: got another size on host 1") for h in hosts), hosts


def test_only_the_chief_writes_and_every_host_gets_its_path(seen):
    folder, hosts = seen
    assert hosts[0]["save"] == hosts[1]["save"] == {"ok": str(folder / "ckpt.npz")}
    assert not (folder / "missing").exists()


def test_a_checkpoint_one_host_cannot_read_is_restored_nowhere(seen):
    _, hosts = seen
    assert "is not a readable file" in hosts[1]["unreadable"]["error"]
    assert hosts[0]["unreadable"]["error"].startswith("path: host 1 cannot restore"), hosts[0]
    assert "no host restored it" in hosts[0]["unreadable"]["error"]


def test_different_checkpoints_are_restored_nowhere(seen):
    _, hosts = seen
    for host in hosts:
        assert host["different"]["error"].startswith("path: got another checkpoint on host 1 (sha256 "), host
        assert host["unchanged"] is True


def test_the_same_checkpoint_restores_everywhere(seen):
    _, hosts = seen
    for host in hosts:
        assert host["same"] == {"ok": {"step": 1, "saved_on_hosts": 2, "hosts": 2}}  # one even step trained


def test_another_batch_shape_or_an_uneven_split_is_refused_before_any_step(seen):
    _, hosts = seen
    for host in hosts:
        assert host["horizon"]["error"].startswith(
            "h: got per-host batch shapes [6, 8, 64] on host 0, [7, 8, 64] on host 1"[:26]
        ), host["horizon"]
        assert "expected the same shape on every host" in host["horizon"]["error"]
        assert host["uneven"]["error"].startswith("h: got per-host batch shapes [7, 8, "), host["uneven"]
        assert "a global batch of 15 along axis 1" in host["uneven"]["error"]
        assert host["steps before"] == 0  # nothing trained
        assert host["even"] == {"ok": True}


def test_another_resume_step_is_refused_with_each_hosts_value(seen):
    _, hosts = seen
    for host in hosts:
        assert host["resume"]["error"] == (
            "resume step: got [8, 4] on host 0, [] on host 1; expected the same on every host (the same checkpoints)."
        )


def test_a_preemption_signal_on_one_host_reaches_every_host_at_the_same_call(seen):
    _, hosts = seen
    for host in hosts:
        assert host["preempted before"] is False and host["preempted after"] is True
