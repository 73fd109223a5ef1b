"""vitkit: Vision Transformers, exact to the papers and interchangeable with their weights."""

from ._version import __version__
from .deploy import export_onnx
from .models import VisionTransformer, ViTConfig, create_model, list_models
from .weights import WeightsError, export_weights, from_pretrained, load_weights, push_to_hub

__all__ = ["ViTConfig", "VisionTransformer", "create_model", "list_models", "from_pretrained",
           "load_weights", "export_weights", "export_onnx", "push_to_hub", "WeightsError", "__version__"]
