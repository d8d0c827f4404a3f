"""The official agent's value heads served by multicritic (`multicritic.interop.dreamerv3_ninjax`), under ninjax.

Without the official code (not on PyPI): the module runs under plain ninjax (from PyPI, as the official code
uses it) against the numbers the official code wrote (`tests/data/interop/official/`), jitted, with the host's
parts it touches (`MLPHead`, `heads.Head`, `outs.TwoHot`) stood in for where a test needs them. The official
agent's own train step with the swap is `tests/interop/test_official_agent.py` (live, where a checkout is at
hand). JAX backend with ninjax installed (the `jax` nox session); the refusals on the other backends.
"""

import re
import types

import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.interop import dreamerv3, dreamerv3_ninjax
from tests.conftest import BACKEND
from tests.interop.cases import load_npz

SIZES = dict(gru_units=24, num_z_categoricals=4, num_z_classes=5)  # the goldens' deter, stoch, classes
VALUE = {
    "layers": 2,
    "units": 32,
    "act": "silu",
    "norm": "rms",
    "output": "symexp_twohot",
    "outscale": 0.0,
    "winit": "trunc_normal_in",
    "bins": 255,
}  # fmt: skip  (the goldens' config.agent.value)
RSSM = {"deter": 24, "stoch": 4, "classes": 5}
SCALAR = types.SimpleNamespace(shape=())  # elements.Space(np.float32, ())'s shape


def assert_refused(call, argument, *words):
    """`call()` raises a `ValueError` whose message starts with `argument`, says what it got and what was wanted,
    and holds `words`."""
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert re.match(rf"{re.escape(argument)}\b", message), f"{message!r} does not name {argument!r}"
    assert "got" in message and ("expected" in message or "has" in message), message
    for word in words:
        assert word in message, (word, message)


@pytest.fixture(scope="module")
def nj():
    if BACKEND != "jax":
        pytest.skip("the official agent's train step is JAX (ninjax)")
    return pytest.importorskip("ninjax")


@pytest.fixture(scope="module")
def golden():
    return load_npz("official", "official_critic_goldens.npz")


def params_of(golden):
    return {k: v for k, v in golden.items() if k.startswith(("val/", "slowval/"))}


def critic_of(golden):
    return dreamerv3.dreamerv3_critic(params_of(golden), **SIZES)


def heads(critic, **kwargs):
    val = dreamerv3_ninjax.CriticHead(SCALAR, critic=critic, **VALUE, name="val", **kwargs)
    slowval = dreamerv3_ninjax.CriticHead(SCALAR, critic=critic, **VALUE, name="slowval", **kwargs)
    return val, slowval


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def test_the_heads_compute_the_officials_numbers_inside_one_jit(nj, golden):
    """Forward, `pred`, both loss terms of the official value loss and `nj.grad`'s parameter gradients, from the
    official parameters as ninjax state, under `jax.jit` with every implicit transfer refused (the official agent
    trains under `jax_transfer_guard='disallow'`). Measured (max |error| / max |golden|): logits 1.7e-7, values
    3.5e-7, losses 4.2e-7 (4.6e-6 on jax 0.4.33), gradients 9.8e-6 (1.9e-5)."""
    import jax

    val, slowval = heads(critic_of(golden))
    state = jax.device_put(params_of(golden))
    feat, ret, weight = jax.device_put([golden["feat"], golden["ret"], golden["weight"]])

    def forward(x):
        out, slow = val(x, 2), slowval(x, 2)
        target = jax.lax.stop_gradient(slow.pred())
        return dict(logits=out.logits, value=out.pred(), slow_value=slow.pred(), loss_ret=out.loss(ret),
                    loss_slow=out.loss(target))  # fmt: skip

    def gradients(x):
        def loss(x):
            out = val(x, 2)
            target = jax.lax.stop_gradient(slowval(x, 2).pred())
            return (weight * (out.loss(ret) + out.loss(target))).sum()

        return nj.grad(loss, [val])(x)[2]

    with jax.transfer_guard("disallow"):
        _, out = jax.jit(nj.pure(forward))(state, feat)
        _, grads = jax.jit(nj.pure(gradients))(state, feat)
    assert rel(out["logits"], golden["logits"]) < 1e-6
    for key in ("value", "slow_value", "loss_ret", "loss_slow"):
        assert rel(out[key], golden[key]) < 2e-5, key
    # The optimizer's view: gradients for exactly the fast head's entries, as the stock head's.
    assert sorted(grads) == sorted(k for k in golden if k.startswith("val/"))
    for key, grad in grads.items():
        assert rel(grad, golden[f"grad/{key}"]) < 1e-4, key
    assert float(np.abs(golden["grad/val/mlp/linear0/kernel"]).max()) > 0


def test_the_state_has_the_stock_heads_names_shapes_and_creation_order(nj, golden):
    """`initializer=None`: the critic's own weights become the entries on the creation pass, in the stock
    head's order (layer by layer, then the head), under the stock head's names."""
    import jax

    critic = critic_of(golden)
    val, slowval = heads(critic)
    created, _ = nj.pure(lambda x: (val(x, 2), slowval(x, 2)) and None)({}, golden["feat"], create=True)
    fast = {k: v for k, v in params_of(golden).items() if k.startswith("val/")}
    assert list(created) == [
        f"{head}/{key}"
        for head in ("val", "slowval")
        for key in ("mlp/linear0/kernel", "mlp/linear0/bias", "mlp/norm0/scale", "mlp/linear1/kernel",
                    "mlp/linear1/bias", "mlp/norm1/scale", "head/logits/kernel", "head/logits/bias")
    ]  # fmt: skip
    for key, want in fast.items():
        np.testing.assert_array_equal(np.asarray(created[key]), want)
        # The slow head starts from the critic's fast weights too (the host's SlowModel copies `val` first).
        np.testing.assert_array_equal(np.asarray(created["slow" + key]), want)
    # Inside the host's jitted initialisation the weights are read on device: nothing moves to or from the host.
    with jax.transfer_guard("disallow"):
        state = nj.init(lambda x: (val(x, 2), slowval(x, 2)) and None)({}, jax.device_put(golden["feat"]))
    assert sorted(state) == sorted(created)
    for key, value in state.items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(created[key]))


def _host_head(nj, values):
    """A stand-in for the official `MLPHead`: creates its entries from `values` on its call, and counts calls."""

    class HostHead(nj.Module):
        calls = []

        def __init__(self, space, output=None, **kwargs):
            self.kwargs = dict(kwargs, output=output)

        def __call__(self, x, bdims):
            HostHead.calls.append(self.path)
            for key, value in values.items():
                self.value(key, lambda value=value: value)
            return "host output"

    return HostHead


def test_the_host_initializer_draws_the_parameters_once_at_the_same_path(nj, golden):
    """`initializer=` the host's head at the head's path: called on the creation pass only, its entries kept
    as it made them (the official draw), the critic's weights never used for them."""
    import jax

    official = {k[len("official_init/val/") :]: v for k, v in golden.items() if k.startswith("official_init/val/")}
    official["head/logits/kernel"] = np.zeros((32, 255), "float32")  # outscale=0: the official head starts at zero
    official["head/logits/bias"] = np.zeros(255, "float32")
    host = _host_head(nj, official)
    critic = critic_of(golden)
    val = dreamerv3_ninjax.CriticHead(SCALAR, critic=critic, initializer=host(SCALAR, name="val"), **VALUE, name="val")
    feat = jax.device_put(golden["feat"])
    state = nj.init(lambda x: val(x, 2) and None)({}, feat)
    assert host.calls == ["val"] and sorted(state) == sorted(f"val/{k}" for k in official)
    for key, value in official.items():
        np.testing.assert_array_equal(np.asarray(state[f"val/{key}"]), value)
    _, pred = jax.jit(nj.pure(lambda x: val(x, 2).pred()))(state, feat)
    assert host.calls == ["val"]  # a later pass finds the entries and runs the critic only
    np.testing.assert_array_equal(np.asarray(pred), np.zeros((3, 4), "float32"))  # a zero head predicts 0


def _namespace(nj, golden):
    """A stand-in for the host's `embodied.jax`: `MLPHead` (the stand-in host head), `heads.Head` whose
    `symexp_twohot` output holds the official bins, and `outs.TwoHot` recording what it is given."""
    bins = golden["bins"]

    class Output:
        def __init__(self, logits, bins):
            self.logits, self.bins = logits, bins

    class Head(nj.Module):
        def __init__(self, space, output, bins, outscale):
            assert (tuple(space), output, outscale) == ((), "symexp_twohot", 0.0)
            self.count = bins

        def __call__(self, x):
            return Output(x, bins[: self.count])

    class TwoHot(Output):
        made = []

        def __init__(self, logits, bins):
            super().__init__(logits, bins)
            TwoHot.made.append(self)

    values = {k[len("val/") :]: v for k, v in golden.items() if k.startswith("val/")}
    return types.SimpleNamespace(
        MLPHead=_host_head(nj, values),
        heads=types.SimpleNamespace(Head=Head),
        outs=types.SimpleNamespace(TwoHot=TwoHot),
        nets=types.SimpleNamespace(COMPUTE_DTYPE=np.float32),
    )


def test_the_swap_serves_the_named_heads_and_leaves_the_others_to_the_host(nj, golden):
    import jax

    namespace = _namespace(nj, golden)
    original = namespace.MLPHead
    critic = critic_of(golden)
    with dreamerv3_ninjax.swap_value_heads(namespace, critic) as swap:
        assert namespace.MLPHead is not original
        # As the official agent builds its heads (agent.py:57-68):
        rew = namespace.MLPHead(SCALAR, **VALUE, name="rew")
        val = namespace.MLPHead(SCALAR, **VALUE, name="val")
        slowval = namespace.MLPHead(SCALAR, **VALUE, name="slowval")
        assert_refused(lambda: dreamerv3_ninjax.swap_value_heads(namespace, critic), "namespace", "already")
    assert namespace.MLPHead is original  # restored; the heads built meanwhile keep serving
    assert type(rew) is original and sorted(swap.heads) == ["slowval", "val"] and swap.heads["val"] is val
    assert isinstance(val, dreamerv3_ninjax.CriticHead) and type(val.host) is original
    # distribution="host": the host's TwoHot over the bins the host's Head computed, fed the critic's logits.
    np.testing.assert_array_equal(swap.distribution.bins, golden["bins"])
    state = jax.device_put(params_of(golden))
    _, logits = jax.jit(nj.pure(lambda x: (val(x, 2).logits, slowval(x, 2).logits)))(state, golden["feat"])
    made = namespace.outs.TwoHot.made[-2:]
    assert [type(m.bins) for m in made] == [np.ndarray] * 2  # a host array: a constant of the step
    assert rel(logits[0], golden["logits"]) < 1e-6 and rel(logits[1], golden["slow_logits"]) < 1e-6
    # initializer="critic", distribution="critic": no host head behind the swapped one; CriticOutput.
    with dreamerv3_ninjax.swap_value_heads(namespace, critic, names=("val",), initializer="critic",
                                           distribution="critic") as swap:  # fmt: skip
        val = namespace.MLPHead(SCALAR, **VALUE, name="val")
        slowval = namespace.MLPHead(SCALAR, **VALUE, name="slowval")
    assert val.host is None and type(slowval) is original and swap.distribution is None
    _, out = nj.pure(lambda x: val(x, 2))(state, golden["feat"])
    assert isinstance(out, dreamerv3_ninjax.CriticOutput)


def test_bfloat16_features_run_in_float32_and_take_their_gradient(nj, golden):
    """The stock agent's features are its compute dtype (bfloat16 by default): the critic computes in float32
    (its logits equal the float32 features' to bfloat16's rounding of the input), and the gradient reaches the
    features in their dtype (the official `repval_grad` trains the world model through the value loss)."""
    import jax
    import jax.numpy as jnp

    val, _ = heads(critic_of(golden))
    state = jax.device_put(params_of(golden))
    feat = jnp.asarray(golden["feat"], jnp.bfloat16)
    ret = jax.device_put(golden["ret"])

    def loss(x):
        return val(x, 2).loss(ret).sum()

    _, (logits, grad) = jax.jit(nj.pure(lambda x: (val(x, 2).logits, jax.grad(loss)(x))))(state, feat)
    assert logits.dtype == jnp.float32 and grad.dtype == jnp.bfloat16 and grad.shape == feat.shape
    assert rel(logits, golden["logits"]) < 2e-2 and float(jnp.abs(grad.astype(jnp.float32)).max()) > 0


def test_official_critic_sizes_the_critic_from_the_hosts_config(golden):
    if BACKEND != "jax":
        pytest.skip("a JAX critic")
    critic = dreamerv3_ninjax.official_critic(VALUE, RSSM)
    assert (critic.num_dense_layers, critic.dense_hidden_units, critic.num_buckets) == (2, 32, 255)
    assert (critic.gru_units, critic.num_z_categoricals, critic.num_z_classes, critic.latent_size) == (24, 4, 5, 44)
    assert critic.input_layout == "h_z" and critic.norm == "rms" and critic.bin_scheme == "symexp"
    assert_refused(lambda: dreamerv3_ninjax.official_critic({**VALUE, "act": "relu"}, RSSM), "value", "act='relu'")
    assert_refused(lambda: dreamerv3_ninjax.official_critic(VALUE, {"deter": 24, "stoch": 4}), "rssm", "classes")
    assert_refused(lambda: dreamerv3_ninjax.official_critic(VALUE, RSSM, gru_units=8), "gru_units")
    assert_refused(lambda: dreamerv3_ninjax.official_critic([2, 32], RSSM), "value", "config.agent.value")


def test_bad_input_is_refused_naming_the_argument(nj, golden):
    import jax

    critic = critic_of(golden)
    namespace = _namespace(nj, golden)
    swap = dreamerv3_ninjax.swap_value_heads
    assert_refused(lambda: swap(namespace, object()), "critic", "CriticNetwork")
    layer = CriticNetwork(model_size=None, num_dense_layers=2, dense_hidden_units=32, **SIZES)
    assert_refused(lambda: swap(namespace, layer), "critic", "norm=")
    ensemble = CriticNetwork(model_size=None, num_dense_layers=2, dense_hidden_units=32, ensemble_size=2, **SIZES,
                             **dreamerv3.CRITIC_OPTIONS)  # fmt: skip
    assert_refused(lambda: swap(namespace, ensemble), "critic", "ensemble")
    assert_refused(lambda: swap(types.SimpleNamespace(), critic), "namespace", "MLPHead")
    assert_refused(lambda: swap(types.SimpleNamespace(MLPHead=namespace.MLPHead), critic), "namespace", "outs.TwoHot")
    for names in ("val", (), ("val", "val"), ("val", "a/b"), ("val", 3)):
        assert_refused(lambda names=names: swap(namespace, critic, names=names), "names")
    assert_refused(lambda: swap(namespace, critic, initializer="keras"), "initializer", "'host'")
    assert_refused(lambda: swap(namespace, critic, distribution="uniform"), "distribution", "'critic'")
    assert namespace.MLPHead.__name__ == "HostHead"  # nothing was swapped by a refused call

    def head(**changes):
        return dreamerv3_ninjax.CriticHead(**{"space": SCALAR, "critic": critic, **VALUE, "name": "val", **changes})

    assert_refused(lambda: head(layers=3), "layers", "got 3", "expected 2")
    assert_refused(lambda: head(units=64), "units", "expected 32")
    assert_refused(lambda: head(bins=5), "bins", "expected 255")
    assert_refused(lambda: head(space=types.SimpleNamespace(shape=(2,))), "space", "scalar")
    assert_refused(lambda: head(output="mse"), "output", "symexp_twohot")
    assert_refused(lambda: head(distribution="host"), "distribution")
    val = head()
    state = params_of(golden)
    assert_refused(lambda: nj.pure(lambda x: val(x, 2))(state, np.zeros((3, 4, 40), "float32")), "x", "44", "40")
    assert_refused(lambda: nj.pure(lambda x: val(x, 3))(state, golden["feat"]), "bdims")
    # A host state whose shapes are not the critic's (another config.value than the critic was built for).
    other = {k: np.zeros((44, 16), "float32") if k == "val/mlp/linear0/kernel" else v for k, v in state.items()}
    assert_refused(lambda: jax.jit(nj.pure(lambda x: val(x, 2).logits))(other, golden["feat"]), "mlp/linear0/kernel")


def test_other_backends_are_refused_before_anything_is_swapped():
    if BACKEND == "jax":
        pytest.skip("the refusal of a critic on another backend")
    critic = CriticNetwork(model_size="nano", **dreamerv3.CRITIC_OPTIONS)
    namespace = types.SimpleNamespace(MLPHead=object)
    assert_refused(lambda: dreamerv3_ninjax.swap_value_heads(namespace, critic), "critic", BACKEND, "JAX")
    assert namespace.MLPHead is object


def _step(nj, val, state, feat, ret, lr):
    """One LaProp-sized update of the fast head's entries (each moves by about `lr`: the gradient over its RMS, as
    the official optimizer scales it), under `jax.jit`; returns the new state and the logits before it."""
    import jax
    import jax.numpy as jnp

    def train(x, target):
        logits = val(x, 2).logits
        _, _, grads = nj.grad(lambda: val(x, 2).loss(target).mean(), [val])()
        rms = jnp.sqrt(
            sum((g.astype(jnp.float32) ** 2).sum() for g in grads.values()) / sum(g.size for g in grads.values())
        )
        for key, grad in grads.items():
            nj.context()[key] = nj.context()[key] - lr * grad / (rms + 1e-20)
        return logits

    return jax.jit(nj.pure(train))(state, feat, ret)


@pytest.mark.parametrize("policy", ["bfloat16", "mixed_bfloat16"])
def test_issue_71_finding_15_a_bfloat16_critic_gets_float32_host_parameters_and_computes_in_its_policy(
    nj, golden, policy
):
    """Honoured: the host's state holds float32 entries (as the stock head's, which its optimizer updates in place),
    whatever the critic's dtype policy, and the trunk computes in the policy's compute dtype (bfloat16: the stock
    head's under the official default `--jax.compute_dtype bfloat16`), the head in float32. It used to put the
    bfloat16 weights themselves in the host's state, where an official-size update (lr 4e-5) left 88-94% of the
    trunk's entries unchanged."""
    import jax

    full = critic_of(golden)
    critic = CriticNetwork.from_config({**full.get_config(), "dtype": policy})
    critic.set_weights(full.get_weights())
    assert critic.compute_dtype == "bfloat16"
    val, slowval = heads(critic)
    feat, ret = jax.device_put([golden["feat"], golden["ret"]])
    with jax.transfer_guard("disallow"):
        state = jax.jit(nj.init(lambda x: (val(x, 2), slowval(x, 2)) and None))({}, feat)
    assert sorted(state) == sorted(params_of(golden))
    assert {str(v.dtype) for v in state.values()} == {"float32"}
    for key, value in state.items():  # the critic's fast weights (both heads), in bfloat16 where it holds them so
        want = golden["val/" + key.split("/", 1)[1]]
        want = want.astype("bfloat16").astype("float32") if policy == "bfloat16" and "/mlp/" in key else want
        np.testing.assert_array_equal(np.asarray(value), want, err_msg=key)
    new, logits = _step(nj, val, state, feat, ret, lr=4e-5)
    # Computed in bfloat16: within bfloat16's rounding of the float32 critic's logits, and not equal to them.
    assert 1e-4 < rel(logits, golden["logits"]) < 2e-2
    for key in (k for k in state if k.startswith("val/mlp/")):
        assert new[key].dtype == "float32"
        moved = np.asarray(new[key]) != np.asarray(state[key])
        assert moved.mean() > 0.99, (key, moved.mean())  # every entry with a gradient moves by ~4e-5


@pytest.mark.parametrize("change", ["frozen", "frozen trunk", "int8", "lora"])
def test_issue_71_finding_16_a_frozen_quantized_or_lora_critic_is_refused_by_the_swap(nj, golden, change):
    """Refused by `swap_value_heads` itself, naming `critic` and what is wrong, with the host's `MLPHead` left as it
    was (frozen and int8 critics used to be accepted, then the agent's init died with `KeyError:
    'mlp/linear0/kernel'`); and by `CriticHead`."""
    critic = critic_of(golden)
    if change == "frozen":
        critic.trainable = False
        words = ("'mlp/linear0/kernel'", "frozen", "trainable")
    elif change == "frozen trunk":
        critic.mlp.trainable = False
        words = ("'mlp/linear0/kernel'", "frozen", "trainable")
    elif change == "int8":
        with pytest.warns(UserWarning, match="quantize"):  # (Keras: the norms have no int8 form)
            critic.quantize("int8")
        words = ("'mlp/linear0/kernel'", "int8", "quantized")
    else:
        critic.mlp.dense_layers[0].enable_lora(2)
        words = ("lora",)
    namespace = _namespace(nj, golden)
    original = namespace.MLPHead
    assert_refused(lambda: dreamerv3_ninjax.swap_value_heads(namespace, critic), "critic", *words)
    assert namespace.MLPHead is original
    assert_refused(lambda: heads(critic), "critic", *words)


def test_issue_71_finding_18_official_critic_refuses_other_architectures_and_sizes_at_once(golden):
    if BACKEND != "jax":
        pytest.skip("a JAX critic")
    build = dreamerv3_ninjax.official_critic
    for option, value in (
        ("norm", "layer"),
        ("norm_epsilon", 1e-3),
        ("use_bias", False),
        ("bin_scheme", "uniform_symlog"),
        ("upper_bound", 15.0),
        ("input_layout", "z_h"),
        ("ensemble_size", 2),
        ("head", "hl_gauss"),
        ("head", {"class_name": "mse", "config": {}}),
        ("trunk", "residual"),
    ):
        assert_refused(lambda: build(VALUE, RSSM, **{option: value}), option, repr(value).split(",")[0], "official")
    # The official parts given as a spec, and the options the names do not depend on, are taken.
    critic = build(VALUE, RSSM, head={"class_name": "two_hot", "config": {}}, trunk="mlp", ema_decay=0.9)
    assert critic.head == "two_hot" and critic.ema_decay == 0.9
    for mapping, key, bad in (("value", "layers", "x"), ("value", "units", 2.7), ("value", "bins", 1),
                              ("rssm", "deter", None), ("rssm", "classes", True)):  # fmt: skip
        value, rssm = ({**VALUE, key: bad}, RSSM) if mapping == "value" else (VALUE, {**RSSM, key: bad})
        assert_refused(lambda: build(value, rssm), mapping, f"{key}={bad!r}", "an integer")
    critic = build({**VALUE, "layers": 2.0, "units": np.int64(32)}, RSSM)  # whole numbers of any kind
    assert (critic.num_dense_layers, critic.dense_hidden_units) == (2, 32)


def test_issue_71_finding_18_critic_output_loss_broadcasts_its_target_as_the_official_two_hot(nj, golden):
    """`CriticOutput.loss` broadcasts `target` against the logits' leading shape as the official `TwoHot.loss` does
    (`target[..., None]` against `[..., bins]`), and names `target` where they do not broadcast (it raised an
    internal JAX error)."""
    import jax

    val, _ = heads(critic_of(golden))
    state = jax.device_put(params_of(golden))
    ret = golden["ret"]

    def losses(x):
        out = val(x, 2)
        return out.loss(ret[None]), out.loss(ret[:1]), out.loss(ret[:, :1]), out.loss(2.5), out.loss(ret)

    _, (lead, row, column, scalar, same) = jax.jit(nj.pure(losses))(state, golden["feat"])
    assert lead.shape == (1, 3, 4) and rel(lead[0], golden["loss_ret"]) < 2e-5  # the official numbers
    np.testing.assert_allclose(np.asarray(lead[0]), np.asarray(same), rtol=1e-6)
    for got, target in ((row, np.broadcast_to(ret[:1], (3, 4))), (column, np.broadcast_to(ret[:, :1], (3, 4))),
                        (scalar, np.full((3, 4), 2.5, "float32"))):  # fmt: skip
        _, want = nj.pure(lambda x, t: val(x, 2).loss(t))(state, golden["feat"], np.ascontiguousarray(target))
        assert got.shape == (3, 4)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    for bad in (np.zeros(5, "float32"), np.zeros((2, 4), "float32")):
        call = lambda bad=bad: nj.pure(lambda x: val(x, 2).loss(bad))(state, golden["feat"])  # noqa: E731
        assert_refused(call, "target", str(list(bad.shape)), "[3, 4]")
