"""Writes tests/data/simba_v2_goldens.npz: outputs of SimbaV2's own JAX (Flax) layers.

Not run by the test-suite. It needs jax and flax (the test environment has
both) and a checkout of the authors' code (github.com/dojeon-ai/SimbaV2, read
at commit 14fafb2):

    KERAS_BACKEND=jax python tests/data/generate_simba_v2_goldens.py /path/to/SimbaV2

The authors' modules import TensorFlow Probability (their policy's
distributions) and their agent's utilities at import time; the layers used here
need neither, so those imports (and the packages' `__init__`s) get empty
stand-ins. What it records, for a
trunk of width 8, 2 LERP blocks and 5 inputs: the input rows, the parameters
(Flax's initialisation times a random factor each, so no scaler sits at its
initial value), keyed by `SimbaV2Trunk`'s variable names; the output of
SimbaV2's `HyperEmbedder` followed by two `HyperLERPBlock`s (the critic's
encoder, `SimbaV2Critic` without its value head); and the parameters after
the authors' `l2normalize_network` (their projection after every update).
"""

from __future__ import annotations

import math
import pathlib
import sys
import types

import numpy as np

WIDTH, BLOCKS, INPUTS, ROWS = 8, 2, 5, 6
OUT = pathlib.Path(__file__).with_name("simba_v2_goldens.npz")

# `SimbaV2Trunk`'s variable (below the trunk) -> the authors' parameter path.
NAMES = {"embedding/kernel": "embedder/w/hyper_dense/kernel", "embedding_scaler/scaler": "embedder/scaler/scaler"}
for _i in range(BLOCKS):
    NAMES.update(
        {
            f"block_{_i}_dense_0/kernel": f"blocks_{_i}/mlp/w1/hyper_dense/kernel",
            f"block_{_i}_scaler/scaler": f"blocks_{_i}/mlp/scaler/scaler",
            f"block_{_i}_dense_1/kernel": f"blocks_{_i}/mlp/w2/hyper_dense/kernel",
            f"block_{_i}_alpha/scaler": f"blocks_{_i}/alpha_scaler/scaler",
        }
    )


def _stand_ins(checkout):
    """Empty modules for what the authors' layer and update modules import but these layers never use (their
    packages' `__init__`s import the whole agent: the packages are given as bare namespaces)."""
    for name in ("scale_rl", "scale_rl.agents", "scale_rl.agents.jax_utils", "scale_rl.agents.simbaV2"):
        package = types.ModuleType(name)
        package.__path__ = [str(pathlib.Path(checkout, *name.split(".")))]
        sys.modules[name] = package
    anything = types.SimpleNamespace(Distribution=object)
    tfp = types.ModuleType("tensorflow_probability")
    tfp.substrates = types.ModuleType("tensorflow_probability.substrates")
    tfp.substrates.jax = types.SimpleNamespace(distributions=anything, bijectors=anything)
    sys.modules.setdefault("tensorflow_probability", tfp)
    sys.modules.setdefault("tensorflow_probability.substrates", tfp.substrates)
    network = types.ModuleType("scale_rl.agents.jax_utils.network")
    network.Network, network.PRNGKey = object, object
    sys.modules["scale_rl.agents.jax_utils.network"] = network
    buffers = types.ModuleType("scale_rl.buffers")
    buffers.Batch = dict
    sys.modules["scale_rl.buffers"] = buffers


def _flat(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, prefix + key + "/"))
        else:
            out[prefix + key] = np.asarray(value, np.float32)
    return out


def main(checkout: str) -> None:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    _stand_ins(checkout)
    from scale_rl.agents.jax_utils.tree_utils import tree_map_until_match
    from scale_rl.agents.simbaV2.simbaV2_layer import HyperEmbedder, HyperLERPBlock
    from scale_rl.agents.simbaV2.simbaV2_update import l2normalize_layer

    gain = math.sqrt(2 / WIDTH)

    class Encoder(nn.Module):  # the critic's embedder and blocks, with the authors' configuration
        def setup(self):
            self.embedder = HyperEmbedder(hidden_dim=WIDTH, scaler_init=gain, scaler_scale=gain, c_shift=3.0)
            self.blocks = [
                HyperLERPBlock(
                    hidden_dim=WIDTH,
                    scaler_init=gain,
                    scaler_scale=gain,
                    alpha_init=1 / (BLOCKS + 1),
                    alpha_scale=1 / math.sqrt(WIDTH),
                )
                for _ in range(BLOCKS)
            ]

        def __call__(self, x):
            x = self.embedder(x)
            for block in self.blocks:
                x = block(x)
            return x

    rng = np.random.default_rng(75)
    x = rng.normal(size=(ROWS, INPUTS)).astype(np.float32)
    encoder = Encoder()
    params = jax.tree.map(np.asarray, dict(encoder.init(jax.random.PRNGKey(75), x)["params"]))
    params = jax.tree.map(lambda p: (p * (1 + 0.3 * rng.normal(size=p.shape))).astype(np.float32), params)
    output = np.asarray(encoder.apply({"params": jax.tree.map(jnp.asarray, params)}, x))
    projected = tree_map_until_match(f=l2normalize_layer, tree=params, target_re="hyper_dense", keep_values=True)
    before, after = _flat(params), _flat(jax.tree.map(np.asarray, projected))
    arrays = {"x": x, "output": output}
    for name, theirs in NAMES.items():
        arrays[f"params/{name}"] = before[theirs]
        arrays[f"projected/{name}"] = after[theirs]
    np.savez(OUT, **arrays)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
