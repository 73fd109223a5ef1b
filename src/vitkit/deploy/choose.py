"""Which runtime runs a model: ``resolve_runtime`` makes ``--runtime auto`` concrete (the path
measured fastest on this CPU, :mod:`.fastest`), ``load_for_runtime`` gives the model of a source
on it -- the vitkit model, an ``.onnx`` or OpenVINO file as it is, or weights exported on the fly.
It sits above both runtimes (:mod:`.runtime`, :mod:`.openvino`), which know nothing of it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from torch import nn

from ..files import PathLike, as_argument, work_folder
from ..models.sizes import one_size
from .onnx_export import export_onnx
from .openvino import OpenVinoModel, export_openvino, is_openvino
from .quantize import CalibrationSource, calibrates, can_calibrate
from .runtime import OnnxModel

RUNTIMES = ("torch", "onnxruntime", "openvino")


def is_onnx(source: PathLike) -> bool:
    return str(source).lower().endswith(".onnx")


def resolve_runtime(source: PathLike, runtime: Optional[str], quantize: Optional[str], calibrated: bool = True
                    ) -> "tuple[Optional[str], Optional[str], Optional[str]]":
    """``runtime="auto"`` made concrete -> (runtime, quantize, what was chosen and why): an
    ``.onnx`` or OpenVINO file runs on its own runtime; weights on the runtime and precision
    measured fastest on this CPU's instruction set (:func:`vitkit.deploy.fastest.fastest`; with
    ``calibrated=False`` the fastest that needs no calibration images), with ``quantize`` kept
    where it is given. Any other ``runtime`` comes back as it is."""
    from .fastest import fastest

    if runtime != "auto":
        return runtime, quantize, None
    if is_onnx(source) or is_openvino(source):
        return None, quantize, f"{source} runs on its own runtime"
    choice = fastest(calibrated=calibrated)
    # int8 asked for where the choice is a float path (torch; OpenVINO's fp32 or bf16, which is chosen where its
    # int8 is slower or has no images to calibrate on), or int8-static, an ONNX format: ONNX Runtime, which has
    # every kind everywhere
    if quantize and (choice.quantize is None or quantize == "int8-static"):
        return "onnxruntime", quantize, f"onnxruntime {quantize} (--quantize; {choice.why})"
    return choice.runtime, quantize or choice.quantize, choice.describe()


def load_for_runtime(source: PathLike, runtime: Optional[str] = None, quantize: Optional[str] = None,
                     model: Optional[nn.Module] = None, calibration: CalibrationSource = None,
                     apart: bool = False, **preprocessing: Any) -> nn.Module:
    """The model of ``source`` on ``runtime``: ``torch`` (the vitkit model), ``onnxruntime`` or
    ``openvino`` (an ``.onnx`` file or an OpenVINO ``.xml`` as is, or weights exported on the fly
    into a temporary file, quantized when ``quantize`` says so). ``runtime=None`` picks the file's
    own runtime for ``.onnx`` and ``.xml`` files, torch otherwise; ``"auto"`` the fastest measured
    on this CPU (:func:`resolve_runtime`). ``model`` is the already-loaded
    vitkit model of ``source`` (weights only); ``calibration``: the images a calibrated int8 export
    calibrates on (:func:`vitkit.deploy.quantize.calibration_images`); ``apart``: an export on the fly runs
    in a child process (:mod:`.apart`), so a process that lives on does not keep the exporter's memory."""
    calibrated = calibration is not None or model is None or can_calibrate(model)
    runtime, quantize, _ = resolve_runtime(source, runtime, quantize, calibrated)
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
        from ..weights.pretrained import without_preprocessing

        own_words = (f"{source} holds weights: its classes are its tensors' (for a file of tensors only, --mean "
                     f"and --std stand in for its normalisation, --img-size for a size its position table leaves "
                     f"open)" if without_preprocessing(source) else
                     f"{source} carries its own preprocessing")
        raise ValueError(f"{', '.join('--' + k.replace('_', '-') for k in given)} stand"
                         f"{'s' if len(given) == 1 else ''} in for the metadata of an "
                         f".onnx or .xml file without it; {own_words}")
    if calibration is not None and not calibrates(runtime, quantize):
        raise ValueError("--calibration gives the images a calibrated int8 model is quantized on: --runtime openvino "
                         "--quantize int8, or --runtime onnxruntime --quantize int8-static")
    if runtime == "torch":
        if quantize:
            raise ValueError("--quantize needs --runtime onnxruntime or openvino (int8 models run there)")
        return model
    # the runtime holds the model in memory: the file is not needed once it is loaded (a killed
    # process's folder is removed by the next export on the fly)
    with work_folder(tempfile.gettempdir(), "vitkit-onnx" if runtime == "onnxruntime" else "vitkit-openvino") as folder:
        runner, export, name = (OpenVinoModel, export_openvino, "model.xml") if runtime == "openvino" else \
            (OnnxModel, export_onnx, "model.onnx")
        if apart and os.name == "posix":  # a process group and an inherited pipe
            from .apart import export_apart

            return runner(export_apart(model, Path(folder) / name, runtime, quantize, calibration))
        return runner(export(model, Path(folder) / name, quantize=quantize, calibration=calibration))


def read_weights(source: PathLike, model_name: Optional[str] = None, say: Optional[Callable[[str], None]] = None,
                 **kwargs: Any) -> nn.Module:
    """The model ``source`` holds (``weights.from_pretrained``): a run folder stands for the model it
    saved (``say`` is told so), a run that has not finished has none yet (one line)."""
    from ..runlock import unfinished_run
    from ..weights import from_pretrained
    from ..weights.pretrained import run_model_folder

    if why := unfinished_run(source):
        raise FileNotFoundError(why)
    if say is not None and (model_folder := run_model_folder(Path(source))) is not None:
        say(f"reading {model_folder} (the model run {source} saved)")
    return from_pretrained(source, model_name=model_name, **kwargs)


def check_classifier(model: nn.Module, weights: PathLike) -> nn.Module:
    """A model with classes, or one clear line: a pre-training model (or a headless encoder) has none."""
    from ..selfsup import is_pretrainer

    if is_pretrainer(model):
        raise ValueError(f"{weights} is a {model.objective} pre-training model: it has no classifier; fine-tune it "
                         f"first (vitkit train --init {as_argument(weights)}), or read its encoder with vitkit "
                         f"fewshot / inspect")
    from ..models.config_base import no_classes

    if why := no_classes(model.config):
        if is_onnx(weights) or is_openvino(weights):
            raise ValueError(f"{weights} has {why}: an exported graph scores no classes; fine-tune the weights it "
                             f"was exported from (vitkit train --init WEIGHTS) and export that")
        raise ValueError(f"{weights} has {why}: fine-tune it first (vitkit train --init {as_argument(weights)}), or "
                         f"read it with vitkit fewshot / inspect")
    return model


def load_classifier(weights: PathLike, runtime: Optional[str] = None, quantize: Optional[str] = None,
                    model_name: Optional[str] = None, say: Optional[Callable[[str], None]] = None,
                    calibration: CalibrationSource = None, apart: bool = False, **stand_ins: Any) -> nn.Module:
    """The classifier ``weights`` name, on ``runtime`` (``auto``: the fastest measured here, said
    through ``say``): the vitkit model (on a CPU, its batches split over the threads), or ONNX
    Runtime / OpenVINO running an exported file or the weights exported on the fly. ``stand_ins``
    (img_size, mean, std, labels) describe an ``.onnx`` file without vitkit's metadata (mean and std a bare
    state dict's normalisation too);
    ``calibration`` the images a calibrated int8 export calibrates on; ``apart``: an export on the fly in a
    child process (``vitkit serve``: the server does not keep the exporter's memory). What ``vitkit predict``,
    ``eval`` and ``serve`` run."""
    if is_onnx(weights) or is_openvino(weights):
        runtime, quantize, chosen = resolve_runtime(weights, runtime, quantize)
        if chosen and say is not None:
            say(f"runtime auto: {chosen}")
        if model_name:
            raise ValueError("--model names an architecture for weights without a config; an .onnx or OpenVINO "
                             ".xml file is its own graph")
        if calibration is not None:
            raise ValueError(f"{weights} is already exported: --calibration is for quantizing weights")
        return check_classifier(load_for_runtime(weights, runtime, quantize, **stand_ins), weights)
    from ..weights.pretrained import without_preprocessing

    # a bare state dict's normalisation, and its size where the position table leaves it open (70 slots: 7x10)
    read_as = {k: stand_ins.pop(k) for k in ("mean", "std", "img_size") if stand_ins.get(k) is not None}
    if read_as and not without_preprocessing(weights):
        stand_ins.update(read_as)  # refused below: the source carries its own
        read_as = {}
    if "img_size" in read_as:
        read_as["img_size"] = one_size(read_as["img_size"])
    model = check_classifier(read_weights(weights, model_name, say, **read_as), weights)
    # the choice waits for the model: OpenVINO's int8 needs images to calibrate on, which its classes may not name
    runtime, quantize, chosen = resolve_runtime(weights, runtime, quantize,
                                                calibration is not None or can_calibrate(model))
    if chosen and say is not None:
        say(f"runtime auto: {chosen}")
    model = load_for_runtime(weights, runtime, quantize, model=model, calibration=calibration, apart=apart,
                             **stand_ins)
    if getattr(model, "quantization", None) is None:  # torch on a CPU: batches in parts, one per thread
        from ..parallel import for_inference

        model = for_inference(model)
    return model


def runtime_of(model: nn.Module) -> str:
    """Which of :data:`RUNTIMES` a loaded model runs on (a runtime wrapper carries its quantization)."""
    if getattr(model, "quantization", None) is None:
        return "torch"
    return "openvino" if getattr(model, "export_flag", "onnx") == "openvino" else "onnxruntime"


def runtime_label(model: nn.Module) -> str:
    """How a loaded model runs, in words: fp32 (torch), or ONNX Runtime / OpenVINO and its precision."""
    quantization = getattr(model, "quantization", None)
    if quantization is None:
        return "fp32"
    if getattr(model, "export_flag", "onnx") == "openvino":  # OpenVINO computes in the precision it was given
        if quantization in ("none", "unknown"):
            return f"openvino {model.precision}"
        return "openvino int8 (NNCF, calibrated)" if quantization == "int8-static" else f"openvino {quantization}"
    if quantization == "unknown":  # a file exported elsewhere records none ("onnxruntime unknown" said nothing)
        return "onnxruntime, precision not recorded: no vitkit metadata"
    return "onnxruntime " + ("fp32" if quantization == "none" else quantization)


__all__ = ["RUNTIMES", "is_onnx", "resolve_runtime", "load_for_runtime", "read_weights", "check_classifier",
           "load_classifier", "runtime_of", "runtime_label"]
