"""Inference throughput: vitkit against timm, same process, same weights.

For each model, timm's state dict is loaded into the vitkit model, so both compute the same
function; the fp32 logits are compared to prove it. Then, for each batch size and dtype,
both are timed in turns (interleaved, alternating which goes first) so that slow drift of
the machine (turbo, thermal, other load) hits both alike. Every row is measured on two
builds, timm constructed first and then vitkit first, because the allocation order alone
shifts CPU speed (see build_pair). The reported figure is the median images/second over
all samples, and the ratio vitkit/timm (goal: >= 1.0). Each row also states the img/s at
the machine's limit (that dtype's GEMM peak, measured in the same run, over the model's
GFLOPs per image; limits.py) and the fraction of it each library reaches.

    python benchmarks/bench_inference.py                 # full run (slow on a small CPU)
    python benchmarks/bench_inference.py --quick         # smoke check: tiny, batch 1 and 8 (written to SMOKE_DIR)
    python benchmarks/bench_inference.py --models vit_small_patch16_224 --batch-sizes 32 --dtypes bf16

This is a benchmark, not a test: run it on a quiet machine. Only stdlib, torch, timm, vitkit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch

import vitkit
from vitkit.files import check_output
from vitkit.machine import native_bf16_cpu
from vitkit.models.complexity import complexity

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling module, however run
from limits import at_limit, close_limits, describe, machine_limits  # noqa: E402

DEFAULT_MODELS = ["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224"]
DEFAULT_BATCH_SIZES = [1, 32]
DEFAULT_REPEATS = 5
QUICK_MODELS = ["vit_tiny_patch16_224"]
QUICK_BATCH_SIZES = [1, 8]
QUICK_REPEATS = 3
LOGITS_TOLERANCE = 1e-4  # fp32, same weights: anything above this is a real difference
NOISY_SPREAD = 1.25  # max/min of one implementation's samples above this: machine was busy
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: Where a smoke check (``--quick``, ``--smoke``) writes unless given ``--out``. Never
#: benchmarks/results/: its files are the tracked results of full runs, named by device and
#: day, so a smoke check on the same day would overwrite one.
SMOKE_DIR = os.path.join(tempfile.gettempdir(), "vitkit-bench-smoke")


# ---------------------------------------------------------------------------- machine


def cpu_model_name() -> str:
    """The CPU's marketing name; platform.processor() is often empty or just 'x86_64' on Linux."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


#: The instruction-set flags that decide which precision and runtime are fast (/proc/cpuinfo names).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile",
             "avx512_fp16")


def cpu_flags() -> list:
    """Which of :data:`ISA_FLAGS` this CPU reports (Linux; empty elsewhere)."""
    from vitkit.deploy.fastest import cpu_flags as reported

    have = reported()
    return [flag for flag in ISA_FLAGS if flag in have]


def cpu_family_model() -> str | None:
    """"family F model M" from /proc/cpuinfo: what tells a Zen 3 from a Zen 4 when lscpu says only "AMD EPYC"."""
    from vitkit.machine import cpu_info

    info = cpu_info()
    return f"family {info['cpu family']} model {info['model']}" if "cpu family" in info and "model" in info else None


def git_revision() -> str | None:
    """The commit measured (with '+dirty' when the tree has changes), so results can be traced."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("+dirty" if dirty else "")) if rev else None


def machine_info(device: torch.device, limits: bool = True) -> dict:
    """Everything needed to tell whether two result files are comparable, with the machine's
    limits measured now (``limits``: the clock and the fp32/bf16/int8 GEMM peaks; see limits.py).
    A benchmark samples the clock again when it writes its results (``limits.close_limits``).
    ``limits=False`` where nothing is measured now (collecting finished runs)."""
    info = {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_model": cpu_model_name(),
        "cpu_flags": cpu_flags(),
        "cpu_family_model": cpu_family_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "vitkit": vitkit.__version__,
        "git_revision": git_revision(),
        "mkldnn_available": torch.backends.mkldnn.is_available(),
        "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    if device.type == "cuda":
        info["cuda_device"] = torch.cuda.get_device_name(device)
        info["cuda_version"] = torch.version.cuda
    if limits:
        info["limits"] = machine_limits(device)
    return info


def device_slug(device: torch.device, info: dict) -> str:
    """A file-name friendly name of the hardware measured, e.g. 'cpu-amd-epyc'."""
    name = info.get("cuda_device") if device.type == "cuda" else info.get("cpu_model")
    slug = re.sub(r"[^a-z0-9]+", "-", f"{device.type} {name or ''}".lower()).strip("-")
    return slug or device.type


def dated_name(kind: str, device: torch.device, info: dict) -> str:
    """The results file name of a benchmark: ``<kind>_<device-slug>_<date>.json``."""
    return f"{kind}_{device_slug(device, info)}_{datetime.date.today().isoformat()}.json"


def results_path(out, name: str, smoke: bool = False) -> str:
    """Where the results file ``name`` goes: ``--out`` when given (a file, or a folder -- one
    that exists or ends in '/' -- to hold ``name``), else benchmarks/results/ for a full run
    and :data:`SMOKE_DIR` for a smoke check."""
    if out:
        out = str(out)
        path = os.path.join(out, name) if os.path.isdir(out) or out.endswith(("/", os.sep)) else out
    else:
        path = os.path.join(SMOKE_DIR if smoke else RESULTS_DIR, name)
    try:  # said before the run, not after its minutes of measuring
        check_output(path, "file", "--out" if out else "the results file")
    except ValueError as e:
        refuse(str(e))
    return path


def refuse(message: str) -> None:
    """One line naming the script, exit code 2 (argparse's), no traceback."""
    print(f"{Path(sys.argv[0]).stem}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def work_dir(given, name: str, smoke: bool = False) -> Path:
    """The runs' folder of a benchmark that trains: ``--work`` when given, else ``runs/<name>``
    for a full run and ``SMOKE_DIR/<name>`` for a smoke check (read when called, so a smoke
    check never reuses or writes a real run's folder)."""
    if given:
        return Path(given)
    return Path(SMOKE_DIR) / name if smoke else Path("runs") / name


# ---------------------------------------------------------------------------- timing


def synchronize(device: torch.device) -> None:
    """CUDA runs asynchronously: without this the clock would measure only the kernel launches."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def precision(device: torch.device, dtype: str):
    """A fresh context per use: fp32 is plain, bf16 is autocast (weights stay fp32)."""
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run(model, x, iters: int, device: torch.device, dtype: str) -> float:
    """Seconds for ``iters`` forward passes, measured by wall clock. vitkit's models run inside
    ``vitkit.models.fast_inference`` (weights fixed: bf16 copies kept, GELU in place), as
    vitkit's own prediction does; it is opt-in since the 2026-11-23 hardening."""
    synchronize(device)
    fast = vitkit.models.fast_inference(model) if isinstance(model, vitkit.models.TokenModel) \
        else contextlib.nullcontext()
    start = time.perf_counter()
    with precision(device, dtype), fast:
        for _ in range(iters):
            model(x)
    synchronize(device)
    return time.perf_counter() - start


def bf16_skip_reason(models, x, device: torch.device) -> str | None:
    """Why bf16 cannot be measured here, or None. A CPU without native bf16 is named (torch emulates
    bf16 there many times slower than fp32: hours of rows that measure nothing); elsewhere trying it
    is the only reliable check."""
    if device.type == "cpu" and not torch.backends.mkldnn.is_available():
        return "torch built without oneDNN (mkldnn): no fast bf16 on CPU"
    if device.type == "cpu" and not native_bf16_cpu():
        return "no native bf16 on this CPU (no AVX-512 BF16 or AMX): torch would emulate it"
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU does not support bf16"
    try:
        for model in models:
            run(model, x, 1, device, "bf16")
    except RuntimeError as exc:
        return f"bf16 autocast failed: {str(exc).splitlines()[0]}"
    return None


def measure(impls: dict, x, args, device: torch.device, dtype: str) -> dict:
    """Warm up, pick an iteration count, then time the implementations in turns.

    Warm-up absorbs one-off costs (allocator growth, oneDNN/cuDNN kernel selection): each
    implementation runs at least ``--warmup`` passes and at least ``--min-time`` seconds.
    The fastest warm-up pass of each (noise only ever slows a pass down) calibrates ``iters``
    so that one timing lasts about ``--min-time`` seconds; both use the same count, so each
    timing does the same work. A single iteration is allowed: a big model at batch 32 on a
    small CPU already takes seconds.
    """
    fastest = {}
    for name, model in impls.items():
        passes = []
        while len(passes) < args.warmup or sum(passes) < args.min_time:
            passes.append(run(model, x, 1, device, dtype))
        fastest[name] = min(passes)
    iters = max(1, math.ceil(args.min_time / statistics.mean(fastest.values())))

    names = list(impls)
    samples = {name: [] for name in names}
    for r in range(args.repeats):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            seconds = run(impls[name], x, iters, device, dtype)
            samples[name].append(iters * x.shape[0] / seconds)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    spread = {name: max(s) / min(s) for name, s in samples.items()}
    return {"iters_per_timing": iters, "samples_img_s": samples, "median_img_s": medians,
            "spread_max_over_min": spread,
            "ratio_vitkit_over_timm": medians["vitkit"] / medians["timm"]}


# ---------------------------------------------------------------------------- models


def build_pair(name: str, device: torch.device, vitkit_first: bool, **kwargs):
    """timm's model and vitkit's model holding timm's (random) weights, both in eval mode.

    Construction order matters on CPU: glibc moves its mmap threshold once the first
    model's temporaries are freed, so the second model's weights land in other memory and
    run measurably slower (seen here: up to 20% either way). Each row is therefore measured
    on two builds with opposite orders and the samples pooled.
    """
    with torch.inference_mode(False):  # built as users build them; timed under inference_mode
        return _build_pair(name, device, vitkit_first, kwargs)


def _build_pair(name: str, device: torch.device, vitkit_first: bool, kwargs: dict):
    """``kwargs`` (e.g. ``img_size``) go to both constructors."""
    if vitkit_first:
        vk_model = vitkit.create_model(name, **kwargs)
        timm_model = timm.create_model(name, pretrained=False, **kwargs)
    else:
        timm_model = timm.create_model(name, pretrained=False, **kwargs)
        vk_model = vitkit.create_model(name, **kwargs)
    vitkit.load_weights(vk_model, timm_model.state_dict())
    return timm_model.eval().to(device), vk_model.eval().to(device)


def pool(results: list) -> dict:
    """Merge the measurements of the two construction orders into one row."""
    samples = {k: [v for r in results for v in r["samples_img_s"][k]] for k in ("timm", "vitkit")}
    medians = {k: statistics.median(v) for k, v in samples.items()}
    return {"iters_per_timing": [r["iters_per_timing"] for r in results],
            "construction_orders": ["timm first", "vitkit first"][:len(results)],
            "samples_img_s": samples, "median_img_s": medians,
            "spread_max_over_min": {k: max(v) / min(v) for k, v in samples.items()},
            "ratio_vitkit_over_timm": medians["vitkit"] / medians["timm"]}


def check_logits(timm_model, vk_model, device: torch.device) -> float:
    """Same weights must give the same fp32 logits, or the speed comparison means nothing."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 224, 224, generator=gen).to(device)
    diff = (timm_model(x).float() - vk_model(x).float()).abs().max().item()
    if not diff <= LOGITS_TOLERANCE:  # also catches NaN
        raise SystemExit(f"FAIL: fp32 logits of timm and vitkit differ by {diff:.3e} "
                         f"(> {LOGITS_TOLERANCE:g}); the models do not compute the same function")
    return diff


# ---------------------------------------------------------------------------- output


def fmt_row(cells) -> str:
    widths = (24, 6, 6, 12, 12, 7, 9, 12)
    return "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w)
                     for i, (c, w) in enumerate(zip(cells, widths)))


def write_json_atomic(path: str, data: dict) -> None:
    """Temp file + os.replace: an interrupted run never leaves a half-written result file. Where the
    file cannot be written after all (a disk that filled during the run), the results go to stdout
    after one line that says so: a run's minutes of measuring are not lost."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".bench-", suffix=".json.tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if not isinstance(e, OSError):
            raise
        print(json.dumps(data, indent=2))
        refuse(f"{path}: {e.strerror or e} (the results are above, on stdout)")


# ---------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", help=f"default: {' '.join(DEFAULT_MODELS)}")
    p.add_argument("--batch-sizes", nargs="+", type=int, help="default: 1 32")
    p.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    p.add_argument("--repeats", type=int, help=f"interleaved timings per implementation "
                                               f"(default {DEFAULT_REPEATS})")
    p.add_argument("--min-time", type=float, default=0.5,
                   help="target seconds per timing; sets the iterations (default 0.5)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up passes per implementation, at least (default 2; "
                                                     "warm-up also lasts at least --min-time)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda when available, else cpu")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--out", help="results file, or a folder for the default name (default: benchmarks/results/"
                                 "inference_<device-slug>_<date>.json; with --quick, the same name in "
                                 f"{SMOKE_DIR})")
    p.add_argument("--quick", action="store_true",
                   help="smoke check: tiny model, batch 1 and 8, 3 repeats (explicit options win)")
    p.add_argument("--compile", action="store_true",
                   help="also time both models under torch.compile (default mode): rows with compiled true")
    args = p.parse_args(argv)
    args.models = args.models or (QUICK_MODELS if args.quick else DEFAULT_MODELS)
    args.batch_sizes = args.batch_sizes or (QUICK_BATCH_SIZES if args.quick else DEFAULT_BATCH_SIZES)
    args.repeats = args.repeats or (QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    if args.repeats < 1 or args.warmup < 1 or args.min_time < 0:
        p.error("--repeats and --warmup must be >= 1, --min-time >= 0")
    return args


def prepare_run(args, kind: str):
    """Threads and device from the options -> (device, machine info, results path for ``kind``)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    info = machine_info(device)
    return device, info, results_path(args.out, dated_name(kind, device, info), smoke=args.quick)


def main(argv=None) -> int:
    args = parse_args(argv)
    device, info, out = prepare_run(args, "inference")
    settings = {"models": args.models, "batch_sizes": args.batch_sizes, "dtypes": args.dtypes, "compile": args.compile,
                "repeats": args.repeats, "min_time_s": args.min_time, "warmup": args.warmup,
                "device": str(device), "threads": torch.get_num_threads(), "quick": args.quick,
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    print(f"{info['cuda_device'] if device.type == 'cuda' else info['cpu_model']} | "
          f"torch {info['torch']} | timm {info['timm']} | vitkit {info['vitkit']} | "
          f"threads {settings['threads']}")
    print(describe(info["limits"]))

    checks, rows = {}, []
    header = fmt_row(["model", "batch", "dtype", "timm img/s", "vitkit img/s", "ratio", "at limit", "vitkit/limit"])
    with torch.inference_mode():
        for name in args.models:
            measured, skipped = {}, {}
            for vitkit_first in (False, True):
                timm_model, vk_model = build_pair(name, device, vitkit_first)
                gflop = complexity(vk_model.config).flops / 1e9
                checks[name] = max(checks.get(name, 0.0), check_logits(timm_model, vk_model, device))
                builds = {False: {"timm": timm_model, "vitkit": vk_model}}
                if args.compile:  # each compiled once; a new batch size recompiles inside the warm-up
                    builds[True] = {k: torch.compile(m) for k, m in builds[False].items()}
                for batch in args.batch_sizes:
                    gen = torch.Generator().manual_seed(batch)
                    x = torch.randn(batch, 3, 224, 224, generator=gen).to(device)
                    for dtype in args.dtypes:
                        skip = bf16_skip_reason(builds[False].values(), x, device) if dtype == "bf16" else None
                        for compiled, impls in builds.items():
                            if skip:
                                skipped[(batch, dtype, compiled)] = skip
                            else:
                                measured.setdefault((batch, dtype, compiled), []).append(
                                    measure(impls, x, args, device, dtype))
                del timm_model, vk_model, builds
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            print(f"\n{name}: fp32 logits max |timm - vitkit| = {checks[name]:.2e}")
            print(header)
            print("-" * len(header))
            for batch, dtype, compiled in itertools.product(args.batch_sizes, args.dtypes,
                                                            (False, True) if args.compile else (False,)):
                key, label = (batch, dtype, compiled), f"{dtype}{' compiled' if compiled else ''}"
                row = {"model": name, "batch": batch, "dtype": dtype, "compiled": compiled,
                       "gflop_per_image": gflop}
                if key in skipped:
                    row["skipped"] = skipped[key]
                    print(fmt_row([name, batch, label, "-", "-", "-"]) + f"  skipped: {row['skipped']}")
                else:
                    row.update(pool(measured[key]))
                    med, spread = row["median_img_s"], max(row["spread_max_over_min"].values())
                    peak = info["limits"][f"{dtype}_gflop_s"]
                    row["limit"] = {impl: at_limit(med[impl], gflop, peak) for impl in med}
                    note = f"  noisy: samples vary {spread:.2f}x" if spread > NOISY_SPREAD else ""
                    print(fmt_row([name, batch, label, f"{med['timm']:.1f}", f"{med['vitkit']:.1f}",
                                   f"{row['ratio_vitkit_over_timm']:.3f}",
                                   f"{row['limit']['vitkit']['img_s_at_limit']:.1f}",
                                   f"{row['limit']['vitkit']['fraction_of_limit']:.1%}"]) + note, flush=True)
                rows.append(row)

    settings["finished"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    info["limits"] = close_limits(info["limits"])
    write_json_atomic(out, {"benchmark": "inference", "machine": info, "settings": settings,
                            "logits_max_abs_diff": checks, "rows": rows})
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
