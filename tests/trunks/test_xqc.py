"""The XQC trunk against the batch and weight normalisation equations: forward passes (batch and moving
statistics), the statistics and projection of a trainer step (eager, compiled, `fit`), all or nothing, the
stateless call, its options."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from multicritic.trunks import TRUNKS
from tests.conftest import BACKEND, random_inputs, to_np
from tests.trunks import assert_refused

XQCTrunk = TRUNKS["xqc"]
EPS, MOMENTUM = 1e-3, 0.99


def batch_norm(x, gamma, beta, mean, var):
    return (x - mean) / np.sqrt(var + EPS) * gamma + beta


def reference(x, w, *, layers, training):
    """The trunk in float64 numpy, `w` by its variable names: `BN(x)`, then `relu(BN(x W_i))` per layer, each BN
    by the batch's (biased) statistics in training, by the moving ones otherwise. Returns the output and each
    BN's batch statistics `{norm: (mean, var)}`."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    stats = {}

    def norm(name, x):
        if training:
            stats[name] = (x.mean(0), x.var(0))
        mean, var = stats[name] if training else (w[f"{name}/moving_mean"], w[f"{name}/moving_variance"])
        return batch_norm(x, w[f"{name}/gamma"], w[f"{name}/beta"], mean, var)

    x = norm("input_norm", np.asarray(x, np.float64))
    for i in range(layers):
        x = np.maximum(norm(f"batch_norm_{i}", x @ w[f"dense_{i}/kernel"]), 0.0)
    return x, stats


def randomized(layer, seed):
    rng = np.random.default_rng(seed)
    for v in layer.weights:
        value = rng.normal(scale=0.5, size=tuple(v.shape))
        v.assign((np.abs(value) + 0.5 if "variance" in v.path else value).astype("float32"))


@pytest.mark.parametrize("members", [None, 2])
def test_forward_is_batch_norm_then_weight_normalised_blocks(members):
    trunk = XQCTrunk(model_size=None, num_dense_layers=2, dense_hidden_units=6, members=members)
    trunk.build((None, 5))
    randomized(trunk, 1)
    x = np.random.default_rng(2).normal(size=(7, 5)).astype("float32")
    for training in (True, False):
        got = to_np(trunk([x[:, :3], x[:, 3:]], training=training))
        for m in [None] if members is None else range(members):
            want, _ = reference(x, _names(trunk, m), layers=2, training=training)
            np.testing.assert_allclose(got if m is None else got[m], want, rtol=2e-5, atol=2e-5)


def _names(trunk, member=None):
    """The trunk's weights by `sublayer/variable` (one member's with `member`)."""
    return {
        "/".join(v.path.split("/")[-2:]): to_np(v.value) if member is None else to_np(v.value)[member]
        for v in trunk.weights
    }


def test_the_projection_changes_no_output_in_training():
    """Each Dense is followed by a batch norm: the block is blind to its columns' scale (up to epsilon, here
    made negligible)."""
    trunk = XQCTrunk(model_size=None, num_dense_layers=2, dense_hidden_units=6, norm_epsilon=1e-10)
    trunk.build((None, 5))
    randomized(trunk, 3)
    x = np.random.default_rng(4).normal(size=(9, 5)).astype("float32")
    before = to_np(trunk(x, training=True))
    trunk.after_update()
    for layer in trunk.dense_layers:
        np.testing.assert_allclose(np.linalg.norm(to_np(layer.kernel), axis=0), 1.0, rtol=1e-6)
    np.testing.assert_allclose(to_np(trunk(x, training=True)), before, rtol=1e-4, atol=1e-5)


def _critic(**options):
    critic = CriticNetwork(model_size="nano", trunk="xqc", ema_decay=0.5, **options)
    randomized(critic.mlp, 5)
    randomized(critic.return_layer, 6)
    critic.init_ema()
    randomized(critic.mlp_ema, 7)  # a slow copy of its own, so that the EMA's arithmetic shows
    return critic


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_step_moves_the_statistics_projects_the_kernels_and_the_slow_copy_averages_both(jit_compile):
    """Fast statistics: `0.99 * moving + 0.01 * batch` of the forward pass on the pre-step weights (numpy);
    kernels on the sphere; the slow copy `0.5 * slow + 0.5 * fast` for weights and statistics alike."""
    critic = _critic()
    trainer = CriticTrainer(critic, learning_rate=1e-2, jit_compile=jit_compile)
    h, z = random_inputs(critic, 8)
    x = np.concatenate([h, z.reshape(8, -1)], -1)
    fast_before, slow_before = _names(critic.mlp), [to_np(v.value) for v in critic.ema_weights]
    _, batch = reference(x, fast_before, layers=1, training=True)
    targets = np.random.default_rng(8).normal(scale=20.0, size=8).astype("float32")
    metrics = trainer.train_step(h, z, targets, np.ones(8, "float32"))
    assert float(to_np(metrics["step_skipped"])) == 0.0 and not any("statistics" in k for k in metrics)
    fast = _names(critic.mlp)
    for name, (mean, var) in batch.items():
        for stat, value in (("moving_mean", mean), ("moving_variance", var)):
            want = MOMENTUM * fast_before[f"{name}/{stat}"] + (1 - MOMENTUM) * value
            np.testing.assert_allclose(fast[f"{name}/{stat}"], want, rtol=1e-5, atol=1e-6, err_msg=f"{name}/{stat}")
    np.testing.assert_allclose(np.linalg.norm(fast["dense_0/kernel"], axis=0), 1.0, rtol=1e-5)
    for f, e, old in zip(critic.fast_weights, critic.ema_weights, slow_before):
        np.testing.assert_allclose(to_np(e.value), 0.5 * old + 0.5 * to_np(f.value), rtol=1e-5, atol=1e-6)


def test_fit_steps_as_the_trainer_does():
    a, b = _critic(), _critic()
    b.set_weights(a.get_weights())
    h, z = random_inputs(a, 8)
    targets = np.random.default_rng(9).normal(scale=20.0, size=8).astype("float32")
    a.compile(learning_rate=1e-2)
    a.fit((h, z), targets, batch_size=8, shuffle=False, verbose=0)
    CriticTrainer(b, learning_rate=1e-2).train_step(h, z, targets, np.ones(8, "float32"))
    moved = 0
    for va, vb, before in zip(a.weights, b.weights, _critic().weights):
        np.testing.assert_allclose(to_np(va.value), to_np(vb.value), rtol=1e-5, atol=1e-6, err_msg=va.path)
        moved += "moving" in va.path and not np.array_equal(to_np(va.value), to_np(before.value))
    assert moved == 8  # fast and slow means and variances of both norms


def test_a_skipped_step_leaves_the_statistics():
    critic = _critic()
    trainer = CriticTrainer(critic, learning_rate=1e-2)
    before = [to_np(v.value) for v in critic.weights]
    h, z = random_inputs(critic, 4)
    weights = keras.ops.convert_to_tensor(np.full(4, -1.0, "float32"))  # inside the step: skipped
    metrics = trainer.train_step(h, z, np.ones(4, "float32"), weights)
    assert float(to_np(metrics["step_skipped"])) == 1.0
    for got, want in zip(critic.weights, before):
        np.testing.assert_array_equal(to_np(got.value), want, err_msg=got.path)


def test_inference_and_evaluation_read_the_moving_statistics():
    critic = _critic()
    h, z = random_inputs(critic, 5)
    x = np.concatenate([h, z.reshape(5, -1)], -1)
    features, _ = reference(x, _names(critic.mlp), layers=1, training=False)
    head = _names(critic.return_layer)
    logits = features @ head["reward_buckets/kernel"] + head["reward_buckets/bias"]
    np.testing.assert_allclose(to_np(critic(h, z)[1]), logits, rtol=1e-4, atol=1e-4)
    before = [to_np(v.value) for v in critic.weights]
    critic.compile()
    critic.evaluate((h, z), np.ones(5, "float32"), verbose=0)
    for got, want in zip(critic.weights, before):
        np.testing.assert_array_equal(to_np(got.value), want)


def test_the_stateless_call_in_training_returns_the_new_statistics():
    critic = _critic()
    h, z = random_inputs(critic, 6)
    x = np.concatenate([h, z.reshape(6, -1)], -1)
    before = [to_np(v.value) for v in critic.weights]
    trainable = [v.value for v in critic.trainable_variables]
    non_trainable = [v.value for v in critic.non_trainable_variables]
    (value, logits), new = critic.stateless_call(trainable, non_trainable, h, z, training=True)
    for got, want in zip(critic.weights, before):  # nothing assigned
        np.testing.assert_array_equal(to_np(got.value), want)
    fast, (mean, var) = _names(critic.mlp), reference(x, _names(critic.mlp), layers=1, training=True)[1]["input_norm"]
    new = {v.path: to_np(n) for v, n in zip(critic.non_trainable_variables, new)}
    mlp = critic.mlp.input_norm
    np.testing.assert_allclose(
        new[mlp.moving_mean.path], MOMENTUM * fast["input_norm/moving_mean"] + (1 - MOMENTUM) * mean, rtol=1e-5
    )
    np.testing.assert_allclose(
        new[mlp.moving_variance.path], MOMENTUM * fast["input_norm/moving_variance"] + (1 - MOMENTUM) * var, rtol=1e-5
    )
    ema = critic.mlp_ema.input_norm.moving_mean  # the slow copy moves nothing of its own
    np.testing.assert_array_equal(new[ema.path], to_np(ema.value))
    if BACKEND == "jax":  # the pure function under jax.jit gives the same
        import jax

        jitted = jax.jit(lambda t, n: critic.stateless_call(t, n, h, z, training=True))
        (_, again), new_jit = jitted(trainable, non_trainable)
        np.testing.assert_allclose(to_np(again), to_np(logits), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(to_np(new_jit[0]), new[critic.non_trainable_variables[0].path], rtol=1e-6)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"norm": "rms"}, r"^norm: got 'rms' with trunk='xqc', expected 'layer'"),
        ({"momentum": 1.5}, r"^momentum: got 1\.5, expected a finite number in \[0, 1\]"),
        ({"activation": "no_such"}, r"^activation: got 'no_such', expected a Keras activation name"),
        ({"use_bias": "yes"}, r"^use_bias: got 'yes', expected True or False"),
    ],
)
def test_bad_options_are_refused_naming_them(options, message):
    assert_refused("xqc", options, message)


def test_a_dream_and_replay_step_moves_the_statistics_once_per_pass():
    """Two forward passes in one step (the dream's, then the replay's): the input norm's moving mean moves
    twice, the second time from where the first left it (its batch statistics are the inputs')."""
    rng = np.random.default_rng(10)
    horizon, t, b = 3, 3, 2  # dream start j = b * T + t is replay step (t, b)
    dream = (
        rng.normal(size=(horizon + 1, t * b, 16)).astype("float32"),
        rng.random((horizon + 1, t * b, 4, 4)).astype("float32"),
        rng.normal(size=(horizon + 1, t * b)).astype("float32"),
        np.ones((horizon + 1, t * b), "float32"),
    )
    replay = (
        rng.normal(size=(t, b, 16)).astype("float32"),
        rng.random((t, b, 4, 4)).astype("float32"),
        rng.normal(size=(t, b)).astype("float32"),
        np.zeros((t, b), "float32"),
        np.zeros((t, b), "float32"),
    )
    critic = _critic()
    old = to_np(critic.mlp.input_norm.moving_mean.value)
    CriticTrainer(critic, learning_rate=1e-2, jit_compile=True).train_on_dream_and_replay(*dream, *replay)

    def mean(h, z):
        return np.concatenate([h.reshape(-1, 16), z.reshape(h.reshape(-1, 16).shape[0], -1)], -1).mean(0)

    after_dream = MOMENTUM * old + (1 - MOMENTUM) * mean(*dream[:2])
    want = MOMENTUM * after_dream + (1 - MOMENTUM) * mean(*replay[:2])
    np.testing.assert_allclose(to_np(critic.mlp.input_norm.moving_mean.value), want, rtol=1e-5, atol=1e-6)
