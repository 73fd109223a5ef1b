"""NNCF's int8 quantization of an OpenVINO IR, the work of a child process that never imports torch.

:func:`~.openvino.export_openvino` runs this file in a process of its own (by path, not as
``vitkit.deploy.openvino_int8``: the package's import brings torch). NNCF imports torch whenever
it is installed, with hooks on torch's functions (a process that went on training after that
crashed: see :func:`~.openvino._quantized`), and torch was 3.4 s of NNCF's 4.6 s import on an AMX
Xeon. With torch hidden, NNCF takes its OpenVINO backend alone and writes the same IR.

Only the standard library, numpy, openvino and nncf are imported here.
"""

import contextlib
import logging
import os
import sys
from typing import Any


def no_telemetry() -> None:
    """Hide ``openvino_telemetry`` from this process, so OpenVINO's converter and NNCF take their stubs.

    Without a consent file both send usage events, each from a process forked off this one (about 25
    for one export). Once, while name lookups hung, such a fork was made as another thread held the
    resolver's lock, never ended, and ``vitkit convert --quantize int8`` waited on it for good. vitkit
    sends nothing; a process that imported the package first keeps it."""
    sys.modules.setdefault("openvino_telemetry", None)


@contextlib.contextmanager
def silenced():
    """stdout and stderr to /dev/null while the block runs (file descriptors too: NNCF's bars)."""
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        yield


def quiet(nncf: Any) -> Any:
    """NNCF with its INFO lines off (they are not the user's)."""
    nncf.set_log_level(logging.ERROR)
    return nncf


def kept_float(ir: Any) -> list:
    """The layers NNCF leaves in float: the first that the image reaches (raw pixels) and every
    product over a single token: the classifier and a MAP head's pooled query (its attention
    output and the MLP after it). Those cost one token's work, and in int8 their error has no
    other tokens to average it out: on a SigLIP-style model trained briefly on Fashion-MNIST
    (Zen 3, AVX2), int8 kept 94.3% of fp32's decisions with only the first and last layers
    float, 95.7% so.

    A headless model's last product is a block's over every token, and it is quantized too: kept
    float it cost DINOv2-S/14 at batch 32 5% of its int8 speed (45.3 against 42.9 img/s, Zen 4),
    and on two trained Fashion-MNIST hybrids with their heads removed it changed nothing
    measurable (features' cosine to fp32 0.99979 / 0.99985 either way, the fp32 head's decisions
    on them 99.62% / 99.72% the same).

    Only layers the image reaches count: products of constants come first in graph order (a MAP
    head projects its learned query before any pixel arrives; only the batch size, through
    ``ShapeOf``, comes from the image), and taking one for "the first layer" left the patch
    embedding quantized."""
    reached, layers, single = set(), [], []
    for op in ir.get_ordered_ops():  # topological: an op's inputs come before it
        name = op.get_friendly_name()
        if op.get_type_name() == "Parameter" or op.get_type_name() != "ShapeOf" and any(
                value.get_node().get_friendly_name() in reached for value in op.input_values()):
            reached.add(name)
            if op.get_type_name() in ("Convolution", "MatMul"):
                layers.append(name)
                if _one_token(op.get_output_partial_shape(0)):
                    single.append(name)
    return sorted(set(layers[:1] + single))


def _one_token(shape: Any) -> bool:
    """An output of one token per image: (batch, features), or (..., 1, features)."""
    if not shape.rank.is_static:
        return False
    return len(shape) == 2 or shape[len(shape) - 2].is_static and shape[len(shape) - 2].get_length() == 1


def quantize_ir(nncf: Any, ir: Any, batches: list, count: int) -> Any:
    """NNCF's transformer preset (norms, softmax, GELU and the residual adds stay float) without
    its SmoothQuant step, with the first layer (raw pixels) and the one-token products (the
    classifier, a MAP head's query) kept float (:func:`kept_float`).
    Measured on a Fashion-MNIST hybrid (4 epochs, 2,000 test images; fp32 91.15%): the preset
    with SmoothQuant 13.8% (its scales break the convolution stem), without it 90.9%, NNCF's
    default preset 90.55%, the mixed preset with the first and last layers float 90.95%."""
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    keep = kept_float(ir)
    no_smoothing = AdvancedQuantizationParameters(
        smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=-1, convolution=-1))
    with silenced():  # NNCF draws its own progress bars on stdout
        return nncf.quantize(ir, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER, subset_size=count,
                             ignored_scope=nncf.IgnoredScope(names=keep), advanced_parameters=no_smoothing)


def quantize_file(src: str, data: str, dst: str) -> None:
    """The child's work: read the IR and the calibration batches (``.npz``, no pickles), quantize, write."""
    import numpy as np

    for name in ("torch", "torchvision"):  # NNCF then takes its OpenVINO backend alone
        sys.modules.setdefault(name, None)
    no_telemetry()
    import openvino as ov

    with silenced():  # its import's notes (a missing CUDA runtime) are not the user's
        import nncf
    with np.load(data, allow_pickle=False) as saved:
        batches = [saved[k] for k in sorted(saved.files, key=lambda k: int(k.split("_")[1]))]
    ir = quantize_ir(quiet(nncf), ov.Core().read_model(src), batches, sum(len(b) for b in batches))
    ov.save_model(ir, dst, compress_to_fp16=False)


if __name__ == "__main__":
    quantize_file(*sys.argv[1:4])
