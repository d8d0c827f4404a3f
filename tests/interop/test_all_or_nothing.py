"""Every interop loader and export refuses what does not fit, by name, and changes nothing (issue 31).

Unbuilt critics (finding 12) and wrapper prefixes on every PyTorch layout (finding 13); the hypothesis fuzz
per loader family (and of the PyTorch views) is `tests/interop/test_fuzz_loaders.py`.
"""

from __future__ import annotations

import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.interop import dreamerv3, nm512, rllib, sheeprl, torchrl
from tests.conftest import to_np

SIZES = dict(gru_units=6, num_z_categoricals=2, num_z_classes=3)


def small(options, seed):
    """A two-layer critic (first kernel [12, 8], second [8, 8], head [8, 255]) with random weights."""
    critic = CriticNetwork(model_size=None, num_dense_layers=2, dense_hidden_units=8, **SIZES, **options)
    rng = np.random.default_rng(seed)
    for var in critic.weights:
        var.assign(rng.normal(0.0, 0.3, tuple(var.shape)).astype("float32"))
    return critic


def weights_of(critic):
    return [np.array(to_np(v.value)) for v in critic.weights]


class Family:
    """One loader family: its critic options, a valid state (exported from another critic) as a list of
    named parts, and how the parts load."""

    def __init__(self, name, options, export, load):
        self.name, self.options, self.export, self.load = name, options, export, load

    def parts(self, source):
        """The valid state, as `[{key: array}, ...]` (a list's entries keyed by position)."""
        out = self.export(source)
        if isinstance(out, list):
            return [dict(enumerate(out))]
        return [dict(part) for part in (out if isinstance(out, tuple) else (out,))]

    def load_parts(self, critic, parts):
        if self.name == "rllib_tf":
            return rllib.load_rllib_weights(critic, [parts[0][k] for k in sorted(parts[0])])
        return self.load(critic, *parts)


FAMILIES = {
    "rllib_tf": Family("rllib_tf", rllib.CRITIC_OPTIONS, rllib.export_rllib_weights, None),
    "rllib_torch": Family("rllib_torch", rllib.CRITIC_OPTIONS, rllib.export_rllib_torch, rllib.load_rllib_torch),
    "sheeprl": Family("sheeprl", sheeprl.CRITIC_OPTIONS, sheeprl.export_sheeprl, sheeprl.load_sheeprl),
    "dreamerv3": Family("dreamerv3", dreamerv3.CRITIC_OPTIONS, dreamerv3.export_dreamerv3, dreamerv3.load_dreamerv3),
    "nm512": Family("nm512", nm512.CRITIC_OPTIONS, nm512.export_nm512, nm512.load_nm512),
    "torchrl": Family("torchrl", torchrl.CRITIC_OPTIONS, torchrl.export_torchrl, torchrl.load_torchrl),
}


# --- Findings 12 and 13 --------------------------------------------------------------------------------------------


def test_unbuilt_and_foreign_critics_are_refused_by_name():
    """Finding 12: every load and export on an unbuilt critic raised AttributeError ('Dense' has no
    attribute 'kernel')."""
    for fam in FAMILIES.values():
        parts = fam.parts(small(fam.options, seed=1))
        unbuilt = CriticNetwork(model_size=None, num_dense_layers=2, dense_hidden_units=8, **fam.options)
        assert not unbuilt.built
        for action in (lambda c: fam.export(c), lambda c: fam.load_parts(c, parts)):
            with pytest.raises(ValueError, match="critic: not built yet"):
                action(unbuilt)
            with pytest.raises(ValueError, match="critic: got a dict, expected a CriticNetwork"):
                action({})
    with pytest.raises(ValueError, match="critic: not built yet"):
        rllib.rllib_weight_names(CriticNetwork(model_size=None, num_dense_layers=1, dense_hidden_units=8))
    with pytest.raises(ValueError, match=r"weights: got a dict, expected a list of arrays"):
        rllib.load_rllib_weights(small(rllib.CRITIC_OPTIONS, 1), {"a": 1})


@pytest.mark.parametrize("prefix", ["_orig_mod.", "module.", "_forward_module.", "module._orig_mod."])
@pytest.mark.parametrize("name", ["rllib_torch", "sheeprl", "nm512", "torchrl"])
def test_every_pytorch_layout_loads_with_a_wrappers_prefix(name, prefix):
    """Finding 13: the NM512 loader ignored the `_orig_mod.` / `module.` / `_forward_module.` prefixes every
    loader accepts; TorchRL refused DDP's `module.` (its own keys start with `module.` too)."""
    fam = FAMILIES[name]
    source, target = small(fam.options, seed=1), small(fam.options, seed=2)
    parts = fam.parts(source)
    fam.load_parts(target, [{prefix + k: v for k, v in part.items()} for part in parts])
    for a, b in zip(weights_of(target), weights_of(source)):
        np.testing.assert_array_equal(a, b)
    if name == "torchrl":  # and a wrapped DreamerV3ValueLoss state dict
        loss = {f"{prefix}value_model_params.{k}": v for k, v in parts[0].items()}
        loss.update({f"{prefix}target_value_model_params.{k}": v for k, v in parts[1].items()})
        other = small(fam.options, seed=4)
        torchrl.load_torchrl(other, loss)
        for a, b in zip(weights_of(other), weights_of(source)):
            np.testing.assert_array_equal(a, b)
    builder = {
        "rllib_torch": lambda p: rllib.rllib_torch_critic(*p, **SIZES),
        "sheeprl": lambda p: sheeprl.sheeprl_critic(*p, **SIZES),
        "nm512": lambda p: nm512.nm512_critic(*p, **SIZES),
        "torchrl": lambda p: torchrl.torchrl_critic(*p, **SIZES),
    }[name]
    built = builder([{prefix + k: v for k, v in part.items()} for part in parts])
    for a, b in zip(weights_of(built), weights_of(source)):
        np.testing.assert_array_equal(a, b)


def test_builders_refuse_options_the_state_sets():
    parts = FAMILIES["sheeprl"].parts(small(sheeprl.CRITIC_OPTIONS, seed=1))
    with pytest.raises(ValueError, match="num_buckets: got 11, expected no num_buckets"):
        sheeprl.sheeprl_critic(*parts, num_buckets=11, **SIZES)
    with pytest.raises(ValueError, match="input_layout: got 'h_z', expected no input_layout"):
        sheeprl.sheeprl_critic(*parts, input_layout="h_z", **SIZES)
