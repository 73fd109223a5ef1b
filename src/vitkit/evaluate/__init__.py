"""Evaluation and inference: top-k prediction, classification metrics, few-shot linear evaluation,
and both over a whole dataset (what ``vitkit eval`` and ``vitkit fewshot`` call)."""

from .dataset import DatasetScore, FewShotScore, fewshot_on_dataset, score_dataset
from .fewshot import FewShotResult, extract_features, features_over, fewshot_from_features, ridge_fit
from .metrics import ClassificationReport, classification_report, plot_confusion, prepare_batch, report_over
from .predict import Prediction, predict_images

__all__ = ["DatasetScore", "FewShotScore", "fewshot_on_dataset", "score_dataset",
           "FewShotResult", "extract_features", "features_over", "fewshot_from_features", "ridge_fit",
           "ClassificationReport", "classification_report", "report_over", "plot_confusion", "prepare_batch",
           "Prediction", "predict_images"]
