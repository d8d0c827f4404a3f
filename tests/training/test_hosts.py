"""multicritic.training.hosts on one host: what it records and says, and the fingerprint it compares.

(The checks between hosts run in tests/multihost, with several processes.)
"""

import hashlib
import json
import warnings

import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer, MultiCritic

from multicritic.files import integrity
from multicritic.training import checkpoint, hosts
from tests.conftest import to_np


def make(seed=0, **kwargs):
    critic = CriticNetwork(model_size="nano")
    rng = np.random.default_rng(seed)
    critic.set_weights([rng.normal(scale=0.2, size=tuple(v.shape)).astype("float32") for v in critic.weights])
    return CriticTrainer(critic, seed=0, **kwargs)


def test_one_host_is_host_zero_of_one_and_exchanges_with_itself():
    assert hosts.topology() == (0, 1) and hosts.is_chief()
    assert hosts.gather({"a": [1, 2]}) == [{"a": [1, 2]}]
    hosts.agree("anything", {"x": 1})  # nothing to disagree with


def test_a_checkpoint_records_the_hosts_and_restoring_reports_them(tmp_path):
    trainer = make()
    path = trainer.save(tmp_path / "one")
    with np.load(path) as archive:
        assert '"hosts": 1' in str(archive["meta"][()])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert make(seed=1).restore(path) == {"step": 0, "saved_on_hosts": 1, "hosts": 1}
    assert not [w for w in said if "host(s)" in str(w.message)]  # the same host count: nothing to say


def test_restoring_a_checkpoint_of_two_hosts_on_one_works_and_says_so(tmp_path):
    trainer = make()
    path = checkpoint.save(trainer, tmp_path / "two", hosts=2)  # as host 0 of a two-host run writes it
    other = make(seed=1)
    with pytest.warns(UserWarning, match=r"saved by a run on 2 host\(s\) and is restored on 1"):
        info = other.restore(path)
    assert info == {"step": 0, "saved_on_hosts": 2, "hosts": 1}
    for a, b in zip(trainer.state_variables, other.state_variables):
        np.testing.assert_array_equal(to_np(a), to_np(b))


def test_check_reads_a_checkpoint_without_assigning_it(tmp_path):
    trainer = make()
    path = trainer.save(tmp_path / "state")
    other = make(seed=1)
    before = [to_np(v) for v in other.state_variables]
    checked = checkpoint.check(other, path)
    content, sealed = integrity.read_file(path, "path")
    assert sealed and checked.digest == hashlib.sha256(content).hexdigest() and checked.hosts == 1
    keyed = checkpoint.keyed_variables(trainer)
    assert set(checked.values) == set(keyed)
    for key, var in keyed.items():
        np.testing.assert_array_equal(checked.values[key], to_np(var))
    for a, v in zip(before, other.state_variables):
        np.testing.assert_array_equal(a, to_np(v))


def test_the_fingerprint_changes_with_what_a_host_must_share():
    base = hosts.fingerprint(make())
    assert hosts.fingerprint(make(seed=5)) == base  # weights are not part of it
    assert set(base) == {"critic config", "trainer options", "optimizer", "state variables"}
    changed = {
        "trainer options": hosts.fingerprint(make(gamma=0.99)),
        "optimizer": hosts.fingerprint(make(learning_rate=1e-4)),
    }
    for part, other in changed.items():
        assert [k for k in base if base[k] != other[k]] == [part]
    ensemble = hosts.fingerprint(CriticTrainer(CriticNetwork(model_size="nano", ensemble_size=2), seed=0))
    assert ensemble["critic config"] != base["critic config"] and ensemble["state variables"] != base["state variables"]
    # Without a seed, "min_of_random" draws differ from host to host: the draw seeds are part of it.
    drawn = [
        hosts.fingerprint(CriticTrainer(CriticNetwork(model_size="nano", ensemble_size=3, aggregation="min_of_random")))
        for _ in range(2)
    ]
    assert drawn[0]["trainer options"] != drawn[1]["trainer options"]


def test_a_multi_critic_fingerprint_covers_its_streams():
    def multi(head):
        return MultiCritic({"task": {"model_size": "nano"}, "explore": {"model_size": "nano", "head": head}})

    a = hosts.fingerprint(CriticTrainer(multi("two_hot"), seed=0))
    b = hosts.fingerprint(CriticTrainer(multi("hl_gauss"), seed=0))
    assert a["critic config"] != b["critic config"]


class FakeHosts:
    """`hosts` as host `index` of `len(others) + 1`: each exchange's rows are this host's and `others(...)`'s
    (what each other host sends, from this host's message)."""

    def __init__(self, monkeypatch, index, others):
        self.rounds = []
        monkeypatch.setattr(hosts, "topology", lambda variables=(): (index, len(others) + 1))

        def exchange(data, width, variables):
            assert len(data) <= width
            self.rounds.append(width)
            theirs = [other(data, len(self.rounds)) for other in others]
            return theirs[:index] + [data] + theirs[index:]

        monkeypatch.setattr(hosts, "_exchange", exchange)


def test_finding_8_agree_names_the_first_option_that_differs_and_each_hosts_value(monkeypatch):
    def config(sigma, gamma=0.99):
        head = {"class_name": "hl_gauss", "config": {"sigma": sigma}}
        return {"critic option": {"head": head, "num_buckets": 255}, "trainer option": {"gamma": gamma}}

    def sent(value):
        return lambda data, call: json.dumps(json.loads(data) | {"value": value}).encode()

    FakeHosts(monkeypatch, 0, [sent(config(1.0, gamma=0.9)), sent(config(0.75))])
    with pytest.raises(ValueError) as err:
        hosts.agree("CriticTrainer", config(0.75))
    assert str(err.value) == (
        "CriticTrainer: hosts disagree on critic option 'head.sigma': host 0 has 0.75, host 1 has 1.0, host 2 has "
        "0.75; they also differ on trainer option 'gamma'; expected the same on every host (build the same critic "
        "and trainer, with the same seed and options, on every host)."
    )
    # Another head kind: named by its name; an option one host lacks.
    two_hot = {"critic option": {"head": {"class_name": "two_hot", "config": {}}, "num_buckets": 255}}
    FakeHosts(monkeypatch, 1, [sent(two_hot)])
    with pytest.raises(ValueError, match=r"on critic option 'head': host 0 has 'two_hot', host 1 has 'hl_gauss'; "):
        hosts.agree("CriticTrainer", config(0.75))
    mixed = config(0.75)
    mixed["critic option"]["dtype"] = "mixed_bfloat16"
    FakeHosts(monkeypatch, 1, [sent(mixed)])
    with pytest.raises(ValueError, match=r"option 'dtype': host 0 has 'mixed_bfloat16', host 1 has no such option; "):
        hosts.agree("CriticTrainer", config(0.75))
    FakeHosts(monkeypatch, 0, [sent(config(0.75))])
    hosts.agree("CriticTrainer", config(0.75))  # the same everywhere


def test_finding_8_configs_larger_than_one_round_travel_whole_in_a_second(monkeypatch):
    big = {f"option {i:04d}": i for i in range(400)}  # several KiB of JSON
    fake = FakeHosts(monkeypatch, 0, [lambda data, call: data])
    assert hosts.gather(big, kind="agree x") == [big, big]
    assert fake.rounds[0] == hosts.EXCHANGE_BYTES and fake.rounds[1] % hosts.EXCHANGE_BYTES == 0
    assert hosts.gather({"small": 1}) == [{"small": 1}] * 2 and fake.rounds[2:] == [hosts.EXCHANGE_BYTES]  # one


def test_finding_7_a_message_of_another_kind_is_refused_naming_both_kinds(monkeypatch, tmp_path):
    # Host 1 checks for a preemption where this host, host 0, checkpoints (another checkpoint schedule): it used
    # to read the other's flag as the chief's status (`TypeError: argument of type 'bool' is not iterable`).
    trainer = make(seed=1)
    preempt = json.dumps({"kind": "preempt", "value": False}).encode()
    FakeHosts(monkeypatch, 0, [lambda data, call: preempt])
    with pytest.raises(hosts.HostsOutOfStep) as err:
        trainer.save(tmp_path / "never-written.npz")
    assert str(err.value).startswith(
        "hosts out of step: host 0 expected a 'checkpoint' message and got a 'preempt' message from host 1 "
        "(host 0 'checkpoint', host 1 'preempt'); expected every host to make the same exchanges in the same order"
    )
    assert not isinstance(err.value, ValueError)  # no input to fix (and no damaged checkpoint to pass over)
    assert not list(tmp_path.iterdir())  # refused before host 0 wrote anything
    assert hosts.preempted() is False  # a message of the kind expected


RESOLVED_SPECS = {
    "default": {"model_size": "nano"},
    "head by name": {"model_size": "nano", "head": "hl_gauss"},
    "head by spec": {"model_size": "nano", "head": {"class_name": "hl_gauss", "config": {"sigma": 1.0}}},
    "legacy sigma": {"model_size": "nano", "head": "hl_gauss", "hl_gauss_sigma": 0.5},
    "ensemble": {"model_size": "nano", "ensemble_size": 3, "aggregation": "min_of_random", "dtype": "mixed_bfloat16"},
    "explicit": {
        **{"model_size": None, "num_dense_layers": 2, "dense_hidden_units": 8, "gru_units": 4},
        **{"num_z_categoricals": 2, "num_z_classes": 3, "trunk": "residual", "norm": "rms", "norm_epsilon": 1e-4},
        **{"use_bias": True, "bin_scheme": "symexp", "kernel_initializer": "he_normal", "input_layout": "z_h"},
    },
    "other parts": {"model_size": "nano", "head": "quantile", "trunk": "residual"},
    "part options": {"model_size": "nano", "head": {"class_name": "mse", "config": {"symlog": False}}},
    "multi": {
        "critics": {"task": {"model_size": "nano"}, "explore": {"model_size": "nano", "head": "hl_gauss"}},
        "stream_weights": {"explore": 0.5},
        "normalizers": {"task": {"impl": "perc", "rate": 0.01, "debias": True}, "explore": "meanstd"},
    },
    "multi per task": {  # issue 74: a normaliser's statistics per task
        "critics": {"task": {"model_size": "nano"}},
        "normalizers": {"task": {"impl": "perc", "num_tasks": 2}},
    },
}


def replay(monkeypatch, spec):
    """What a host asking for `spec` sends in `agree_critic`'s exchanges, in order (as host 1 of 2, every host
    sending the same)."""
    sent = []
    FakeHosts(monkeypatch, 1, [lambda data, call: data])
    monkeypatch.setattr(hosts, "_exchange", lambda data, width, variables: sent.append(data) or [data, data])
    hosts.agree_critic("critic 'single'", spec, {"run option": {"steps": 4}})
    return sent


@pytest.mark.parametrize("name", sorted(RESOLVED_SPECS))
def test_issue_71_finding_19_critic_config_is_the_built_critics_config_without_building_it(name):
    spec = RESOLVED_SPECS[name]
    resolved = hosts.critic_config(spec)
    built = (MultiCritic(**spec) if "critics" in spec else CriticNetwork(**spec)).get_config()
    assert json.dumps(resolved) == json.dumps(built)  # the same options, values and order

    def named(config):  # what `agree_critic` exchanges: without Keras's serialization (it imports TensorFlow)
        if isinstance(config, dict):
            return {
                k: v["config"]["name"] if k == "dtype" else None if k == "kernel_initializer" else named(v)
                for k, v in config.items()
            }
        return config

    assert json.dumps(hosts._resolved(spec, serialized=False)) == json.dumps(named(built))


def test_issue_71_finding_19_hosts_compare_the_resolved_configs_naming_the_option_and_both_values(monkeypatch):
    """Before building the critic (the examples' pre-build check): a head given by name on host 0 (HL-Gauss's
    default sigma, 0.75) and as a spec with sigma 1.0 on host 1 (both used to show `'hl_gauss'`); an option host 0
    leaves at its default (`host 0 has no such option` before); the critic's dtype policy. The same words as
    `CriticTrainer`'s own check."""
    hl = {"class_name": "hl_gauss", "config": {"sigma": 1.0}}
    for ours, theirs, message in (
        ({"head": "hl_gauss"}, {"head": hl}, "critic option 'head.sigma': host 0 has 0.75, host 1 has 1.0;"),
        ({}, {"ensemble_size": 2}, "critic option 'ensemble_size': host 0 has 1, host 1 has 2;"),
        ({}, {"dtype": "mixed_bfloat16"}, "dtype policy 'critic': host 0 has 'float32', host 1 has 'mixed_bfloat16';"),
        ({"head": "two_hot"}, {"head": hl}, "critic option 'head': host 0 has 'two_hot', host 1 has 'hl_gauss';"),
    ):
        other = replay(monkeypatch, {"model_size": "nano", **theirs})
        FakeHosts(monkeypatch, 0, [lambda data, call, other=other: other[call - 1]])
        with pytest.raises(ValueError) as err:
            hosts.agree_critic("critic 'single'", {"model_size": "nano", **ours}, {"run option": {"steps": 4}})
        assert str(err.value).startswith(f"critic 'single': hosts disagree on {message}"), str(err.value)
        assert "expected the same on every host" in str(err.value)
    # The same critic asked for two ways (its defaults given or left out): agreed.
    explicit = {"model_size": "nano", "head": {"class_name": "hl_gauss", "config": {"sigma": 0.75}}, "dtype": "float32"}
    other = replay(monkeypatch, dict(explicit, ensemble_size=1, aggregation="mean", num_buckets=255))
    fake = FakeHosts(monkeypatch, 0, [lambda data, call: other[call - 1]])
    hosts.agree_critic("critic 'single'", {"model_size": "nano", "head": "hl_gauss"}, {"run option": {"steps": 4}})
    assert fake.rounds == [hosts.EXCHANGE_BYTES]  # one small exchange, as the spec itself took
    # This host's own spec that cannot be resolved: its own error, once the others know.
    fake = FakeHosts(monkeypatch, 0, [lambda data, call: other[call - 1]])
    with pytest.raises(ValueError, match=r"^norm: got 'x', expected one of"):
        hosts.agree_critic("critic 'single'", {"model_size": "nano", "norm": "x"}, {"run option": {"steps": 4}})
    assert fake.rounds == [hosts.EXCHANGE_BYTES]
    # A spec one host cannot resolve: refused on every host, naming that host (not a host waiting alone).
    FakeHosts(
        monkeypatch,
        0,
        [
            lambda data, call: json.dumps(
                {"kind": "agree critic 'single'", "value": {"error": "ValueError: norm: got 'x'"}}
            ).encode()
        ],
    )
    with pytest.raises(
        ValueError, match=r"^critic 'single': host 1 cannot build the critic it asks for \(ValueError: norm"
    ):
        hosts.agree_critic("critic 'single'", {"model_size": "nano"})


def test_issue_71_finding_19_agree_shows_whole_specs_of_one_kind(monkeypatch):
    """`agree` on raw specs: two specs of one kind that differ show whole (their name alone told them apart by
    nothing)."""
    ours = {"critic option": {"head": {"class_name": "hl_gauss", "config": {"sigma": 0.75}, "x": 1}}}
    theirs = {"critic option": {"head": {"class_name": "hl_gauss", "config": {"sigma": 0.75}, "x": 2}}}
    FakeHosts(monkeypatch, 0, [lambda data, call: json.dumps(json.loads(data) | {"value": theirs}).encode()])
    with pytest.raises(
        ValueError, match=r"'head': host 0 has \{'class_name': 'hl_gauss', .*'x': 1\}, host 1 has .*'x': 2\}"
    ):
        hosts.agree("CriticTrainer", ours)
