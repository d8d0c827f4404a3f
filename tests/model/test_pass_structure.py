"""`PassStructure`: the dtype policy, compute dtypes, quantization modes and LoRA states a compiled pass is keyed
on, read again whenever `quantize`, `enable_lora` or a new policy changes them, and equal to reading them fresh."""

import keras

from multicritic.model.pass_structure import PassStructure


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])


def _fresh(model):
    """The structure read without anything kept."""
    return PassStructure()(model, model.layers)


def test_each_change_is_read_and_the_kept_one_is_the_fresh_one():
    model = _model()
    structure = PassStructure()
    seen = [structure(model, model.layers)]
    assert seen[0] == ("float32", ("float32", None, False), ("float32", None, False))
    assert structure(model, model.layers) is seen[0]  # nothing changed: what was kept
    model.layers[0].enable_lora(2)
    seen.append(structure(model, model.layers))
    model.layers[1].dtype_policy = "mixed_bfloat16"
    seen.append(structure(model, model.layers))
    model.layers[1].quantize("int8")
    seen.append(structure(model, model.layers))
    assert seen[1][1] == ("float32", None, True)
    assert seen[2][2] == ("bfloat16", None, False)
    assert seen[3][2][1] == "int8"
    assert len(set(seen)) == 4
    assert seen[-1] == _fresh(model)


def test_with_a_policy_map_nothing_is_kept():
    model = _model()
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy="float32")
    model.layers[0].dtype_policy = policy_map
    structure = PassStructure()
    first = structure(model, model.layers)
    assert first == _fresh(model)
    assert structure(model, model.layers) is not first  # read again: a map changes in place
