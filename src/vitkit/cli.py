"""``vitkit <verb>``: a thin shell over the library; every verb calls a library function.

Every verb takes ``--json`` for machine-readable output. Errors of input print one line to
stderr and exit with status 2 (``VITKIT_DEBUG=1`` shows their traceback instead).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import __version__
from .utils import Terminated, check_output, expect_worker_deaths, interrupt


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PiB"


def _table(rows: List[List[str]], header: List[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    right = [i > 0 for i in range(len(header))]

    def line(cells):
        return "  ".join(str(c).rjust(w) if r else str(c).ljust(w) for c, w, r in zip(cells, widths, right))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _preview(names: Sequence[str], n: int = 3) -> str:
    shown = ", ".join(map(str, list(names)[:n]))
    return f"{len(names)}: {shown}" + (", ..." if len(names) > n else "")


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


# ------------------------------------------------------------------------ verbs


def cmd_models(args: argparse.Namespace) -> int:
    from .models import get_model_config, list_models
    from .models.complexity import complexity

    names = list_models(args.filter)
    if not names:
        raise ValueError(f"no model matches {args.filter!r}")
    infos = [(n, complexity(get_model_config(n))) for n in names]
    if args.json:
        _print_json([{"name": n, **c.to_dict()} for n, c in infos])
        return 0
    rows = [[n, f"{c.params / 1e6:.2f}M", f"{c.macs / 1e9:.2f}", f"{c.flops / 1e9:.2f}",
             f"{c.img_size[0]}x{c.img_size[1]}", str(c.tokens)] for n, c in infos]
    print(_table(rows, ["model", "params", "GMACs", "GFLOPs", "input", "tokens"]))
    print("\nGFLOPs = 2 x GMACs (matrix products only); also accepted: size strings like 'B/16'.")
    return 0


def _source_lines(info: Dict[str, Any]) -> List[str]:
    """``vitkit info FILE``'s account of a weights source (``weights.describe_source``)."""
    lines = [f"{info['path']}",
             f"  layout      {info['format']}" + (f" ({info['source_name']})" if info.get("source_name") else ""),
             f"  tensors     {info['tensors']:,} holding {_fmt_int(info['values'])} values "
             f"({', '.join(info['dtypes'])})"]
    if info.get("pretraining"):
        lines.append(f"  holds       a {info['pretraining']} pre-training model (its encoder is described)")
    if "refused" in info:
        lines.append(f"  vitkit      cannot load it: {info['refused']}")
        return lines
    c = info["config"]
    extra = [f"{c.reg_tokens} registers" if getattr(c, "reg_tokens", 0) else "",
             f"rotary positions ({c.rope})" if getattr(c, "rope", "none") != "none" else "",
             f"pooling {c.global_pool}", f"mean {list(c.mean)} std {list(c.std)}, crop {c.crop_pct}"]
    lines.append(f"  vitkit      architecture {c.architecture!r}" + (f" ({c.name})" if c.name else "") + ": "
                 + ", ".join(e for e in extra if e))
    return lines


def cmd_info(args: argparse.Namespace) -> int:
    from .models import family_of, get_model_config
    from .models.complexity import complexity

    overrides: Dict[str, Any] = {}
    if args.img_size:
        if len(args.img_size) > 2:
            raise ValueError(f"--img-size takes one value or two (H W), not {len(args.img_size)}")
        overrides["img_size"] = tuple(args.img_size) if len(args.img_size) == 2 else (args.img_size[0],) * 2
    if args.patch_size is not None:
        overrides["patch_size"] = args.patch_size
    source: Optional[Dict[str, Any]] = None
    if Path(args.name).exists() or args.name.startswith("hf-hub:"):  # a weights file or folder: say what it is
        from .weights.pretrained import describe_source

        source = describe_source(args.name)
        if "refused" in source or source.get("pretraining") and "config" not in source:
            if args.json:
                _print_json({k: v for k, v in source.items() if k != "config"})
            else:
                print("\n".join(_source_lines(source)))
            return 2 if "refused" in source else 0
        config = source["config"].replace(**overrides)
    else:
        config = get_model_config(args.name).replace(**overrides)
    if not family_of(config).tokens:
        raise ValueError(f"{args.name} is a {config.architecture} CNN, not a ViT: `vitkit info` describes "
                         f"token costs; `vitkit models --filter {args.name}` lists its parameters and GMACs")
    c = complexity(config)
    d = c.to_dict()
    d.update(name=args.name, embed_dim=config.embed_dim, mlp_dim=config.mlp_dim,
             in_chans=config.in_chans, value_tokens=c.pixel_tokens * config.in_chans,
             value_attn_entries=(c.pixel_tokens * config.in_chans) ** 2)
    if source is not None:
        d["source"] = {**{k: v for k, v in source.items() if k != "config"}, "architecture": config.architecture,
                       "config": config.to_dict()}
    if args.json:
        _print_json(d)
        return 0
    (h, w), (ph, pw), (gh, gw) = c.img_size, c.patch_size, c.grid
    prefix = c.tokens - gh * gw
    patch_entries = c.tokens * c.tokens
    print("\n".join(_source_lines({**source, "config": config})) if source is not None else f"{args.name}")
    print(f"  input       {h} x {w} x {config.in_chans}")
    print(f"  patches     {ph} x {pw} -> grid {gh} x {gw} = {gh * gw:,} patches"
          + (f" + {prefix} prefix token{'s' if prefix > 1 else ''} = {c.tokens:,} tokens" if prefix
             else f" = {c.tokens:,} tokens"))
    print(f"  encoder     width {config.embed_dim}, {c.depth} layers, {c.heads} heads, MLP {config.mlp_dim}")
    print(f"  parameters  {_fmt_int(c.params)}")
    print(f"  compute     {c.macs / 1e9:.3f} GMACs = {c.flops / 1e9:.3f} GFLOPs per image "
          f"(attention mixing {100 * c.attn_macs_share:.1f}%)")
    print(f"  attention   {c.heads} heads x {c.tokens:,} x {c.tokens:,} = {_fmt_int(c.attn_entries_per_layer)} "
          f"weights per image and layer = {_fmt_bytes(c.attn_bytes_per_layer_fp32)} in fp32")
    print("  the quadratic cost, per head and layer:")
    print(f"    {ph}x{pw} patches as tokens   {_fmt_int(c.tokens):>12} tokens -> "
          f"{_fmt_int(patch_entries)} attention weights ({_fmt_bytes(4 * patch_entries)})")
    print(f"    each pixel a token      {_fmt_int(c.pixel_tokens):>12} tokens -> "
          f"{_fmt_int(c.pixel_attn_entries)} ({_fmt_bytes(4 * c.pixel_attn_entries)}), "
          f"{c.pixel_attn_entries / patch_entries:,.0f}x more")
    print(f"    each value a token      {_fmt_int(d['value_tokens']):>12} tokens -> "
          f"{_fmt_int(d['value_attn_entries'])} ({_fmt_bytes(4 * d['value_attn_entries'])})")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .weights import export_weights
    from .weights.export import ExportWarning

    onnx_only = [f for f, v in (("--exporter", args.exporter), ("--opset", args.opset)) if v is not None]
    if onnx_only and args.to != "onnx":
        raise ValueError(f"{', '.join(onnx_only)} apply to --to onnx, not --to {args.to}")
    if args.quantize and args.to not in ("onnx", "openvino"):
        raise ValueError(f"--quantize applies to --to onnx and --to openvino, not --to {args.to}")
    if args.quantize == "int8-static" and args.to == "openvino":
        raise ValueError("--to openvino quantizes with --quantize int8 (NNCF, calibrated on training images)")
    if args.scan and args.to != "big_vision":
        raise ValueError(f"--scan applies to --to big_vision, not --to {args.to}")
    _check_destination(args.src, args.dst, args.to)  # before the work
    model = _load(args, interpolation=args.interpolation)
    if args.to in ("onnx", "openvino"):
        return _convert_onnx(model, args)
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", ExportWarning)
        out = export_weights(model, args.dst, args.to, scan=args.scan)
    for note in notes:
        print(f"vitkit convert: note: {note.message}", file=sys.stderr)
    arch = getattr(model.config, "architecture", None) or f"{model.config.objective} pre-training (vit)"
    whole = getattr(model.config, "architecture", None) or args.to in ("vitkit", "hf", "mae")
    written = model if whole else model.encoder  # layouts without a decoder hold the encoder
    info = {"src": args.src, "dst": str(out), "format": args.to, "architecture": arch,
            "params": sum(p.numel() for p in written.parameters())}
    if args.json:
        _print_json(info)
    else:
        print(f"wrote {out} ({args.to}, {_fmt_int(info['params'])} parameters)")
    return 0


#: The files a folder of weights is read from, and those ``--to vitkit|hf`` write into one.
_FOLDER_FILES = ("config.json", "preprocessor_config.json", "model.safetensors", "pytorch_model.bin", "model.pth",
                 "model.npz")


def _check_destination(src: str, dst: str, to: str) -> None:
    """DST can be written as ``--to`` writes it (a folder for vitkit/hf, a file otherwise) and
    would not overwrite a file SRC is read from (``convert M M/model.safetensors --to timm``
    would replace the model it reads with another layout)."""
    from pathlib import Path

    from .weights.pretrained import run_model_folder

    folder = to in ("vitkit", "hf")
    if folder and Path(dst).suffix.lower() in (".safetensors", ".pth", ".pt", ".bin", ".npz", ".onnx", ".json"):
        raise ValueError(f"--to {to} writes a folder (config.json, model.safetensors, ...); DST {dst} is a file name")
    if to == "openvino" and Path(dst).suffix.lower() != ".xml":
        raise ValueError(f"--to openvino writes an IR: DST must end in .xml (its weights go beside it as .bin), "
                         f"not {dst}")
    check_output(dst, "folder" if folder else "file", "DST")
    if to == "openvino":
        check_output(str(Path(dst).with_suffix(".bin")), "file", "DST's weights")
    source = Path(src)
    source = run_model_folder(source) or source
    reads = {source / name for name in _FOLDER_FILES} if source.is_dir() else {source}
    writes = {Path(dst) / name for name in _FOLDER_FILES} if folder else {Path(dst)}
    if to == "openvino":
        writes.add(Path(dst).with_suffix(".bin"))
    hit = sorted(str(p) for p in {p.resolve() for p in reads} & {p.resolve() for p in writes} if p.exists())
    if hit:
        raise ValueError(f"DST {dst} would overwrite {hit[0]}, which SRC {src} is read from: write somewhere else")


def _convert_onnx(model, args: argparse.Namespace) -> int:
    """--to onnx (ONNX Runtime) and --to openvino (an IR: DST.xml and DST.bin)."""
    from .deploy import EXPORTERS, export_onnx

    params = sum(p.numel() for p in model.parameters())
    if args.to == "openvino":
        from .deploy.openvino import export_openvino

        out = export_openvino(model, args.dst, quantize=args.quantize)
        info = {"src": args.src, "dst": str(out), "weights": str(out.with_suffix(".bin")), "format": "openvino",
                "architecture": model.config.architecture, "params": params,
                "quantization": "int8-static" if args.quantize else "none",
                "bytes": out.stat().st_size + out.with_suffix(".bin").stat().st_size}
        what = "int8 (NNCF, calibrated)" if args.quantize else "fp32 weights"
        said = (f"wrote {out} and {out.with_suffix('.bin').name} (OpenVINO IR, {what}, {_fmt_int(params)} parameters, "
                f"{_fmt_bytes(info['bytes'])}; preprocessing in its runtime info)")
    else:
        exporter = args.exporter or EXPORTERS[0]
        out = export_onnx(model, args.dst, exporter=exporter, opset=args.opset, quantize=args.quantize)
        info = {"src": args.src, "dst": str(out), "format": "onnx", "architecture": model.config.architecture,
                "params": params, "quantization": args.quantize or "none", "exporter": exporter,
                "bytes": out.stat().st_size}
        what = {"int8": "int8 dynamic", "int8-static": "int8 static (QDQ)"}.get(args.quantize, "fp32")
        said = (f"wrote {out} (ONNX, {what}, {_fmt_int(params)} parameters, {_fmt_bytes(info['bytes'])}; "
                f"batch dimension dynamic, preprocessing in its metadata)")
    faster = _faster_here(args.to, args.quantize)
    if faster:
        info["fastest_here"] = faster
    if args.json:
        _print_json(info)
    else:
        print(said)
        if faster:
            print(f"vitkit convert: note: on this CPU the fastest measured path is {faster}", file=sys.stderr)
    return 0


def _faster_here(to: str, quantize) -> "str | None":
    """The runtime and precision measured fastest on this CPU, when the export is not it."""
    from .deploy.fastest import fastest

    choice = fastest()
    flag = {"onnxruntime": "onnx", "openvino": "openvino"}.get(choice.runtime)
    if flag is None or (flag, quantize) == (to, choice.quantize):
        return None
    return f"{choice.describe()}: --to {flag} --quantize {choice.quantize}"


def cmd_push(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .runlock import unfinished_run
    from .weights.hub import check_repo_id, push_to_hub, save_for_hub

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
            _print_json({"repo_id": repo_id, "folder": str(folder), "files": files})
        else:
            print(f"wrote {folder} ({len(files)} files: {', '.join(files)}): what vitkit push would upload "
                  f"to {repo_id}")
        return 0
    url = push_to_hub(args.src, repo_id, token=args.token, private=args.private, revision=args.revision,
                      commit_message=args.message)
    if args.json:
        _print_json({"repo_id": repo_id, "url": url})
    else:
        print(f"pushed {args.src} to {repo_id}: {url}\nload it with vitkit.from_pretrained(\"hf-hub:{repo_id}\")")
    return 0


def _runtime_model(args: argparse.Namespace):
    """The classifier ``--weights`` names, on ``--runtime``: the vitkit model, or ONNX Runtime
    running an ``.onnx`` file (or the weights exported on the fly, ``--quantize``d if asked)."""
    from .deploy.choose import is_onnx, load_for_runtime, resolve_runtime
    from .deploy.openvino import is_openvino

    stand_ins = {k: getattr(args, k, None) for k in ("img_size", "mean", "std", "labels")}
    args.runtime, args.quantize, chosen = resolve_runtime(args.weights, args.runtime, args.quantize)
    if chosen:
        print(f"vitkit {args.verb}: runtime auto: {chosen}", file=sys.stderr)
    if is_onnx(args.weights) or is_openvino(args.weights):
        if args.model:
            raise ValueError("--model names an architecture for weights without a config; an .onnx or OpenVINO "
                             ".xml file is its own graph")
        return load_for_runtime(args.weights, args.runtime, args.quantize, **stand_ins)
    model = _classifier(_load(args), args.weights)
    model = load_for_runtime(args.weights, args.runtime, args.quantize, model=model, **stand_ins)
    if getattr(model, "quantization", None) is None:  # torch on a CPU: batches in parts, one per thread
        from .parallel import for_inference

        model = for_inference(model)
    return model


def _runtime_name(model) -> str:
    """How the model runs, for the printed line: fp32, or ONNX Runtime and its quantization."""
    quantization = getattr(model, "quantization", None)
    if quantization is None:
        return "fp32"
    if getattr(model, "export_flag", "onnx") == "openvino":  # OpenVINO computes in the precision it was given
        if quantization in ("none", "unknown"):
            return f"openvino {model.precision}"
        return "openvino int8 (NNCF, calibrated)" if quantization == "int8-static" else f"openvino {quantization}"
    return "onnxruntime " + ("fp32" if quantization == "none" else quantization)


def _load(args: argparse.Namespace, **kwargs):
    """The model behind ``--weights``/``SRC``: a run folder stands for the model it saved, and
    the verb says so on stderr (a run that has not finished has no model yet: one line)."""
    from pathlib import Path

    from .runlock import unfinished_run
    from .weights import from_pretrained
    from .weights.pretrained import run_model_folder

    source = getattr(args, "weights", None) or args.src
    if why := unfinished_run(source):
        raise FileNotFoundError(why)
    if (model_folder := run_model_folder(Path(source))) is not None:
        print(f"vitkit {args.verb}: reading {model_folder} (the model run {source} saved)", file=sys.stderr)
    return from_pretrained(source, model_name=args.model, **kwargs)


def _classifier(model, weights: str):
    """A model with classes, or one clear line: a pre-training model (or a headless encoder) has none."""
    from .selfsup import is_pretrainer

    if is_pretrainer(model):
        raise ValueError(f"{weights} is a {model.objective} pre-training model: it has no classifier; fine-tune it "
                         f"first (vitkit train --init {weights}), or read its encoder with vitkit fewshot / inspect")
    if not getattr(model.config, "num_classes", 1):
        raise ValueError(f"{weights} has no classifier head (num_classes 0): fine-tune it first "
                         f"(vitkit train --init {weights}), or read it with vitkit fewshot / inspect")
    return model


def cmd_predict(args: argparse.Namespace) -> int:
    from .evaluate import predict_images

    if args.top_k < 1:  # before the weights are read
        raise ValueError(f"--top-k must be a positive integer, not {args.top_k}")
    model = _runtime_model(args)
    preds = predict_images(model, args.images, top_k=args.top_k)
    if args.json:
        _print_json([p.to_dict() for p in preds])
        return 0
    for p in preds:
        print(p.image)
        for rank, (index, label, prob) in enumerate(p.top, 1):
            print(f"  {rank}. {label:<30} {100 * prob:6.2f}%  (class {index})")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from .inspect import inspect_model

    out = args.out or _inspect_folder(args.weights)
    check_output(out, "folder", "--out")
    model = _load(args)
    result = inspect_model(model, out, args.image, title=str(args.weights),
                           progress=not args.no_progress)
    if args.json:
        _print_json(result.to_dict())
        return 0
    for image, label, prob in result.predictions:
        print(f"{image}: {label} ({100 * prob:.1f}%)")
    print(f"{len(result.figures)} figures and {result.report} written")
    return 0


def _inspect_folder(weights: str) -> str:
    """Where ``vitkit inspect`` writes without ``--out``: beside a run's model (``runs/NAME/inspect``),
    else ``runs/inspect-NAME`` -- never the current directory itself."""
    from pathlib import Path

    from .weights.pretrained import run_model_folder

    path = Path(weights)
    if run_model_folder(path) is not None:
        return str(path / "inspect")
    if path.name == "model" and (path.parent / "config.json").is_file():  # runs/NAME/model
        return str(path.parent / "inspect")
    stem = path.stem if path.suffix else path.name
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in (stem or "model")).strip(".-") or "model"
    return str(Path("runs") / f"inspect-{name}")


#: The flags of the runtime fields whose flag is not ``--FIELD``.
RUNTIME_FLAGS = {"progress": "--no-progress", "tensorboard": "--[no-]tensorboard"}


def train_config(args: argparse.Namespace, objective: Optional[str] = None):
    """The run's TrainConfig from ``vitkit train``'s (or ``pretrain``'s) flags (recipe <- --config <- flags)."""
    from .train import resolve_config

    overrides = {name: getattr(args, name, None) for name in _train_fields()}
    overrides["objective"] = objective
    if isinstance(overrides.get("model_args"), str):
        try:
            overrides["model_args"] = json.loads(overrides["model_args"])
        except json.JSONDecodeError as e:
            raise ValueError(f"--model-args is not valid JSON ({e}): {overrides['model_args']!r}") from None
        if not isinstance(overrides["model_args"], dict):
            raise ValueError(f"--model-args must be a JSON object of model options, e.g. '{{\"depth\": 4}}', "
                             f"not {json.dumps(overrides['model_args'])}")
    if args.no_progress:
        overrides["progress"] = False
    if args.resume:
        from .train.config import RUNTIME_FIELDS, resume_conflicts, saved_field

        saved = saved_field(args.resume, "objective")
        if saved is not None and (saved == "classify") != (args.verb == "train"):
            kind, verb = ("classification", "train") if saved == "classify" else (f"{saved} pre-training", "pretrain")
            raise ValueError(f"{args.resume} is a {kind} run: resume it with vitkit {verb} --resume")
        if objective is None:
            overrides.pop("objective")  # pretrain --resume without --objective: the saved one
        conflicts = resume_conflicts(args.resume, overrides) + (["--config"] if args.config else [])
        if conflicts:
            free = ", ".join(RUNTIME_FLAGS.get(f, "--" + f.replace("_", "-")) for f in RUNTIME_FIELDS)
            raise ValueError(f"--resume continues {args.resume} as its config.json says; only "
                             f"{free} can change "
                             f"there, not "
                             f"{'; '.join(conflicts)} (for another recipe, start a new run; "
                             f"--init {args.resume} starts one from this run's model once it has finished)")
    recipe = args.recipe or (f"{objective}-fmnist" if objective else None)  # pretrain --resume: the saved
    return resolve_config(recipe, args.config, **overrides)


def _run(cfg, args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """Train (or pre-train); the summary to print, or None when it was printed as JSON or this
    process is not the one that reports (under torchrun, rank 0 reports)."""
    from .train import train
    from .train.config import RUNTIME_FIELDS

    asked = [f for f in RUNTIME_FIELDS if getattr(args, f, None) is not None] + ["progress"] * args.no_progress
    summary = train(cfg, resume=args.resume, log=lambda m: print(m, file=sys.stderr), asked=asked)
    if os.environ.get("RANK", "0") != "0":
        return None
    if args.json:
        print(json.dumps(summary))
        return None
    return summary


def _quick_run_notes(summary: Dict[str, Any], width: int = 9, cfg: Any = None) -> None:
    """The notes that keep a quick run's numbers from passing for the split's."""
    if cfg is not None and cfg.test_size is not None:
        print(f"{'note':<{width}}test scores are of the first {summary.get('test_images', cfg.test_size):,} test "
              f"images (--test-size), not the whole split")
    if summary.get("tiny"):
        print(f"{'note':<{width}}{summary['tiny']}")


def cmd_train(args: argparse.Namespace) -> int:
    cfg = train_config(args)
    check_output(cfg.runs_dir, "folder", "--runs-dir")
    if cfg.objective != "classify":  # a config file may say so; its summary is pre-training's
        raise ValueError(f"the configuration asks for {cfg.objective} pre-training: run it with vitkit pretrain")
    summary = _run(cfg, args)
    if summary is None:
        return 0
    print(f"\nrun      {summary['run_dir']}")
    print(f"model    {summary['model']} ({_fmt_int(summary['params'])} parameters, {summary['precision']})")
    def tta(key: str) -> str:  # the test score with the views it was scored with, when the run has one
        return f"; {summary['test_tta']} TTA {100 * summary[key]:.2f}%" if key in summary else ""

    print(f"test     top-1 {100 * summary['test_top1']:.2f}%  (validation {100 * summary['val_top1']:.2f}%"
          f"{tta('test_top1_tta')})")
    if "test_top1_ema" in summary:
        print(f"EMA      top-1 {100 * summary['test_top1_ema']:.2f}%  (validation "
              f"{100 * summary['val_top1_ema']:.2f}%{tta('test_top1_ema_tta')}; model_ema/)")
    print(f"time     {summary['seconds']:.0f} s for {summary['steps']:,} steps ({summary['epochs']} epochs), "
          f"{summary['train_img_s']:.0f} img/s")
    run = summary["run_dir"]
    print(f"next     vitkit eval --weights {run}   (per-class accuracy, confusion matrix)")
    print(f"         vitkit predict --weights {run} IMAGE...   |   vitkit inspect --weights {run}   (attention "
          f"maps)")
    _quick_run_notes(summary, cfg=cfg)
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    if not args.objective and not args.resume and not args.config:
        raise ValueError("--objective is required: simmim, mpp or mae (see vitkit pretrain --help)")
    cfg = train_config(args, args.objective)
    if cfg.objective == "classify" and not args.resume:  # a config file without an objective
        raise ValueError("--objective is required: simmim, mpp or mae (or objective: in the config file)")
    check_output(cfg.runs_dir, "folder", "--runs-dir")
    summary = _run(cfg, args)
    if summary is None:
        return 0
    print(f"\nrun       {summary['run_dir']}")
    print(f"model     {summary['objective']} on {summary['model']} ({_fmt_int(summary['params'])} parameters, "
          f"{summary['precision']}; {summary['train_images']:,} images, no labels)")
    acc = f", colour accuracy {100 * summary['test_colour_acc']:.1f}%" if "test_colour_acc" in summary else ""
    print(f"test      pre-training loss {summary['test_loss']:.4f}{acc}")
    if summary.get("fewshot"):
        shots = "  ".join(f"{k}-shot {100 * v:.1f}%" for k, v in summary["fewshot"].items())
        print(f"few-shot  {shots}  (frozen encoder, ridge; labels only here)")
    print(f"time      {summary['seconds']:.0f} s for {summary['steps']:,} steps ({summary['epochs']} epochs), "
          f"{summary['train_img_s']:.0f} img/s")
    print(f"next      vitkit train --init {summary['run_dir']}   (fine-tune the encoder on labels)")
    _quick_run_notes(summary, 10, cfg)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:

    from .data import datasets
    from .evaluate import plot_confusion
    from .utils import new_folder, write_json

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be a positive integer, not {args.batch_size}")
    if args.max_images is not None and args.max_images < 1:
        raise ValueError(f"--max-images must be a positive integer, not {args.max_images}")
    _check_hf_flags(args)
    if args.out:  # checked before the evaluation, not after it
        check_output(args.out, "folder", "--out")
    model = _runtime_model(args)
    names = model.config.label_names
    dataset = args.dataset or datasets.dataset_for_labels(names)
    if dataset is None:
        raise ValueError(f"the weights' classes ({_preview(names) if names else 'no label names'}) are none of "
                         f"{', '.join(datasets.CLASS_NAMES)}: pass --dataset")
    evaluate = _eval_hf if datasets.is_hf(dataset) else _eval_in_memory
    report, split, skipped, total = evaluate(args, model, dataset)
    result = {"weights": args.weights, "dataset": dataset, "split": split, "precision": _runtime_name(model),
              "tta": args.tta, **report.to_dict()}
    if args.max_images is not None:
        result["split_images"] = total
    if skipped:
        result["skipped"] = len(skipped)
    png = None
    if args.out:  # files only where asked: the confusion matrix and the numbers beside it
        with new_folder(args.out) as out:  # a failure (a full disk, a signal) removes the folder it made
            png = result["confusion_png"] = str(plot_confusion(report, out / "confusion_matrix.png"))
            write_json(out / "eval.json", result)
    if args.json:
        print(json.dumps(result))
        return 0
    tta = "" if args.tta == "none" else f", {args.tta} TTA"
    cut = args.max_images is not None and args.max_images < total
    first = f"the first {report.count:,} of {total:,}" if cut else f"{report.count:,}"
    print(f"{dataset} {split}: top-1 {100 * report.top1:.2f}%  top-5 {100 * report.top5:.2f}%  "
          f"({first} images, {_runtime_name(model)}{tta})")
    if skipped:
        print(f"skipped {len(skipped)} unusable rows (first: {skipped[0]}); see the log for why")
    for name, acc in report.per_class.items():
        print(f"  {name:<16} {100 * acc:6.2f}%")
    print(f"confusion matrix: {png} (and eval.json)" if png else "(--out DIR writes confusion_matrix.png and "
          "eval.json there)")
    return 0


def _check_hf_flags(args: argparse.Namespace) -> None:
    """The Hugging Face flags of eval and fewshot apply to --dataset hf:... alone."""
    from .data import datasets

    given = [f"--{k.replace('_', '-')}" for k in ("hf_split", "image_key", "label_key")
             if getattr(args, k, None) is not None]
    if given and not datasets.is_hf(args.dataset):
        raise ValueError(f"{', '.join(given)} {'apply' if len(given) > 1 else 'applies'} only to Hugging Face "
                         f"datasets (--dataset hf:NAME_OR_DIR)")
    if datasets.is_hf(args.dataset) and args.data_dir:
        raise ValueError(f"--data-dir does not apply to --dataset {args.dataset}: the folder or Hub name follows hf:")


def _same_classes(names, classes, dataset: str) -> None:
    from .data.datasets import class_difference

    if why := class_difference(names, classes, ("the weights", f"{dataset}'s data")):
        raise ValueError(f"the weights were trained on {why}: evaluate them on their own dataset")


def _eval_in_memory(args: argparse.Namespace, model, dataset: str):
    from .evaluate import classification_report
    from .train.loop import load_split_tensors

    images, labels, classes = load_split_tensors(dataset, args.split, args.data_dir)
    _same_classes(model.config.label_names, classes, dataset)
    total = len(labels)
    images, labels = images[:args.max_images], labels[:args.max_images]
    report = classification_report(model, images, labels, classes, args.batch_size,
                                   progress=not args.no_progress, label=f"evaluating {dataset} {args.split}",
                                   tta=args.tta)
    return report, args.split, [], total


def _eval_hf(args: argparse.Namespace, model, dataset: str):
    """A Hugging Face split through the model's evaluation pipeline (resize, centre crop)."""
    from torch.utils.data import Subset

    from .data import hf
    from .data.pipelines import from_model_config
    from .evaluate import report_over

    split = args.hf_split or ("train" if args.split == "train" else None)
    data = hf.open_splits(dataset, {args.split: split}, args.image_key, args.label_key,
                          _channels(model), from_model_config(model.config, train=False))[args.split]
    _same_classes(model.config.label_names, data.classes, dataset)
    skipped = [name for name, _ in data.skipped]
    scored = data if args.max_images is None else Subset(data, range(len(data))[:args.max_images])
    batches = hf.batches(scored, args.batch_size, 2, skipped)
    report = report_over(model, batches, data.classes, -(-len(scored) // args.batch_size), not args.no_progress,
                         f"evaluating {dataset} {data.split_name}", args.tta)
    return report, data.split_name, skipped, len(data)


def _channels(model) -> int:
    """The channels to decode image files to for ``model`` (grey for one, else RGB)."""
    return 1 if model.config.in_chans == 1 else 3


def cmd_study(args: argparse.Namespace) -> int:
    from .studies import get_study, list_studies
    from .studies.base import default_folders, options_from, run_study, summary_lines

    if args.name == "list":
        for name in list_studies():
            study = get_study(name)
            print(f"{name:<22} {study.title}")
        return 0
    study = get_study(args.name)
    options = options_from(args)
    _, out = default_folders(study, options)
    check_output(out, "folder", "--out")
    results = run_study(study, options, say=(lambda line: None) if args.json else
                        (lambda line: print(line, flush=True)))
    if args.json:
        print(json.dumps({k: results[k] for k in ("study", "verdicts", "table")}))
        return 0
    print()
    for line in summary_lines(results):
        print(line)
    print(f"\nwrote {out / (study.name + '.json')}, {study.name}.md" + (", " + study.name + ".png" if
                                                                         "figure" in results else ""))
    return 0


def cmd_fewshot(args: argparse.Namespace) -> int:
    from .data import datasets
    from .evaluate import fewshot_from_features

    if min(args.shots) < 1 or args.seeds < 1 or args.pool < 0:  # before the features are computed
        raise ValueError(f"--shots must be >= 1, --seeds >= 1 and --pool >= 0 (0: all), not {args.shots}, "
                         f"{args.seeds} and {args.pool}")
    _check_hf_flags(args)
    model = _load(args, encoder_only=True)  # a pre-training model's ViT
    features = _fewshot_features_hf if datasets.is_hf(args.dataset) else _fewshot_features_in_memory
    feats_tr, tr_y, feats_te, te_y = features(args, model)
    results = fewshot_from_features(feats_tr, tr_y, feats_te, te_y, args.shots, args.seeds,
                                    progress=not args.no_progress)
    if args.json:
        print(json.dumps({"weights": args.weights, "dataset": args.dataset, "seeds": args.seeds,
                          "results": [r.to_dict() for r in results.values()]}))
        return 0
    print(f"few-shot linear evaluation ({args.dataset}, {args.seeds} seeds, ridge to {{-1, 1}} targets)")
    for r in results.values():
        print(f"  {r.shots:>3}-shot  {100 * r.mean:6.2f}% +- {100 * r.std:.2f}")
    return 0


def _pool(n: int, pool: int):
    """The training rows shots are drawn from: a random ``pool`` of them (0: all), the same every run."""
    import torch

    if not pool or pool >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(0))[:pool]


def _fewshot_features_in_memory(args: argparse.Namespace, model):
    from .evaluate import extract_features
    from .train.loop import load_split_tensors

    tr_x, tr_y, _ = load_split_tensors(args.dataset, "train", args.data_dir)
    te_x, te_y, _ = load_split_tensors(args.dataset, "test", args.data_dir)
    pick = _pool(len(tr_y), args.pool)  # features of a random subset of the training pool are enough
    tr_x, tr_y = tr_x[pick], tr_y[pick]
    show = not args.no_progress
    return (extract_features(model, tr_x, progress=show, label="extracting train features"), tr_y,
            extract_features(model, te_x, progress=show, label="extracting test features"), te_y)


def _fewshot_features_hf(args: argparse.Namespace, model):
    import torch
    from torch.utils.data import Subset

    from .data import hf
    from .data.pipelines import from_model_config
    from .evaluate import features_over

    data = hf.open_splits(args.dataset, {"train": args.hf_split, "test": None}, args.image_key, args.label_key,
                          _channels(model), from_model_config(model.config, train=False))
    out, skipped = [], []
    for role, rows in (("train", _pool(len(data["train"]), args.pool).tolist()), ("test", None)):
        part = data[role] if rows is None else Subset(data[role], rows)
        labels: list = []

        def inputs(part=part, labels=labels):
            for x, y in hf.batches(part, 500, 2, skipped):
                labels.append(y)
                yield x

        feats = features_over(model, inputs(), -(-len(part) // 500), not args.no_progress,
                              f"extracting {role} features")
        out += [feats, torch.cat(labels)]
    if skipped:
        print(f"note: skipped {len(skipped)} unusable rows (first: {skipped[0]})", file=sys.stderr)
    return tuple(out)


def _train_fields():
    from .train import TrainConfig

    return {f.name: f for f in dataclasses.fields(TrainConfig) if f.name not in ("recipe", "progress", "objective")}


def _optional(parse):
    """A flag type that also takes ``none`` (or ``off``): switch the optional field off."""
    from .train.config import OFF

    def convert(text: str):
        return OFF if text.lower() in ("none", "off") else parse(text)

    convert.__name__ = getattr(parse, "__name__", "value")  # argparse names the type in its errors
    return convert


def _add_hf_flags(p: argparse.ArgumentParser, split_help: str) -> None:
    """--hf-split, --image-key, --label-key: a Hugging Face dataset's split and columns."""
    p.add_argument("--hf-split", help=f"hf: datasets: {split_help}")
    p.add_argument("--image-key", help="hf: datasets: the image column (default: the one Image column)")
    p.add_argument("--label-key", help="hf: datasets: the label column (default: the one ClassLabel column)")


def _add_train_flags(p: argparse.ArgumentParser, pretrain: bool = False) -> None:
    """One flag per TrainConfig field: every hyper-parameter is overridable, its help the field's
    comment. ``vitkit train`` shows classification's fields, ``vitkit pretrain`` the objectives'
    and none of those that need labels."""
    from .train import RECIPES, TrainConfig
    from .train.config import LABEL_FIELDS, OBJECTIVE_OPTIONS
    from .utils import field_comments

    recipes = [r for r in RECIPES if r.endswith("-fmnist") and r.split("-")[0] in ("simmim", "mpp", "mae")]
    if pretrain:
        p.add_argument("--recipe", choices=recipes, help="named recipe whose values replace the defaults "
                       "(a config file and flags override it) [default: OBJECTIVE-fmnist]")
    else:
        p.add_argument("--recipe", choices=[r for r in RECIPES if r not in recipes],
                       help=field_comments(TrainConfig)["recipe"])
    p.add_argument("--config", help="YAML or JSON file of training options (over the recipe; flags win)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    comments = field_comments(TrainConfig)
    hidden = set(LABEL_FIELDS) | {"init_head", "alpha", "tau", "mixup_switch_prob"} if pretrain else \
        set(OBJECTIVE_OPTIONS) | {"fewshot"}
    for name, f in _train_fields().items():
        if name in hidden:
            continue
        flag, kind = "--" + name.replace("_", "-"), str(f.type)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        shown = "none" if default is None else json.dumps(default) if isinstance(default, dict) else default
        help = comments.get(name, "").replace("%", "%%") + f" [default: {shown}"
        help += "; 'none' unsets it]" if "Optional" in kind else "]"
        if name == "model_args":
            p.add_argument(flag, metavar="JSON", help=help)
        elif name == "betas":
            p.add_argument(flag, type=float, nargs=2, metavar=("B1", "B2"), help=help)
        elif "bool" in kind:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help)
        else:
            parse = int if "int" in kind else float if "float" in kind else str
            p.add_argument(flag, type=_optional(parse) if "Optional" in kind else parse, help=help)


# ------------------------------------------------------------------------ parser


def _add_runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", choices=["torch", "onnxruntime", "openvino", "auto"],
                   help="torch (default for weights), onnxruntime (default for an .onnx file) or openvino "
                        "(default for an OpenVINO .xml); weights are exported on the fly; auto: the runtime and "
                        "precision measured fastest on this CPU's instruction set (said on stderr)")
    p.add_argument("--quantize", choices=["int8", "int8-static"],
                   help="with --runtime onnxruntime or openvino and weights: run the int8 model (see vitkit "
                        "convert --to onnx / openvino)")


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes are one line like every other input error (exit 2), with the flag
    meant when one is close, instead of argparse's usage block. No abbreviations: ``--epoch 3``
    would be read as ``--epochs 3``, and a typo would silently start a long run."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)  # the verbs' parsers are made by this class too
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)  # for the hints of error()
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        if message.startswith("the following arguments are required"):  # a misspelt flag is why, often
            unknown = [w for w in getattr(self, "_given", []) if w.startswith("--")
                       and w.split("=")[0] not in self._option_string_actions]
            message += self._meant(unknown)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _meant(self, words: Sequence[str]) -> str:
        import difflib

        flags = [f for f in self._option_string_actions if f.startswith("--")]
        guesses = [g for word in words if word.startswith("-")
                   for g in difflib.get_close_matches(word.split("=")[0], flags, n=1)]
        return f" (did you mean {', '.join(dict.fromkeys(guesses))}?)" if guesses else ""

    def refuse_empty(self, args: argparse.Namespace) -> None:
        """An empty string is no path or name: ``--out ""`` would mean the current folder, or
        nothing at all (``--dry-run ""`` would push for real)."""
        for action in self._actions:
            value = getattr(args, action.dest, None)
            if value == "" or (isinstance(value, list) and any(v == "" for v in value)):
                name = action.option_strings[-1] if action.option_strings else action.dest.upper()
                self.error(f"argument {name}: an empty value (give a path or a name)")

    def unknown(self, extra: List[str]):
        self.error(f"unrecognized arguments: {' '.join(extra)}{self._meant(extra)}")


def build_parser() -> argparse.ArgumentParser:
    from .train.config import CHOICES

    parser = _Parser(prog="vitkit", description="Vision Transformers: build, "
                     "convert, inspect and run ViT-family models.")
    parser.add_argument("--version", action="version", version=f"vitkit {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    p = verb("models", "list the registered models with parameters, compute and tokens")
    p.add_argument("--filter", default="*", help="shell-style name pattern, e.g. 'vit_base*'")
    p.set_defaults(func=cmd_models)

    p = verb("info", "parameters, FLOPs, tokens and attention memory of a model; what a weights file or folder is")
    p.add_argument("name", help="registered name, size string ('B/16'), or a weights file / folder / hf-hub:org/name "
                                "(its layout and the architecture it loads as, before loading it)")
    p.add_argument("--img-size", type=int, nargs="+", metavar="PX", help="H W (or one value)")
    p.add_argument("--patch-size", type=int, metavar="P")
    p.set_defaults(func=cmd_info)

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
                        "training images of the dataset the labels name); openvino: int8 (NNCF post-training "
                        "quantization calibrated on the same images; norms, softmax and GELU stay float)")
    p.add_argument("--exporter", choices=["dynamo", "torchscript"], help="onnx: torch.onnx.export's path "
                                                                         "(default dynamo)")
    p.add_argument("--opset", type=int, help="onnx: the ONNX opset (default: the exporter's)")
    p.add_argument("--model", help="architecture name when the source has no config")
    p.add_argument("--scan", action="store_true", help="big_vision: stack blocks on a depth axis")
    p.add_argument("--interpolation", default="bicubic", choices=["bicubic", "bilinear"])
    p.set_defaults(func=cmd_convert)

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

    p = verb("predict", "top-k classes of images")
    p.add_argument("images", nargs="+", help="image files")
    p.add_argument("--weights", required=True, help="file, folder, hf-hub:org/name or an .onnx file")
    p.add_argument("--model", help="architecture name when the weights have no config")
    p.add_argument("--top-k", type=int, default=5)
    _add_runtime_flags(p)
    p.add_argument("--img-size", type=int, nargs="+", metavar="PX",
                   help="an .onnx file without vitkit metadata: its input H W (or one value)")
    p.add_argument("--mean", type=float, nargs="+", help="an .onnx file without vitkit metadata: per-channel mean")
    p.add_argument("--std", type=float, nargs="+", help="an .onnx file without vitkit metadata: per-channel std")
    p.add_argument("--labels", nargs="+", help="an .onnx file without vitkit metadata: class names")
    p.set_defaults(func=cmd_predict)

    p = verb("eval", "top-1, top-5, per-class accuracy and a confusion-matrix PNG")
    p.add_argument("--weights", required=True, help="file, folder, hf-hub:org/name or an .onnx file")
    p.add_argument("--dataset", help="fashion-mnist, cifar10, cifar100 or hf:NAME_OR_DIR (default: the one "
                                     "whose classes the weights name)")
    p.add_argument("--data-dir")
    p.add_argument("--split", default="test", choices=["train", "test"])
    _add_hf_flags(p, "the split to score (default: --split train's train, else test, or validation)")
    p.add_argument("--model", help="architecture name when the weights have no config")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--max-images", type=int, metavar="N",
                   help="score only the split's first N images, for a quick check of a large set (default: all)")
    p.add_argument("--tta", default="none", choices=CHOICES["test_tta"],
                   help="test-time augmentation: flip scores the mean probabilities of each image and its mirror, "
                        "flip-shift of those and their one-pixel shifts up, down, left and right (10 views; for "
                        "classes a mirror and a small shift do not change) [default: none]")
    _add_runtime_flags(p)
    p.add_argument("--out", metavar="DIR", help="folder to write confusion_matrix.png and eval.json into "
                                                "(default: print only, write nothing)")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.set_defaults(func=cmd_eval)

    p = verb("fewshot", "the paper's few-shot linear evaluation of frozen features")
    p.add_argument("--weights", required=True, help="file, folder or hf-hub:org/name")
    p.add_argument("--dataset", default="fashion-mnist", help="fashion-mnist, cifar10, cifar100 or hf:NAME_OR_DIR")
    p.add_argument("--data-dir")
    _add_hf_flags(p, "the split shots are drawn from (default: train; tested on test, or validation)")
    p.add_argument("--shots", type=int, nargs="+", default=[1, 5, 10, 25])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--pool", type=int, default=10_000,
                   help="training images to draw shots and the held-out split from (0: all)")
    p.add_argument("--model", help="architecture name when the weights have no config")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.set_defaults(func=cmd_fewshot)

    p = verb("inspect", "the paper's analyses as PNG figures and a self-contained report.html")
    p.add_argument("--weights", required=True, help="file, folder or hf-hub:org/name")
    p.add_argument("--image", nargs="+", help="image files (default: scikit-image's sample photos, or "
                                             "Fashion-MNIST test images for a 28x28 grey model)")
    p.add_argument("--out", metavar="DIR", help="folder to write the figures and report.html into (default: "
                                                "RUN/inspect for a run's model, else runs/inspect-NAME)")
    p.add_argument("--model", help="architecture name when the weights have no config")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.set_defaults(func=cmd_inspect)

    p = verb("study", "the paper's experiments as studies: runs over seeds, a table, a figure and a verdict")
    p.add_argument("name", help="the study (list: name them)")
    from .studies.base import add_options

    add_options(p)
    p.set_defaults(func=cmd_study)

    p = verb("train", "train a ViT (default: Fashion-MNIST, a few minutes on a CPU)")
    _add_train_flags(p)
    p.set_defaults(func=cmd_train)

    p = verb("pretrain", "self-supervised pre-training of a ViT on images without labels: SimMIM, the paper's "
                         "masked patch prediction or MAE (default: Fashion-MNIST's 60k training images)")
    p.add_argument("--objective", choices=["simmim", "mpp", "mae"],
                   help="simmim: masked blocks' pixels by L1 (arXiv 2111.09886); mpp: the ViT paper's masked patch "
                        "prediction (3-bit mean colour); mae: masked autoencoder (arXiv 2111.06377)")
    _add_train_flags(p, pretrain=True)
    p.set_defaults(func=cmd_pretrain)
    return parser


# ------------------------------------------------------------------------ the error boundary


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM while cleaning up ends it at once
    expect_worker_deaths()  # sent to the process group, it ends the DataLoader workers too
    interrupt(Terminated())  # now, or after a native import (raised inside one, it would abort)


def _on_sigint(signum, frame):
    interrupt(KeyboardInterrupt())  # Python's own handler, made to wait out native imports too


def describe_error(e: BaseException) -> str:
    """One line for an exception that reached the command line: the message of an input error
    as it is, the others named in plain words (the traceback is one VITKIT_DEBUG=1 away)."""
    from .utils import is_disk_full

    text = " ".join(str(e).split()) if str(e).strip() else ""
    if text.startswith("Caught ") and "Original Traceback" in text:  # re-raised from a DataLoader worker
        last = str(e).strip().splitlines()[-1]
        text = last.split(": ", 1)[1].strip() if ": " in last else last.strip()
    if is_disk_full(e, "."):
        where = f" while writing {e.filename}" if getattr(e, "filename", None) else ""
        return text if "no space left on device while writing" in text else \
            f"no space left on device{where}: free some space and run it again"
    if isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and any(
            words in text for words in ("can't allocate memory", "DefaultCPUAllocator", "out of memory"))):
        return (f"out of memory ({text or 'MemoryError'}): use a smaller --batch-size, --img-size or model, or "
                f"free memory")
    if isinstance(e, RecursionError):
        return "the input is nested too deeply to read (a recursion limit was reached)"
    if isinstance(e, OSError) and e.filename is not None and e.strerror:  # not "[Errno 13] ...: 'x'"
        return f"{e.strerror}: {e.filename}"
    if isinstance(e, (ValueError, OSError)) or _is_user_error(e):
        return text or type(e).__name__
    return (f"unexpected {type(e).__name__}: {text or 'no detail'} (VITKIT_DEBUG=1 shows where; please report it "
            f"if the input was sound)")


def _is_user_error(e: BaseException) -> bool:
    """vitkit's own errors of input that are not ValueError/OSError (a missing extra, a diverged run)."""
    from .utils import MissingExtra

    loop = sys.modules.get("vitkit.train.loop")
    return isinstance(e, MissingExtra) or (loop is not None and isinstance(e, loop.NonFiniteLoss))


def _one_line_warnings(verb: str):
    """Warnings as one line each (``vitkit VERB: note: ...``) instead of Python's two lines with a
    source line; each said once (a model built twice would say its note twice); returns the previous hook."""
    previous = warnings.showwarning
    said = set()

    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        if text not in said:
            said.add(text)
            print(f"vitkit {verb}: note: {text}", file=sys.stderr)

    warnings.showwarning = show
    return previous


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: one verb, and every way it can end as one line on stderr: 0 done, 2 an
    error (said in words; ``VITKIT_DEBUG=1`` shows its traceback), 130 Ctrl-C, 143 SIGTERM."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if extra:  # said by the verb's own parser, which knows the flags that were meant
        (verbs.get(getattr(args, "verb", None)) or parser).unknown(extra)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    verbs[args.verb].refuse_empty(args)
    debug = bool(os.environ.get("VITKIT_DEBUG"))
    main_thread = threading.current_thread() is threading.main_thread()
    previous_term = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    # Ctrl-C: only where Python's handler is installed (a background job ignores SIGINT: it still does)
    previous_int = signal.signal(signal.SIGINT, _on_sigint) \
        if main_thread and signal.getsignal(signal.SIGINT) is signal.default_int_handler else None
    previous_warn = _one_line_warnings(args.verb)
    previous_chld = signal.getsignal(signal.SIGCHLD) if main_thread else None  # see expect_worker_deaths
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as e:
        if debug:
            raise
        signal_name = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"
        print(f"vitkit {args.verb}: stopped by {signal_name}; partial files were removed", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    except Exception as e:
        if debug:
            raise
        print(f"vitkit {args.verb}: error: {describe_error(e)}", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = previous_warn
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
        if main_thread and previous_chld is not None and signal.getsignal(signal.SIGCHLD) != previous_chld:
            signal.signal(signal.SIGCHLD, previous_chld)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
