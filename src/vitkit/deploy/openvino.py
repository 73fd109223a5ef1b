"""OpenVINO as a runtime beside ONNX Runtime: an IR (``.xml`` + ``.bin``) that describes itself.

``export_openvino(model, "model.xml")`` exports the ONNX graph (:func:`~.onnx_export.export_onnx`,
the same graph ONNX Runtime runs), converts it with ``openvino.convert_model`` and stores the
``.onnx`` file's metadata entries (``vitkit.config``, ``input_size``, ``mean``, ``std``,
``labels``, ...; :func:`~.onnx_export.metadata_for`) in the IR's runtime info, section
``vitkit``. Weights stay fp32 in the ``.bin`` (no fp16 compression: the CPU computes in the
precision asked at load time).

``quantize="int8"``: NNCF's post-training quantisation (``nncf.quantize``) calibrated on
training images (256 of the dataset the model's class names name, by default), with NNCF's
transformer preset, which keeps in float the operations where int8 costs a transformer
accuracy for little time (softmax, normalisation, the residual additions, GELU), and with the
first layer and the classifier float too: the other matmuls and convolutions read int8.

``OpenVinoModel(path)`` compiles the IR for the CPU and runs it where vitkit runs a model, with
the checks of :class:`~.runtime.OnnxModel` (metadata against the graph, one clear line for a
foreign, truncated or lying file). ``precision``: ``fp32`` (exact to ~1e-6) or ``bf16``;
none: OpenVINO's default for the CPU (bf16 where the CPU has it). A batch runs in parts on
OpenVINO's throughput streams, as vitkit's PyTorch inference splits a batch over its threads
(:mod:`vitkit.parallel`; see :class:`OpenVinoModel`).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..extras import first_line, require
from ..files import PathLike, parent_held, said_as_disk_full, work_folder
from ..parallel import parts
from ..progress import working
from ..signals import how_it_ended, interrupts_deferred
from . import openvino_int8
from .onnx_export import OnnxExportError, export_onnx, metadata_for
from .openvino_int8 import no_telemetry, quiet, silenced
from .quantize import CalibrationSource
from .runtime import OnnxMetadataError, OnnxModel, _last_op, _read_as_probabilities, thread_count

#: The IR's runtime-info section that holds vitkit's metadata entries.
RT_SECTION = "vitkit"
OPENVINO_QUANTIZATIONS = ("int8",)
PRECISIONS = {"fp32": "f32", "bf16": "bf16"}
#: what calibration images are for, in the line that says they are missing
CALIBRATION_PURPOSE = "OpenVINO int8 (NNCF)"


def openvino_module(purpose: str):
    """``openvino``, or one line naming the ``openvino`` extra (its telemetry left out:
    :func:`~.openvino_int8.no_telemetry`)."""
    no_telemetry()
    return require("openvino", "openvino", purpose)


def export_openvino(model: nn.Module, path: PathLike, *, quantize: Optional[str] = None,
                    calibration: CalibrationSource = None, calibration_batch: int = 32,
                    progress: bool = True) -> Path:
    """Write ``model`` as an OpenVINO IR at ``path`` (``.xml``, its weights beside it as ``.bin``);
    ``quantize="int8"`` quantises it with NNCF on ``calibration``: uint8 images (N, C, H, W), a
    folder of image files or a built-in dataset's name (:func:`~.quantize.calibration_images`;
    default: 256 training images of the dataset the class names name). Returns the ``.xml`` path."""
    from .quantize import calibration_images

    path = Path(path)
    problems = []
    if path.suffix.lower() != ".xml":
        problems.append(f"an OpenVINO IR's name must end in .xml (its weights go beside it as .bin), not {path.name!r}")
    if quantize is not None and quantize not in OPENVINO_QUANTIZATIONS:
        problems.append(f"OpenVINO quantization must be one of {', '.join(OPENVINO_QUANTIZATIONS)}, not {quantize!r}")
    if quantize is None and calibration is not None:
        problems.append("calibration images are used by int8 quantization only")
    if problems:
        raise OnnxExportError("; ".join(problems))
    ov = openvino_module("OpenVINO export (vitkit convert --to openvino)")
    if quantize:
        _check_nncf()  # installed? (one line naming the extra); the quantization runs in a child process
        calibration = calibration_images(model, source=calibration, purpose=CALIBRATION_PURPOSE)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = "nothing was replaced (the previous files, if any, are intact)"
    with said_as_disk_full(path, kept), work_folder(path.parent, path.name) as work, \
            working(f"exporting {path.name} to OpenVINO", progress) as said:
        onnx_path = export_onnx(model, Path(work) / "model.onnx", progress=False)
        ir = ov.convert_model(str(onnx_path))
        if quantize:
            said.label = f"quantizing {path.name} to int8 (NNCF, {len(calibration)} calibration images)"
            ir = _quantized(ov, ir, _batches(calibration, model.config, calibration_batch), Path(work))
        for key, value in metadata_for(model.config, "openvino", "int8-static" if quantize else None).items():
            ir.set_rt_info(value, [RT_SECTION, key])
        staged = Path(work) / "model.xml"
        ov.save_model(ir, str(staged), compress_to_fp16=False)
        # two exports to one IR: one pair moved at a time, never one file of each; Ctrl-C waits for the pair
        with interrupts_deferred(), parent_held(path):
            path.unlink(missing_ok=True)  # a stop between the moves leaves no IR, not an old .xml with new weights
            for src, dst in ((staged.with_suffix(".bin"), path.with_suffix(".bin")), (staged, path)):
                os.chmod(src, 0o644)
                os.replace(src, dst)  # the weights first: an .xml never names a .bin that is not there yet
    return path


def _quantized(ov: Any, ir: Any, batches: list, work: Path) -> Any:
    """``ir`` quantized by :func:`~.openvino_int8.quantize_ir` in a child process that never imports
    torch. NNCF loads its torch backend with hooks on torch's functions (nncf.torch.function_hook),
    and a process that had imported it and went on training crashed (a segfault, seen in the test
    suite): the child takes NNCF with it when it exits."""
    import subprocess

    src, dst, data = work / "float.xml", work / "int8.xml", work / "calibration.npz"
    ov.save_model(ir, str(src), compress_to_fp16=False)
    np.savez(data, *batches)
    done = subprocess.run([sys.executable, "-c", _CHILD, openvino_int8.__file__, str(src), str(data), str(dst)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise OnnxExportError(f"NNCF could not quantize the model: {_child_failure(done.returncode, done.stderr)}")
    return ov.Core().read_model(str(dst))


#: the child of _quantized: openvino_int8.py run by path, without the package (which imports torch), and
#: by ``-c``: a script's own folder would come first on sys.path, and its openvino.py is not OpenVINO
_CHILD = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def _child_failure(code: int, stderr: str) -> str:
    """Why the quantizing process failed: its error's line, or the signal that killed it without one
    (a segfault inside OpenVINO said nothing, and an earlier warning passed for the reason)."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines and code > 0 else how_it_ended(code, "its process")


def _batches(images: torch.Tensor, config: Any, batch_size: int):
    from ..evaluate.metrics import prepare_batch

    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4 or not len(images):
        raise ValueError("calibration images must be a non-empty uint8 tensor (N, C, H, W)")
    return [prepare_batch(images[i:i + batch_size], config).numpy() for i in range(0, len(images), batch_size)]


def _check_nncf() -> None:
    """NNCF is installed (else one line naming the extra), without importing it here: importing
    it loads its torch hooks into this process, which crashed later training (see _quantized)."""
    import importlib.util

    if importlib.util.find_spec("nncf") is None:
        _nncf()  # raises MissingExtra


def _nncf():
    """NNCF, quiet: its INFO lines and torch's note on a missing CUDA runtime are not the user's."""
    no_telemetry()
    with silenced():
        nncf = require("nncf", "openvino", "int8 quantization for OpenVINO (NNCF)")
    return quiet(nncf)


def is_openvino(source: PathLike) -> bool:
    return str(source).lower().endswith(".xml")


class OpenVinoModel(OnnxModel):
    """An OpenVINO IR run on the CPU, where vitkit runs a model (see the module docstring).

    A batch is cut into one contiguous part per throughput stream (OpenVINO's ``THROUGHPUT``
    hint chooses how many: two of one thread each on 2 cores), the parts run at once and their
    outputs are joined in order: no barrier between the cores inside a layer, as
    :mod:`vitkit.parallel` does for PyTorch. DINOv2-S/14 int8 at batch 32 on a 2-core Zen 4, five
    interleaved comparisons alone: from 4% slower to 10% faster than one request on both threads,
    steadier while the machine was noisy (41-48 against 33-47 img/s), and beside one busy Python
    loop 0.80 of its speed alone against 0.52. A batch too small to cut (one image) runs
    on a second compilation for latency, made on first use: one image on one stream took 40 ms,
    on both cores 25 ms. An image's output does not depend on the part it ran in.
    """

    runtime = "OpenVINO"
    export_flag = "openvino"

    def __init__(self, path: PathLike, threads: Optional[int] = None, precision: Optional[str] = None,
                 img_size: Optional[Sequence[int]] = None, mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None, labels: Optional[Sequence[str]] = None):
        nn.Module.__init__(self)
        ov = openvino_module("running OpenVINO models (--runtime openvino)")
        if precision is not None and precision not in PRECISIONS:
            raise ValueError(f"OpenVINO precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        self.path = Path(path)
        _check_files(self.path)
        self._core = ov.Core()
        try:
            graph = self._core.read_model(str(self.path))
        except Exception as e:
            raise OnnxMetadataError(f"{self.path} is not a readable OpenVINO IR ({openvino_words(e)})") from None
        self.metadata = _rt_metadata(graph)
        if graph.outputs:
            self.probabilities = _read_as_probabilities(self.path, _last_op(
                _made, graph.outputs[0].get_node().input_value(0).get_node()))
        inputs, outputs = [_port(p) for p in graph.inputs], [_port(p) for p in graph.outputs]
        self._check_graph(inputs, outputs)
        self.quantization = self.metadata.get("vitkit.quantization", "unknown")
        self.config = self._config(inputs[0].shape, outputs[0].shape, img_size, mean, std, labels)
        self._check_claims(inputs[0].shape, outputs[0].shape)
        self._options: Dict[str, Any] = {"INFERENCE_NUM_THREADS": thread_count(threads)}
        if precision:
            self._options["INFERENCE_PRECISION_HINT"] = PRECISIONS[precision]
        self.compiled = self._compile(graph, "THROUGHPUT")
        self.streams = int(self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self._requests = [self.compiled.create_infer_request() for _ in range(self.streams)]
        # the graph stays for the latency compilation, made on first use (the file may be gone by then)
        self._graph, self._latency = (graph, None) if self.streams > 1 else (None, self.compiled)
        self._lock = threading.Lock()  # the requests are shared: one batch at a time
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        hint = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        self.precision = {"f32": "fp32"}.get(hint, hint)

    def _compile(self, graph: Any, hint: str) -> Any:
        try:
            return self._core.compile_model(graph, "CPU", {**self._options, "PERFORMANCE_HINT": hint})
        except Exception as e:
            raise OnnxMetadataError(f"OpenVINO cannot compile {self.path}: {openvino_words(e)}") from None

    def _run(self, array):
        if self.per_image and len(array) > 1:  # an IR of batch 1: its images one at a time
            return np.concatenate([self._run(array[i:i + 1]) for i in range(len(array))])
        slices = parts(len(array), self.streams)
        with self._lock:
            if len(slices) == 1:
                if self._latency is None:
                    self._latency, self._graph = self._compile(self._graph, "LATENCY"), None
                return self._latency(array)[0]
            started, failed = [], []
            try:
                for request, part in zip(self._requests, slices):
                    request.start_async({0: array[part]})
                    started.append(request)
            finally:  # every started part ends before this returns or raises, the others too when one
                for request in started:  # failed: a request left running is "busy" for the next batch
                    try:
                        request.wait()
                    except Exception as e:
                        failed.append(e)
            if failed:
                raise failed[0]
            # concatenate copies the outputs out of the requests' buffers while no request runs
            return np.concatenate([request.get_output_tensor(0).data for request in started])

    def extra_repr(self) -> str:
        return f"{self.path}, quantization={self.quantization}, precision={self.precision}, streams={self.streams}"


def openvino_words(e: BaseException) -> str:
    """What OpenVINO's C++ error says, in its last line of words: its first lines are where it was thrown
    ("Exception from src/inference/src/cpp/core.cpp:84:", "Check '...' failed at ..."), no cause."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    words = [line for line in lines if not line.startswith(("Exception from ", "Check '"))]
    return words[-1] if words else first_line(e)


def _check_files(path: Path) -> None:
    """The .xml and its .bin exist, are not empty and belong together: one line naming the missing piece."""
    if path.is_dir():
        raise OnnxMetadataError(f"{path} is a folder, not an OpenVINO IR (.xml)")
    if not path.is_file():
        raise FileNotFoundError(f"OpenVINO model not found: {path}")
    weights = path.with_suffix(".bin")
    for file in (path, weights):
        if not file.is_file():
            raise OnnxMetadataError(f"{path}: its weights file {weights.name} is missing (an IR is the .xml and "
                                    f"the .bin beside it)")
        if file.stat().st_size == 0:
            raise OnnxMetadataError(f"{file} is empty (0 bytes): not an OpenVINO IR (an interrupted copy?)")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise OnnxMetadataError(f"cannot read {path}: {e.strerror or e}") from None
    if "<net" not in text[:4096]:  # else OpenVINO tries its other readers (TensorFlow's logs C++ errors)
        raise OnnxMetadataError(f"{path} is not an OpenVINO IR: its text has no <net> element (an IR's .xml is "
                                f"what vitkit convert --to openvino writes)")
    if why := _mismatched_weights(path, text):
        raise OnnxMetadataError(why)


def _mismatched_weights(path: Path, text: str) -> Optional[str]:
    """An IR whose .bin is another model's or cut: OpenVINO read a larger model's .bin under a smaller one's graph
    without a word (other weights), and named only the first layer that wrong bytes broke. The .xml's constants say
    how many bytes they read (``offset`` + ``size``), which an export's .bin holds exactly; read as text, not parsed
    as XML (an untrusted file)."""
    if not text.rstrip().endswith("</net>"):  # the .xml is what was cut: its constants are not all listed
        return None
    ends = [int(m.group(1)) + int(m.group(2)) for tag in re.findall(r"<data\b[^>]*>", text)
            if (m := re.search(r'\boffset="(\d+)"[^>]*\bsize="(\d+)"', tag))]
    held = path.with_suffix(".bin").stat().st_size
    if not ends or max(ends) == held:
        return None
    return (f"{path}: its weights file {path.with_suffix('.bin').name} holds {held:,} bytes where the .xml reads "
            f"{max(ends):,}: the two are not one export (a .bin of another model, or cut); convert again, or put "
            f"the .xml's own .bin beside it")


def _made(node: Any):
    """An OpenVINO operation's type and its first input's operation (for runtime._last_op)."""
    values = node.input_values()
    return node.get_type_name(), [values[0].get_node()] if values and values[0].get_node().get_type_name() != \
        "Parameter" else []


def _rt_metadata(graph: Any) -> Dict[str, str]:
    """The IR's ``vitkit`` runtime-info entries as strings (none for a foreign IR)."""
    if not graph.has_rt_info([RT_SECTION]):
        return {}
    section = graph.get_rt_info()[RT_SECTION]
    return {key: graph.get_rt_info([RT_SECTION, key]).astype(str) for key in section}


def _port(port: Any) -> SimpleNamespace:
    """An OpenVINO input or output as ONNX Runtime describes one (name, shape with ints for
    static dimensions and "?" for dynamic ones, type), for the checks :class:`OnnxModel` shares."""
    shape = port.get_partial_shape()
    dims = [d.get_length() if d.is_static else "?" for d in shape] if shape.rank.is_static else []
    kind = "tensor(float)" if port.get_element_type().get_type_name() == "f32" else str(port.get_element_type())
    names = port.get_names()
    return SimpleNamespace(name=next(iter(names)) if names else "input", shape=dims, type=kind)


__all__ = ["OPENVINO_QUANTIZATIONS", "OpenVinoModel", "export_openvino", "is_openvino", "openvino_module"]
