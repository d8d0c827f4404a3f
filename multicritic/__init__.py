"""multicritic: the DreamerV3 critic, written once against keras.ops.

Set `KERAS_BACKEND` to `tensorflow`, `torch` or `jax` before importing.
"""

import sys

from multicritic import moved
from multicritic.backend import selection

moved.install()  # 0.1.0's module paths, with a warning

if "keras" not in sys.modules and selection.cli_argv() is not None:
    # This process is the `multicritic` command: its flags choose the backend, before Keras is imported.
    from multicritic.cli import preflight

    preflight(selection.cli_argv())  # sets KERAS_BACKEND, or exits with one line on stderr and code 2
selection.select()

from multicritic.math.bins import expected_value, inverse_symlog, symexp, symlog, two_hot  # noqa: E402
from multicritic.model.critic import CriticNetwork  # noqa: E402
from multicritic.heads.hl_gauss import HLGaussHead, hl_gauss  # noqa: E402
from multicritic.heads.mse import MSEHead  # noqa: E402
from multicritic.heads.quantile import QuantileHead  # noqa: E402
from multicritic.heads.two_hot import TwoHotHead  # noqa: E402
from multicritic.trunks.residual import ResidualTrunk  # noqa: E402
from multicritic.layers.layer_norm import LayerNormalization  # noqa: E402
from multicritic.layers.mlp import MLP  # noqa: E402
from multicritic.heads.two_hot import RewardPredictorLayer  # noqa: E402
from multicritic.math.losses import critic_loss  # noqa: E402
from multicritic.model.multi_critic import MultiCritic  # noqa: E402
from multicritic.model.compiled_forward import CompiledForward  # noqa: E402
from multicritic.model.normalizer import ReturnNormalizer  # noqa: E402
from multicritic.training.optimizers import LaProp, LinearWarmup  # noqa: E402
from multicritic import interop  # noqa: E402
from multicritic.training import presets  # noqa: E402
from multicritic.math.returns import dream_loss_weights, lambda_returns, replay_lambda_returns  # noqa: E402
from multicritic.interop.rllib import export_rllib_weights, load_rllib_weights  # noqa: E402
from multicritic.model.sizes import get_model_dims  # noqa: E402
from multicritic.training.trainer import CriticTrainer  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "CompiledForward",
    "CriticNetwork",
    "CriticTrainer",
    "HLGaussHead",
    "LaProp",
    "LayerNormalization",
    "LinearWarmup",
    "MLP",
    "MSEHead",
    "MultiCritic",
    "QuantileHead",
    "ResidualTrunk",
    "ReturnNormalizer",
    "RewardPredictorLayer",
    "TwoHotHead",
    "critic_loss",
    "dream_loss_weights",
    "expected_value",
    "export_rllib_weights",
    "get_model_dims",
    "hl_gauss",
    "interop",
    "inverse_symlog",
    "lambda_returns",
    "load_rllib_weights",
    "presets",
    "replay_lambda_returns",
    "symexp",
    "symlog",
    "two_hot",
]
