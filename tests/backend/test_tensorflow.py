"""The TensorFlow backend: `"auto"` switching a step to XLA, and under a `tf.distribute` strategy where a step may run
and the hosts it sees."""

import numpy as np
import pytest

from tests.conftest import BACKEND, to_np

pytestmark = pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute")


def test_a_step_inside_the_strategy_scope_is_refused_and_changes_nothing():
    import tensorflow as tf

    from multicritic import CriticNetwork, CriticTrainer
    from tests.distributed.common import batches

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        trainer = CriticTrainer(CriticNetwork(model_size="nano"))
        before = [to_np(v) for v in trainer.state_variables]
        # Keras's optimizer updates from a replica context inside a scope, and the step's update runs in the
        # cross-replica one: refused with the way out, instead of failing inside Keras.
        with pytest.raises(ValueError, match=r"train step: got a call inside `MirroredStrategy.scope\(\)`"):
            trainer.train_step(*batches("direct")[0])
    for a, v in zip(before, trainer.state_variables):
        np.testing.assert_array_equal(a, to_np(v))
    metrics = trainer.train_step(*batches("direct")[0])  # outside the scope: trains
    assert np.isfinite(float(metrics["total"])) and int(to_np(trainer.steps)) == 1


def test_one_worker_is_host_zero_of_one():
    import tensorflow as tf

    from multicritic.backend import contract as backend

    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        assert backend.current().hosts() == (0, 1)
        np.testing.assert_array_equal(backend.current().gather_hosts(np.arange(4, dtype=np.uint8)), [[0, 1, 2, 3]])


def test_auto_switches_a_step_kind_to_xla_at_its_nth_call_with_the_same_values(monkeypatch):
    import keras

    from multicritic import CriticNetwork, CriticTrainer
    from multicritic.backend import contract as backend_contract
    from tests.conftest import randomize
    from tests.distributed.common import batches

    monkeypatch.setattr(backend_contract, "AUTO_COMPILE_AFTER_STEPS", 2)
    monkeypatch.setattr(backend_contract, "AUTO_COMPILE_DEVICES", ("cpu",))  # as on an accelerator
    data = batches("direct", steps=4)

    def trained(jit_compile):
        keras.utils.set_random_seed(0)
        critic = CriticNetwork(model_size="nano")
        randomize(critic)
        trainer = CriticTrainer(critic, jit_compile=jit_compile)
        losses = [float(trainer.train_step(*batch)["total"]) for batch in data]
        return trainer, losses, [to_np(v) for v in trainer.state_variables]

    auto, auto_losses, auto_state = trained("auto")
    graph, graph_losses, graph_state = trained(False)
    (run,) = auto._compiled.values()
    assert sorted(key[-1] for key in run.compiled) == [False, True]  # two plain-graph calls, then XLA
    (run,) = graph._compiled.values()
    assert [key[-1] for key in run.compiled] == [False]
    np.testing.assert_allclose(auto_losses, graph_losses, rtol=1e-5)
    assert auto_losses[:2] == graph_losses[:2]  # the same graph before the switch
    for a, g in zip(auto_state, graph_state):
        np.testing.assert_allclose(a, g, rtol=1e-4, atol=1e-6)


def test_the_layer_norm_fallback_is_a_cond_in_a_plain_graph_and_fused_under_xla():
    # A plain graph runs the overflow fallback only in a cond's branch; under XLA it is computed beside the
    # variance (a cond would split XLA's fusions). Both give the exact normalisation of rows whose variance
    # overflows float32, beside ordinary rows.
    import tensorflow as tf

    from multicritic.backend import contract as backend
    from multicritic.layers.layer_norm import layer_norm

    rng = np.random.default_rng(0)
    x = (rng.normal(size=(5, 16)) * np.array([[1.0], [1e30], [3.0], [1e20], [1e-3]])).astype(np.float32)
    gamma, beta = rng.normal(size=16).astype(np.float32), rng.normal(size=16).astype(np.float32)
    wide = x.astype(np.float64)
    expected = (wide - wide.mean(-1, keepdims=True)) / np.sqrt(wide.var(-1, keepdims=True) + 1e-3) * gamma + beta
    seen = {}

    def fn(x):
        seen[len(seen)] = backend.current().lazy_fallbacks
        return layer_norm(x, tf.constant(gamma), tf.constant(beta), 1e-3)

    assert backend.current().lazy_fallbacks  # eagerly
    for jit_compile in (False, True):
        f = tf.function(fn, jit_compile=jit_compile)
        got = f(tf.constant(x)).numpy()
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)
        ops = {op.type for op in f.get_concrete_function(tf.constant(x)).graph.get_operations()}
        assert ("StatelessIf" in ops or "If" in ops) == (not jit_compile), sorted(ops)
    assert seen == {0: True, 1: False}


def test_under_xla_the_decodes_softmax_and_the_losss_log_softmax_share_one_exp():
    # The backend composes both from the same ops, so XLA computes `exp` of a logits tensor once for the
    # decode, the loss and the loss's gradient; `tf.nn.softmax` and `tf.nn.log_softmax` took two.
    import tensorflow as tf

    from multicritic.backend import contract as backend

    current = backend.current()

    def exps(softmax, log_softmax):
        def step(logits):
            with tf.GradientTape() as tape:
                tape.watch(logits)
                value = tf.reduce_sum(tf.stop_gradient(softmax(logits)) * tf.range(255, dtype=tf.float32), -1)
                loss = -tf.reduce_mean(log_softmax(logits)[..., 3])
            return value, tape.gradient(loss, logits)

        logits = tf.constant(np.random.default_rng(0).normal(size=(64, 255)).astype(np.float32))
        hlo = tf.function(step, jit_compile=True).experimental_get_compiler_ir(logits)(stage="optimized_hlo")
        return hlo.count(" exponential(")

    assert exps(current.softmax, current.log_softmax) == 1
    assert exps(tf.nn.softmax, tf.nn.log_softmax) == 2


def _xla_step_hlo(trainer, batch):
    """The optimized HLO of the trainer's compiled direct step (XLA, traced for the batch's size) for `batch`."""
    import tensorflow as tf

    rows = batch[0].shape[0]
    (fn,) = [fn for key, fn in trainer._compiled["direct"].compiled.items() if key[0][0][0] == rows]
    return fn.experimental_get_compiler_ir(*(tf.convert_to_tensor(x) for x in batch))(stage="optimized_hlo")


def test_the_xla_step_is_traced_for_its_batch_size_and_places_the_input_scale_by_it():
    """XLA compiles a program per batch size anyway; traced with that size, the first layer scales its input
    (a batch smaller than the input's width) or its kernel (a larger one) by the overflow guard's 2^-32, as
    on JAX. Either way TensorFlow concatenates `h` and `z` for one GEMM per network forward: the same number
    of dots at both sizes. The plain graph keeps one trace for every batch size."""
    import re

    from multicritic import CriticNetwork, CriticTrainer
    from tests.conftest import random_inputs

    critic = CriticNetwork(model_size="nano")  # input width 16 + 4 * 4 = 32
    units = critic.mlp.dense_hidden_units
    xla, graph = CriticTrainer(critic, jit_compile=True), CriticTrainer(critic, jit_compile=False)
    dots, scaled = {}, {}
    for rows in (8, 64):
        h, z = random_inputs(critic, rows)
        batch = (h, z, np.ones(rows, "float32"), np.ones(rows, "float32"))
        xla.train_step(*batch)
        graph.train_step(*batch)
        text = _xla_step_hlo(xla, batch)
        dots[rows] = len(re.findall(r" dot\(", text[text.index("\nENTRY") :]))
        # The shapes the scale's constant is broadcast to, wherever XLA fused the multiply.
        constants = re.findall(r"%(\S+) = f32\[\] constant\(2\.32830644e-10\)", text)
        scaled[rows] = {
            m.group(1)
            for c in constants
            for m in re.finditer(r"= (f32\[[\d,]+\])\S* broadcast\(%" + re.escape(c) + r"\)", text)
        }
    assert sorted(k[0][0][0] for k in xla._compiled["direct"].compiled) == [8, 64]
    assert [k[0][0][0] for k in graph._compiled["direct"].compiled] == [None]
    assert scaled == {8: {"f32[8,32]"}, 64: {f"f32[32,{units}]"}}, scaled
    assert dots[64] == dots[8], dots


def test_a_single_critics_first_dense_is_one_gemm_of_the_concatenated_input():
    """On TensorFlow (`concatenates_first_input`) `h` and `z` are concatenated for the first Dense wherever
    the overflow scale goes, in the plain graph too: each network forward has one GEMM against the whole
    kernel, none against a part of its rows."""
    import tensorflow as tf

    from multicritic import CriticNetwork
    from tests.conftest import random_inputs

    critic = CriticNetwork(model_size="nano")
    h, z = random_inputs(critic, 64)
    graph = (
        tf.function(lambda h, z: critic(h, z))
        .get_concrete_function(
            tf.TensorSpec([None, h.shape[1]], tf.float32), tf.TensorSpec([None, *z.shape[1:]], tf.float32)
        )
        .graph
    )
    widths = [op.inputs[1].shape.as_list() for op in graph.get_operations() if op.type == "MatMul"]
    kernel = critic.mlp.dense_layers[0].kernel.shape
    assert widths.count(list(kernel)) == 1, widths
    assert not [w for w in widths if w[1] == kernel[1] and w[0] < kernel[0]], widths


@pytest.mark.parametrize("ensemble_size", [1, 3])
def test_the_xla_step_updates_weights_and_slots_in_place(ensemble_size):
    """Under XLA the first Dense kernel (the largest buffers), its Adam moments and its EMA copy are each
    updated in place: the compiled program copies none of them. (A `tf.cond` around the update became selects
    after it, and XLA copied the kernel and both moments before every step.)"""
    import re

    from multicritic import CriticNetwork, CriticTrainer
    from tests.conftest import random_inputs

    critic = CriticNetwork(model_size="nano", ensemble_size=ensemble_size)
    trainer = CriticTrainer(critic, jit_compile=True)
    h, z = random_inputs(critic, 8)
    batch = (h, z, np.ones(8, "float32"), np.ones(8, "float32"))
    trainer.train_step(*batch)
    text = _xla_step_hlo(trainer, batch)
    entry = text[text.index("\nENTRY") :]
    kernel = "f32[{}]".format(",".join(map(str, critic.mlp.dense_layers[0].kernel.shape)))
    params = set(re.findall(r"%(\S+) = " + re.escape(kernel) + r"\S* parameter\(", entry))
    assert len(params) >= 4  # the kernel, its EMA copy and its two moments
    copied = re.findall(r"= " + re.escape(kernel) + r"\S* copy\(%(\S+)\)", entry)
    assert not [p for p in copied if p in params], copied


def test_under_xla_a_skipped_step_changes_nothing_and_a_good_one_is_the_plain_graphs():
    """The selects that replace the cond under XLA keep the whole state (weights, EMA, slots, counters) where
    the step is skipped, and take the plain graph's update where it is not; tracing leaves the variables'
    own assignment methods in place."""
    import keras
    import tensorflow as tf

    from multicritic import CriticNetwork, CriticTrainer
    from tests.conftest import randomize
    from tests.training.test_step_safety import direct_batch, state

    def trainer(jit_compile):
        keras.utils.set_random_seed(0)
        critic = CriticNetwork(model_size="nano")
        randomize(critic)
        return CriticTrainer(critic, learning_rate=1e-3, jit_compile=jit_compile)

    xla, graph = trainer(True), trainer(False)
    good = [direct_batch(xla.critic, seed=s) for s in (1, 2)]
    for t in (xla, graph):
        t.train_step(*good[0])  # slots and counters away from their initial values
    before = state(xla)
    h, z, targets, weights = good[1]
    bad_weights = weights.copy()
    bad_weights[3] = -1.0
    bad_h = h.copy()
    bad_h[0, 0] = np.inf
    for bad in ((h, z, targets, tf.constant(bad_weights)), (tf.constant(bad_h), z, targets, weights)):
        metrics = to_np(xla.train_step(*bad))
        assert metrics["step_skipped"] == 1.0
        for a, b in zip(state(xla), before):
            np.testing.assert_array_equal(a, b)
    a, b = to_np(xla.train_step(*good[1])), to_np(graph.train_step(*good[1]))
    assert a["step_skipped"] == 0.0
    np.testing.assert_allclose(a["total"], b["total"], rtol=1e-5)
    moved = [not np.array_equal(x, y) for x, y in zip(state(xla), before)]
    assert all(moved[: len(xla.critic.trainable_variables)]) and int(to_np(xla.steps)) == 2
    for x, y in zip(state(xla), state(graph)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    for var in xla.state_variables:
        assert not {"assign", "assign_add", "assign_sub"} & set(vars(var.value)), var.path
