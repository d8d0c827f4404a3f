"""The peers' own critic updates (sheeprl, RLlib, TorchRL, the official DreamerV3 code), timed next to ours."""
