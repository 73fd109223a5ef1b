"""Evaluation and inference: top-k prediction, classification metrics (few-shot grows here)."""

from .metrics import ClassificationReport, classification_report, plot_confusion, prepare_batch
from .predict import Prediction, predict_images

__all__ = ["ClassificationReport", "classification_report", "plot_confusion", "prepare_batch",
           "Prediction", "predict_images"]
