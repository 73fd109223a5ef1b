"""``export_onnx``: a vitkit model as a self-describing ONNX file for ONNX Runtime.

The graph comes from PyTorch's maintained exporter (``torch.onnx.export``), never from
hand-written graph code. Two paths exist; both were measured on this project's 2-core CPU in
ONNX Runtime and run within 3% of each other (ViT-B/16, batch 32: fp32 10.5 vs 10.7 img/s,
dynamic int8 24.6 vs 24.9 img/s, dynamo vs TorchScript), with logits within 2e-6 of PyTorch's:

- ``dynamo`` (default): ``torch.export`` + onnxscript, the path PyTorch maintains (default
  since 2.9). Export takes 2-8 s.
- ``torchscript``: the tracer, deprecated by PyTorch (a DeprecationWarning says it will be
  removed), kept because it exports in a fraction of the time and needs no onnxscript.

The file's ``metadata_props`` carry what a deployer needs to feed it (all JSON strings):

- ``vitkit.config``: the model's vitkit config (as config.json's ``config``), from which
  :class:`~vitkit.deploy.runtime.OnnxModel` rebuilds the preprocessing exactly;
- ``input_size`` ``[C, H, W]``, ``mean``, ``std``, ``labels``, ``interpolation``, ``crop_pct``
  and ``preprocessing`` (in words): the same facts for readers that are not vitkit;
- ``vitkit.version``, ``vitkit.exporter``, ``vitkit.quantization`` (``none``/``int8-dynamic``/
  ``int8-static``).

The batch dimension is dynamic (``batch``); height and width are the config's (a model
built with ``dynamic_img_size`` is exported at its configured size, and the metadata says so).

Self-attention is exported with q, k and v as three projections and the scores divided by
sqrt(head_dim) after ``q k^T`` (BERT's graph; :class:`SeparateQKV`), not as vitkit's one fused
``qkv``: ONNX Runtime's transformer optimizer recognises this graph as its ``Attention`` op,
and even unfused it runs faster than the fused projection's slices (ViT-B/16, batch 32, 2-core
EPYC: fp32 10.5 vs 10.3 img/s, dynamic int8 28.0 vs 25.5). ORT's fused ``Attention`` op itself
was level in fp32 and slower in int8 (fp32 10.6, int8 23.5; ViT-Ti/16 batch 1 fp32 111 vs 128),
so the file keeps standard operators only (``benchmarks/bench_onnx.py`` measures all three).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import torch
from torch import nn
from torch.torch_version import TorchVersion

from .._version import __version__
from ..extras import require
from ..files import PathLike, said_as_disk_full, work_folder
from ..models import positions
from ..progress import working
from .quantize import CalibrationSource

EXPORTERS = ("dynamo", "torchscript")
#: the oldest torch whose ONNX export vitkit's models pass (pyproject.toml's onnx extra asks for it)
MIN_TORCH = "2.8"
INPUT_NAME = "pixel_values"
CONFIG_KEY = "vitkit.config"
#: protobuf's limit on one file; vitkit writes single-file models (ViT-H/14's 2.5 GB is past it)
PROTO_LIMIT = 2_000_000_000
#: what calibration images are for, in the line that says they are missing
CALIBRATION_PURPOSE = "ONNX int8-static"


class OnnxExportError(ValueError):
    """A model or an option the ONNX export cannot serve; the message says which and why."""


def onnx_modules(purpose: str):
    """``onnx`` and ``onnxruntime``, or one line naming the ``onnx`` extra."""
    return require("onnx", "onnx", purpose), require("onnxruntime", "onnx", purpose)


def export_onnx(model: nn.Module, path: PathLike, *, exporter: str = "dynamo", opset: Optional[int] = None,
                quantize: Optional[str] = None, calibration: CalibrationSource = None,
                progress: bool = True) -> Path:
    """Write ``model`` (any vitkit classifier or headless encoder) as an ONNX file at ``path``.

    ``quantize``: ``None`` (fp32), ``"int8"`` (ONNX Runtime's dynamic int8: weights int8,
    activations quantized per batch at run time) or ``"int8-static"`` (QDQ with activation
    ranges calibrated on ``calibration``: uint8 images ``(N, C, H, W)``, a folder of image files
    or a built-in dataset's name; by default 256 training images of the built-in dataset the
    model's class names name, see :func:`vitkit.deploy.quantize.calibration_images`). The file
    is written atomically.
    """
    from .quantize import QUANTIZATIONS, calibration_images

    path = Path(path)
    problems = _problems(model, path, exporter, opset, quantize, calibration, QUANTIZATIONS)
    if problems:
        raise OnnxExportError("; ".join(problems))
    if quantize == "int8-static":  # one line when there are none
        calibration = calibration_images(model, source=calibration, purpose=CALIBRATION_PURPOSE)
    onnx_modules("ONNX export")  # said before any work when onnx is missing
    if exporter == "dynamo":
        require("onnxscript", "onnx", "ONNX export (the dynamo exporter; or exporter='torchscript')")
    model = positions.at_img_size(model)  # the graph's one size: a table held at another is written resampled to it
    config = model.config
    path.parent.mkdir(parents=True, exist_ok=True)
    # built in a private folder beside the target, then renamed over it: a crash leaves no half file,
    # and a killed export's folder is removed by the next export of the same name; a full disk, which the
    # exporter and ORT's quantizer say as their own types, is one line naming the file
    with said_as_disk_full(path), work_folder(path.parent, path.name) as work, \
            working(f"exporting {path.name} to ONNX ({exporter})", progress) as said:
        fp32 = Path(work) / "fp32.onnx"
        _export_graph(model, fp32, exporter, opset)
        _check_graph(model, fp32, exporter)
        final = fp32
        if quantize:
            said.label = f"quantizing {path.name} ({quantize})"
            final = Path(work) / f"{quantize}.onnx"
        finish_export(fp32, final, config, exporter, quantize, calibration)
        os.chmod(final, 0o644)
        os.replace(final, path)
    return path


def finish_export(fp32: PathLike, final: PathLike, config: Any, exporter: str, quantize: Optional[str] = None,
                  calibration: Optional[torch.Tensor] = None) -> Path:
    """An export's last steps: the fp32 graph ``fp32`` quantized into ``final`` (or ``final`` is ``fp32``),
    then vitkit's metadata written into it. A caller that needs several quantizations of one model (a
    benchmark) traces it once and finishes each file from the same fp32 graph."""
    from .quantize import quantize_onnx

    onnx, _ = onnx_modules("ONNX export")
    if quantize:
        quantize_onnx(fp32, final, quantize, config=config, calibration=calibration)
    proto = onnx.load(str(final))
    set_metadata(proto, metadata_for(config, exporter, quantize))
    onnx.save_model(proto, str(final))
    return Path(final)


def _problems(model, path, exporter, opset, quantize, calibration, quantizations) -> list:
    from ..selfsup import is_pretrainer

    if not isinstance(model, nn.Module):  # a path was "'str' object has no attribute 'parameters'"
        hint = ": load it first (vitkit.from_pretrained(path)), or vitkit convert SRC DST --to onnx" \
            if isinstance(model, (str, os.PathLike)) else ""
        given = f"{type(model).__name__} {str(model)[:60]!r}"
        return [f"export_onnx takes a model (a torch.nn.Module), not the {given}{hint}"]
    problems = []
    params = sum(p.numel() for p in model.parameters())
    if is_pretrainer(model):
        problems.append(f"a {model.objective} pre-training model has no ONNX form (its loss needs masks "
                        f"drawn at run time): export its encoder (from_pretrained(..., encoder_only=True)) "
                        f"or fine-tune it first")
    elif not hasattr(getattr(model, "config", None), "img_size"):
        problems.append(f"export_onnx takes a vitkit model (with a .config), not {type(model).__name__}")
    elif halves := sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()} - {"float32"}):
        # (the exporters failed on it in their own words: escape codes, or example images of another dtype)
        problems.append(f"export_onnx writes float32 graphs; this model holds {', '.join(halves)} weights: export "
                        f"model.float() (int8 comes from quantize=)")
    elif params * 4 >= PROTO_LIMIT:
        problems.append(f"{model.config.architecture} has {params:,} parameters: "
                        f"over 2 GB in fp32, past the single-file ONNX limit vitkit writes")
    if path.suffix.lower() != ".onnx":
        problems.append(f"the ONNX file's name must end in .onnx, not {path.name!r}")
    if exporter not in EXPORTERS:
        problems.append(f"exporter must be one of {', '.join(EXPORTERS)}, not {exporter!r}")
    elif exporter == "torchscript" and getattr(getattr(model, "config", None), "rope", "none") == "mixed":
        problems.append("RoPE-Mixed's learned rotations export with the dynamo exporter (the default) only: "
                        "torchscript's tracer failed on them, and a graph made to pass it did not run")
    elif TorchVersion(torch.__version__) < MIN_TORCH:  # the onnx extra asks for it; this says so where it was not
        problems.append(f"ONNX export needs torch {MIN_TORCH} or newer, not {torch.__version__} (2.4's exporter lacks "
                        f"the arguments vitkit passes; 2.6's and 2.7's torch.export fail on its models): "
                        f"pip install -U 'torch>={MIN_TORCH}'")
    if opset is not None and (not isinstance(opset, int) or not 17 <= opset <= 23):
        problems.append(f"opset must be an integer from 17 (LayerNormalization) to 23, not {opset!r}")
    if quantize is not None and quantize not in quantizations:
        problems.append(f"quantize must be one of {', '.join(quantizations)}, not {quantize!r}")
    if quantize != "int8-static" and calibration is not None:
        problems.append("calibration images are used by int8-static quantization only")
    return problems


class SeparateQKV(nn.Module):
    """The export form of :class:`~vitkit.models.layers.Attention` (and of its q/v-bias and split-projection
    kinds): the same function with q, k and v as three projections whose weights are views of the fused
    ``qkv``'s rows (no copy), scores ``(q @ k^T) / sqrt(head_dim)`` (see the module docstring for why);
    q/k norms, rotary positions and the inner norm as the layer has them."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.num_heads, self.head_dim = attn.num_heads, attn.head_dim
        self.kv_heads = getattr(attn, "kv_heads", attn.num_heads)  # grouped-query attention (Sapiens)
        self.root = float(attn.head_dim) ** 0.5
        if getattr(attn, "qkv", None) is None:  # split projections: taken as they are
            self.q, self.k, self.v = attn.q_proj, attn.k_proj, attn.v_proj
        else:
            dim = attn.qkv.in_features
            bias = attn.qkv.bias
            if getattr(attn, "q_bias", None) is not None:  # BEiT / EVA: q and v biases, none for k
                bias = torch.cat([attn.q_bias.detach(), torch.zeros_like(attn.q_bias), attn.v_bias.detach()])
            self.q, self.k, self.v = (nn.Linear(dim, dim, bias=bias is not None) for _ in range(3))
            for i, linear in enumerate((self.q, self.k, self.v)):
                linear.weight = nn.Parameter(attn.qkv.weight.detach()[i * dim:(i + 1) * dim], requires_grad=False)
                if bias is not None:
                    linear.bias = nn.Parameter(bias.detach()[i * dim:(i + 1) * dim], requires_grad=False)
        self.q_norm, self.k_norm, self.norm = attn.q_norm, attn.k_norm, attn.norm
        self.proj = attn.proj
        # the model asks the layer for its relative bias (relative positions); BEiT's layer holds its own table
        self.rel_pos = attn.rel_pos if attn.rel_pos is not None or not hasattr(attn, "relative_bias") else attn

    def forward(self, x: torch.Tensor, return_attention: bool = False, bias: Optional[torch.Tensor] = None,
                rope=None):
        from ..models.layers import _repeat_heads, apply_rope

        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).reshape(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is None and rope is None and self.kv_heads == self.num_heads:
            # (B, heads, d, N) straight from the projection: BERT's graph
            k = self.k(x).reshape(b, n, self.num_heads, self.head_dim).permute(0, 2, 3, 1)
        else:
            k = self.k(x).reshape(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            if rope is not None:
                q, k = apply_rope(q, rope), apply_rope(k, rope)
            if self.kv_heads != self.num_heads:
                k, v = _repeat_heads(k, self.num_heads), _repeat_heads(v, self.num_heads)
            k = k.transpose(-2, -1)
        scores = (q @ k) / self.root
        weights = torch.softmax(scores if bias is None else scores + bias, dim=-1)
        x = (weights @ v).transpose(1, 2).reshape(b, n, c)
        if self.norm is not None:
            x = self.norm(x)
        return self.proj(x), None


@contextlib.contextmanager
def separate_qkv(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with every self-attention layer (:class:`~vitkit.models.layers.Attention` and its kinds)
    swapped for :class:`SeparateQKV` while the block runs, the originals put back after (on an error too).
    Other attention kinds (ConViT's gated, CaiT's talking-heads and class attention, a kind that says
    ``exported_as_is``: SAM's, whose bias is computed from its queries) are exported as they are."""
    from ..models.layers import Attention

    swapped = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, Attention) and not getattr(child, "exported_as_is", False)]
    try:
        for parent, name, child in swapped:
            setattr(parent, name, SeparateQKV(child))
        yield model
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)


def _check_graph(model: nn.Module, graph: Path, exporter: str) -> None:
    """The exported graph run once by ONNX Runtime at batch 3 (not the traced 2) against the model: an exporter's
    graph that does not compute the model, or keeps the traced batch, is refused here, not written (a RoPE-Mixed
    graph the tracer made ran at no batch size, and was written with exit 0). ViT-B/16: about 2 s of a 12 s export."""
    _, ort = onnx_modules("ONNX export")
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = torch.get_num_threads(), 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # (made once for a check)
    h, w = model.config.img_size
    x = torch.randn(3, model.config.in_chans, h, w, generator=torch.Generator().manual_seed(3))
    try:
        session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        with torch.no_grad():
            expected = model(x)
        expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        for want, have in zip(expected, got):
            want = want.float().numpy()
            if have.shape != want.shape:
                raise ValueError(f"at batch 3 it gave shape {have.shape} where the model gives {want.shape}")
            far = float(np.abs(have - want).max())
            if far > 1e-3 * max(1.0, float(np.abs(want).max())):
                raise ValueError(f"at batch 3 its outputs are {far:.2g} off the model's")
    except Exception as e:
        words = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxExportError(f"the {exporter} exporter's graph of {type(model).__name__} "
                              f"({getattr(model.config, 'architecture', '?')}) does not compute the model: "
                              f"{words}") from None


@contextlib.contextmanager
def _no_jit_log():
    """The tracer without its ONNX log: torch turns it on for every export (its check reads the function, not its
    answer) and, on a failure, wrote the whole graph to stdout (280 lines before ``--json``'s one object)."""
    log = torch._C._jit_onnx_log
    torch._C._jit_onnx_log = lambda *args: None
    try:
        yield
    finally:
        torch._C._jit_onnx_log = log


def _export_graph(model: nn.Module, path: Path, exporter: str, opset: Optional[int]) -> None:
    """The fp32 graph, batch dimension dynamic. The example batch is 2: an exporter may
    specialise a dimension of size 1 into a constant."""
    h, w = model.config.img_size
    example = torch.zeros(2, model.config.in_chans, h, w)
    outputs = backbone_outputs(model) or ["logits" if getattr(model.config, "num_classes", 0) else "features"]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings(), separate_qkv(model):
            warnings.simplefilter("ignore")  # the tracer's notes on shapes it fixes: the batch stays dynamic
            if exporter == "dynamo":
                torch.onnx.export(model, (example,), str(path), dynamo=True, verbose=False, external_data=False,
                                  input_names=[INPUT_NAME], output_names=outputs, opset_version=opset,
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
            else:
                with _no_jit_log():
                    torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=opset or 17,
                                      input_names=[INPUT_NAME], output_names=outputs,
                                      dynamic_axes={INPUT_NAME: {0: "batch"}, **{o: {0: "batch"} for o in outputs}})
    except Exception as e:
        if stop := _stop_inside(e):  # torch.export wraps a signal's KeyboardInterrupt in its own error
            raise stop from None
        raise OnnxExportError(f"torch.onnx.export ({exporter}) failed on {type(model).__name__} "
                              f"({getattr(model.config, 'architecture', '?')}): {type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else 'no detail'}") from e
    finally:
        model.train(was_training)


#: the outputs of a backbone's graph (a ``features_only`` model's maps): features_0, features_1, ...
BACKBONE_OUTPUT = "features_"


def backbone_outputs(model: nn.Module) -> List[str]:
    """A ``features_only`` model's output names, one per map (its second was named by the exporter, "313"); []
    for a classifier or an encoder."""
    from ..models.features import FeatureModel

    return [f"{BACKBONE_OUTPUT}{i}" for i in range(len(model.feature_info))] if isinstance(model, FeatureModel) else []


def _stop_inside(error: BaseException) -> Optional[KeyboardInterrupt]:
    """The Ctrl-C or SIGTERM an exporter's error carries as its cause or context, if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def metadata_for(config: Any, exporter: str, quantize: Optional[str]) -> Dict[str, str]:
    """The metadata_props of an exported model (see the module docstring)."""
    from ..models.serialize import native_config_dict

    h, w = config.img_size
    labels = list(config.label_names or [])
    return {
        CONFIG_KEY: json.dumps(native_config_dict(config)),
        "vitkit.version": __version__,
        "vitkit.exporter": exporter,
        "vitkit.quantization": {None: "none", "int8": "int8-dynamic"}.get(quantize, quantize),
        "input_size": json.dumps([config.in_chans, h, w]),
        "mean": json.dumps(list(config.mean)),
        "std": json.dumps(list(config.std)),
        "labels": json.dumps(labels),
        "interpolation": config.interpolation,
        "crop_pct": json.dumps(config.crop_pct),
        "preprocessing": (f"RGB (or grey for 1 channel) resized by {config.interpolation} so the centre crop of "
                          f"{config.crop_pct:g} is {h}x{w}"
                          + {"squash": " (the whole image to that, its aspect not kept)",
                             "border": " (its longer side to that, the rest padded with the mean's colour"
                                       + (" at the right and bottom)" if getattr(config, "crop_offset", "") == "start"
                                          else ")")}.get(getattr(config, "crop_mode", "center"), "")
                          + ", scaled to [0, 1], then (x - mean) / std per channel; "
                          f"input {INPUT_NAME} float32 (batch, {config.in_chans}, {h}, {w})"
                          + ("; built with dynamic_img_size, exported at this size"
                             if getattr(config, "dynamic_img_size", False) else "")),
    }


def set_metadata(proto: Any, metadata: Dict[str, str]) -> None:
    """Replace ``proto``'s metadata entries of the same keys."""
    keep = [(p.key, p.value) for p in proto.metadata_props if p.key not in metadata]
    del proto.metadata_props[:]
    for key, value in keep + list(metadata.items()):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value


def read_metadata(path: PathLike) -> Dict[str, str]:
    """An ONNX file's metadata_props, read without its tensors."""
    onnx = require("onnx", "onnx", "reading ONNX files")
    proto = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in proto.metadata_props}
