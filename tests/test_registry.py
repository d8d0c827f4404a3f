"""The parts' contract, over the registries (`multicritic.heads.HEADS`, `multicritic.trunks.TRUNKS`): every
registered head and trunk passes Keras's `run_layer_test`, serializes (alone and in a critic's config), round
trips through weight files and `.keras` archives, runs as an ensemble (each member the single critic it
exports), trains, and exports. A new part is tested by registering it. (Checkpoints across backends: the
`cross-backend` session's kinds, `tests/portable.py`, come from the same registries.)"""

import keras
import numpy as np
import pytest
from keras.src.testing import TestCase

from multicritic import CriticNetwork, CriticTrainer, critic_loss
from multicritic.files.export import SUPPORTED
from multicritic.heads import HEADS
from multicritic.registry import LAYER_KEYS
from multicritic.trunks import TRUNKS
from tests.conftest import BACKEND, compiled, random_inputs, randomize, to_np
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
        expected_num_non_trainable_weights=0,
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
