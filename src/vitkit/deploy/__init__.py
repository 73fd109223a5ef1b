"""Deployment: ONNX export with self-describing metadata, ONNX Runtime inference, int8.

``export_onnx`` (:mod:`.onnx_export`) writes the file; :mod:`.quantize` makes its int8 forms
with ONNX Runtime's tools; ``OnnxModel`` (:mod:`.runtime`) runs it where vitkit runs a model, as
``OpenVinoModel`` (:mod:`.openvino`, which ``export_openvino`` writes) runs an OpenVINO IR;
:mod:`.choose` picks the runtime (``load_for_runtime``).
The Hugging Face Hub side of shipping is :func:`vitkit.weights.hub.push_to_hub`.
"""

from .choose import RUNTIMES, load_for_runtime
from .onnx_export import EXPORTERS, OnnxExportError, export_onnx, read_metadata
from .openvino import OpenVinoModel, export_openvino
from .quantize import QUANTIZATIONS, quantize_onnx
from .runtime import OnnxMetadataError, OnnxModel

__all__ = ["EXPORTERS", "OnnxExportError", "export_onnx", "read_metadata", "QUANTIZATIONS", "quantize_onnx",
           "RUNTIMES", "OnnxMetadataError", "OnnxModel", "OpenVinoModel", "export_openvino", "load_for_runtime"]
