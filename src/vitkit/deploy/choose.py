"""Which runtime runs a model: ``resolve_runtime`` makes ``--runtime auto`` concrete (the path
measured fastest on this CPU, :mod:`.fastest`), ``load_for_runtime`` gives the model of a source
on it -- the vitkit model, an ``.onnx`` or OpenVINO file as it is, or weights exported on the fly.
It sits above both runtimes (:mod:`.runtime`, :mod:`.openvino`), which know nothing of it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional

from torch import nn

from ..files import PathLike, work_folder
from .onnx_export import export_onnx
from .openvino import OpenVinoModel, export_openvino, is_openvino
from .runtime import OnnxModel

RUNTIMES = ("torch", "onnxruntime", "openvino")


def is_onnx(source: PathLike) -> bool:
    return str(source).lower().endswith(".onnx")


def resolve_runtime(source: PathLike, runtime: Optional[str], quantize: Optional[str]
                    ) -> "tuple[Optional[str], Optional[str], Optional[str]]":
    """``runtime="auto"`` made concrete -> (runtime, quantize, what was chosen and why): an
    ``.onnx`` or OpenVINO file runs on its own runtime; weights on the runtime and precision
    measured fastest on this CPU's instruction set (:func:`vitkit.deploy.fastest.fastest`), with
    ``quantize`` kept where it is given. Any other ``runtime`` comes back as it is."""
    from .fastest import fastest

    if runtime != "auto":
        return runtime, quantize, None
    if is_onnx(source) or is_openvino(source):
        return None, quantize, f"{source} runs on its own runtime"
    choice = fastest()
    if quantize and choice.runtime == "torch":  # int8 asked for: the runtime that has it everywhere
        return "onnxruntime", quantize, f"onnxruntime {quantize} (--quantize; {choice.why})"
    return choice.runtime, quantize or choice.quantize, choice.describe()


def load_for_runtime(source: PathLike, runtime: Optional[str] = None, quantize: Optional[str] = None,
                     model: Optional[nn.Module] = None, **preprocessing: Any) -> nn.Module:
    """The model of ``source`` on ``runtime``: ``torch`` (the vitkit model), ``onnxruntime`` or
    ``openvino`` (an ``.onnx`` file or an OpenVINO ``.xml`` as is, or weights exported on the fly
    into a temporary file, quantized when ``quantize`` says so). ``runtime=None`` picks the file's
    own runtime for ``.onnx`` and ``.xml`` files, torch otherwise; ``"auto"`` the fastest measured
    on this CPU (:func:`resolve_runtime`). ``model`` is the already-loaded
    vitkit model of ``source`` (weights only)."""
    runtime, quantize, _ = resolve_runtime(source, runtime, quantize)
    own = "onnxruntime" if is_onnx(source) else "openvino" if is_openvino(source) else None
    runtime = runtime or own or "torch"
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
    given = sorted(k for k, v in preprocessing.items() if v is not None)
    if own is not None:
        kind, suffix, flag = ("an ONNX model", "onnx", "onnx") if own == "onnxruntime" else \
            ("an OpenVINO IR", "xml", "openvino")
        if runtime != own:
            raise ValueError(f"{source} is {kind}: it runs on --runtime {own}")
        if quantize:
            raise ValueError(f"{source} is already exported: quantize while exporting "
                             f"(vitkit convert WEIGHTS OUT.{suffix} --to {flag} --quantize {quantize})")
        return (OnnxModel if own == "onnxruntime" else OpenVinoModel)(source, **preprocessing)
    if given:
        raise ValueError(f"{', '.join('--' + k.replace('_', '-') for k in given)} stand in for the metadata of an "
                         f".onnx or .xml file without it; {source} carries its own preprocessing")
    if runtime == "torch":
        if quantize:
            raise ValueError("--quantize needs --runtime onnxruntime or openvino (int8 models run there)")
        return model
    # the runtime holds the model in memory: the file is not needed once it is loaded (a killed
    # process's folder is removed by the next export on the fly)
    with work_folder(tempfile.gettempdir(), "vitkit-onnx" if runtime == "onnxruntime" else "vitkit-openvino") as folder:
        if runtime == "openvino":
            return OpenVinoModel(export_openvino(model, Path(folder) / "model.xml", quantize=quantize))
        return OnnxModel(export_onnx(model, Path(folder) / "model.onnx", quantize=quantize, calibration=None))


__all__ = ["RUNTIMES", "is_onnx", "resolve_runtime", "load_for_runtime"]
