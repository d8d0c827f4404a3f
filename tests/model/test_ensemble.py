"""Ensembles: member k of a stacked ensemble is a single critic with member k's weights."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer, critic_loss
from tests.conftest import random_inputs, randomize, to_np

K = 3


def ensemble_and_members(seed=0, **kwargs):
    """A randomised K-member ensemble (fast and EMA weights differ) and K single critics holding its members."""
    ensemble = CriticNetwork(model_size="nano", ensemble_size=K, **kwargs)
    rng = np.random.default_rng(seed)
    for v in ensemble.weights:
        v.assign(rng.normal(scale=0.3, size=tuple(v.shape)).astype("float32"))
    options = {k: v for k, v in kwargs.items() if k not in ("aggregation", "aggregation_subset")}
    singles = []
    for k in range(K):
        single = CriticNetwork(model_size="nano", **options)
        single.set_weights(ensemble.get_member_weights(k))
        singles.append(single)
    return ensemble, singles


def batch(critic, n=12, seed=1):
    h, z = random_inputs(critic, n, seed)
    rng = np.random.default_rng(seed)
    return h, z, (rng.normal(size=n) * 30).astype("float32"), rng.uniform(0.2, 1.0, size=n).astype("float32")


@pytest.mark.parametrize("head", ["two_hot", "hl_gauss", "mse"])
def test_forward_of_each_member(head):
    ensemble, singles = ensemble_and_members(head=head)
    h, z, _, _ = batch(ensemble)
    for use_ema in (False, True):
        values, logits = to_np(ensemble(h, z, use_ema=use_ema))
        assert values.shape == (K, 12)
        for k, single in enumerate(singles):
            value, logit = to_np(single(h, z, use_ema=use_ema))
            np.testing.assert_allclose(values[k], value, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(logits[k], logit, rtol=1e-5, atol=1e-5)


def test_members_are_initialised_independently_as_single_critics():
    ensemble = CriticNetwork(model_size="S", ensemble_size=4, gru_units=64, num_z_categoricals=8, num_z_classes=8)
    kernel = to_np(ensemble.mlp.dense_layers[0].kernel)
    fan_in, units = kernel.shape[1:]
    limit = np.sqrt(6.0 / (fan_in + units))  # glorot-uniform of one [in, units] kernel
    for k in range(4):
        assert np.abs(kernel[k]).max() <= limit
        assert np.abs(kernel[k]).max() > 0.95 * limit
        for j in range(k):
            assert not np.allclose(kernel[k], kernel[j])
    np.testing.assert_array_equal(to_np(ensemble.mlp_ema.dense_layers[0].kernel), kernel)
    np.testing.assert_array_equal(to_np(ensemble.return_layer.reward_buckets_layer.kernel), 0.0)


def test_loss_is_the_mean_of_the_members_losses():
    ensemble, singles = ensemble_and_members(seed=2)
    h, z, targets, weights = batch(ensemble)
    values, logits = ensemble(h, z)
    ema_values, _ = ensemble(h, z, use_ema=True)
    stacked = to_np(critic_loss(logits, np.stack([targets] * K), ema_values, np.stack([weights] * K)))
    per_member = []
    for single in singles:
        _, logit = single(h, z)
        per_member.append(to_np(critic_loss(logit, targets, single(h, z, use_ema=True)[0], weights))["total"])
    np.testing.assert_allclose(stacked["total"], np.mean(per_member), rtol=1e-5)


@pytest.mark.parametrize("kind", ["direct", "dream"])
def test_a_train_step_moves_each_member_as_a_single_critic(kind):
    # Plain SGD, no clipping: a member's gradient is its single critic's over K
    # (the ensemble's loss is the mean over members), so K times the learning
    # rate moves it exactly as the single critic moves. "members": each member
    # bootstraps its dream targets from its own values, as a single critic.
    ensemble, singles = ensemble_and_members(seed=3, aggregation="members")
    lr = 0.05
    trainer = CriticTrainer(ensemble, keras.optimizers.SGD(K * lr), grad_clip=None, ema_update_period=1)
    if kind == "direct":
        data = batch(ensemble)
        metrics = to_np(trainer.train_step(*data))
    else:
        rng = np.random.default_rng(5)
        h, z = random_inputs(ensemble, 6 * 4, seed=4)
        data = (
            h.reshape(6, 4, -1),
            z.reshape((6, 4) + z.shape[1:]),
            rng.normal(size=(6, 4)).astype("float32"),
            (rng.random((6, 4)) > 0.1).astype("float32"),
        )
        metrics = to_np(trainer.train_on_dream(*data))
    totals = []
    for single in singles:
        single_trainer = CriticTrainer(single, keras.optimizers.SGD(lr), grad_clip=None)
        step = single_trainer.train_step if kind == "direct" else single_trainer.train_on_dream
        totals.append(to_np(step(*data))["total"])
    np.testing.assert_allclose(metrics["total"], np.mean(totals), rtol=1e-5)
    for k, single in enumerate(singles):
        for mine, theirs, var in zip(single.get_weights(), ensemble.get_member_weights(k), single.weights):
            np.testing.assert_allclose(theirs, mine, rtol=1e-4, atol=2e-6, err_msg=var.path)
    assert metrics["member_spread"] > 0


def test_aggregations():
    values = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0], [2.0, 0.0, 0.0], [-1.0, 1.0, 5.0]], np.float32)
    for aggregation, want in (("mean", values.mean(0)), ("min", values.min(0)), ("members", values)):
        critic = CriticNetwork(model_size="nano", ensemble_size=4, aggregation=aggregation)
        np.testing.assert_allclose(to_np(critic.aggregate(keras.ops.convert_to_tensor(values))), want, rtol=1e-6)
    critic = CriticNetwork(model_size="nano", ensemble_size=4, aggregation="min_of_random", aggregation_subset=2)
    seen = set()
    for seed in range(40):
        got = to_np(critic.aggregate(keras.ops.convert_to_tensor(values), seed=seed))
        # The minimum over one pair of members, the same pair for every position.
        pairs = [(a, b) for a in range(4) for b in range(a + 1, 4)]
        match = [p for p in pairs if np.array_equal(got, np.minimum(values[p[0]], values[p[1]]))]
        assert match, got
        seen.add(match[0])
    assert len(seen) >= 4  # different draws pick different pairs
    subset_all = CriticNetwork(model_size="nano", ensemble_size=4, aggregation="min_of_random", aggregation_subset=4)
    np.testing.assert_array_equal(
        to_np(subset_all.aggregate(keras.ops.convert_to_tensor(values), seed=0)), values.min(0)
    )


def test_min_of_random_draws_follow_seed_and_step_count(tmp_path):
    """Draws are a function of (seed, step count): no random state, and a resumed run draws as the whole run."""
    rng = np.random.default_rng(0)
    h, z = random_inputs(CriticNetwork(model_size="nano"), 4 * 8, seed=2)
    dreams = [
        (
            h.reshape(4, 8, -1),
            z.reshape((4, 8) + z.shape[1:]),
            rng.normal(size=(4, 8)) * 30,
            np.ones((4, 8), np.float32),
        )
        for _ in range(4)
    ]

    def run(seed, steps, trainer=None):
        if trainer is None:
            critic = CriticNetwork(model_size="nano", ensemble_size=4, aggregation="min_of_random")
            randomize(critic, seed=1)
            trainer = CriticTrainer(critic, seed=seed, learning_rate=1e-2)
        targets = [float(trainer.train_on_dream(*dreams[i])["value_target_mean"]) for i in steps]
        return trainer, targets

    trainer, whole = run(7, range(4))
    again = run(7, range(4))[1]
    assert whole == again  # deterministic given the seed
    assert run(8, range(4))[1] != whole  # another seed draws other members
    first, _ = run(7, range(2))
    first.save(tmp_path / "ckpt.npz")
    critic = CriticNetwork(model_size="nano", ensemble_size=4, aggregation="min_of_random")
    resumed = CriticTrainer(critic, seed=7, learning_rate=1e-2)
    resumed.restore(tmp_path / "ckpt.npz")
    np.testing.assert_allclose(run(7, range(2, 4), resumed)[1], whole[2:], rtol=1e-6)


def test_member_weights_round_trip_and_are_checked():
    ensemble = CriticNetwork(model_size="nano", ensemble_size=3)
    single = CriticNetwork(model_size="nano")
    rng = np.random.default_rng(0)
    single.set_weights([rng.normal(size=w.shape).astype("float32") for w in single.get_weights()])
    before = [to_np(v).copy() for v in ensemble.weights]
    ensemble.set_member_weights(1, single.get_weights())
    for got, want in zip(ensemble.get_member_weights(1), single.get_weights()):
        np.testing.assert_array_equal(got, want)
    for var, old in zip(ensemble.weights, before):
        np.testing.assert_array_equal(to_np(var)[[0, 2]], old[[0, 2]])
    bad = single.get_weights()
    bad[-1] = bad[-1].copy()
    bad[-1][0] = np.nan
    snapshot = [to_np(v).copy() for v in ensemble.weights]
    with pytest.raises(ValueError, match="expected finite values"):
        ensemble.set_member_weights(0, bad)
    for var, old in zip(ensemble.weights, snapshot):
        np.testing.assert_array_equal(to_np(var), old)
    with pytest.raises(ValueError, match=r"member: got 3, expected an integer in \[0, 3\)"):
        ensemble.get_member_weights(3)


def test_single_critic_layout_is_unchanged():
    critic = CriticNetwork(model_size="XS")
    assert [v.path for v in critic.fast_weights] == [
        "critic/mlp/dense_0/kernel",
        "critic/mlp/layer_norm_0/gamma",
        "critic/mlp/layer_norm_0/beta",
        "critic/return_layer/reward_buckets/kernel",
        "critic/return_layer/reward_buckets/bias",
    ]
    assert [tuple(v.shape) for v in critic.fast_weights] == [(1280, 256), (256,), (256,), (256, 255), (255,)]


@pytest.mark.parametrize("aggregation", ["mean", "min", "min_of_random", "members"])
def test_aggregate_refuses_values_of_another_member_count(aggregation):
    """Finding 7: 4 rows on a 3-member "mean" critic averaged the 4 rows; "min_of_random" raised a raw
    framework error."""
    ensemble = CriticNetwork(model_size="nano", ensemble_size=K, aggregation=aggregation)
    values = np.arange(20, dtype="float32").reshape(4, 5)
    for bad, shape in ((values, r"\[4, 5\]"), (np.float32(1.0), r"\[\]")):
        with pytest.raises(ValueError, match=rf"values: got shape {shape}, expected \[3, \.\.\.\]"):
            ensemble.aggregate(bad, seed=0)
    with pytest.raises(ValueError, match="values: got 'x'"):
        ensemble.aggregate("x")
    got = to_np(ensemble.aggregate(values[:K], seed=0))
    want = {"mean": values[:K].mean(0), "min": values[:K].min(0), "members": values[:K]}.get(aggregation)
    if want is not None:
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:  # the minimum of 2 of the 3 rows
        assert got.shape == (5,) and any(
            np.array_equal(got, values[[i, j]].min(0)) for i in range(K) for j in range(K) if i < j
        )


def test_an_ensemble_that_cannot_fit_is_refused_before_any_allocation():
    """Finding 14: ensemble_size=10**9 hung (a Python loop per member). Its 2 * K * P float32 weights (fast and
    EMA copies of K members of P parameters) need more bytes than any machine's memory: refused at once."""
    import time

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"ensemble_size: got 1000000000, expected at most \d+ for this critic"):
        CriticNetwork(model_size="nano", ensemble_size=10**9)
    # Input sizes from the first call: the head alone (16 * 255 + 255 parameters per member) does not fit.
    with pytest.raises(ValueError, match=r"ensemble_size: got 1000000000"):
        CriticNetwork(model_size=None, num_dense_layers=1, dense_hidden_units=16, ensemble_size=10**9)
    assert time.perf_counter() - start < 30.0


def test_set_member_weights_refuses_what_is_not_a_list():
    ensemble, _ = ensemble_and_members()
    before = [to_np(v).copy() for v in ensemble.weights]
    for bad in (None, 3, "weights", {"a": 1}):
        with pytest.raises(ValueError, match=r"weights: got a \w+, expected a list of arrays"):
            ensemble.set_member_weights(0, bad)
    for v, b in zip(ensemble.weights, before):
        np.testing.assert_array_equal(to_np(v), b)
