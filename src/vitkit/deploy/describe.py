"""What an exported graph (``.onnx``, OpenVINO ``.xml``) is, before anything runs it: ``vitkit
info model.onnx``. The same account as a weights file's (:func:`vitkit.weights.pretrained.describe_source`):
its layout, what made it (vitkit's exporter and quantization, from its metadata), its constant
tensors, the model its vitkit config describes, checked against the graph as ``vitkit predict``
checks it (a file whose metadata lies is refused, exit 2); a graph from elsewhere, its input and
output and what running it needs."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Tuple

from ..extras import first_line
from ..files import PathLike
from .onnx_export import CONFIG_KEY

#: (name, shape with "?" for a dynamic dimension, element type)
Port = Tuple[str, List[Any], str]


def is_graph(source: PathLike) -> bool:
    return str(source).lower().endswith((".onnx", ".xml"))


def describe_graph(path: PathLike) -> Dict[str, Any]:
    """``vitkit info``'s facts of an exported graph (see the module docstring); its named weights are checked
    against the model its metadata describes too (an OpenVINO IR keeps the names of the weights it did not fold
    or transpose: the patch embedding's, the classifier's, the tokens and the position table)."""
    from .openvino import OpenVinoModel, _check_files, is_openvino
    from .runtime import OnnxMetadataError, OnnxModel, check_onnx_file

    path = Path(path)
    openvino = is_openvino(path)
    runtime = OpenVinoModel if openvino else OnnxModel
    (_check_files if openvino else check_onnx_file)(path)  # what the runtime checks first: there, not empty
    try:
        metadata, inputs, outputs, tensors, graph = (_openvino_facts if openvino else _onnx_facts)(path)
    except Exception as e:  # protobuf's and OpenVINO's parse errors: all mean "not such a file"
        raise OnnxMetadataError(f"{path} is not a readable {'OpenVINO IR' if openvino else 'ONNX model'} "
                                f"({first_line(e) or type(e).__name__})") from None
    info: Dict[str, Any] = dict(
        path=str(path), format="openvino" if openvino else "onnx", pretraining=None, tensors=len(tensors),
        values=sum(n for _, n in tensors), dtypes=sorted(Counter(t for t, _ in tensors)),
        graph={"inputs": inputs, "outputs": outputs})
    if CONFIG_KEY not in metadata:
        info["source_name"] = "not exported by vitkit"
        info["note"] = ("no vitkit metadata: vitkit predict and eval run it given its preprocessing (--img-size, "
                        "--mean, --std; --labels for class names)")
        return info
    info["source_name"] = (f"exported by vitkit {metadata.get('vitkit.version', '?')}"
                           + (f" with {metadata['vitkit.exporter']}" if metadata.get("vitkit.exporter") else "")
                           + f", quantization {metadata.get('vitkit.quantization', 'unknown')}")
    try:
        info["config"] = runtime(path, threads=1).config  # every check predict makes
        if lie := _tensors_disagree(info["config"], graph):
            raise OnnxMetadataError(f"its vitkit metadata does not describe its graph: {lie}")
    except (OnnxMetadataError, ValueError) as e:
        info["refused"] = " ".join(str(e).split())
    return info


def _tensors_disagree(config: Any, graph: Dict[str, Any]) -> str:
    """Where the graph's named weights and layers are not those of the model its metadata describes (a depth or
    patch size edited in the metadata was printed as the file's: predict checks only what it runs by, the input and
    the classes); "" where they agree, or where nothing can be compared (a family not built on torch's meta device).
    A graph names a layer through its weights (the exporter keeps one name for equal constants: zero biases) and
    through the module each operation came from (the dynamo exporter's ``namespace``): where it has the second,
    its layers are all of the model's; without, none past them."""
    import torch

    from ..models import build_from_config

    try:
        with torch.device("meta"):
            model = build_from_config(config)
    except Exception:  # (a family that computes at build time: nothing to compare)
        return ""
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    for name in sorted(expected.keys() & graph["weights"].keys()):
        if expected[name] != graph["weights"][name]:
            return f"its {name} is {graph['weights'][name]} where that model's is {expected[name]}"
    held, wanted = _layers([*graph["weights"], *graph["modules"]]), _layers(name for name, _ in model.named_modules())
    for prefix in sorted(held.keys() & wanted.keys()):
        if held[prefix] - wanted[prefix] or (graph["modules"] and held[prefix] != wanted[prefix]):
            return f"it holds {len(held[prefix])} of {prefix}.N where that model has {len(wanted[prefix])}"
    return ""


def _layers(names) -> Dict[str, set]:
    """{"blocks": {0, 1, ...}} of module or weight names (CaiT's blocks_token_only too)."""
    out: Dict[str, set] = {}
    for name in names:
        if m := re.match(r"(.*\bblocks\w*)\.(\d+)(\.|$)", name):
            out.setdefault(m[1], set()).add(int(m[2]))
    return out


def _onnx_facts(path: Path):
    import onnx
    from onnx import TensorProto

    proto = onnx.load(str(path), load_external_data=False)
    metadata = {p.key: p.value for p in proto.metadata_props}
    known = {i.name for i in proto.graph.initializer}

    def port(value) -> Port:
        kind = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else "?" for d in kind.shape.dim]
        return value.name, dims, TensorProto.DataType.Name(kind.elem_type).lower()

    tensors = [(TensorProto.DataType.Name(t.data_type).lower(), math.prod(t.dims)) for t in proto.graph.initializer]
    modules = {part.split(":")[0].strip() for node in proto.graph.node for p in node.metadata_props
               if p.key == "namespace" for part in p.value.split("/")}
    graph = {"weights": {t.name: list(t.dims) for t in proto.graph.initializer}, "modules": modules - {""}}
    tensors += [(TensorProto.DataType.Name(a.t.data_type).lower(), math.prod(a.t.dims))
                for node in proto.graph.node if node.op_type == "Constant" for a in node.attribute if a.name == "value"]
    inputs = [port(i) for i in proto.graph.input if i.name not in known]  # (old exporters list weights as inputs)
    return metadata, inputs, [port(o) for o in proto.graph.output], tensors, graph


def _openvino_facts(path: Path):
    from .openvino import _rt_metadata, openvino_module

    ov = openvino_module("reading OpenVINO models")
    graph = ov.Core().read_model(str(path))

    def port(value) -> Port:
        shape = value.get_partial_shape()
        dims = [d.get_length() if d.is_static else "?" for d in shape] if shape.rank.is_static else []
        names = value.get_names()
        return (next(iter(names)) if names else "?"), dims, value.get_element_type().get_type_name()

    constants = [op for op in graph.get_ordered_ops() if op.get_type_name() == "Constant"]
    tensors = [(op.get_output_element_type(0).get_type_name(), math.prod(op.get_output_shape(0))) for op in constants]
    weights = {op.get_friendly_name(): list(op.get_output_shape(0)) for op in constants}  # (others: Constant_5)
    return _rt_metadata(graph), [port(i) for i in graph.inputs], [port(o) for o in graph.outputs], tensors, \
        {"weights": weights, "modules": set()}


__all__ = ["describe_graph", "is_graph"]
