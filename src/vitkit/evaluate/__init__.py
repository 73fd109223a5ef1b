"""Evaluation and inference (top-k prediction; accuracy and few-shot grow here)."""

from .predict import Prediction, predict_images

__all__ = ["Prediction", "predict_images"]
