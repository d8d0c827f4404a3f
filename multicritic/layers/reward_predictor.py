"""The two-hot head's historical home: `RewardPredictorLayer` lives in `multicritic.heads.two_hot`."""

from multicritic.heads.two_hot import RewardPredictorLayer

__all__ = ["RewardPredictorLayer"]
