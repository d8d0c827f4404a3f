"""The critic's value heads, by the name the critic's `head` option takes."""

from multicritic.heads.base import ValueHead
from multicritic.heads.hl_gauss import HLGaussHead, hl_gauss
from multicritic.heads.mse import MSEHead
from multicritic.heads.two_hot import RewardPredictorLayer

HEADS = {
    "two_hot": RewardPredictorLayer,
    "hl_gauss": HLGaussHead,
    "mse": MSEHead,
}


def get(name):
    """The head class registered as `name`."""
    if not isinstance(name, str) or name not in HEADS:
        raise ValueError(f"head: got {name!r}, expected one of {list(HEADS)}.")
    return HEADS[name]


__all__ = ["HEADS", "HLGaussHead", "MSEHead", "RewardPredictorLayer", "ValueHead", "get", "hl_gauss"]
