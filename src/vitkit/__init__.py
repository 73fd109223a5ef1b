"""vitkit: Vision Transformers, exact to the papers and interchangeable with their weights.

The public names load on first use (PEP 562): ``import vitkit`` -- and so ``vitkit --help`` and
a mistyped flag -- does not import torch until a model, weights or a runtime is asked for.
"""

import importlib
from typing import Any, List

from ._version import __version__

#: public name -> the submodule that defines it
_NAMES = {"export_onnx": "deploy", "VisionTransformer": "models", "ViTConfig": "models", "create_model": "models",
          "list_models": "models", "WeightsError": "weights", "export_weights": "weights",
          "from_pretrained": "weights", "load_weights": "weights", "push_to_hub": "weights", "preprocess": "data",
          "transform_for": "data"}
#: subpackages reachable as attributes of ``vitkit`` (``vitkit.models.layers``) after ``import vitkit``
_SUBPACKAGES = ("data", "deploy", "evaluate", "inspect", "models", "selfsup", "train", "weights", "parallel",
                "progress", "utils", "files", "errors")


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'vitkit' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_NAMES) | set(_SUBPACKAGES))


__all__ = ["ViTConfig", "VisionTransformer", "create_model", "list_models", "from_pretrained",
           "load_weights", "export_weights", "export_onnx", "push_to_hub", "preprocess", "transform_for",
           "WeightsError", "__version__"]
