"""ONNX Runtime as a drop-in for a vitkit model: ``OnnxModel`` (:mod:`.choose` picks the runtime).

``OnnxModel`` is an ``nn.Module`` only so that vitkit's evaluation code (``predict_images``,
``classification_report``) and a user's ``model(x)`` take it unchanged: it holds no
parameters; its ``forward`` hands the batch to an ONNX Runtime session (CPU execution
provider) and returns the output as a torch tensor; a batch runs in parts, one per thread, each
on a one-thread session (:mod:`vitkit.parallel`'s reason: no barrier between the cores inside an
operation), a lone image on a session with every thread. Its ``config`` is the exported model's
vitkit config, read from the file's metadata (:mod:`vitkit.deploy.onnx_export`), so the
preprocessing is exactly the one the model was trained with. A file exported elsewhere has
no such metadata: then the input size, mean and std must be given (the class count and the
channels are read off the graph).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from ..extras import first_line
from ..files import PathLike
from ..models.config_base import MAX_IMG_SIZE, _is_int, pixel_scale_problem
from ..models.patch import check_pixel_tensor
from ..models.sizes import one_size
from ..parallel import BatchParallel, parts
from .onnx_export import BACKBONE_OUTPUT, CONFIG_KEY, onnx_modules


def _channels_last(shape) -> bool:
    """A foreign graph's input laid out (batch, height, width, channels): 1, 3 or 4 (RGBA) last, where the
    channels go neither 1 nor 3 (a size, or a named dimension). vitkit's own exports say their channels."""
    return isinstance(shape[3], int) and shape[3] in (1, 3, 4) and shape[1] not in (1, 3)


class StandInNote(UserWarning):
    """How a graph without vitkit's metadata is preprocessed where its stand-ins say nothing (the crop)."""


class OnnxMetadataError(ValueError):
    """An ONNX file without vitkit's metadata, and no preprocessing given to stand in for it."""


@dataclass
class OnnxConfig:
    """The preprocessing facts of an ONNX model that vitkit did not export (what a vitkit
    config offers evaluation code; the architecture is unknown)."""

    img_size: Tuple[int, int]
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    in_chans: int
    num_classes: int
    label_names: List[str] = field(default_factory=list)
    crop_pct: float = 1.0
    interpolation: str = "bicubic"
    crop_mode: str = "center"
    crop_offset: str = "round"
    architecture: str = "onnx"


class OnnxModel(nn.Module):
    """An exported model run by ONNX Runtime (see the module docstring).

    ``threads`` (default: torch's thread count, which the ``--threads`` of ``vitkit serve`` sets): a batch is cut
    into that many parts, each run on a one-thread session at once; a lone image runs on a session
    with that many intra-op threads. DINOv2-S/14 int8 at batch 32 on a 2-core Zen 4: alone as fast
    as one session on both threads (24.4 against 23.4 img/s), beside one busy Python loop 0.69 of
    that against 0.54 (a scratch comparison, 4 alternations). The two sessions cost the model's
    weights twice in memory (ViT-B/16 int8: about 55 MB more). A graph that quantizes its
    activations dynamically (``DynamicQuantizeLinear``: ONNX Runtime's dynamic int8) scales them by
    the largest value in its whole input, so an image's answer would depend on the other images of
    its batch (a server's traffic: top-1 flips seen on untrained ViT-Ti/16): it is run one image at
    a time, which is no slower (ViT-S/16 and ViT-B/16 int8, 16 images on one thread: 16.5-17.3
    against 13.3-14.8 and 8.0-8.2 against 7.6 img/s).
    ``img_size``/``mean``/``std``/``labels`` stand in for missing
    metadata and are refused when the file has its own (they would contradict it).
    """

    #: the runtime and the ``vitkit convert --to`` value of this kind of file, for messages
    runtime = "ONNX Runtime"
    export_flag = "onnx"
    #: the graph ends in Softmax (a foreign export's "prob" output): its outputs are read as probabilities, not
    #: softmaxed a second time (40% where the model said 100%)
    probabilities = False
    #: one image per run (see the class notes; a graph exported at batch 1 too)
    per_image = False

    def __init__(self, path: PathLike, threads: Optional[int] = None, img_size: Optional[Sequence[int]] = None,
                 mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                 labels: Optional[Sequence[str]] = None):
        super().__init__()
        onnx, ort = onnx_modules("running ONNX models (--runtime onnxruntime)")
        self.path = Path(path)
        check_onnx_file(self.path)
        try:
            proto = onnx.load(str(self.path), load_external_data=False)
        except Exception as e:  # protobuf's DecodeError and friends: all mean "not an ONNX file"
            raise OnnxMetadataError(f"{self.path} is not a readable ONNX model ({type(e).__name__})") from None
        self.metadata = {p.key: p.value for p in proto.metadata_props}
        #: one image per run: the graph scales its activations by its whole input (see the class notes)
        self.per_image = any(node.op_type == "DynamicQuantizeLinear" for node in proto.graph.node)
        producers = {out: node for node in proto.graph.node for out in node.output}

        def made(name: str):
            node = producers.get(name)
            if node is None:
                return None
            axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
            over_classes = node.op_type != "Softmax" or axis in (-1, 1)  # (a softmax over the batch is not one)
            return (node.op_type if over_classes else "Softmax over another axis"), list(node.input[:1])

        self.probabilities = _read_as_probabilities(self.path, _last_op(made, proto.graph.output[0].name)
                                                    if proto.graph.output else None)
        del proto
        threads = thread_count(threads)
        self.session = self._session(ort, threads)
        self.parallel = BatchParallel(threads)
        self._part_session = self._session(ort, 1) if threads > 1 else self.session
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        self._check_graph(inputs, outputs)
        self.input_name = inputs[0].name
        self.quantization = self.metadata.get("vitkit.quantization", "unknown")
        self.config = self._config(inputs[0].shape, outputs[0].shape, img_size, mean, std, labels)
        self._check_claims(inputs[0].shape, outputs[0].shape)

    def _session(self, ort: Any, threads: int) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 4  # fatal only: its notes on unused initializers are not the user's, and an
        # error it raises is said in vitkit's one line (its own log printed the same error above it, in colour)
        try:
            return ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise OnnxMetadataError(f"ONNX Runtime cannot load {self.path}: {first_line(e)}") from None

    def _check_graph(self, inputs, outputs) -> None:
        """What vitkit can feed and read: one float32 (batch, channels, height, width) input and
        one (batch, classes) output."""
        maps = [o.name for o in outputs if o.name.startswith(BACKBONE_OUTPUT)]
        if maps and len(maps) == len(outputs):  # export_onnx of a features_only model
            raise OnnxMetadataError(f"{self.path} is a backbone's graph ({len(maps)} feature maps: {', '.join(maps)}), "
                                    f"not a classifier's: vitkit predict, eval and serve run classifiers; run it with "
                                    f"ONNX Runtime (onnxruntime.InferenceSession) for its maps")
        problems = []
        if len(inputs) != 1 or len(inputs[0].shape) != 4:
            problems.append(f"it takes {len(inputs)} input(s) of shape(s) {[i.shape for i in inputs]}, not one "
                            f"(batch, channels, height, width)")
        elif CONFIG_KEY not in self.metadata and _channels_last(inputs[0].shape):  # ("--mean has 3 values for 32
            # channels"; a vitkit export of 12 channels and 1 px wide images is what its config says)
            problems.append(f"its input {inputs[0].name!r} is {inputs[0].shape}: channels last (batch, height, width, "
                            f"channels), where vitkit feeds (batch, channels, height, width); export it channels "
                            f"first")
        elif inputs[0].type != "tensor(float)":
            problems.append(f"its input {inputs[0].name!r} is {inputs[0].type}, not tensor(float) (vitkit feeds "
                            f"normalised float32 pixels)")
        if len(outputs) > 1:  # (the first was read: a features output before the logits was ranked as classes)
            problems.append(f"it has {len(outputs)} outputs ({', '.join(f'{o.name} {o.shape}' for o in outputs)}), "
                            f"where vitkit reads a classifier's one (batch, classes): export the classes' alone")
        elif len(outputs) < 1 or len(outputs[0].shape) != 2:
            problems.append(f"its output has shape {outputs[0].shape if outputs else 'none'}, not (batch, classes)")
        elif outputs[0].shape[1] == 1:  # (softmaxed over one value, every image was "class 0, 100%")
            problems.append(f"its output {outputs[0].name!r} holds one value an image (a binary logit or a score), "
                            f"where vitkit ranks two or more classes that exclude one another")
        if problems:
            raise OnnxMetadataError(f"{self.path} is no image model vitkit can run: " + "; ".join(problems))
        if inputs[0].shape[0] == 1:  # exported at batch 1 (torch.onnx.export's default): fed one image at a time
            self.per_image = True

    def _check_claims(self, in_shape, out_shape) -> None:
        """What the file's metadata says (its config, and the input_size and labels entries for
        other readers) against what its graph holds: channels, image size and classes. A file
        whose metadata lies is refused, never believed."""
        config, problems = self.config, []
        fixed = [d if isinstance(d, int) else None for d in in_shape[1:]]
        if fixed[0] is not None and fixed[0] != config.in_chans:
            problems.append(f"{config.in_chans} input channels, the graph takes {fixed[0]}")
        if None not in fixed[1:] and tuple(fixed[1:]) != tuple(config.img_size):
            problems.append(f"{config.img_size[0]}x{config.img_size[1]} images, the graph takes "
                            f"{fixed[1]}x{fixed[2]}")
        classes = out_shape[-1] if isinstance(out_shape[-1], int) else None
        if classes is not None and config.num_classes and classes != config.num_classes:
            problems.append(f"{config.num_classes} classes, the graph outputs {classes}")
        for key, want in (("input_size", [config.in_chans, *config.img_size]),
                          ("labels", list(config.label_names or [])), ("mean", list(config.mean)),
                          ("std", list(config.std)), ("crop_pct", config.crop_pct),
                          ("interpolation", config.interpolation)):
            if key in self.metadata and CONFIG_KEY in self.metadata:
                try:
                    said = json.loads(self.metadata[key])
                except ValueError:
                    said = self.metadata[key]
                if said != want:
                    problems.append(f"{key} {_brief(said)} in its metadata, {_brief(want)} in its vitkit config")
        if problems:
            raise OnnxMetadataError(f"{self.path}: its metadata does not match what the file holds (it says "
                                    + "; ".join(problems) + f"): re-export it (vitkit convert --to {self.export_flag})")

    def _config(self, in_shape, out_shape, img_size, mean, std, labels):
        given = {k: v for k, v in (("img_size", img_size), ("mean", mean), ("std", std), ("labels", labels))
                 if v is not None}
        if CONFIG_KEY in self.metadata:
            if given:
                raise OnnxMetadataError(f"{self.path} carries its own preprocessing (vitkit metadata): "
                                        f"drop {', '.join('--' + k.replace('_', '-') for k in given)}")
            from ..models import config_from_dict

            try:
                stored = json.loads(self.metadata[CONFIG_KEY])
                return config_from_dict(stored["config"])
            except (ValueError, TypeError, KeyError) as e:
                raise OnnxMetadataError(f"{self.path}: its {CONFIG_KEY} metadata is not a valid vitkit config "
                                        f"({first_line(e)})") from None
        missing = [k for k in ("img_size", "mean", "std") if k not in given]
        if missing:
            raise OnnxMetadataError(f"{self.path} has no vitkit metadata (it was not exported by vitkit "
                                    f"convert --to {self.export_flag}): give its preprocessing with "
                                    f"{', '.join('--' + k.replace('_', '-') for k in missing)} "
                                    f"(and --labels for class names), or re-export it with vitkit")
        chans = in_shape[1] if isinstance(in_shape[1], int) else len(mean)
        try:
            side = one_size(img_size)
        except ValueError as e:
            raise OnnxMetadataError(str(e)) from None
        size = side if isinstance(side, tuple) else (side, side)
        classes = out_shape[-1] if isinstance(out_shape[-1], int) else 0
        problems = [f"--{k} has {len(v)} values for {chans} channels" for k, v in (("mean", mean), ("std", std))
                    if len(v) != chans]
        if not all(0 < s <= MAX_IMG_SIZE for s in size):
            problems.append(f"--img-size must be between 1 and {MAX_IMG_SIZE:,} px, not {size[0]} {size[1]}")
        if not all(math.isfinite(s) and s > 0 for s in std) or not all(math.isfinite(m) for m in mean):
            problems.append("--std values must be positive and --mean values finite")
        elif scale := pixel_scale_problem(mean, std, "--"):
            problems.append(scale)
        if labels and classes and len(labels) != classes:
            problems.append(f"--labels names {len(labels)} classes, the model has {classes}")
        fixed = [d for d in in_shape[2:] if isinstance(d, int)]
        if len(fixed) == 2 and tuple(fixed) != size:
            problems.append(f"--img-size {size[0]} {size[1]} differs from the graph's input {fixed[0]}x{fixed[1]}")
        if problems:
            raise OnnxMetadataError(f"{self.path}: " + "; ".join(problems))
        config = OnnxConfig(size, tuple(mean), tuple(std), chans, classes, list(labels or []))
        warnings.warn(StandInNote(f"{self.path} has no vitkit metadata: each image is resized whole to "
                                  f"{size[0]}x{size[1]} ({config.interpolation}, no centre crop); a model trained "
                                  f"with a crop (timm's and DeiT's 0.875-0.9) answers somewhat differently: "
                                  f"re-export it with vitkit convert to carry its preprocessing"), stacklevel=2)
        return config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, C, H, W) prepared as ``config`` says -> the model's output (B, classes)."""
        check_pixel_tensor(x, self.config.in_chans)
        array = x.detach().to("cpu", torch.float32).contiguous().numpy()
        try:
            out = self._run(array)
        except Exception as e:  # the runtime's own error types (Fail, InvalidArgument, ...): one line naming the file
            raise OnnxMetadataError(f"{self.runtime} could not run {self.path} on a batch of shape "
                                    f"{tuple(array.shape)}: {_runtime_words(e)}") from None
        classes = self.config.num_classes
        if self.probabilities:  # a graph that ends in Softmax: its log is what a softmax reads back as itself
            out = np.log(np.clip(out, np.finfo(np.float32).tiny, None))
        if out.ndim != 2 or out.shape[0] != array.shape[0] or (classes and out.shape[1] != classes):
            raise OnnxMetadataError(f"{self.path} gave an output of shape {tuple(out.shape)} for {array.shape[0]} "
                                    f"images where (batch, {classes or 'features'}) was expected: its metadata "
                                    f"does not match its graph")
        return torch.from_numpy(out)

    def _run(self, array):
        if len(parts(len(array), self.parallel.workers)) == 1:
            return self._each(self.session, array)
        return np.concatenate(self.parallel.run(lambda part: self._each(self._part_session, array[part]), len(array)))

    def _each(self, session: Any, array: np.ndarray) -> np.ndarray:
        """``session``'s output for ``array``: in one run, or one image at a time where the graph
        scales by its input (:attr:`per_image`)."""
        if not self.per_image or len(array) == 1:
            return session.run(None, {self.input_name: array})[0]
        return np.concatenate([session.run(None, {self.input_name: array[i:i + 1]})[0] for i in range(len(array))])

    def extra_repr(self) -> str:
        return f"{self.path}, quantization={self.quantization}"


#: operations that pass a classifier's output on unchanged in value (looked through for the last one); a
#: quantized graph's probabilities pass through a quantize-dequantize pair (ONNX's Q/DQ, OpenVINO's FakeQuantize)
PASS_THROUGH = ("Identity", "Cast", "Reshape", "Squeeze", "Flatten", "Convert", "QuantizeLinear", "DequantizeLinear",
                "FakeQuantize")


def _read_as_probabilities(path: Path, last: Optional[str]) -> bool:
    """Whether a graph's output (``last``: the operation that computes it) is read as probabilities: a Softmax's
    are; a Sigmoid's (a multi-label model's, one independent probability per class) are refused, since every
    answer of vitkit's ranks classes that exclude one another (a softmax over them changed each number)."""
    if last == "Softmax over another axis":  # (over the batch: each row is no one image's probabilities)
        raise OnnxMetadataError(f"{path} ends in a Softmax over another axis than its classes': not read")
    if last == "Sigmoid":
        raise OnnxMetadataError(f"{path} ends in Sigmoid: a multi-label model's independent probabilities, which "
                                f"vitkit would rank as classes that exclude one another (a softmax over them): "
                                f"not read")
    return last in ("Softmax", "SoftMax")


def _last_op(producer: Any, name: str) -> Optional[str]:
    """The operation that computes the output ``name``, looked through :data:`PASS_THROUGH` ones
    (``producer(name)``: its operation and input names, or None for a graph input)."""
    for _ in range(16):
        made = producer(name)
        if made is None:
            return None
        op, inputs = made
        if op not in PASS_THROUGH or not inputs:
            return op
        name = inputs[0]
    return None


def check_onnx_file(path: Path) -> None:
    """The file is there and not empty: one line naming what is wrong, before any parser reads it."""
    if path.is_dir():
        raise OnnxMetadataError(f"{path} is a folder, not an ONNX file")
    if not path.is_file():
        raise FileNotFoundError(f"ONNX model not found: {path}")
    if path.stat().st_size == 0:
        raise OnnxMetadataError(f"{path} is empty (0 bytes): not an ONNX model (an interrupted copy?)")


def thread_count(threads: Optional[int]) -> int:
    """The threads a runtime is given: ``threads``, or torch's count (what ``vitkit serve --threads`` sets)."""
    if threads is None or threads == 0:
        return torch.get_num_threads()
    if not _is_int(threads) or threads < 1:
        raise ValueError(f"threads must be a whole number of at least 1, not {threads!r}")
    return threads


def _runtime_words(e: BaseException) -> str:
    """A runtime's error in one line: ONNX Runtime's first line ends "for the following indices" and its next says
    which ("index: 0 Got: 5 Expected: 4"), which the first line alone left out."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return "no detail"
    return " ".join(lines[:2]) if lines[0].rstrip().endswith(("indices", ":")) and len(lines) > 1 else lines[0]


def _brief(value: Any) -> str:
    """A metadata value short enough for one line: a long list as its length and first items."""
    if isinstance(value, list) and len(value) > 3:
        return f"[{', '.join(json.dumps(v) for v in value[:3])}, ... ({len(value)} in all)]"
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
