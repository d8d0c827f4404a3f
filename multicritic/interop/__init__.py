"""Weights in and out of the DreamerV3 critics people run: one module per codebase.

`rllib` (RLlib's TensorFlow and PyTorch critics), `sheeprl`, `dreamerv3` (the
official JAX code), `nm512` (NM512/dreamerv3-torch) and `torchrl`. Each has
`load_*(critic, ...)` / `export_*(critic, ...)` for the fast and the slow
(EMA, target) critic, all or nothing, and `CRITIC_OPTIONS`: the
`CriticNetwork` options that reproduce the codebase's forward pass.
"""
