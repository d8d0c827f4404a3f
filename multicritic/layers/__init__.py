from multicritic.layers.layer_norm import LayerNormalization
from multicritic.layers.mlp import MLP


def __getattr__(name):
    # The two-hot head lives with the other heads (which build on this package).
    if name == "RewardPredictorLayer":
        from multicritic.heads.two_hot import RewardPredictorLayer

        return RewardPredictorLayer
    raise AttributeError(name)


__all__ = ["LayerNormalization", "MLP", "RewardPredictorLayer"]
