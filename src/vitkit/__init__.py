"""vitkit: Vision Transformers, exact to the papers and interchangeable with their weights."""

from ._version import __version__
from .models import VisionTransformer, ViTConfig, create_model, list_models
from .weights import WeightsError, export_weights, from_pretrained, load_weights

__all__ = ["ViTConfig", "VisionTransformer", "create_model", "list_models", "from_pretrained",
           "load_weights", "export_weights", "WeightsError", "__version__"]
