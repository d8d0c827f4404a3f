"""multicritic: the DreamerV3 critic, written once against keras.ops."""

from multicritic.bins import inverse_symlog, symexp, symlog, two_hot
from multicritic.critic import CriticNetwork
from multicritic.layers.mlp import MLP
from multicritic.layers.reward_predictor import RewardPredictorLayer
from multicritic.losses import critic_loss
from multicritic.returns import dream_loss_weights, lambda_returns
from multicritic.rllib import export_rllib_weights, load_rllib_weights
from multicritic.sizes import get_model_dims
from multicritic.training.trainer import CriticTrainer

__version__ = "0.1.0"
