"""Deployment speed and int8 accuracy: vitkit on ONNX Runtime against timm in PyTorch, one run.

Speed. For each model and batch size, every path computes the same function (timm's random
weights loaded into vitkit, then exported), and the paths are timed in turns, ``--rounds``
rounds with the order reversed every other round, so drift of the machine hits all alike:

- ``timm fp32``, ``timm bf16`` (autocast): timm in PyTorch, inference_mode;
- ``vitkit fp32``, ``vitkit bf16``: vitkit in PyTorch inside ``fast_inference``, one call on
  torch's threads (a library user's ``model(x)``); ``vitkit bf16 in parts`` (fp32 without native
  bf16): the same with the batch cut into one part per thread (``vitkit.parallel.for_inference``),
  as ``vitkit predict`` and ``eval`` run it; ``timm bf16 in parts``: timm's model in those parts,
  for the record (not a path timm offers: left out of "timm's fastest", and reported as a second
  ratio, ``fastest_over_timm_in_parts``); with ``--compile``, ``vitkit bf16 compiled``:
  ``vitkit.models.compile_for_inference`` (inductor with freezing: weights folded in and
  prepacked, norms and GELU fused), and, so that timm's fastest PyTorch path is not handicapped,
  ``timm bf16 compiled``: timm's model through the same ``torch.compile`` call. On a CPU without
  native bf16 (no AVX-512 BF16 or AMX) torch emulates bf16 many times slower than fp32: there
  the bf16 paths are left out (the results say so) and the compiled paths run in fp32;
- ``ort fp32``, ``ort int8``, ``ort int8-static``: ``vitkit.export_onnx`` (dynamo exporter)
  run by ONNX Runtime's CPU provider with the same thread count; int8 is ONNX Runtime's
  dynamic quantization, int8-static its QDQ form (calibrated here on random images: speed only);
- ``ort fused fp32``, ``ort fused int8``: the same fp32 file through ONNX Runtime's transformer
  optimizer (``model_type="vit"``: its ``Attention``, ``SkipLayerNormalization`` and ``BiasGelu``
  ops), then dynamic int8 with ``Attention`` quantized too. Not a vitkit path: it measures the
  choice of the exported graph (separate q/k/v in standard operators, see
  ``vitkit.deploy.onnx_export``), and is left out of "vitkit's fastest";
- ``ov bf16``, ``ov int8`` (when OpenVINO is installed): ``vitkit.deploy.openvino.export_openvino``
  compiled for the CPU with the same thread count (a batch in parts on OpenVINO's throughput
  streams, as ``OpenVinoModel`` runs it), bf16 inference precision (``ov fp32`` without
  native bf16), and NNCF's int8
  (calibrated on the same random images: speed only; the float parts in OpenVINO's default
  precision).

Reported: median img/s per path, the ratios of vitkit's fastest path to timm's fastest and of
ORT fp32 to timm fp32, and each path against the machine's limit (limits.py, measured in the
same run, at its start and again at its end: each peak the better reading): the GEMM peak of
its precision (fp32, bf16, int8: a 2048x3072x768 product, ViT-B's MLP shape cut to fit) divided
by the model's GFLOPs per image is the img/s a model made only of such GEMMs would reach, and
each path's fraction of it; the clock at the start and the end.

Accuracy (``--weights RUN``, e.g. the folder ``make demo`` prints): Fashion-MNIST test top-1
of the trained model in PyTorch fp32, ONNX Runtime fp32, int8 and int8-static (calibrated on
256 training images), OpenVINO bf16 and int8 (NNCF, the same images), and how many predictions
each changes.

    python benchmarks/bench_onnx.py --weights runs/NAME              # full run, ~15 min on 2 cores
    python benchmarks/bench_onnx.py --quick                          # smoke: ViT-Ti, batch 1 (to SMOKE_DIR)
    python benchmarks/bench_onnx.py --models vit_small_patch14_dinov2 vit_base_patch16_siglip_224 \
        --img-size 224 --batch-sizes 32 --compile                    # the later ViTs' rows

Each model runs at its own image size (timm's default for that name) unless ``--img-size`` is given.

This is a benchmark, not a test: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import tempfile
import time

import torch

import vitkit
from vitkit.deploy import OnnxModel, export_onnx
from vitkit.deploy.onnx_export import finish_export
from vitkit.machine import native_bf16_cpu
from vitkit.models import compile_for_inference, get_model_config
from vitkit.models.complexity import complexity
from vitkit.parallel import for_inference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling benchmark, however run
from bench_inference import build_pair, dated_name, machine_info, results_path, write_json_atomic  # noqa: E402
from limits import at_limit, close_limits, describe  # noqa: E402

DEFAULT_MODELS = ["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224"]
DEFAULT_BATCH_SIZES = [1, 32]
TIMM_PATHS = ("timm fp32", "timm bf16", "timm bf16 compiled", "timm fp32 compiled")
#: measured for the record, not offered by vitkit (see the module docstring)
REFERENCE_PATHS = ("ort fused fp32", "ort fused int8", "timm bf16 in parts", "timm fp32 in parts")
EVAL_BATCH = 500  # vitkit eval --batch-size default


# ---------------------------------------------------------------------------- paths


def paths_for(timm_model, vk_model, folder: str, compile_fast: bool, bf16: bool) -> dict:
    """name -> a function running one batch, for every path of the module docstring (the bf16
    ones only where ``bf16`` is native). The ONNX files have a dynamic batch and the compiled
    modules recompile per shape: one set serves every batch size."""
    def torch_path(model, bf16: bool, fast: bool):
        def forward(x):
            autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
            keep = vitkit.models.fast_inference(model) if fast else contextlib.nullcontext()
            with torch.inference_mode(), autocast, keep:
                return model(x)
        return forward

    precisions = ("fp32", "bf16") if bf16 else ("fp32",)
    paths = {}
    for precision in precisions:
        paths[f"timm {precision}"] = torch_path(timm_model, precision == "bf16", False)
        paths[f"vitkit {precision}"] = torch_path(vk_model, precision == "bf16", True)
    fastest = precisions[-1]  # batch parts and compilation: in the machine's fastest precision
    paths[f"vitkit {fastest} in parts"] = torch_path(for_inference(vk_model), bf16, True)
    paths[f"timm {fastest} in parts"] = torch_path(for_inference(timm_model), bf16, False)
    if compile_fast:
        paths[f"timm {precisions[-1]} compiled"] = torch_path(compile_for_inference(timm_model), bf16, False)
        paths[f"vitkit {precisions[-1]} compiled"] = torch_path(compile_for_inference(vk_model), bf16, False)
    h, w = vk_model.config.img_size
    calibration = torch.randint(0, 256, (32, 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    # one dynamo trace serves the three files (a trace of ViT-Ti took 20 s on a 2.45 GHz Zen 3): the int8
    # ones are finished from the fp32 graph as export_onnx(quantize=...) finishes its own
    fp32 = export_onnx(vk_model, os.path.join(folder, "fp32.onnx"))
    paths["ort fp32"] = OnnxModel(fp32, threads=torch.get_num_threads())
    for name, quantize in (("ort int8", "int8"), ("ort int8-static", "int8-static")):
        file = finish_export(fp32, os.path.join(folder, f"{quantize}.onnx"), vk_model.config, "dynamo", quantize,
                             calibration if quantize == "int8-static" else None)
        paths[name] = OnnxModel(file, threads=torch.get_num_threads())
    paths.update(ort_fused(str(fp32), folder, vk_model.config))
    if openvino_installed():
        from vitkit.deploy.openvino import OpenVinoModel, export_openvino

        for name, quantize, precision in (openvino_float(bf16), ("ov int8", "int8", None)):
            file = export_openvino(vk_model, os.path.join(folder, f"ov_{quantize or 'float'}.xml"), quantize=quantize,
                                   calibration=calibration if quantize else None)
            paths[name] = OpenVinoModel(file, threads=torch.get_num_threads(), precision=precision)
    return paths


def ort_fused(fp32_file: str, folder: str, config) -> dict:
    """The ``ort fused`` paths: ``fp32_file`` through ORT's transformer optimizer, and its
    dynamic int8 form with the fused Attention quantized as well."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    fused, fused_int8 = os.path.join(folder, "fused.onnx"), os.path.join(folder, "fused_int8.onnx")
    optimize_model(fp32_file, model_type="vit", num_heads=config.num_heads, hidden_size=config.embed_dim,
                   opt_level=0).save_model_to_file(fused)
    quantize_dynamic(fused, fused_int8, weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Gemm", "Attention"])

    def session(file):
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        run = ort.InferenceSession(file, options, providers=["CPUExecutionProvider"])
        return lambda x: torch.from_numpy(run.run(None, {run.get_inputs()[0].name: x.numpy()})[0])
    return {"ort fused fp32": session(fused), "ort fused int8": session(fused_int8)}


def limit_of(path: str, gflop: float, medians: dict, limits: dict) -> dict:
    """A path's img/s against the GEMM peak of its precision (int8 paths: the int8 peak; their
    float parts run slower than that, so this is the bound the int8 form aims at)."""
    kind = "int8_gop_s" if "int8" in path else "bf16_gflop_s" if "bf16" in path else "fp32_gflop_s"
    return {"peak": kind, **at_limit(medians[path], gflop, limits.get(kind))}


def openvino_float(bf16: bool) -> tuple:
    """(path name, quantization, precision) of OpenVINO's float path: bf16 where it is native."""
    return ("ov bf16", None, "bf16") if bf16 else ("ov fp32", None, "fp32")


def openvino_installed() -> bool:
    """OpenVINO and NNCF found as vitkit's runtime choice finds them (not imported: NNCF's torch hooks)."""
    from vitkit.deploy.fastest import installed_runtimes

    return "openvino" in installed_runtimes()


def timed(fn, x, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn(x)
    return time.perf_counter() - start


def measure(paths: dict, x: torch.Tensor, rounds: int, min_time: float) -> dict:
    """Warm up each path (compiles, ORT's first-run allocations), size the iterations so one timing
    lasts about ``min_time``, then ``rounds`` interleaved rounds; median img/s per path."""
    iters = {}
    for name, fn in paths.items():
        for _ in range(2):
            fn(x)
        one = min(timed(fn, x, 1) for _ in range(2))
        iters[name] = max(1, round(min_time / one))
    samples = {name: [] for name in paths}
    names = list(paths)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            samples[name].append(iters[name] * len(x) / timed(paths[name], x, iters[name]))
    return {name: {"median_img_s": statistics.median(s), "samples_img_s": s, "iters": iters[name]}
            for name, s in samples.items()}


# ---------------------------------------------------------------------------- accuracy


def int8_accuracy(weights: str, bf16: bool) -> dict:
    """Fashion-MNIST test top-1 of a trained model on each runtime (see the module docstring)."""
    from vitkit.deploy.quantize import calibration_images
    from vitkit.evaluate.metrics import prepare_batch
    from vitkit.train.data import load_split_tensors

    model = vitkit.from_pretrained(weights).eval()
    images, labels, _ = load_split_tensors("fashion-mnist", "test")
    x = prepare_batch(images, model.config)

    def predictions(run) -> torch.Tensor:
        """In batches of ``vitkit eval``'s default size: dynamic int8 scales activations per batch,
        so its predictions depend (slightly) on what else is in the batch."""
        with torch.inference_mode():
            return torch.cat([run(x[i:i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH)]).argmax(-1)

    out = {"weights": weights, "model": model.config.architecture, "images": len(labels)}
    reference = predictions(model)
    out["torch fp32"] = {"top1": (reference == labels).float().mean().item()}
    with tempfile.TemporaryDirectory() as folder:
        for name, quantize in (("ort fp32", None), ("ort int8", "int8"), ("ort int8-static", "int8-static")):
            file = export_onnx(model, os.path.join(folder, "m.onnx"), quantize=quantize,
                               calibration=calibration_images(model) if quantize == "int8-static" else None)
            pred = predictions(OnnxModel(file))
            out[name] = {"top1": (pred == labels).float().mean().item(),
                         "changed_predictions": int((pred != reference).sum()), "bytes": os.path.getsize(file)}
        if openvino_installed():
            from vitkit.deploy.openvino import OpenVinoModel, export_openvino

            for name, quantize, precision in (openvino_float(bf16), ("ov int8", "int8", None)):
                file = export_openvino(model, os.path.join(folder, f"ov_{quantize or 'float'}.xml"), quantize=quantize)
                pred = predictions(OpenVinoModel(file, precision=precision))
                out[name] = {"top1": (pred == labels).float().mean().item(),
                             "changed_predictions": int((pred != reference).sum()),
                             "bytes": os.path.getsize(file) + os.path.getsize(file.with_suffix(".bin"))}
    for name in ("ort int8", "ort int8-static", "ov bf16", "ov fp32", "ov int8"):
        if name in out:
            out[name]["points_below_fp32"] = 100 * (out["torch fp32"]["top1"] - out[name]["top1"])
    return out


# ---------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", help=f"default: {' '.join(DEFAULT_MODELS)}")
    p.add_argument("--batch-sizes", nargs="+", type=int, help="default: 1 32")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timings per path (default 5)")
    p.add_argument("--min-time", type=float, default=1.0, help="target seconds per timing (default 1)")
    p.add_argument("--compile", action="store_true",
                   help="also time vitkit and timm under torch.compile (bf16 where native, else fp32)")
    p.add_argument("--img-size", type=int, help="image side for every model (default: each model's own)")
    p.add_argument("--weights", help="a trained Fashion-MNIST model (run folder): measure int8's accuracy cost")
    p.add_argument("--threads", type=int, help="torch and ONNX Runtime threads (default: torch's)")
    p.add_argument("--out", help="results file or folder (default: benchmarks/results/onnx_<device>_<date>.json)")
    p.add_argument("--quick", action="store_true", help="smoke check: ViT-Ti, batch 1, 2 rounds of 0.1 s")
    args = p.parse_args(argv)
    args.models = args.models or (DEFAULT_MODELS[:1] if args.quick else DEFAULT_MODELS)
    args.batch_sizes = args.batch_sizes or ([1] if args.quick else DEFAULT_BATCH_SIZES)
    if args.quick:
        args.rounds, args.min_time = 2, 0.1
    bad_size = args.img_size is not None and args.img_size < 1
    if args.rounds < 1 or args.min_time < 0 or min(args.batch_sizes) < 1 or bad_size:
        p.error("--rounds, --batch-sizes and --img-size must be >= 1, --min-time >= 0")
    for name in args.models:  # a name or size that cannot build is one line here, not a traceback later
        try:
            config = get_model_config(name)
            if args.img_size is not None:
                config.replace(img_size=args.img_size)
        except ValueError as e:
            p.error(str(e).splitlines()[0])
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    info = machine_info(device)
    info["onnxruntime"] = __import__("onnxruntime").__version__
    out = results_path(args.out, dated_name("onnx", device, info), smoke=args.quick)
    settings = {k: getattr(args, k) for k in ("models", "batch_sizes", "img_size", "rounds", "min_time", "compile",
                                              "weights")}
    bf16 = native_bf16_cpu()
    settings.update(threads=torch.get_num_threads(), native_bf16=bf16,
                    started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
    print(f"{info['cpu_model']} | torch {info['torch']} | timm {info['timm']} | onnxruntime {info['onnxruntime']} "
          f"| threads {settings['threads']}", flush=True)
    print(describe(info["limits"]), flush=True)
    if not bf16:
        print("no native bf16 on this CPU: the bf16 paths are left out, the compiled ones run in fp32", flush=True)
    rows = []
    for name in args.models:
        size = {} if args.img_size is None else {"img_size": args.img_size}
        timm_model, vk_model = build_pair(name, torch.device("cpu"), vitkit_first=False, **size)
        gflop = complexity(vk_model.config).flops / 1e9
        h, w = vk_model.config.img_size
        with tempfile.TemporaryDirectory() as folder:
            paths = paths_for(timm_model, vk_model, folder, args.compile, bf16)
            for batch in args.batch_sizes:
                x = torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(batch))
                with torch.inference_mode():
                    expected = timm_model(x[:2])
                fp32_diff = (paths["ort fp32"](x[:2]) - expected).abs().max().item()
                results = measure(paths, x, args.rounds, args.min_time)
                medians = {k: v["median_img_s"] for k, v in results.items()}
                timm_best = max(medians[k] for k in TIMM_PATHS if k in medians)
                timm_parts = max(v for k, v in medians.items() if k.startswith("timm") and k.endswith("in parts"))
                ours = {k: v for k, v in medians.items() if k not in TIMM_PATHS + REFERENCE_PATHS}
                best = max(ours, key=ours.get)
                limit = {k: limit_of(k, gflop, medians, info["limits"]) for k in medians}
                row = {"model": name, "batch": batch, "img_size": [h, w], "gflop_per_image": gflop, "paths": results,
                       "ort_fp32_max_abs_diff_vs_timm": fp32_diff, "vitkit_fastest": best,
                       "fastest_over_timm_fastest": ours[best] / timm_best,
                       "fastest_over_timm_in_parts": ours[best] / max(timm_best, timm_parts),
                       "ort_fp32_over_timm_fp32": medians["ort fp32"] / medians["timm fp32"],
                       "limit": limit}
                rows.append(row)
                print(f"\n{name} {h}x{w} batch {batch} (ORT fp32 vs timm logits {fp32_diff:.1e}; img/s at the limit: "
                      + ", ".join(f"{k[:4]} {info['limits'][k] / gflop:.1f}"
                                  for k in ("fp32_gflop_s", "bf16_gflop_s", "int8_gop_s") if info["limits"][k])
                      + ")")
                for k, v in sorted(medians.items(), key=lambda kv: -kv[1]):
                    fraction = limit[k]["fraction_of_limit"]
                    of = "" if fraction is None else f"  {100 * fraction:5.1f}% of the {limit[k]['peak'][:4]} limit"
                    print(f"  {k:<22} {v:8.1f} img/s{of}")
                print(f"  fastest vitkit ({best}) / fastest timm: {row['fastest_over_timm_fastest']:.2f}x "
                      f"({row['fastest_over_timm_in_parts']:.2f}x counting timm in vitkit's parts); "
                      f"ORT fp32 / timm fp32: {row['ort_fp32_over_timm_fp32']:.2f}x", flush=True)
        del timm_model, vk_model
    accuracy = None
    if args.weights:
        accuracy = int8_accuracy(args.weights, bf16)
        print(f"\nint8 on {args.weights} (Fashion-MNIST test, {accuracy['images']:,} images):")
        for k in [k for k in ("torch fp32", "ort fp32", "ort int8", "ort int8-static", "ov bf16", "ov fp32", "ov int8")
                  if k in accuracy]:
            extra = (f"  ({accuracy[k]['points_below_fp32']:+.2f} points below torch fp32, "
                     f"{accuracy[k]['changed_predictions']} predictions changed)" if "points_below_fp32" in accuracy[k]
                     else "")
            print(f"  {k:<16} top-1 {100 * accuracy[k]['top1']:.2f}%{extra}")
    settings["finished"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    info["limits"] = close_limits(info["limits"], device)  # the peaks again: each the better reading
    print(f"\nat the end: {describe(info['limits'])}; each row against the better of the two readings:")
    for row in rows:
        medians = {k: v["median_img_s"] for k, v in row["paths"].items()}
        row["limit"] = {k: limit_of(k, row["gflop_per_image"], medians, info["limits"]) for k in medians}
        best = row["limit"][row["vitkit_fastest"]]
        print(f"  {row['model']} batch {row['batch']}: {row['vitkit_fastest']} at "
              f"{100 * (best['fraction_of_limit'] or 0):.1f}% of the {best['peak'][:4]} limit, timm's fastest at "
              + ", ".join(f"{k} {100 * (row['limit'][k]['fraction_of_limit'] or 0):.1f}%"
                          for k in TIMM_PATHS if k in row["limit"]))
    write_json_atomic(out, {"benchmark": "onnx", "machine": info, "settings": settings,
                            "rows": rows, "int8_accuracy": accuracy})
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
