"""What the verbs share: the numbers and tables they print, the model behind ``--weights`` (a
run folder stands for the model it saved) on the runtime asked for, and the flags several verbs take."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, List, Sequence


def fmt_int(n: int) -> str:
    return f"{n:,}"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PiB"


def table(rows: List[List[str]], header: List[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    right = [i > 0 for i in range(len(header))]

    def line(cells):
        return "  ".join(str(c).rjust(w) if r else str(c).ljust(w) for c, w, r in zip(cells, widths, right))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def preview(names: Sequence[str], n: int = 3) -> str:
    shown = ", ".join(map(str, list(names)[:n]))
    return f"{len(names)}: {shown}" + (", ..." if len(names) > n else "")


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def load_model(args: argparse.Namespace, **kwargs):
    """The model behind ``--weights``/``SRC``: a run folder stands for the model it saved, and
    the verb says so on stderr (a run that has not finished has no model yet: one line)."""
    from pathlib import Path

    from ..runlock import unfinished_run
    from ..weights import from_pretrained
    from ..weights.pretrained import run_model_folder

    source = getattr(args, "weights", None) or args.src
    if why := unfinished_run(source):
        raise FileNotFoundError(why)
    if (model_folder := run_model_folder(Path(source))) is not None:
        print(f"vitkit {args.verb}: reading {model_folder} (the model run {source} saved)", file=sys.stderr)
    return from_pretrained(source, model_name=args.model, **kwargs)


def classifier(model, weights: str):
    """A model with classes, or one clear line: a pre-training model (or a headless encoder) has none."""
    from ..selfsup import is_pretrainer

    if is_pretrainer(model):
        raise ValueError(f"{weights} is a {model.objective} pre-training model: it has no classifier; fine-tune it "
                         f"first (vitkit train --init {weights}), or read its encoder with vitkit fewshot / inspect")
    if not getattr(model.config, "num_classes", 1):
        raise ValueError(f"{weights} has no classifier head (num_classes 0): fine-tune it first "
                         f"(vitkit train --init {weights}), or read it with vitkit fewshot / inspect")
    return model


def runtime_model(args: argparse.Namespace):
    """The classifier ``--weights`` names, on ``--runtime``: the vitkit model, or ONNX Runtime
    running an ``.onnx`` file (or the weights exported on the fly, ``--quantize``d if asked)."""
    from ..deploy.choose import is_onnx, load_for_runtime, resolve_runtime
    from ..deploy.openvino import is_openvino

    stand_ins = {k: getattr(args, k, None) for k in ("img_size", "mean", "std", "labels")}
    args.runtime, args.quantize, chosen = resolve_runtime(args.weights, args.runtime, args.quantize)
    if chosen:
        print(f"vitkit {args.verb}: runtime auto: {chosen}", file=sys.stderr)
    if is_onnx(args.weights) or is_openvino(args.weights):
        if args.model:
            raise ValueError("--model names an architecture for weights without a config; an .onnx or OpenVINO "
                             ".xml file is its own graph")
        return load_for_runtime(args.weights, args.runtime, args.quantize, **stand_ins)
    model = classifier(load_model(args), args.weights)
    model = load_for_runtime(args.weights, args.runtime, args.quantize, model=model, **stand_ins)
    if getattr(model, "quantization", None) is None:  # torch on a CPU: batches in parts, one per thread
        from ..parallel import for_inference

        model = for_inference(model)
    return model


def runtime_name(model) -> str:
    """How the model runs, for the printed line: fp32, or ONNX Runtime and its quantization."""
    quantization = getattr(model, "quantization", None)
    if quantization is None:
        return "fp32"
    if getattr(model, "export_flag", "onnx") == "openvino":  # OpenVINO computes in the precision it was given
        if quantization in ("none", "unknown"):
            return f"openvino {model.precision}"
        return "openvino int8 (NNCF, calibrated)" if quantization == "int8-static" else f"openvino {quantization}"
    return "onnxruntime " + ("fp32" if quantization == "none" else quantization)


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", choices=["torch", "onnxruntime", "openvino", "auto"],
                   help="torch (default for weights), onnxruntime (default for an .onnx file) or openvino "
                        "(default for an OpenVINO .xml); weights are exported on the fly; auto: the runtime and "
                        "precision measured fastest on this CPU's instruction set (said on stderr)")
    p.add_argument("--quantize", choices=["int8", "int8-static"],
                   help="with --runtime onnxruntime or openvino and weights: run the int8 model (see vitkit "
                        "convert --to onnx / openvino)")


def add_hf_flags(p: argparse.ArgumentParser, split_help: str) -> None:
    """--hf-split, --image-key, --label-key: a Hugging Face dataset's split and columns."""
    p.add_argument("--hf-split", help=f"hf: datasets: {split_help}")
    p.add_argument("--image-key", help="hf: datasets: the image column (default: the one Image column)")
    p.add_argument("--label-key", help="hf: datasets: the label column (default: the one ClassLabel column)")
