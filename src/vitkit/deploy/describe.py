"""What an exported graph (``.onnx``, OpenVINO ``.xml``) is, before anything runs it: ``vitkit
info model.onnx``. The same account as a weights file's (:func:`vitkit.weights.pretrained.describe_source`):
its layout, what made it (vitkit's exporter and quantization, from its metadata), its constant
tensors, the model its vitkit config describes, checked against the graph as ``vitkit predict``
checks it (a file whose metadata lies is refused, exit 2); a graph from elsewhere, its input and
output and what running it needs."""

from __future__ import annotations

import math
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
    """``vitkit info``'s facts of an exported graph (see the module docstring)."""
    from .openvino import OpenVinoModel, _check_files, is_openvino
    from .runtime import OnnxMetadataError, OnnxModel, check_onnx_file

    path = Path(path)
    openvino = is_openvino(path)
    runtime = OpenVinoModel if openvino else OnnxModel
    (_check_files if openvino else check_onnx_file)(path)  # what the runtime checks first: there, not empty
    try:
        metadata, inputs, outputs, tensors = (_openvino_facts if openvino else _onnx_facts)(path)
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
    except (OnnxMetadataError, ValueError) as e:
        info["refused"] = " ".join(str(e).split())
    return info


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
    tensors += [(TensorProto.DataType.Name(a.t.data_type).lower(), math.prod(a.t.dims))
                for node in proto.graph.node if node.op_type == "Constant" for a in node.attribute if a.name == "value"]
    inputs = [port(i) for i in proto.graph.input if i.name not in known]  # (old exporters list weights as inputs)
    return metadata, inputs, [port(o) for o in proto.graph.output], tensors


def _openvino_facts(path: Path):
    from .openvino import _rt_metadata, openvino_module

    ov = openvino_module("reading OpenVINO models")
    graph = ov.Core().read_model(str(path))

    def port(value) -> Port:
        shape = value.get_partial_shape()
        dims = [d.get_length() if d.is_static else "?" for d in shape] if shape.rank.is_static else []
        names = value.get_names()
        return (next(iter(names)) if names else "?"), dims, value.get_element_type().get_type_name()

    tensors = [(op.get_output_element_type(0).get_type_name(), math.prod(op.get_output_shape(0)))
               for op in graph.get_ordered_ops() if op.get_type_name() == "Constant"]
    return _rt_metadata(graph), [port(i) for i in graph.inputs], [port(o) for o in graph.outputs], tensors


__all__ = ["describe_graph", "is_graph"]
