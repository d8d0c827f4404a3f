"""Decode bias of the two bin schemes for noisy returns (a table of the docs, docs/critic.md).

A critic that has converged on returns R predicts their average two-hot
target, p = E[two_hot(R)]. Decoding p gives back E[R] only if two-hot
interpolation and decoding are both linear in the same space:

- "symexp" (2024): real-space buckets, real-space interpolation and mean, so
  the decode is E[R] exactly;
- "uniform_symlog" (2023): symlog-space interpolation and mean, so the decode
  is symexp(E[symlog R]), biased towards 0 when returns are spread out.

    python benchmarks/ours/bin_scheme_bias.py --json benchmarks/results/results_bin_scheme_bias.json
"""

import argparse
import json

import keras
import numpy as np

from multicritic import inverse_symlog, symlog, two_hot
from multicritic.math.bins import expected_value


def decoded(returns, scheme):
    target = keras.ops.mean(two_hot(symlog(returns.astype(np.float32)), bin_scheme=scheme), axis=0)
    return float(keras.ops.convert_to_numpy(inverse_symlog(expected_value(target, bin_scheme=scheme))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="also write the rows (relative biases) as JSON")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    records = []
    print("| mean return | spread (std / mean) | uniform_symlog decode bias | symexp decode bias |")
    print("|---:|---:|---:|---:|")
    for mean in (10.0, 1e3, 1e6):
        for spread in (0.0, 0.5, 1.0, 2.0):
            returns = mean * (1.0 + spread * rng.standard_normal(20000))
            truth = returns.mean()
            row = [100 * (decoded(returns, s) - truth) / truth for s in ("uniform_symlog", "symexp")]
            print(f"| {mean:g} | {spread:g} | {row[0]:+.2f}% | {row[1]:+.3f}% |")
            records.append(
                {
                    "mean": mean,
                    "spread": spread,
                    "samples": len(returns),
                    "bias_uniform_symlog": row[0] / 100,
                    "bias_symexp": row[1] / 100,
                }
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": keras.backend.backend(), "rows": records}, f, indent=1)


if __name__ == "__main__":
    main()
