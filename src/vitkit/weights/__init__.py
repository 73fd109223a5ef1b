"""Weights in every layout: native, timm, Hugging Face, official npz (vit_jax, big_vision).

Nothing here unpickles arbitrary objects (see :mod:`vitkit.weights.io`).
"""

from .checked import load_weights
from .export import EXPORT_FORMATS, export_weights
from .hub import push_to_hub, save_for_hub
from .io import UnsafeCheckpointError, WeightsError, read_tensors
from .load import LoadReport, detect_format, read_source
from .pretrained import download_from_hub, from_pretrained

__all__ = ["EXPORT_FORMATS", "export_weights", "UnsafeCheckpointError", "WeightsError",
           "read_tensors", "LoadReport", "detect_format", "load_weights", "read_source",
           "download_from_hub", "from_pretrained", "push_to_hub", "save_for_hub"]
