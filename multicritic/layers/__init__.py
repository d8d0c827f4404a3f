from multicritic.layers.mlp import MLP
from multicritic.layers.reward_predictor import RewardPredictorLayer

__all__ = ["MLP", "RewardPredictorLayer"]
