"""The official DreamerV3 agent's jitted train step with its own critic and with multicritic's, side by side.

`python -m tests.interop.official_agent OUT.json` (a process of its own, in the official code's environment:
jax <= 0.6.2, numpy < 2, ninjax, elements, Keras; `MULTICRITIC_OFFICIAL_SRC` a checkout of danijar/dreamerv3 at
`benchmarks/agents/official_dreamer.COMMIT`; this checkout on `PYTHONPATH`, `KERAS_BACKEND=jax`) builds the
official agent through the official `make_agent` on its dummy task (`--configs debug --task dummy_disc`, float32,
the value head 2 x 16 with 255 bins), as the official code ships it (`stock`) and with its value heads served by
multicritic (`swap_value_heads`):

- `swap`: `initializer="host"`, `distribution="host"` (the official initialisers and two-hot);
- `swap-critic`: `initializer="host"`, `distribution="critic"` (multicritic's two-hot over its own bins).

Each agent trains `STEPS` steps on the same random batches with the same seeds (through the agent's own
`agent.stream`), under the debug preset's `jax.debug True` (XLA's optimisations off), then `stock` and `swap`
again with optimised XLA (`--jax.debug False`). Recorded per agent, to OUT (JSON): the initial parameters
against stock's (bit-equal count), the metrics of every step, the parameters after the steps against stock's
(bit-equal count, the largest `max|a - b| / max|a|` per key), the transfer guard the step ran under, and the
checkpoints (`agent.save()`) loaded across stock and swap and read by `multicritic.interop.dreamerv3`.
`tests/interop/test_official_agent.py` checks them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks.agents import official_dreamer  # noqa: E402

STEPS = {"debug": 5, "optimised": 2}
FLAGS = (
    "--configs", "debug", "--task", "dummy_disc", "--jax.compute_dtype", "float32", "--agent.value.bins", "255",
    "--agent.value.layers", "2", "--agent.value.units", "16", "--seed", "0",
)  # fmt: skip
SWAPS = {"swap": "host", "swap-critic": "critic"}


def _params(agent):
    return agent.save()["params"]  # numpy, through the official checkpoint path (jax.device_get)


def compare(want, got):
    """`{"equal": bit-equal arrays, "total": arrays, "worst": {key: max|a - b| / max|a|} where not equal}`."""
    assert sorted(want) == sorted(got), sorted(set(want) ^ set(got))
    worst = {}
    for key in want:
        a, b = np.asarray(want[key]), np.asarray(got[key])
        assert a.shape == b.shape and a.dtype == b.dtype, (key, a.shape, b.shape, a.dtype, b.dtype)
        if not np.array_equal(a, b):
            a, b = a.astype(np.float64), b.astype(np.float64)
            worst[key] = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-30))
    return {"equal": len(want) - len(worst), "total": len(want), "worst": worst}


def train(agent, batches, steps, jax):
    """`steps` train steps of `agent` on `batches`: the metrics of each (the official `train` returns a step's
    metrics at the next call), the seconds per step and the transfer guard the steps ran under."""
    stream = iter(agent.stream(iter(batches)))
    carry, metrics, seconds = agent.init_train(len(batches[0]["consec"])), [], []
    for step in range(steps + 1):
        start = time.perf_counter()
        carry, _, mets = agent.train(carry, next(stream))
        seconds.append(time.perf_counter() - start)
        if step:
            metrics.append({k: float(v) for k, v in mets.items() if np.ndim(v) == 0})
    return {"metrics": metrics, "seconds": seconds[1:], "transfer_guard": str(jax.config.jax_transfer_guard)}


def run(mode, config, mainlib, namespace, dreamerv3_ninjax, jax):
    steps = STEPS[mode]
    names = ["stock", *SWAPS] if mode == "debug" else ["stock", "swap"]
    out, agents, initial = {"steps": steps}, {}, {}
    for name in names:
        start = time.perf_counter()
        if name == "stock":
            agents[name] = mainlib.make_agent(config)
        else:
            # The stock agent turned on jax_transfer_guard='disallow': the critic and the official bins' probe are
            # eager steps before the swapped agent's heads are built.
            with jax.transfer_guard("allow"):
                rssm = config.agent.dyn.rssm
                critic = dreamerv3_ninjax.official_critic(config.agent.value, rssm)
                swap = dreamerv3_ninjax.swap_value_heads(namespace, critic, distribution=SWAPS[name])
            with swap:
                agents[name] = mainlib.make_agent(config)
            out.setdefault("served", {})[name] = {k: type(v).__name__ for k, v in swap.heads.items()}
        if name == "stock":
            # The same random batches for every agent, of the agent's replay spaces; one more than steps: the
            # agent's stream prefetches one ahead.
            rng, length = np.random.default_rng(1), config.batch_length + config.replay_context
            batches = [
                official_dreamer.random_batch(agents[name], config.batch_size, length, rng) for _ in range(steps + 2)
            ]
        initial[name] = _params(agents[name])
        out.setdefault("build_s", {})[name] = time.perf_counter() - start
        out.setdefault("train", {})[name] = train(agents[name], batches, steps, jax)
    out["initial"] = {name: compare(initial["stock"], initial[name]) for name in names[1:]}
    after = {name: _params(agents[name]) for name in names}
    out["after"] = {name: compare(after["stock"], after[name]) for name in names[1:]}
    out["value_keys"] = sorted(k for k in after["stock"] if k.startswith(("val/", "slowval/")))
    if mode == "debug":
        with jax.transfer_guard("allow"):  # multicritic's importer builds a critic eagerly
            out["checkpoints"] = checkpoints(agents["stock"], agents["swap"], config)
    return out


def checkpoints(stock, swap, config):
    """The official checkpoints across the swap: stock's loads into the swapped agent and back, and multicritic's
    importer reads the swapped agent's."""
    from multicritic.interop import dreamerv3

    saved = {"stock": stock.save(), "swap": swap.save()}
    out = {
        "same_keys": sorted(saved["stock"]["params"]) == sorted(saved["swap"]["params"]),
        "same_shapes": all(
            np.shape(v) == np.shape(saved["swap"]["params"][k]) for k, v in saved["stock"]["params"].items()
        ),
    }
    swap.load(saved["stock"])
    out["swap_loads_stock"] = compare(saved["stock"]["params"], _params(swap))
    stock.load(saved["swap"])
    out["stock_loads_swap"] = compare(saved["swap"]["params"], _params(stock))
    rssm = config.agent.dyn.rssm
    params = saved["swap"]["params"]
    critic = dreamerv3.dreamerv3_critic(
        params, gru_units=rssm.deter, num_z_categoricals=rssm.stoch, num_z_classes=rssm.classes
    )
    exported = dreamerv3.export_dreamerv3(critic)
    out["multicritic_reads_swap"] = compare({k: params[k] for k in exported}, exported)
    return out


def main(path):
    src = official_dreamer.official_source()
    import jax

    import dreamerv3.main as mainlib  # the official entry point (puts its folders on sys.path)
    import embodied.jax

    from multicritic.interop import dreamerv3_ninjax

    out = {"versions": official_dreamer.versions(), "flags": list(FLAGS)}
    for mode, debug in (("debug", "True"), ("optimised", "False")):
        logdir = tempfile.mkdtemp(prefix=f"official-agent-{mode}-")
        config = official_dreamer.official_config(src, [*FLAGS, "--jax.debug", debug, "--logdir", logdir])
        out[mode] = run(mode, config, mainlib, embodied.jax, dreamerv3_ninjax, jax)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
