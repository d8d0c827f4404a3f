#!/usr/bin/env bash
# Downloads, where pip has network, the wheels `benchmarks/gpu/run.sh` installs on a GPU machine without network:
# Keras and what it needs beyond that machine's own packages (Python 3.12, x86-64; it has numpy, h5py,
# ml-dtypes, rich, absl-py and packaging). Into `.whl/` at the repository's root, kept out of git.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl keras==3.15.1 namex==0.1.0 optree==0.17.0
ls -l .whl
