"""Prediction module: every model seen through one ``Predictor`` interface."""

from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import Normalize, TorchPredictor

__all__ = ["Normalize", "Predictor", "TorchPredictor"]
