from multicritic.training.trainer import CriticTrainer, predict_function

__all__ = ["CriticTrainer", "predict_function"]
