"""What the verbs share: the numbers and tables they print, the model behind ``--weights`` (a
run folder stands for the model it saved) on the runtime asked for, and the flags several verbs take."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, List


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


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def load_model(args: argparse.Namespace, **kwargs):
    """The model behind ``--weights``/``SRC`` (``deploy.choose.read_weights``): a run folder stands for
    the model it saved, and the verb says so on stderr."""
    from ..deploy.choose import read_weights

    source = getattr(args, "weights", None) or args.src
    return read_weights(source, args.model, say_for(args.verb), **kwargs)


def add_threads_flag(p: argparse.ArgumentParser, work: str) -> None:
    """``--threads`` for a verb whose time is the model's: a process that shares the CPU should take its share,
    and torch's default takes every core (``use_threads`` sets it before the weights are read)."""
    p.add_argument("--threads", type=int, metavar="N",
                   help=f"CPU threads for {work} (default: torch's, every core; processes that share a CPU "
                        f"should split it)")
    p.set_defaults(sets_threads=True)


def check_threads(threads) -> None:
    """One line for a thread count this process cannot use (torch crashed past about 10,000)."""
    from ..machine import usable_cores

    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, not {threads}")
    if threads is not None and threads > usable_cores():
        raise ValueError(f"--threads must be at most the {usable_cores()} core(s) this process may use, not "
                         f"{threads}")


def use_threads(args: argparse.Namespace) -> None:
    """The verb's ``--threads`` (from ``add_threads_flag``), checked and given to torch, whose count the ONNX
    Runtime and OpenVINO models take too."""
    if getattr(args, "sets_threads", False) and args.threads is not None:
        check_threads(args.threads)
        import torch

        torch.set_num_threads(args.threads)


def add_size_flag(p: argparse.ArgumentParser, what: str) -> None:
    """``--img-size`` for a verb that reads weights as a model (convert, fewshot, inspect): the size it runs at,
    and the one a bare state dict's table of no square grid is read at, which its error asks for."""
    p.add_argument("--img-size", type=int, nargs="+", metavar="PX",
                   help=f"H W (or one value): the size {what}, its position table resampled to it; a bare state "
                        f"dict whose table holds no square grid is read at it")


def size_of(args: argparse.Namespace) -> dict:
    """``load_model``'s ``img_size`` from ``--img-size`` (none where it was not given)."""
    from ..models.sizes import one_size

    return {"img_size": one_size(args.img_size)} if getattr(args, "img_size", None) else {}


#: the stand-in flags' argparse names (an .onnx file without vitkit metadata; a bare state dict's normalisation)
STAND_INS = ("img_size", "mean", "std", "labels")


def add_stand_in_flags(p: argparse.ArgumentParser) -> None:
    """What an .onnx file without vitkit's metadata needs (and a bare state dict's normalisation): `vitkit predict`
    and `vitkit serve` take the same."""
    p.add_argument("--img-size", type=int, nargs="+", metavar="PX",
                   help="an .onnx file without vitkit metadata: its input H W (or one value); a bare state dict "
                        "whose position table holds no square grid: the size it was trained at")
    p.add_argument("--mean", type=float, nargs="+",
                   help="an .onnx file without vitkit metadata or a bare state dict: per-channel mean")
    p.add_argument("--std", type=float, nargs="+",
                   help="an .onnx file without vitkit metadata or a bare state dict: per-channel std")
    p.add_argument("--labels", nargs="+", help="an .onnx file without vitkit metadata: class names")


def stand_ins_of(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k, None) for k in STAND_INS}


def runtime_model(args: argparse.Namespace):
    """The classifier ``--weights`` names, on ``--runtime`` (``deploy.choose.load_classifier``)."""
    from ..deploy.choose import load_classifier

    return load_classifier(args.weights, args.runtime, args.quantize, args.model, say_for(args.verb),
                           args.calibration, **stand_ins_of(args))


def runtime_name(model) -> str:
    from ..deploy.choose import runtime_label

    return runtime_label(model)


def say_for(verb: str):
    """A line on stderr as the verb's own (``vitkit VERB: ...``), printed at once."""
    return lambda line: print(f"vitkit {verb}: {line}", file=sys.stderr, flush=True)


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", choices=["torch", "onnxruntime", "openvino", "auto"],
                   help="torch (default for weights), onnxruntime (default for an .onnx file) or openvino "
                        "(default for an OpenVINO .xml); weights are exported on the fly; auto: the runtime and "
                        "precision measured fastest on this CPU's instruction set (said on stderr)")
    p.add_argument("--quantize", choices=["int8", "int8-static"],
                   help="with --runtime onnxruntime or openvino and weights: run the int8 model (see vitkit "
                        "convert --to onnx / openvino)")
    add_calibration_flag(p)


def add_calibration_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibration", metavar="FOLDER|DATASET",
                   help="the images a calibrated int8 model is quantized on (OpenVINO int8, ONNX int8-static): a "
                        "folder of image files like those the model will see (256 drawn) or a built-in dataset "
                        "(default: the dataset the model's classes name)")


def add_hf_flags(p: argparse.ArgumentParser, split_help: str) -> None:
    """--hf-split, --image-key, --label-key: a Hugging Face dataset's split and columns."""
    p.add_argument("--hf-split", help=f"hf: datasets: {split_help}")
    p.add_argument("--image-key", help="hf: datasets: the image column (default: the one Image column)")
    p.add_argument("--label-key", help="hf: datasets: the label column (default: the one ClassLabel column)")
