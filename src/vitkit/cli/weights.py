"""``vitkit convert`` and ``vitkit push``: weights written in another layout, or shared on the Hub."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import List, Optional

from ..files import check_output
from .common import (
    add_calibration_flag,
    add_size_flag,
    add_threads_flag,
    fmt_bytes,
    fmt_int,
    load_model,
    print_json,
    size_of,
)


def cmd_convert(args: argparse.Namespace) -> int:
    from ..deploy.quantize import calibrates
    from ..weights import export_weights
    from ..weights.export import ExportWarning, check_destination

    onnx_only = [f for f, v in (("--exporter", args.exporter), ("--opset", args.opset)) if v is not None]
    if onnx_only and args.to != "onnx":
        raise ValueError(f"{' and '.join(onnx_only)} appl{'y' if len(onnx_only) > 1 else 'ies'} to --to onnx, not "
                         f"--to {args.to}")
    if args.quantize and args.to not in ("onnx", "openvino"):
        raise ValueError(f"--quantize applies to --to onnx and --to openvino, not --to {args.to}")
    if args.quantize == "int8-static" and args.to == "openvino":
        raise ValueError("--to openvino quantizes with --quantize int8 (NNCF, calibrated on training images)")
    if args.calibration is not None and not calibrates(args.to, args.quantize):
        raise ValueError("--calibration gives the images a calibrated int8 model is quantized on: --to openvino "
                         "--quantize int8, or --to onnx --quantize int8-static")
    if args.scan and args.to != "big_vision":
        raise ValueError(f"--scan applies to --to big_vision, not --to {args.to}")
    check_destination(args.src, args.dst, args.to)  # before the work
    replaced = _replaced(Path(args.dst))
    # a transformers DINOv2 at the size its processor makes, as transformers runs it: a graph at that size, the
    # layouts that say their input size with the table held as stored; the official files hold no input size
    model, report = load_model(args, interpolation=args.interpolation, output_loading_info=True,
                               at_processor_size=args.to not in ONE_SIZE_LAYOUTS, **size_of(args))
    _say_resampled(model, report.resampled, args.interpolation)
    if args.to in ("onnx", "openvino"):
        return _said_replaced(_convert_onnx(model, args), replaced, args.dst)
    from ..weights.export import source_half_dtype

    half = source_half_dtype(args.src) if args.to in HALF_LAYOUTS else None
    if half is not None:  # a float16 or bfloat16 source is written as it was stored, not twice its size
        model = model.to(half)
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", ExportWarning)
        out = args.written = export_weights(model, args.dst, args.to, scan=args.scan)
    for note in notes:
        print(f"vitkit convert: note: {note.message}", file=sys.stderr)
    arch = getattr(model.config, "architecture", None) or f"{model.config.objective} pre-training (vit)"
    whole = getattr(model.config, "architecture", None) or args.to in ("vitkit", "hf", "mae")
    written = model if whole else model.encoder  # layouts without a decoder hold the encoder
    from ..models.positions import parameters_at_img_size  # (one-size layouts: a held table written at img_size)
    from ..weights.export import writes_held_table

    held = writes_held_table(written, args.to)
    params = sum(p.numel() for p in written.parameters()) if held else parameters_at_img_size(written)
    info = {"src": args.src, "dst": str(out), "format": args.to, "architecture": arch, "params": params,
            "dtype": str(half).replace("torch.", "") if half else "float32"}
    if args.json:
        print_json(info)
    else:
        print(f"wrote {out} ({args.to}, {fmt_int(info['params'])} parameters"
              + (f", {info['dtype']} as the source" if half else "") + ")")
    return _said_replaced(0, replaced, args.dst)


def _say_resampled(model, resampled: List[str], interpolation: Optional[str]) -> None:
    """What loading resampled to the size asked, said (a table or filters of another size compute another function
    than the stored ones); --interpolation where nothing was resampled did nothing, and is refused before the work."""
    from ..weights.resampling import interpolation_unused

    why = interpolation_unused(resampled, model.config) if interpolation else None
    if why:
        raise ValueError(f"--interpolation {interpolation} resamples a position table or patch filters of another "
                         f"size while the weights load, and {why}: give --img-size H W to write the model at "
                         f"another size, or leave --interpolation out")
    for what in resampled:
        print(f"vitkit convert: note: resampled {what}", file=sys.stderr)


def _replaced(dst: Path) -> Optional[str]:
    """What converting into ``dst`` replaces, said after (as cp replaces a file, but said: it may not have been a
    model): a file, or the model files of a folder (None: nothing)."""
    from ..weights.load import model_files

    if dst.is_symlink() and dst.is_file():  # written as a new file beside its target, as every atomic write is
        return f"{dst} was a link to {dst.resolve()}: the link is replaced by the file, its target left as it was"
    if dst.is_file():
        return f"{dst} was there before and is replaced"
    held = sorted(p.name for p in model_files(dst)) if dst.is_dir() else []
    return f"{dst} held a model before: its {', '.join(held)} are replaced" if held else None


def _said_replaced(code: int, replaced: Optional[str], dst: str) -> int:
    if replaced and code == 0:
        print(f"vitkit convert: note: {replaced}", file=sys.stderr)
    return code


#: the layouts whose files keep a half-precision source's precision (vit_jax and big_vision files are float32)
HALF_LAYOUTS = ("vitkit", "timm", "hf", "mae")
#: layouts without an input size of their own: a transformers DINOv2 is written as stored, not at its processor's
ONE_SIZE_LAYOUTS = ("npz", "big_vision", "mae")


def _convert_onnx(model, args: argparse.Namespace) -> int:
    """--to onnx (ONNX Runtime) and --to openvino (an IR: DST.xml and DST.bin)."""
    from ..deploy import EXPORTERS, export_onnx

    params = sum(p.numel() for p in model.parameters())
    if args.to == "openvino":
        from ..deploy.openvino import export_openvino
        from ..machine import native_bf16_cpu

        out = args.written = export_openvino(model, args.dst, quantize=args.quantize, calibration=args.calibration)
        info = {"src": args.src, "dst": str(out), "weights": str(out.with_suffix(".bin")), "format": "openvino",
                "architecture": model.config.architecture, "params": params,
                "quantization": "int8-static" if args.quantize else "none",
                "bytes": out.stat().st_size + out.with_suffix(".bin").stat().st_size}
        what = "int8 (NNCF, calibrated)" if args.quantize else "fp32 weights"
        info["computes"] = "bf16" if native_bf16_cpu() else "fp32"  # OpenVINO's default float precision here
        if info["computes"] == "bf16":  # said where it is true: 6e-5 to 3e-4 off torch's fp32 (ONNX Runtime's: 1e-7)
            what += ("; OpenVINO computes its float operations in bf16 on this CPU, its default where the CPU has "
                     "bf16 (OpenVinoModel(path, precision='fp32') for fp32)")
        said = (f"wrote {out} and {out.with_suffix('.bin').name} (OpenVINO IR, {what}, {fmt_int(params)} parameters, "
                f"{fmt_bytes(info['bytes'])}; preprocessing in its runtime info)")
    else:
        exporter = args.exporter or EXPORTERS[0]
        out = args.written = export_onnx(model, args.dst, exporter=exporter, opset=args.opset, quantize=args.quantize,
                                         calibration=args.calibration)
        info = {"src": args.src, "dst": str(out), "format": "onnx", "architecture": model.config.architecture,
                "params": params, "quantization": args.quantize or "none", "exporter": exporter,
                "bytes": out.stat().st_size}
        what = {"int8": "int8 dynamic", "int8-static": "int8 static (QDQ)"}.get(args.quantize, "fp32")
        said = (f"wrote {out} (ONNX, {what}, {fmt_int(params)} parameters, {fmt_bytes(info['bytes'])}; "
                f"batch dimension dynamic, preprocessing in its metadata)")
    faster = _faster_here(args.to, args.quantize)
    if faster:
        info["fastest_here"] = faster
    if args.json:
        print_json(info)
    else:
        print(said)
        if faster:
            print(f"vitkit convert: note: on this CPU the fastest measured path is {faster}", file=sys.stderr)
    return 0


def _faster_here(to: str, quantize) -> "str | None":
    """The runtime and precision measured fastest on this CPU, when the export is not it."""
    from ..deploy.fastest import fastest

    choice = fastest()
    flag = {"onnxruntime": "onnx", "openvino": "openvino"}.get(choice.runtime)
    if flag is None or (flag, quantize) == (to, choice.quantize):
        return None
    return f"{choice.describe()}: --to {flag}" + (f" --quantize {choice.quantize}" if choice.quantize else "")


def cmd_push(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..runlock import unfinished_run
    from ..weights.hub import check_repo_id, push_to_hub, save_for_hub

    repo_id = check_repo_id(args.repo_id)  # before any work: a typo should not cost a save
    if args.dry_run is not None:
        check_output(args.dry_run, "folder", "--dry-run")
    if why := unfinished_run(args.src):
        raise FileNotFoundError(why)
    if not Path(args.src).exists():
        raise FileNotFoundError(f"weights not found: {args.src} (no such file or folder)")
    if args.dry_run is not None:
        folder = save_for_hub(args.src, args.dry_run, repo_id=repo_id)
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        if args.json:
            print_json({"repo_id": repo_id, "folder": str(folder), "files": files})
        else:
            print(f"wrote {folder} ({len(files)} files: {', '.join(files)}): what vitkit push would upload "
                  f"to {repo_id}")
        return 0
    url = push_to_hub(args.src, repo_id, token=args.token, private=args.private, revision=args.revision,
                      commit_message=args.message)
    if args.json:
        print_json({"repo_id": repo_id, "url": url})
    else:
        print(f"pushed {args.src} to {repo_id}: {url}\nload it with vitkit.from_pretrained(\"hf-hub:{repo_id}\")")
    return 0


def add_convert(verb) -> None:
    from ..train.config import CHOICES

    p = verb("convert", "convert weights between layouts")
    p.add_argument("src", help="file, folder or hf-hub:org/name")
    p.add_argument("dst", help="output file or folder")
    p.add_argument("--to", required=True,
                   choices=["vitkit", "npz", "big_vision", "timm", "hf", "mae", "onnx", "openvino"],
                   help="a pre-training model: vitkit, hf (SimMIM, MAE), mae (the official MAE .pth); "
                        "timm/npz/big_vision write its encoder; onnx: a classifier for ONNX Runtime (DST.onnx, "
                        "preprocessing in its metadata); openvino: an OpenVINO IR (DST.xml + DST.bin, the same "
                        "metadata in its runtime info)")
    p.add_argument("--quantize", choices=["int8", "int8-static"],
                   help="onnx: int8 (ONNX Runtime dynamic quantization) or int8-static (QDQ calibrated on 256 "
                        "training images of the dataset the labels name, or on --calibration); openvino: int8 (NNCF "
                        "post-training quantization calibrated on the same images; norms, softmax and GELU stay "
                        "float)")
    add_calibration_flag(p)
    p.add_argument("--exporter", choices=["dynamo", "torchscript"], help="onnx: torch.onnx.export's path "
                                                                         "(default dynamo)")
    p.add_argument("--opset", type=int, help="onnx: the ONNX opset (default: the exporter's)")
    p.add_argument("--model", help="architecture name when the source has no config")
    p.add_argument("--scan", action="store_true", help="big_vision: stack blocks on a depth axis")
    add_size_flag(p, "the model is written at (--interpolation)")
    add_threads_flag(p, "the export and int8 calibration")
    p.add_argument("--interpolation", choices=CHOICES["init_interpolation"][1:],  # (--init-interpolation's)
                   help="how a position table of another size is resampled (default: as the weights' library "
                        "does: bicubic; FlexiViT's and the official .npz files' bilinear; bilinear-aligned: the "
                        "official vit_jax code's, corners aligned)")
    p.set_defaults(func=cmd_convert)



def add_push(verb) -> None:
    p = verb("push", "share a model or a run on the Hugging Face Hub (config.json, model.safetensors and a model "
                     "card with the run's scores and figures)")
    p.add_argument("src", help="a run folder (runs/NAME), a saved model folder or a weight file")
    p.add_argument("repo_id", help="org/name on the Hub (created when missing)")
    p.add_argument("--token", help="a write token (default: HF_TOKEN or hf auth login)")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--revision", help="an existing branch to commit to (default: main)")
    p.add_argument("--message", help="the commit message")
    p.add_argument("--dry-run", metavar="DIR", help="write what would be pushed into DIR (new or empty); push "
                                                    "nothing")
    p.set_defaults(func=cmd_push)

