"""Writes {rllib_torch,sheeprl,torchrl}_goldens.npz by running the REAL upstream torch critics.

Nothing numeric is re-implemented: tests/interop/upstream.py builds each upstream critic with the
upstream package's own code (its docstrings cite the upstream file:line of everything called) and
returns numpy arrays; this script only writes them.

Pinned versions (one venv, one pip command; CPU torch):

    python 3.11, torch==2.13.0 (+cpu), keras==3.15.1, numpy==2.4.6, h5py==3.14.0,
    ray[rllib]==2.60.0 (+ pillow, which RLlib's dreamerv3 package imports but does not declare),
    sheeprl==0.8.4 (lightning 2.6.6, hydra-core 1.3.8), torchrl==0.14.1 (tensordict 0.14.3),
    gymnasium==1.2.2 (ray's pin; sheeprl accepts it)

To re-run (CPU, about 15 s after imports):

    python3.11 -m venv /work/venv-interop
    /work/venv-interop/bin/pip install torch==2.13.0 keras==3.15.1 numpy==2.4.6 h5py==3.14.0 \\
        "ray[rllib]==2.60.0" pillow sheeprl==0.8.4 torchrl==0.14.1 pytest hypothesis
    /work/venv-interop/bin/pip install -e . --no-deps
    /work/venv-interop/bin/python tests/data/interop/generate_torch_goldens.py   # from the repo root

Each .npz holds the keys described in tests/interop/upstream.py (fast/ slow/ slow_after/ <upstream
state_dict key>, h, z, latent, logits, slow_logits, value, slow_value, bins, target, weights, loss,
grad_logits, meta) plus ``versions`` (the installed versions it was made with).
"""

import argparse
import importlib.metadata as md
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from tests.interop import upstream  # noqa: E402

PINS = {"torch": "2.13.0", "numpy": "2.4.6", "ray": "2.60.0", "sheeprl": "0.8.4", "torchrl": "0.14.1",
        "tensordict": "0.14.3", "lightning": "2.6.6", "gymnasium": "1.2.2"}
CASES = {"rllib_torch": upstream.make_rllib_torch_case,
         "sheeprl": upstream.make_sheeprl_case,
         "torchrl": upstream.make_torchrl_case}


def installed_versions():
    return {name: md.version(name) for name in PINS}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent)
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--allow-other-versions", action="store_true")
    args = parser.parse_args()

    versions = installed_versions()
    off = {k: (v, PINS[k]) for k, v in versions.items() if not v.split("+")[0] == PINS[k]}
    if off and not args.allow_other_versions:
        sys.exit(f"installed versions differ from the pins (installed, pinned): {off}; "
                 "use --allow-other-versions to write anyway")
    stamp = np.str_(", ".join(f"{k}=={v}" for k, v in versions.items()))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(CASES):
        out = CASES[name]()
        out["versions"] = stamp
        path = args.out_dir / f"{name}_goldens.npz"
        np.savez(path, **out)
        print(f"wrote {path} ({len(out)} keys, loss={float(out['loss']):.6f})")


if __name__ == "__main__":
    main()
