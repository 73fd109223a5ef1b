"""int8 ONNX models through ONNX Runtime's own quantization tools (no home-made kernels).

- ``int8`` (dynamic): ``quantize_dynamic`` stores MatMul/Gemm weights as int8 and quantizes
  their input activations per batch at run time. Needs no data. Convolutions (the patch
  embedding, a hybrid's ResNet) stay fp32: ONNX Runtime's ConvInteger took 7% of ViT-B/16's
  time at batch 32 where the fp32 Conv takes 1.4% (measured on this project's 2-core CPU).
- ``int8-static``: ``quantize_static`` in the QDQ format, per-channel int8 weights, with
  activation ranges measured on calibration images (MinMax over a few hundred training
  images); only MatMul/Gemm/Conv are quantized: LayerNorm, softmax and GELU stay float,
  where int8 costs a transformer the most accuracy for the least time. Weights use 7 bits
  (``reduce_range``): on CPUs without VNNI (AVX2 only: Zen 3, most laptops) ONNX Runtime's
  int8 products go through VPMADDUBSW, whose 16-bit sums saturate on full-range weights; on a
  Zen 3 EPYC the default model's int8-static predictions agreed with fp32 on 88.4% of 1,000
  test images at 8 bits and on over 90% at 7. The file may run on any CPU, so it is always
  written this way.

Both first run ORT's ``quant_pre_process`` (shape inference and graph clean-up), as its
documentation asks. Accuracy of each on a trained model is measured in
``benchmarks/bench_onnx.py``, not assumed.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from ..extras import require
from ..files import PathLike, work_folder

QUANTIZATIONS = ("int8", "int8-static")
_DYNAMIC_OPS = ["MatMul", "Gemm"]
_STATIC_OPS = ["MatMul", "Gemm", "Conv"]


def quantize_onnx(src: PathLike, dst: PathLike, method: str = "int8", config: Any = None,
                  calibration: Optional[torch.Tensor] = None, batch_size: int = 32) -> Path:
    """Write the int8 form of the fp32 ONNX model ``src`` at ``dst`` (see the module docstring).
    ``calibration``: uint8 images (N, C, H, W), prepared with ``config``'s preprocessing."""
    if method not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {method!r}")
    q = require("onnxruntime.quantization", "onnx", "int8 quantization")
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if method == "int8-static" and (calibration is None or config is None):
        raise ValueError("int8-static quantization needs calibration images and the model's config")
    dst = Path(dst)
    with work_folder(dst.parent, "vitkit-quant") as work:
        pre = Path(work) / "pre.onnx"
        with _quiet_root_logger():
            _quantize(q, quant_pre_process, src, pre, dst, method, config, calibration, batch_size)
    return dst


def _quantize(q, quant_pre_process, src, pre, dst, method, config, calibration, batch_size) -> None:
    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    if method == "int8":
        q.quantize_dynamic(str(pre), str(dst), weight_type=q.QuantType.QInt8, op_types_to_quantize=_DYNAMIC_OPS,
                           per_channel=False)
        return
    import onnx

    graph_input = onnx.load(str(pre), load_external_data=False).graph.input[0].name  # whatever the export named it
    q.quantize_static(str(pre), str(dst), _Calibration(calibration, config, batch_size, graph_input),
                      quant_format=q.QuantFormat.QDQ, per_channel=True, op_types_to_quantize=_STATIC_OPS,
                      activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8,
                      calibrate_method=q.CalibrationMethod.MinMax, extra_options={"ActivationSymmetric": True},
                      reduce_range=True)


class _Calibration:
    """ONNX Runtime's CalibrationDataReader protocol over uint8 images: ``get_next`` returns one
    prepared batch as ``{input_name: array}``, then None."""

    def __init__(self, images: torch.Tensor, config: Any, batch_size: int, input_name: str = "pixel_values"):
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError("calibration images must be a uint8 tensor (N, C, H, W)")
        if len(images) == 0:
            raise ValueError("calibration needs at least one image")
        self.images, self.config, self.batch_size, self.start = images, config, batch_size, 0
        self.input_name = input_name

    def get_next(self):
        from ..evaluate.metrics import prepare_batch

        if self.start >= len(self.images):
            return None
        batch = self.images[self.start:self.start + self.batch_size]
        self.start += self.batch_size
        return {self.input_name: prepare_batch(batch, self.config).numpy()}

    def rewind(self):
        self.start = 0


#: where calibration images come from (``calibration=``, ``--calibration``): images as they are, a
#: folder of image files, or a built-in dataset's name; None: the dataset the model's labels name
CalibrationSource = Union[torch.Tensor, PathLike, None]


class NoCalibrationImages(ValueError):
    """A calibrated int8 path was asked for and no images to calibrate on were given or can be found."""


def calibrates(runtime: Optional[str], quantize: Optional[str]) -> bool:
    """Whether ``quantize`` on ``runtime`` (``openvino``, ``onnxruntime`` or ``onnx``) calibrates on
    images: OpenVINO's int8 (NNCF) and the ONNX int8-static do; ONNX Runtime's dynamic int8 does not."""
    return quantize == "int8-static" or (runtime == "openvino" and quantize == "int8")


def can_calibrate(model: nn.Module) -> bool:
    """Whether a calibrated int8 export of ``model`` finds its images without being given any
    (its class names are a built-in dataset's)."""
    from ..data import datasets

    return datasets.dataset_for_labels(getattr(model.config, "label_names", None)) is not None


def calibration_images(model: nn.Module, count: int = 256, source: CalibrationSource = None,
                       purpose: str = "int8-static quantization") -> torch.Tensor:
    """uint8 images (N, C, H, W) to calibrate ``model``'s int8 ranges on: ``source`` as it is (a
    tensor), up to ``count`` image files of a folder (a fixed random draw, any layout, each
    resized and cropped by the model's own preprocessing; unreadable files skipped), ``count``
    training images of a built-in dataset by name, or (None) of the dataset the labels name.
    ``purpose`` names the export in the one line said when there are none."""
    from ..data import datasets

    if isinstance(source, torch.Tensor):
        return source
    if source is None:
        name = datasets.dataset_for_labels(model.config.label_names)
        if name is None:
            raise NoCalibrationImages(
                f"{purpose} calibrates on images like those the model will see, and the model's classes name no "
                f"built-in dataset: give some (--calibration FOLDER, or calibration=FOLDER | IMAGES in Python)")
    elif Path(source).is_dir():
        return _folder_images(model, Path(source), count)
    else:
        name = None
        with contextlib.suppress(ValueError):  # not a dataset's name at all
            name = datasets.canonical(str(source))
        if name not in datasets.IN_MEMORY:
            raise NoCalibrationImages(f"calibration: {source} is neither a folder of images nor a built-in dataset "
                                      f"({', '.join(datasets.IN_MEMORY)})")
    images = torch.from_numpy(datasets.load_split(name, "train").images)
    pick = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:count]
    picked = images[pick]  # (N, H, W) grey or (N, H, W, C) colour -> (N, C, H, W)
    return (picked[:, None] if picked.dim() == 3 else picked.permute(0, 3, 1, 2)).contiguous()


def _folder_images(model: nn.Module, root: Path, count: int) -> torch.Tensor:
    """Up to ``count`` image files under ``root``, seen as the model sees them (uint8, before normalising)."""
    import numpy as np

    from ..data.folder import IMG_EXTENSIONS
    from ..data.images import BadImageError, load_image
    from ..data.transforms import ImageShapeError, transform_for

    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))  # hidden ones are not data
        files += [os.path.join(folder, f) for f in sorted(names)
                  if not f.startswith(".") and f.lower().endswith(IMG_EXTENSIONS)]
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(0)).tolist()
    transform, channels, views = transform_for(model), model.config.in_chans, []
    for index in order:
        if len(views) == count:
            break
        try:
            view = np.asarray(transform.view(load_image(files[index], channels)), dtype=np.uint8)
        except (BadImageError, ImageShapeError, OSError):  # as a calibration file that cannot be read: passed over
            continue
        views.append(view[:, :, None] if view.ndim == 2 else view)
    if not views:
        raise NoCalibrationImages(f"calibration: no readable image files ({', '.join(IMG_EXTENSIONS)}) in {root}")
    return torch.from_numpy(np.stack(views)).permute(0, 3, 1, 2).contiguous()


@contextlib.contextmanager
def _quiet_root_logger():
    """ORT's quantizer logs advice through the root logger (WARNING:root:...); vitkit already
    follows it (pre-processing runs first), so that line is noise to a user. Restored after."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)
