"""The parts' contract, over the registries (`multicritic.heads.HEADS`, `multicritic.trunks.TRUNKS`): every
registered head and trunk passes Keras's `run_layer_test`, serializes (alone and in a critic's config), round
trips through weight files and `.keras` archives, runs as an ensemble (each member the single critic it
exports), trains, and exports. A new part is tested by registering it. (Checkpoints across backends: the
`cross-backend` session's kinds, `tests/portable.py`, come from the same registries.)"""

import json

import keras
import numpy as np
import pytest
from keras.src.testing import TestCase

from multicritic import CriticNetwork, CriticTrainer, critic_loss
from multicritic.files.export import SUPPORTED
from multicritic.heads import HEADS
from multicritic.registry import KERAS_KEYS, LAYER_KEYS
from multicritic.trunks import TRUNKS
from multicritic.validation import FixedOptionError
from tests import registry_throwaway as throwaway
from tests.conftest import BACKEND, compiled, random_inputs, randomize, to_np
from tests.docs.test_api_reference import parts_hook
from tests.files.test_export import assert_serves, exported

PARTS = [("head", name) for name in HEADS] + [("trunk", name) for name in TRUNKS]
IDS = [f"{kind}-{name}" for kind, name in PARTS]
B, D, U, K = 4, 12, 16, 3
TRUNK_SIZES = dict(model_size=None, num_dense_layers=2, dense_hidden_units=U)


def registry(kind):
    return HEADS if kind == "head" else TRUNKS


def critic_with(kind, name, **kwargs):
    return CriticNetwork(model_size="nano", **{kind: name}, **kwargs)


def forward(critic, h, z, use_ema=False):
    return [to_np(x) for x in critic(h, z, use_ema=use_ema)]


def declared_state(cls, init, input_shape):
    """How many non-trainable variables a built part holds as state its slow twin shares (`shared_state`, such
    as `AdaptiveSupportHead`'s support) or as statistics it moves from training batches (`batch_statistics`,
    such as `XQCTrunk`'s batch norms', which the EMA update averages as weights): the only ones a part may hold."""
    part = cls(**init)
    part.build(input_shape)
    declared = list(getattr(part, "shared_state", ())) + list(getattr(part, "batch_statistics", ()))
    return len({id(v) for v in declared})


@pytest.mark.parametrize("members", [None, K])
@pytest.mark.parametrize("kind, name", PARTS, ids=IDS)
def test_part_passes_keras_run_layer_test(kind, name, members):
    cls = registry(kind)[name]
    lead = (B,) if members is None else (K, B)
    if kind == "head":
        units = cls().units
        init, out, weights = {"members": members}, (lead, lead + (units,)), 2
    else:
        init, out, weights = {**TRUNK_SIZES, "members": members}, lead + (U,), None
    TestCase().run_layer_test(
        cls,
        init_kwargs=init,
        input_shape=(B, D) if kind == "trunk" else lead + (D,),
        expected_output_shape=out,
        expected_num_trainable_weights=weights,
        expected_num_non_trainable_weights=declared_state(cls, init, (B, D) if kind == "trunk" else lead + (D,)),
        expected_num_seed_generators=0,
        supports_masking=False,
    )


@pytest.mark.parametrize("kind, name", PARTS, ids=IDS)
def test_part_is_held_by_name_or_instance_and_its_options_travel_in_the_config(kind, name):
    critic = critic_with(kind, name)
    part = critic.return_layer if kind == "head" else critic.mlp
    assert getattr(critic, kind) == name
    spec = critic.get_config()[kind]
    assert spec == {"class_name": name, "config": registry(kind).own_options(part)}
    assert not set(spec["config"]) & (set(LAYER_KEYS) | set(registry(kind).shared))
    # The same part given as a configured instance, or as its spec, gives the same critic.
    for given in (registry(kind)[name](**spec["config"]), spec):
        again = critic_with(kind, given)
        assert again.get_config() == critic.get_config() | {"name": again.name}
    clone = CriticNetwork.from_config(critic.get_config())
    randomize(critic, seed=3)
    clone.set_weights(critic.get_weights())
    h, z = random_inputs(critic, 5)
    for got, want in zip(forward(clone, h, z), forward(critic, h, z)):
        np.testing.assert_array_equal(got, want)
    value, logits = critic(h, z)
    np.testing.assert_allclose(to_np(critic.decode(logits)), to_np(value), rtol=1e-6, atol=1e-6)


def test_a_shared_option_of_a_head_is_the_critics():
    """The support belongs to the critic: a head given with one (as an instance or a spec) is the critic's head
    where it agrees, and a `ValueError` naming the option before anything is built where it does not."""
    symexp = critic_with("head", "two_hot", bin_scheme="symexp")
    for head in (HEADS["two_hot"](bin_scheme="symexp"), {"class_name": "two_hot", "config": {"bin_scheme": "symexp"}}):
        again = critic_with("head", head, bin_scheme="symexp")
        assert again.get_config() == symexp.get_config() | {"name": again.name}
        with pytest.raises(
            ValueError, match=r"bin_scheme='symexp'.*critic has bin_scheme='uniform_symlog'.*give bin_sch"
        ):
            critic_with("head", head)
    with pytest.raises(ValueError, match=r"config has num_buckets=41, while the critic has num_buckets=255"):
        critic_with("head", {"class_name": "hl_gauss", "config": {"num_buckets": 41, "sigma": 0.75}})


@pytest.mark.parametrize("kind, name", PARTS, ids=IDS)
def test_part_round_trips_through_weight_files_and_keras_archives(kind, name, tmp_path):
    critic = critic_with(kind, name)
    randomize(critic, seed=4)
    h, z = random_inputs(critic, 6)
    want = forward(critic, h, z) + forward(critic, h, z, use_ema=True)
    critic.save_weights(tmp_path / "c.weights.h5")
    fresh = critic_with(kind, name)
    fresh.load_weights(tmp_path / "c.weights.h5")
    critic.save(tmp_path / "c.keras")
    loaded = keras.saving.load_model(tmp_path / "c.keras")
    assert type(loaded.return_layer) is type(critic.return_layer) and type(loaded.mlp) is type(critic.mlp)
    for other in (fresh, loaded):
        for got, w in zip(forward(other, h, z) + forward(other, h, z, use_ema=True), want):
            np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("kind, name", PARTS, ids=IDS)
def test_part_in_an_ensemble_is_each_members_single_critic_and_trains(kind, name):
    ensemble = critic_with(kind, name, ensemble_size=K)
    randomize(ensemble, seed=5)
    h, z = random_inputs(ensemble, 7)
    values, logits = forward(ensemble, h, z)
    for m in range(K):
        single = critic_with(kind, name)
        single.set_weights(ensemble.get_member_weights(m))
        got_value, got_logits = forward(single, h, z)
        np.testing.assert_allclose(got_value, values[m], rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(got_logits, logits[m], rtol=2e-5, atol=2e-5)
    trainer = CriticTrainer(ensemble, learning_rate=1e-3)
    before = [to_np(v) for v in ensemble.trainable_variables]
    targets = np.random.default_rng(0).normal(scale=30.0, size=7).astype("float32")
    metrics = trainer.train_step(h, z, targets, np.ones(7, "float32"))
    assert np.isfinite(float(to_np(metrics["total"]))) and float(to_np(metrics["total"])) > 0
    assert any(not np.array_equal(b, to_np(v)) for b, v in zip(before, ensemble.trainable_variables))


@pytest.mark.parametrize("kind, name", PARTS, ids=IDS)
def test_part_trains_the_same_in_the_compiled_step(kind, name):
    # The backend's compiled train step (jax.jit, tf.function with XLA, PyTorch's whole step traced into one
    # graph) against its eager step, from the same weights: the losses and the weights after two steps.
    runs = []
    for jit_compile in (False, True):
        critic = critic_with(kind, name)
        randomize(critic, seed=8)
        trainer = CriticTrainer(critic, learning_rate=1e-3, jit_compile=jit_compile)
        h, z = random_inputs(critic, 6)
        targets = np.random.default_rng(2).normal(scale=30.0, size=6).astype("float32")
        totals = [to_np(trainer.train_step(h, z, targets, np.ones(6, "float32"))["total"]) for _ in range(2)]
        runs.append((totals, [to_np(v) for v in critic.weights]))
    (eager_totals, eager_weights), (totals, weights) = runs
    np.testing.assert_allclose(totals, eager_totals, rtol=1e-5)
    for got, want in zip(weights, eager_weights):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", HEADS)
def test_the_loss_of_a_head_is_the_same_compiled(name):
    critic = critic_with("head", name)
    randomize(critic, seed=6)
    h, z = random_inputs(critic, 8)
    _, logits = critic(h, z)
    ema_value, _ = critic(h, z, use_ema=True)
    targets = np.random.default_rng(1).normal(scale=10.0, size=8).astype("float32")
    weights = np.ones(8, "float32")
    eager = to_np(critic_loss(logits, targets, ema_value, weights, **critic.loss_options())["total"])

    jitted = compiled(lambda lg, t, e, w: critic_loss(lg, t, e, w, **critic.loss_options())["total"])
    args = [keras.ops.convert_to_tensor(x) for x in (logits, targets, ema_value, weights)]
    np.testing.assert_allclose(to_np(jitted(*args)), eager, rtol=1e-5)
    assert np.isfinite(eager) and eager > 0


@pytest.mark.parametrize("kind, name", PARTS, ids=IDS)
def test_part_exports_and_serves_what_keras_computes(kind, name, tmp_path):
    formats = [f for f in SUPPORTED[BACKEND] if f != "litert"] or list(SUPPORTED[BACKEND])
    critic = critic_with(kind, name)
    randomize(critic, seed=7)
    assert_serves(exported(critic, tmp_path, formats[0]), critic, batches=(1, 5))


# ---------------------------------------------------------------- issue 62: a part is as fixed and clear as the critic


def part_of(critic, kind):
    return critic.return_layer if kind == "head" else critic.mlp


@pytest.mark.parametrize("kind, name", PARTS, ids=IDS)
def test_issue_62_finding_1_a_parts_options_are_fixed_once_built(kind, name):
    """Each option of a built critic's part (its own and the shared ones: every key of its config but Keras's)
    refuses an assignment with `FixedOptionError`, leaving the part and its config as they were (an assigned
    `kappa`, `sigma`, `symlog` or `activation` was taken by one backend's step and not another's, and a `.keras`
    file saved after it was another network)."""
    critic = critic_with(kind, name)
    part = part_of(critic, kind)
    config = part.get_config()
    options = [k for k in config if k not in KERAS_KEYS]
    assert set(registry(kind).own_options(part)) <= set(options) and set(registry(kind).shared) & set(options)
    for option in options:
        with pytest.raises(FixedOptionError, match=rf"^{option}: got an assignment of 0\.5 to {type(part).__name__}"):
            setattr(part, option, 0.5)
    assert part.get_config() == config


@pytest.mark.parametrize("kind, name", PARTS, ids=IDS)
def test_a_parts_options_are_its_constructors_arguments_kept_as_attributes(kind, name):
    """What `FixedOptions` fixes (the constructors' arguments) is what the part's config stores."""
    part = part_of(critic_with(kind, name), kind)
    assert part.__dict__["_fixed_names"] == {k for k in part.get_config() if k not in KERAS_KEYS}


@pytest.mark.parametrize(
    "head, trunk, part, option, value",
    [
        ("quantile", "mlp", "return_layer", "kappa", 2.0),
        ("hl_gauss", "mlp", "return_layer", "sigma", 0.5),
        ("mse", "mlp", "return_layer", "symlog", False),
        ("two_hot", "residual", "mlp", "activation", "relu"),
    ],
)
def test_issue_62_finding_1_the_reported_assignments_are_refused(head, trunk, part, option, value):
    critic = CriticNetwork(model_size="nano", head=head, trunk=trunk)
    before = critic.get_config()
    with pytest.raises(FixedOptionError, match=rf"^{option}: got an assignment of {value!r}"):
        setattr(getattr(critic, part), option, value)
    assert critic.get_config() == before | {"name": critic.name}


def test_issue_62_finding_2_an_activation_is_a_name_or_refused_at_construction(tmp_path):
    """A Keras activation given as its function is kept as its name (the config is JSON, the weights file
    loads); a function Keras cannot save by name is refused when the trunk is built, naming `activation`."""
    trunk = TRUNKS["residual"](activation=keras.activations.relu)
    assert trunk.activation == "relu" and json.loads(json.dumps(trunk.get_config()))["activation"] == "relu"
    critic = critic_with("trunk", trunk)
    randomize(critic, seed=1)
    critic.save_weights(tmp_path / "c.weights.h5")
    again = CriticNetwork.from_config(json.loads(json.dumps(critic.get_config())))
    again.load_weights(tmp_path / "c.weights.h5")
    h, z = random_inputs(critic, 3)
    for got, want in zip(forward(again, h, z), forward(critic, h, z)):
        np.testing.assert_array_equal(got, want)
    relu = CriticNetwork(model_size="nano", trunk=TRUNKS["residual"](activation="relu"))
    relu.set_weights(critic.get_weights())
    for got, want in zip(forward(relu, h, z), forward(critic, h, z)):
        np.testing.assert_array_equal(got, want)

    def unnamed(x):
        return keras.ops.relu(x)

    for bad in (unnamed, lambda x: x, "no_such_activation", 3):
        with pytest.raises(ValueError, match=r"^activation: got .*expected a Keras activation name"):
            TRUNKS["residual"](activation=bad)


class TaggedHead(throwaway.ThrowawayHead):
    """A head that keeps an option as given: what the mechanism must check."""

    def __init__(self, *, tag="a", **kwargs):
        self.tag = tag
        super().__init__(**kwargs)

    def get_config(self):
        return {**super().get_config(), "tag": self.tag}


def test_issue_62_finding_2_any_option_that_cannot_be_saved_is_refused_at_construction():
    assert TaggedHead(tag={"a": [1, 2.5]}).get_config()["tag"] == {"a": [1, 2.5]}
    with pytest.raises(ValueError, match=r"^tag: got <object object .*expected a value a config can hold"):
        TaggedHead(tag=object())


@pytest.mark.parametrize("kind, name", PARTS, ids=IDS)
def test_issue_62_finding_4_a_registered_class_is_taken_as_its_name(kind, name):
    """`CriticNetwork(head=QuantileHead)` (the class) is the critic of `head="quantile"` (its defaults, the
    critic's shared options): it raised `TypeError: get_config() missing 'self'`."""
    by_class = critic_with(kind, registry(kind)[name], bin_scheme="uniform_symlog")
    by_name = critic_with(kind, name, bin_scheme="uniform_symlog")
    assert by_class.get_config() == by_name.get_config() | {"name": by_class.name}


def test_issue_62_finding_4_an_unregistered_class_says_what_to_pass():
    with pytest.raises(ValueError, match=r"^head: got a TaggedHead, which is not registered; expected one of"):
        critic_with("head", TaggedHead)
    with pytest.raises(ValueError, match=r"^trunk: got a int, which is not registered"):
        critic_with("trunk", int)


@pytest.fixture
def throwaway_parts():
    """The throwaway head and trunk registered (one line each)."""
    HEADS.register("throwaway", "tests.registry_throwaway:ThrowawayHead")
    TRUNKS.register("throwaway", "tests.registry_throwaway:ThrowawayTrunk")
    try:
        yield
    finally:
        HEADS.unregister("throwaway")
        TRUNKS.unregister("throwaway")


def test_a_new_part_is_one_module_and_one_registration_line(throwaway_parts, tmp_path):
    """The registry-driven checks take a newly registered head and trunk, and the docs' parts table and API
    reference list them, with no other edit."""
    for kind in ("head", "trunk"):
        assert (kind, "throwaway") in [(k, n) for k in ("head", "trunk") for n in registry(k)]
        test_part_passes_keras_run_layer_test(kind, "throwaway", None)
        test_part_is_held_by_name_or_instance_and_its_options_travel_in_the_config(kind, "throwaway")
        test_part_round_trips_through_weight_files_and_keras_archives(kind, "throwaway", tmp_path)
        test_part_trains_the_same_in_the_compiled_step(kind, "throwaway")
        test_issue_62_finding_1_a_parts_options_are_fixed_once_built(kind, "throwaway")
        test_a_parts_options_are_its_constructors_arguments_kept_as_attributes(kind, "throwaway")
    test_the_loss_of_a_head_is_the_same_compiled("throwaway")
    assert throwaway.ThrowawayHead is __import__("multicritic.heads", fromlist=["x"]).ThrowawayHead
    hook = parts_hook()
    rows = hook.table()
    assert "| head | `throwaway` | `tests.registry_throwaway.ThrowawayHead` | `delta=2.0` |" in rows
    assert (
        "| trunk | `throwaway` | `tests.registry_throwaway.ThrowawayTrunk` | `output_layer_size=None`, `gain=0.5` |"
        in rows
    )
    # A head declared under the package's path, as a new module of the package is: its page is rendered.
    HEADS.register("in_package", "multicritic.heads.in_package:InPackageHead")
    try:
        page = hook.on_page_markdown("::: multicritic.heads.base\n\n<!-- parts: api head -->\n")
    finally:
        HEADS.unregister("in_package")
    assert "::: multicritic.heads.in_package" in page and "::: multicritic.heads.two_hot" in page
    assert "tests.registry_throwaway" not in page  # (a part outside the package is not in its reference)


@pytest.mark.parametrize("kind, name", PARTS, ids=IDS)
def test_the_docs_read_each_parts_own_options_as_the_part_has_them(kind, name):
    """The docs' parts table reads the own options' defaults from the source (the docs are built without Keras):
    they are those of the part's config."""
    part = registry(kind)[name]()
    assert parts_hook().own_defaults(registry(kind), name) == registry(kind).own_options(part)
