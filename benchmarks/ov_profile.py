"""Where an OpenVINO int8 model's time goes, and the ratio to timm its matrix products alone allow.

``bench_onnx.py`` gives vitkit's fastest path (OpenVINO int8 on a CPU with VNNI) as a ratio to
timm's fastest. This says what bounds that ratio: the model is exported as ``vitkit convert --to
openvino --quantize int8`` exports it (calibrated on random images: speed only), compiled with
OpenVINO's per-layer counters, and run on one stream of one thread at the batch one of
``OpenVinoModel``'s streams gets (a batch of 32 on 2 cores: 16), as it runs in ``predict``.
Reported: img/s on that stream, the time by operation kind (OpenVINO's node type and the kernel
it chose), and the int8 products' share (``FullyConnected*``: the linear layers).

The ceiling: if every operation but the int8 products took no time, one stream would run at
``img/s / share``, and ``--streams`` streams (one per core) at that many times it. With
``--timm-img-s`` (timm's fastest on the same machine and batch, from a ``bench_onnx.py`` row,
or ``--onnx-json`` to read it), the ceiling's ratio to it: the most any change outside the
products could give. The counters cost a little time; the shares are what is read.

    python benchmarks/ov_profile.py --model vit_base_patch16_siglip_224 \\
        --onnx-json benchmarks/results/onnx_later_cpu-amd-epyc-zen4_2026-11-29_streams-first.json
    python benchmarks/ov_profile.py --quick        # smoke: ViT-Ti at 32 px (to SMOKE_DIR)

This is a benchmark, not a test: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

import vitkit
from vitkit.deploy.openvino import export_openvino

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling benchmark, however run
from bench_inference import dated_name, machine_info, refuse, results_path, write_json_atomic  # noqa: E402

#: OpenVINO's node types of the linear layers (its legacy form included): int8 where their kernel's name says so
PRODUCTS = ("FullyConnected", "FullyConnectedQuantizedLegacy")


def int8_product(kind: str) -> bool:
    """A kind (node type and kernel) is an int8 linear layer: the kept-float first and last layers are not."""
    node, kernel = kind.split(" ", 1)
    return node in PRODUCTS and "i8" in kernel.lower()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: vit_base_patch16_siglip_224 (--quick: vit_tiny_patch16_224)")
    p.add_argument("--img-size", type=int, default=None, help="default: the model's own")
    p.add_argument("--batch", type=int, default=16, help="images per stream (default 16: a batch of 32 on 2 streams)")
    p.add_argument("--streams", type=int, default=None, help="streams the ceiling counts (default: the cores)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timm-img-s", type=float, default=None, help="timm's fastest img/s on this machine and batch")
    p.add_argument("--onnx-json", default=None, help="a bench_onnx.py results file to read timm's fastest from")
    p.add_argument("--quick", action="store_true", help="smoke check: ViT-Ti at 32 px, batch 2, one round")
    p.add_argument("--out", default=None, help="results file or folder (default: benchmarks/results/)")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.img_size, args.batch, args.rounds = args.model or "vit_tiny_patch16_224", 32, 2, 1
    args.model = args.model or "vit_base_patch16_siglip_224"
    for name in ("batch", "rounds", "streams"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name} must be at least 1, got {value}")
    if args.timm_img_s is not None and args.onnx_json:
        p.error("give timm's speed once: --timm-img-s or --onnx-json")
    if args.onnx_json and not os.path.isfile(args.onnx_json):
        p.error(f"--onnx-json {args.onnx_json}: no such file")
    return args


def timm_fastest(path: str, model: str, batch: int) -> float:
    """timm's fastest img/s in a bench_onnx.py row of ``model`` at ``batch`` (the whole batch, all streams)."""
    try:
        with open(path) as f:
            rows = [r for r in json.load(f)["rows"] if r["model"] == model and r["batch"] == batch]
    except (OSError, ValueError, KeyError, TypeError) as e:
        refuse(f"{path} is no bench_onnx.py results file ({type(e).__name__}: {e})")
    if not rows:
        refuse(f"{path} has no row of {model} at batch {batch}")
    paths = rows[0]["paths"]
    return max(v["median_img_s"] for k, v in paths.items() if k.startswith("timm") and "in parts" not in k)


def by_kind(profile) -> dict:
    """Seconds per (node type, kernel) of the executed nodes of one request's counters."""
    seconds: dict = collections.Counter()
    for node in profile:
        if node.status.name == "EXECUTED":
            seconds[f"{node.node_type} {node.exec_type}"] += node.real_time.total_seconds()
    return dict(seconds)


def profile(xml: str, batch: int, size, rounds: int) -> dict:
    """img/s of one stream (one thread, ``batch`` images) and its time by kind, from the fastest round."""
    import openvino as ov

    core = ov.Core()
    graph = core.read_model(xml)
    graph.reshape({graph.inputs[0].get_any_name(): [batch, 3, *size]})
    compiled = core.compile_model(graph, "CPU", {"INFERENCE_NUM_THREADS": 1, "PERF_COUNT": True,
                                                 "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    x = np.random.default_rng(0).standard_normal((batch, 3, *size), dtype=np.float32)
    request.infer({0: x})  # the first call allocates
    best, kinds = None, None
    for _ in range(rounds):
        start = time.perf_counter()
        request.infer({0: x})
        took = time.perf_counter() - start
        if best is None or took < best:
            best, kinds = took, by_kind(request.get_profiling_info())
    return {"img_s": batch / best, "seconds_by_kind": kinds,
            "precision": str(getattr(compiled.get_property("INFERENCE_PRECISION_HINT"), "get_type_name", str)())}


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu")
    info = machine_info(device, limits=False)
    streams = args.streams or info["cpu_affinity"]
    out = results_path(args.out, dated_name("ov_profile", device, info), smoke=args.quick)
    timm = timm_fastest(args.onnx_json, args.model, args.batch * streams) if args.onnx_json else args.timm_img_s
    try:
        model = vitkit.create_model(args.model, **({"img_size": args.img_size} if args.img_size else {})).eval()
    except ValueError as e:
        refuse(str(e))
    size = tuple(model.config.img_size)
    calibration = torch.randint(0, 256, (2 * args.batch, 3, *size), dtype=torch.uint8,
                                generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as folder:
        xml = export_openvino(model, os.path.join(folder, "int8.xml"), quantize="int8", calibration=calibration,
                              progress=False)
        measured = profile(str(xml), args.batch, size, args.rounds)
    kinds = measured["seconds_by_kind"]
    total = sum(kinds.values())
    products = sum(v for k, v in kinds.items() if int8_product(k))
    share = products / total if total else 0.0
    ceiling = measured["img_s"] / share * streams if share else None
    row = {"model": args.model, "img_size": list(size), "batch_per_stream": args.batch, "streams": streams,
           "stream_img_s": measured["img_s"], "float_precision": measured["precision"],
           "products_share": share, "ceiling_img_s": ceiling, "timm_fastest_img_s": timm,
           "ceiling_over_timm": ceiling / timm if ceiling and timm else None,
           "shares_by_kind": {k: v / total for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}}
    print(f"{info['cpu_model']} ({info['cpu_family_model']}) | {args.model} {size[0]}x{size[1]} | one stream of one "
          f"thread, batch {args.batch}: {measured['img_s']:.2f} img/s (float parts in {measured['precision']})")
    for kind, part in list(row["shares_by_kind"].items())[:12]:
        print(f"  {100 * part:5.1f}%  {kind}")
    print(f"int8 products: {100 * share:.1f}% of the time; with everything else free, {streams} streams would run "
          f"at {ceiling:.1f} img/s" if ceiling else "no int8 products measured")
    if row["ceiling_over_timm"]:
        print(f"timm's fastest {timm:.2f} img/s: the ceiling is {row['ceiling_over_timm']:.2f}x it")
    write_json_atomic(out, {"benchmark": "ov_profile", "machine": info, "settings": {
        **vars(args), "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}, "row": row})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
