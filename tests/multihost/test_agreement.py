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


def refused(hosts, case, message):
    """Every host refused `case` with an error starting `message`, saying what every host should do."""
    for host in hosts:
        error = host[case].get("error", "")
        assert error.startswith(message), (case, host[case])
        assert "expected the same on every host" in error, host[case]
    assert hosts[0][case] == hosts[1][case]  # the same words on every host


@pytest.mark.parametrize(
    "case, message",
    [
        ("critic", "critic option 'ensemble_size': host 0 has 1, host 1 has 2"),
        ("options", "trainer option 'gamma': host 0 has 0.997, host 1 has 0.99"),
        ("optimizer", "optimizer 'default Adam.learning_rate': host 0 has 3e-05, host 1 has 0.0001"),
        ("seed", "trainer options 'member_draw_seeds."),
    ],
)
def test_a_host_with_another_trainer_is_refused_on_every_host(seen, case, message):
    refused(seen[1], case, f"CriticTrainer: hosts disagree on {message}")


def test_agree_names_what_differs(seen):
    refused(seen[1], "agree", "config: hosts disagree on size: host 0 has 'nano', host 1 has 'mini';")


@pytest.mark.parametrize(
    "case, message",
    [
        ("head kind", "critic option 'head': host 0 has 'two_hot', host 1 has 'hl_gauss'"),
        ("buckets", "critic option 'num_buckets': host 0 has 255, host 1 has 127"),
        ("sigma", "critic option 'head.sigma': host 0 has 0.75, host 1 has 1.0"),
        ("trunk", "critic option 'trunk': host 0 has 'mlp', host 1 has 'residual'"),
        ("aggregation", "critic option 'aggregation': host 0 has 'mean', host 1 has 'min'"),
        ("ema decay", "critic option 'ema_decay': host 0 has 0.98, host 1 has 0.99"),
    ],
)
def test_finding_8_a_critic_option_that_differs_is_named_with_each_hosts_value(seen, case, message):
    refused(seen[1], case, f"CriticTrainer: hosts disagree on {message}")


def test_finding_6_hosts_with_another_dtype_policy_are_refused(seen):
    """Finding 6: the critic's own `dtype=`, and a global `keras.config.set_dtype_policy` on host 1 alone (both
    trained before, and wrote checkpoints)."""
    _, hosts = seen
    mixed = "host 0 has 'float32', host 1 has 'mixed_bfloat16'"
    refused(hosts, "critic dtype", f"CriticTrainer: hosts disagree on dtype policy 'critic': {mixed};")
    refused(hosts, "global dtype", f"CriticTrainer: hosts disagree on dtype policy 'global': {mixed}; they also differ")


def test_values_larger_than_one_round_of_the_exchange_are_compared_whole(seen):
    _, hosts = seen
    refused(hosts, "large", "config: hosts disagree on big 'option 0399': host 0 has 0, host 1 has 1;")
    assert all(host["large same"] == {"ok": True} for host in hosts)


def test_finding_7_a_host_in_another_exchange_is_refused_naming_both_kinds(seen):
    folder, hosts = seen
    for rank, host in enumerate(hosts):
        assert host["out of step"]["type"] == "HostsOutOfStep", host["out of step"]
        mine, theirs = ("checkpoint", "preempt") if rank == 0 else ("preempt", "checkpoint")
        assert host["out of step"]["error"].startswith(
            f"hosts out of step: host {rank} expected a '{mine}' message and got a '{theirs}' message from "
            f"host {1 - rank} (host 0 'checkpoint', host 1 'preempt'); expected every host to make the same exchanges"
        ), host["out of step"]
        assert host["early written"] is False  # host 0 writes only once every host is saving
    assert not (folder / "early.npz").exists()
    # In step again: the next exchanges (the preemption flags, a save) agree.
    assert hosts[0]["save"] == hosts[1]["save"] == {"ok": str(folder / "ckpt.npz")}


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
