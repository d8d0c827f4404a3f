"""JAX: what XLA makes of the compiled train step."""

import re

import numpy as np
import pytest

from tests.conftest import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="XLA programs of the JAX step")


@pytest.mark.parametrize("model_size", ["nano", "XS"])
def test_the_step_updates_its_donated_slots_in_place(model_size):
    """Adam's moments of the first Dense kernel (the largest buffers) are donated and updated in place: the
    compiled program copies none of them (a select applied after the whole update made XLA copy both)."""
    import jax.numpy as jnp

    from multicritic import CriticNetwork, CriticTrainer
    from tests.conftest import random_inputs

    critic = CriticNetwork(model_size=model_size)
    trainer = CriticTrainer(critic)
    h, z = random_inputs(critic, 8)
    batch = (h, z, np.ones(8, "float32"), np.ones(8, "float32"))
    trainer.train_step(*batch)
    run = trainer._compiled["direct"]
    text = run.lower(*(jnp.asarray(x) for x in batch)).compile().as_text()
    entry = text[text.index("\nENTRY") :]
    kernel = "f32[{},{}]".format(*critic.mlp.dense_layers[0].kernel.shape)
    params = set(re.findall(r"%(\S+) = " + re.escape(kernel) + r"\S* parameter\(", entry))
    assert len(params) >= 4  # the kernel, its EMA copy and its two moments
    copied = re.findall(r"= " + re.escape(kernel) + r"\S* copy\(%(\S+)\)", entry)
    assert not [p for p in copied if p in params], copied
