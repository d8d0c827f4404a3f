"""What the PyTorch codebases' golden generators share (NM512's dreamerv3-torch and r2dreamer).

Each generator runs in its codebase's own environment (torch and numpy, that
codebase on `sys.path`), not in multicritic's: this file imports neither
multicritic nor the codebase, and the generators find it through their parent
folder (`sys.path.append(os.path.dirname(HERE))`). The source check, the
critic's state as numpy, the seeded inputs and the written files are the same
for both, so their goldens are made and described the same way.
"""

import argparse
import hashlib
import json
import os
import sys
import types

import numpy as np
import torch

# The generators' numpy seeds, in the manifests' words.
SEEDS = {
    "torch.manual_seed": 0,
    "perturbation": "np.random.default_rng(0)",
    "inputs": "np.random.default_rng(2)",
    "target_weights": "np.random.default_rng(1)",
}


def parse_args(description, env_var, here):
    """`--src` (default `$env_var`, else src/ next to the generator), `--out-dir` (default: next to it) and
    `--allow-source-mismatch`."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--src", default=os.environ.get(env_var, os.path.join(here, "src")))
    p.add_argument("--out-dir", default=here)
    p.add_argument("--allow-source-mismatch", action="store_true")
    return p.parse_args()


def check_source(src, sha256, commit, allow):
    """`{file: sha256}` of the codebase's files the goldens depend on; a mismatch with the pinned commit's
    stops the run unless `allow` (then it is printed, and the manifest records what was used)."""
    got = {}
    for name, want in sha256.items():
        with open(os.path.join(src, name), "rb") as f:
            got[name] = hashlib.sha256(f.read()).hexdigest()
        if got[name] != want:
            msg = f"{name}: sha256 {got[name]} != expected {want} (commit {commit})"
            if not allow:
                raise SystemExit(msg + "; pass --allow-source-mismatch to go on")
            print("WARNING:", msg)
    return got


def stub_missing(name, attr):
    """Installs module `name` with `attr = None` when it cannot be imported: the codebases import some modules
    (tensorboard's writer, TensorDict) at module level that the goldens never use."""
    try:
        __import__(name)
    except ImportError:
        stub = types.ModuleType(name)
        setattr(stub, attr, None)
        sys.modules[name] = stub
        print(f"note: {name} missing; stubbed")


def sd_numpy(module):
    """`module.state_dict()` as float32 numpy copies."""
    return {k: v.detach().cpu().numpy().astype(np.float32).copy() for k, v in module.state_dict().items()}


def numpy32(tensor):
    """A torch tensor, detached, as a float32 numpy array."""
    return tensor.detach().numpy().astype(np.float32)


def loss_and_grads(module, loss_expr):
    """`(dist, slow, loss, logits, grad_logits)`: `loss_expr() -> (dist, slow, loss)` with `module`'s gradients
    cleared and `loss` backpropagated; `dist`'s logits and their gradient as float32 numpy."""
    for p in module.parameters():
        p.grad = None
    dist, slow, loss = loss_expr()
    loss.backward()
    return dist, slow, loss, numpy32(dist.logits), numpy32(dist.logits.grad)


def latents(rng, lead, stoch, discrete, deter):
    """`(stoch, deter)`: `[*lead, stoch, discrete]` categorical probabilities (softmax of `2 * N(0, 1)`) and
    `[*lead, deter]` states (`tanh` of `N(0, 1)`), float32, drawn from `rng` in that order."""
    lg = 2.0 * rng.normal(size=(*lead, stoch, discrete))
    probs = np.exp(lg - lg.max(-1, keepdims=True))
    probs = (probs / probs.sum(-1, keepdims=True)).astype(np.float32)
    return probs, np.tanh(rng.normal(size=(*lead, deter))).astype(np.float32)


def stoch_then_deter(feat, stoch, deter):
    """Whether the feature `feat` is `cat([flatten(stoch), deter], -1)`: z first."""
    flat = stoch.reshape(*stoch.shape[:-2], -1)
    return bool(
        np.array_equal(feat[..., : flat.shape[-1]], flat) and np.array_equal(feat[..., flat.shape[-1] :], deter)
    )


def targets_and_weights(shape):
    """`(target, weights)`: lambda-return stand-ins `U(-50, 50)` and weights `U(0.5, 1)`, float32, from
    `default_rng(1)` (the manifests' `target_weights` seed)."""
    rng = np.random.default_rng(1)
    target = rng.uniform(-50.0, 50.0, size=shape).astype(np.float32)
    return target, rng.uniform(0.5, 1.0, size=shape).astype(np.float32)


def check_mixed(after, fast, slow, mix):
    """The slow critic's state after one update is `mix * fast + (1 - mix) * slow`."""
    for k in slow:
        np.testing.assert_allclose(after[k], mix * fast[k] + (1 - mix) * slow[k], rtol=1e-6, atol=1e-7)


def provenance(source, commit, source_sha256, generator):
    """The manifest's first entries: where the numbers come from and what ran."""
    return {
        "source": source,
        "commit": commit,
        "source_sha256": source_sha256,
        "generator": generator,
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0]},
    }


class Goldens:
    """The arrays (float32) and each one's description, written as an npz and its manifest."""

    def __init__(self):
        self.out, self.desc = {}, {}

    def put(self, key, arr, text):
        self.out[key] = np.asarray(arr, dtype=np.float32)
        self.desc[key] = text

    def put_states(self, value, slow, slow_after, texts):
        """The critic's state under `value/`, the slow critic's before and after one update under `slow_value/`
        and `slow_after/`; `texts`: the three descriptions."""
        for prefix, state, text in zip(("value/", "slow_value/", "slow_after/"), (value, slow, slow_after), texts):
            for k, v in state.items():
                self.put(f"{prefix}{k}", v, text)

    def write(self, out_dir, name, manifest, compressed):
        """Writes `{name}.npz` and `{name}_manifest.json` (`manifest` with every key described) into `out_dir`."""
        os.makedirs(out_dir, exist_ok=True)
        npz_path = os.path.join(out_dir, f"{name}.npz")
        (np.savez_compressed if compressed else np.savez)(npz_path, **self.out)
        keys = {k: {"shape": list(v.shape), "dtype": str(v.dtype), "desc": self.desc[k]} for k, v in self.out.items()}
        with open(os.path.join(out_dir, f"{name}_manifest.json"), "w") as f:
            json.dump({**manifest, "keys": keys}, f, indent=1)
            f.write("\n")
        print(f"wrote {npz_path} ({os.path.getsize(npz_path)} bytes), {len(self.out)} keys")
