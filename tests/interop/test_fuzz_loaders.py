"""Fuzz of every interop loader family and of the PyTorch views' `load_state_dict` (issue 31, point 5).

From a valid state (an `export_*` of another critic, or a view's `state_dict()`), hypothesis makes one defect
at a time: a missing, extra or renamed key, a transposed or wrong-shape array, a non-finite entry (nan, +-inf,
or a float64 1e39 that is inf as float32), a wrong dtype (strings, objects, bool, complex, None), a wrapper
prefix on some keys only. Each is refused with a `ValueError` that names the argument holding it and says what
was expected, and every variable of the critic (fast and EMA; an ensemble's other members too) is bit-identical
afterwards. A wrapper's prefix on every key (`_orig_mod.`, `module.`, `_forward_module.`, nested) is not a
defect: such a state loads, to the same values as the unwrapped one.

The loaders take numpy arrays: every family runs on every backend; the views exist on PyTorch only.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multicritic import CriticNetwork
from multicritic.interop import dreamerv3, nm512, rllib, sheeprl, torchrl
from tests.conftest import BACKEND, to_np

SIZES = dict(gru_units=6, num_z_categoricals=2, num_z_classes=3)
WRAPPERS = ("_orig_mod.", "module.", "_forward_module.")
# Deterministic (the same examples on every run and machine); nothing written to a database.
FUZZ = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def small(options, seed, ensemble_size=1):
    """A two-layer critic (first kernel [12, 8], second [8, 8], head [8, 255]) with random weights, so that a
    load of another's weights changes every variable (a half load cannot hide)."""
    critic = CriticNetwork(
        model_size=None, num_dense_layers=2, dense_hidden_units=8, ensemble_size=ensemble_size, **SIZES, **options
    )
    rng = np.random.default_rng(seed)
    for var in critic.variables:
        var.assign(rng.normal(0.0, 0.3, tuple(var.shape)).astype("float32"))
    return critic


def snapshot(critic):
    """Numpy copies of every variable of `critic` (fast, EMA, every member)."""
    return [np.array(to_np(v.value), copy=True) for v in critic.variables]


def assert_unchanged(critic, before, what):
    after = snapshot(critic)
    assert len(after) == len(before)
    for a, b, var in zip(after, before, critic.variables):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, var.path)
        assert a.tobytes() == b.tobytes(), f"{what} changed {var.path}"


def assert_refused(load, argument, what):
    """`load()` raises a `ValueError` whose message starts with `argument` and says what was expected."""
    with pytest.raises(ValueError) as info:
        load()
    message = str(info.value)
    assert re.match(rf"{re.escape(argument)}\b", message), f"{what}: {message!r} does not name {argument!r}"
    assert "expected" in message, f"{what}: {message!r} does not say what was expected"


# --- Loader families -----------------------------------------------------------------------------------------------


class Family:
    """A loader family: its critic options, the valid state as named parts (`[{key: array}, ...]`, a list's
    entries keyed by position), the argument each part is given as, and whether wrapper prefixes apply."""

    def __init__(self, name, options, export, load, arguments, torch_keys):
        self.name, self.options, self.export, self._load = name, options, export, load
        self.arguments, self.torch_keys = arguments, torch_keys

    def parts(self, source):
        out = self.export(source)
        if isinstance(out, list):
            return [dict(enumerate(out))]
        return [dict(part) for part in (out if isinstance(out, tuple) else (out,))]

    def load(self, critic, parts, member=None):
        if self.name == "rllib_tf":  # a mapping with names (not positions) is given as such: refused
            named = any(isinstance(k, str) for k in parts[0])
            weights = parts[0] if named else [parts[0][k] for k in sorted(parts[0])]
            return rllib.load_rllib_weights(critic, weights, member=member)
        return self._load(critic, *parts, member=member)


FAMILIES = {
    "rllib_tf": Family("rllib_tf", rllib.CRITIC_OPTIONS, rllib.export_rllib_weights, None, ["weights"], False),
    "rllib_torch": Family(
        "rllib_torch", rllib.CRITIC_OPTIONS, rllib.export_rllib_torch, rllib.load_rllib_torch, ["state_dict"], True
    ),
    "sheeprl": Family(
        "sheeprl",
        sheeprl.CRITIC_OPTIONS,
        sheeprl.export_sheeprl,
        sheeprl.load_sheeprl,
        ["critic_state", "target_critic_state"],
        True,
    ),
    "dreamerv3": Family(
        "dreamerv3", dreamerv3.CRITIC_OPTIONS, dreamerv3.export_dreamerv3, dreamerv3.load_dreamerv3, ["params"], False
    ),
    "nm512": Family(
        "nm512", nm512.CRITIC_OPTIONS, nm512.export_nm512, nm512.load_nm512, ["value_state", "slow_value_state"], True
    ),
    "torchrl": Family(
        "torchrl",
        torchrl.CRITIC_OPTIONS,
        torchrl.export_torchrl,
        torchrl.load_torchrl,
        ["value_state", "target_value_state"],
        True,
    ),
}


class Case:
    """A family with its critics, built once per module: `source` (whose export is the valid state), `single`
    and `ensemble` targets (the fuzzed loads go into them: into member 1 of the ensemble) and `sink` (the
    accepted loads go into it, from `scrambled` values)."""

    def __init__(self, fam):
        self.fam = fam
        self.source = small(fam.options, seed=1)
        self.parts = fam.parts(self.source)
        self.single = small(fam.options, seed=2)
        self.ensemble = small(fam.options, seed=3, ensemble_size=2)
        self.sink = small(fam.options, seed=4)
        self.scrambled = snapshot(self.sink)
        self.want = snapshot(self.source)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def case(request):
    case = Case(FAMILIES[request.param])
    case.fam.load(case.sink, case.parts)  # the valid state loads, to the source's values
    for a, b in zip(snapshot(case.sink), case.want):
        np.testing.assert_array_equal(a, b)
    return case


def _editable(case, key):
    # TorchRL's bins buffer is checked, not loaded: leaving it out (or under another name) is no error.
    return not (case.fam.name == "torchrl" and key.endswith(torchrl.BINS_KEY))


def _bad_dtype(value, how):
    return {
        "str": lambda: value.astype(str),
        "str_scalar": lambda: "abc",
        "bytes": lambda: b"\x00" * value.nbytes,
        "str_list": lambda: np.vectorize(lambda x: f"{x:.3f}")(value).tolist(),
        "complex": lambda: value.astype(np.complex64) + 1j,
        "bool": lambda: value > 0,
        "object": lambda: np.array([{"weights": value}], dtype=object),
        "object_same_shape": lambda: value.astype(object),
        "none": lambda: None,
    }[how]()


DTYPES = ("str", "str_scalar", "bytes", "str_list", "complex", "bool", "object", "object_same_shape", "none")
MUTATIONS = ("drop", "extra", "rename", "transpose", "reshape", "non_finite", "dtype", "partial_prefix")


@st.composite
def wrapped_parts(draw, parts):
    """`parts`, each under its own chain of one or two wrapper prefixes."""
    out = []
    for part in parts:
        prefix = "".join(draw(st.lists(st.sampled_from(WRAPPERS), min_size=1, max_size=2)))
        out.append({prefix + k: v for k, v in part.items()})
    return out


@st.composite
def mutated(draw, case, kind):
    """`(index, description, parts)`: the valid parts (for a PyTorch layout maybe under a wrapper's prefix) with
    one defect of `kind` in part `index`."""
    fam = case.fam
    parts = [dict(p) for p in case.parts]
    if fam.torch_keys and draw(st.booleans()):
        parts = draw(wrapped_parts(parts))
    index = draw(st.integers(0, len(parts) - 1))
    part = parts[index]
    keys = sorted(part, key=str)
    if kind in ("drop", "rename", "partial_prefix"):
        keys = [k for k in keys if _editable(case, k)]
    key = draw(st.sampled_from(keys))
    value = np.asarray(part[key])
    if kind == "drop":
        del part[key]
        if fam.name == "rllib_tf":  # a list: the entries after it move up one place
            parts[index] = dict(enumerate(part[k] for k in sorted(part)))
    elif kind == "extra":
        part[(max(part) + 1) if fam.name == "rllib_tf" else f"{key}_extra"] = value.copy()
    elif kind == "rename":
        if fam.name == "rllib_tf":  # a list has no names: two entries of different shapes swap places
            other = draw(st.sampled_from([k for k in keys if np.shape(part[k]) != value.shape]))
            part[key], part[other] = part[other], part[key]
        else:
            renamed = draw(
                st.sampled_from([key + "x", key.replace(".", "_", 1), key.replace("/", "_", 1), "_" + key, key.upper()])
            )
            part[renamed if renamed != key else key + "x"] = part.pop(key)
    elif kind == "partial_prefix":
        if fam.name == "rllib_tf":  # a list has no keys: the arrays come as a mapping of prefixed names
            prefix = draw(st.sampled_from(WRAPPERS))
            return index, f"a mapping in place of the list ({prefix})", [{f"{prefix}{k}": v for k, v in part.items()}]
        part[draw(st.sampled_from(WRAPPERS)) + key] = part.pop(key)
    elif kind == "transpose":
        if value.ndim != 2 or value.shape[0] == value.shape[1]:  # a square transpose is undetectable
            value = value.reshape(value.shape + (1,))
        part[key] = value.T
    elif kind == "reshape":
        how = draw(st.sampled_from(["grow", "shrink", "flatten", "add_axis", "scalar"]))
        new = {
            "grow": lambda: np.concatenate([value.ravel(), [0.0]]).astype(value.dtype),
            "shrink": lambda: value.ravel()[:-1],
            "flatten": lambda: value.ravel(),
            "add_axis": lambda: value[None],
            "scalar": lambda: value.ravel()[0],
        }[how]()
        part[key] = new if np.shape(new) != value.shape else value[None]
    elif kind == "non_finite":
        bad = value.astype(np.float64 if draw(st.booleans()) else np.float32)
        flat = bad.reshape(-1)
        entry = draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e39, -1e39]))
        if bad.dtype == np.float32 and abs(entry) == 1e39:
            bad = bad.astype(np.float64)
            flat = bad.reshape(-1)
        flat[draw(st.integers(0, flat.size - 1))] = entry
        part[key] = bad
    else:
        how = draw(st.sampled_from(DTYPES))
        part[key] = _bad_dtype(value, how)
        kind = f"dtype ({how})"
    return index, f"{kind} of {key!r} in part {index}", parts


@pytest.mark.parametrize("kind", MUTATIONS)
@FUZZ
@given(data=st.data())
def test_a_defective_state_is_refused_by_name_and_changes_nothing(case, kind, data):
    fam = case.fam
    member = data.draw(st.sampled_from([None, 1]), label="member")
    critic = case.single if member is None else case.ensemble
    if kind == "partial_prefix" and not fam.torch_keys and fam.name != "rllib_tf":
        # The official parameters are a JAX agent's flat dict: other modules' keys are ignored by design, so a
        # prefixed key is a missing one.
        kind = "drop"
    index, what, bad = data.draw(mutated(case, kind), label="defect")
    before = snapshot(critic)
    assert_refused(lambda: fam.load(critic, bad, member=member), fam.arguments[index], f"{fam.name}: {what}")
    assert_unchanged(critic, before, f"{fam.name} (member={member}): {what}")


@FUZZ
@given(data=st.data())
def test_a_wrappers_prefix_on_every_key_loads_the_same_values(case, data):
    fam = case.fam
    if not fam.torch_keys:
        pytest.skip(f"{fam.name}'s states are not PyTorch state dicts")
    parts = data.draw(wrapped_parts(case.parts), label="wrapped")
    for var, value in zip(case.sink.variables, case.scrambled):
        var.assign(value)
    fam.load(case.sink, parts)
    for got, want, var in zip(snapshot(case.sink), case.want, case.sink.variables):
        assert got.tobytes() == want.tobytes(), f"{fam.name}: {var.path} after a wrapped load"


def test_the_ensemble_member_load_leaves_the_other_member_alone():
    """A valid load into member 1 gives member 1 the source's values and leaves member 0 bit-identical."""
    fam = FAMILIES["nm512"]
    source, ensemble = small(fam.options, seed=1), small(fam.options, seed=3, ensemble_size=2)
    before = snapshot(ensemble)
    fam.load(ensemble, [{"module." + k: v for k, v in p.items()} for p in fam.parts(source)], member=1)
    for got, was, want in zip(snapshot(ensemble), before, snapshot(source)):
        assert got[0].tobytes() == was[0].tobytes()
        assert got[1].tobytes() == want.tobytes()


# --- The PyTorch views ---------------------------------------------------------------------------------------------

VIEWS = ("fast_module", "ema_module", "torch_module", "compiled_fast_module")


class Views:
    """A critic and its views (one wrapped in `torch.compile`, loaded through the wrapper), and the state dicts of
    another critic's views (the valid states)."""

    def __init__(self):
        import torch

        self.critic, self.source = small({}, seed=2), small({}, seed=1)
        self.want = snapshot(self.source)
        self.modules = {name: getattr(self.critic, name)() for name in VIEWS[:3]}
        self.modules["compiled_fast_module"] = torch.compile(self.critic.fast_module(), backend="eager")
        self.states = {
            name: {k: v.detach().clone() for k, v in getattr(self.source, name)().state_dict().items()}
            for name in VIEWS[:3]
        }
        self.states["compiled_fast_module"] = {"_orig_mod." + k: v for k, v in self.states["fast_module"].items()}
        self.target = small({}, seed=5)  # the accepted loads go into it, from `scrambled` values
        self.scrambled = snapshot(self.target)


@pytest.fixture(scope="module")
def views():
    if BACKEND != "torch":
        pytest.skip("the torch.nn.Module views exist on PyTorch only")
    return Views()


def _bad_tensor(torch, value, how):
    return {
        "int64": lambda: value.round().long(),
        "bool": lambda: value > 0,
        "complex": lambda: value.to(torch.complex64),
        "numpy": lambda: value.numpy(),
        "list": lambda: value.tolist(),
        "str": lambda: "abc",
        "none": lambda: None,
    }[how]()


@st.composite
def mutated_view_state(draw, state, kind):
    import torch

    state = dict(state)
    key = draw(st.sampled_from(sorted(state)))
    value = state[key]
    if kind == "drop":
        del state[key]
    elif kind == "extra":
        state[key + "_extra"] = value.clone()
    elif kind == "rename":
        renamed = draw(st.sampled_from([key + "x", key.replace("_", ".", 1), "_" + key, key.upper()]))
        state[renamed if renamed != key else key + "x"] = state.pop(key)
    elif kind == "partial_prefix":
        state[draw(st.sampled_from(WRAPPERS)) + key] = state.pop(key)
    elif kind == "transpose":
        v = value if value.ndim == 2 and value.shape[0] != value.shape[1] else value.reshape(value.shape + (1,))
        state[key] = v.permute(*reversed(range(v.ndim))).contiguous()
    elif kind == "reshape":
        how = draw(st.sampled_from(["grow", "shrink", "flatten", "add_axis"]))
        new = {
            "grow": lambda: torch.cat([value.reshape(-1), value.new_zeros(1)]),
            "shrink": lambda: value.reshape(-1)[:-1],
            "flatten": lambda: value.reshape(-1),
            "add_axis": lambda: value[None],
        }[how]()
        state[key] = new if new.shape != value.shape else value[None]
    elif kind == "non_finite":
        bad = value.to(draw(st.sampled_from([torch.float32, torch.float64, torch.float16]))).clone()
        entry = draw(st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e39]))
        if entry == 1e39:  # finite as float64, inf as the parameters' float32
            bad = bad.double()
        bad.view(-1)[draw(st.integers(0, bad.numel() - 1))] = entry
        state[key] = bad
    else:
        state[key] = _bad_tensor(
            torch, value, draw(st.sampled_from(["int64", "bool", "complex", "numpy", "list", "str", "none"]))
        )
    return f"{kind} of {key!r}", state


VIEW_MUTATIONS = ("drop", "extra", "rename", "partial_prefix", "transpose", "reshape", "non_finite", "dtype")


@pytest.mark.parametrize("kind", VIEW_MUTATIONS)
@FUZZ
@given(data=st.data())
def test_a_view_refuses_a_defective_state_dict_and_changes_nothing(views, kind, data):
    name = data.draw(st.sampled_from(VIEWS), label="view")
    if name == "compiled_fast_module" and kind in ("drop", "extra", "rename", "partial_prefix"):
        # Inside a wrapper's load the keys are torch's (strict or not is the wrapper's call); the values are ours.
        name = "fast_module"
    what, bad = data.draw(mutated_view_state(views.states[name], kind), label="defect")
    before = snapshot(views.critic)
    assert_refused(lambda: views.modules[name].load_state_dict(bad), "state_dict", f"{name}: {what}")
    assert_unchanged(views.critic, before, f"{name}: {what}")


@FUZZ
@given(data=st.data())
def test_a_view_loads_a_wrapped_state_dict_to_the_same_values(views, data):
    name = data.draw(st.sampled_from(VIEWS[:3]), label="view")
    (state,) = data.draw(wrapped_parts([views.states[name]]), label="wrapped")
    target = views.target
    for var, value in zip(target.variables, views.scrambled):
        var.assign(value)
    getattr(target, name)().load_state_dict(state)
    loaded = {
        "fast_module": target.fast_weights,
        "ema_module": target.ema_weights,
        "torch_module": target.fast_weights + target.ema_weights,
    }[name]
    loaded = {id(v) for v in loaded}
    for got, want, was, var in zip(snapshot(target), views.want, views.scrambled, target.variables):
        expected = want if id(var) in loaded else was
        assert got.tobytes() == expected.tobytes(), f"{name}: {var.path} after a wrapped load"


def test_a_view_refuses_assign_and_non_mappings_by_name(views):
    fast = views.modules["fast_module"]
    before = snapshot(views.critic)
    assert_refused(lambda: fast.load_state_dict(views.states["fast_module"], assign=True), "assign", "assign=True")
    for bad in ([1, 2], None, "state"):
        assert_refused(lambda bad=bad: fast.load_state_dict(bad), "state_dict", repr(bad))
        assert_refused(lambda bad=bad: views.modules["torch_module"].load_state_dict(bad), "state_dict", repr(bad))
    assert_unchanged(views.critic, before, "assign / non-mapping")
