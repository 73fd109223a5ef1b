"""Training throughput: vitkit against timm, same process, same weights, same optimizer.

One training step is forward (fp32, or bf16 autocast with the loss in fp32), cross-entropy,
backward, AdamW step and zero_grad, at a fixed random batch. For each model, timm's state
dict is loaded into the vitkit model; both are in train mode with dropout and drop-path 0,
and both get the AdamW of ``vitkit train`` (``make_optimizer``: lr 2e-3, weight decay 0.05
on weight matrices only). Before timing, one fp32 step's logits and gradients are compared
to prove that both compute the same thing.

Timing follows bench_inference.py: warm-up steps, then ``--rounds`` rounds in which each
implementation runs a window of ``--steps`` steps, alternating which goes first, so that
drift of the machine (other load, turbo, thermal) hits both alike. Every row is measured on
two builds, timm constructed first and then vitkit first, and the samples pooled (the model
allocated second runs slower on a CPU, whichever library it is). Reported: the median
images/second of each, the ratio vitkit/timm of the medians (goal: >= 1.0), and the median
of the per-round paired ratios (less sensitive to slow drift). Each row also gives the model
FLOPs utilisation (MFU): training FLOPs per image (3x the forward's: the backward costs two
forwards) times img/s over the GEMM peak of the step's precision, measured in the same run
(limits.py), and the img/s that peak would give.

    python benchmarks/bench_training.py --quick       # smoke check: ViT-Ti, batch 8, < 1 min on a CPU (to SMOKE_DIR)
    python benchmarks/bench_training.py               # ViT-Ti and ViT-S, batch 32, fp32 and bf16
    python benchmarks/bench_training.py --models vit_tiny_patch16_224 --precisions bf16 --vitkit-attn auto sdpa
    python benchmarks/bench_training.py --device cuda --models vit_base_patch16_224 --precisions bf16 --compile

``--compile`` also times each step with both models under ``torch.compile`` (inductor; rows with
``"compiled": true``): the compilation falls in the warm-up, whose first step's seconds say what it cost.

This is a benchmark, not a test: run it on a quiet machine. Only stdlib, torch, timm, vitkit.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import time

import timm
import torch
import torch.nn.functional as F

import vitkit
from vitkit.machine import cpu_info, native_bf16_cpu
from vitkit.models.complexity import complexity
from vitkit.train.config import TrainConfig
from vitkit.train.loop import make_optimizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling benchmark, however run
from bench_inference import (  # noqa: E402
    NOISY_SPREAD,
    SMOKE_DIR,
    bf16_skip_reason,
    pool,
    precision,
    prepare_run,
    synchronize,
    write_json_atomic,
)
from limits import at_limit, close_limits, describe  # noqa: E402

DEFAULT_MODELS = ["vit_tiny_patch16_224", "vit_small_patch16_224"]
DEFAULT_BATCH_SIZE = 32
DEFAULT_ROUNDS = 5
QUICK_MODELS = ["vit_tiny_patch16_224"]
QUICK_BATCH_SIZE = 8
QUICK_ROUNDS = 2
IMG_SIZE = 224
LOGITS_TOLERANCE = 1e-4  # fp32, same weights, one training forward
GRAD_TOLERANCE = 1e-4  # per parameter: max |g_timm - g_vitkit| / max |g_timm|
QUIET_LOAD = 0.2  # cores used by other processes during a window, below which it counts as quiet
#: how each step runs: eager, and with --compile also under torch.compile
BUILDS = ("eager", "compiled")
NO_DROPOUT = dict(drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0)
TIMM_NO_DROPOUT = dict(NO_DROPOUT, proj_drop_rate=0.0, pos_drop_rate=0.0, patch_drop_rate=0.0)


# ---------------------------------------------------------------------------- machine


def cpu_details() -> dict:
    """What /proc/cpuinfo says (lscpu's name can be generic in a VM) and its bf16 features."""
    cpu, info = cpu_info(), {}
    if not cpu:
        return info
    if "model name" in cpu:
        info["cpuinfo_model"] = cpu["model name"]
    if "flags" in cpu:
        info["cpu_flags"] = sorted(set(cpu["flags"].split()) & {"avx2", "avx512f", "avx512_bf16", "amx_bf16",
                                                                "amx_tile", "avx512_fp16"})
    info["mkldnn_bf16_supported"] = native_bf16_cpu()  # the probe pick_precision uses
    return info


# ---------------------------------------------------------------------------- models


def build_pair(name: str, device: torch.device, vitkit_first: bool, attn_impl: str):
    """timm's model and vitkit's holding timm's (random) weights, train mode, no dropout.

    Seeded, so every build of a model starts from the same weights. Built in the given
    order for the reason given in bench_inference.build_pair (allocation order shifts CPU
    speed); that helper builds eval models without options, hence this one.
    """
    torch.manual_seed(0)
    if vitkit_first:
        vk_model = vitkit.create_model(name, attn_impl=attn_impl, **NO_DROPOUT)
        timm_model = timm.create_model(name, pretrained=False, **TIMM_NO_DROPOUT)
    else:
        timm_model = timm.create_model(name, pretrained=False, **TIMM_NO_DROPOUT)
        vk_model = vitkit.create_model(name, attn_impl=attn_impl, **NO_DROPOUT)
    report = vitkit.load_weights(vk_model, timm_model.state_dict())
    if report.missing or report.unexpected:
        raise SystemExit(f"FAIL: timm's {name} does not load into vitkit exactly "
                         f"(missing {report.missing}, unexpected {report.unexpected})")
    return timm_model.train().to(device), vk_model.train().to(device)


def check_training_parity(timm_model, vk_model, device: torch.device) -> dict:
    """One fp32 training forward/backward at batch 2: same logits and same gradients, or stop."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, IMG_SIZE, IMG_SIZE, generator=gen).to(device)
    y = torch.tensor([1, 2], device=device)
    grads, logits = {}, {}
    for key, model in (("timm", timm_model), ("vitkit", vk_model)):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        out = model(x)
        loss = F.cross_entropy(out.float(), y)
        grads[key] = dict(zip([n for n, _ in named], torch.autograd.grad(loss, [p for _, p in named])))
        logits[key] = out.detach().float()
    logit_diff = (logits["timm"] - logits["vitkit"]).abs().max().item()
    if grads["timm"].keys() != grads["vitkit"].keys():
        raise SystemExit("FAIL: timm and vitkit parameter names differ: "
                         f"{sorted(grads['timm'].keys() ^ grads['vitkit'].keys())}")
    worst, worst_name = 0.0, None
    for n, g in grads["timm"].items():
        rel = (g - grads["vitkit"][n]).abs().max().item() / max(g.abs().max().item(), 1e-12)
        if not rel <= worst:  # also catches NaN
            worst, worst_name = rel, n
    if not logit_diff <= LOGITS_TOLERANCE or not worst <= GRAD_TOLERANCE:
        raise SystemExit(f"FAIL: fp32 training step differs: logits by {logit_diff:.3e} (> {LOGITS_TOLERANCE:g}?), "
                         f"gradient of {worst_name} by {worst:.3e} relative (> {GRAD_TOLERANCE:g}?)")
    return {"logits_max_abs_diff": logit_diff, "grad_max_rel_diff": worst, "grad_worst_param": worst_name}


class _CountAttention(torch.overrides.TorchFunctionMode):
    """Counts F.scaled_dot_product_attention calls: the fused path; none means explicit attention."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "scaled_dot_product_attention":
            self.calls += 1
        return func(*args, **(kwargs or {}))


def attention_path(model, device: torch.device, dtype: str) -> str:
    """Which attention a training forward of ``model`` takes here (grad on, train mode)."""
    x = torch.randn(1, 3, IMG_SIZE, IMG_SIZE).to(device)
    counter = _CountAttention()
    with counter, precision(device, dtype):
        model(x)
    depth = len(model.blocks)
    if counter.calls == 0:
        return "explicit"
    return "sdpa" if counter.calls == depth else f"sdpa in {counter.calls}/{depth} blocks"


# ---------------------------------------------------------------------------- timing


def make_step(model, optimizer, x, y, device: torch.device, dtype: str):
    """One training step; returns the (detached) loss so the caller can read it after timing."""
    def step():
        with precision(device, dtype):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def _cpu_busy_s():
    """(seconds of busy CPU time of the whole machine, of this process), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle, iowait
    own = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system


def foreign_load(before, after, seconds: float):
    """Cores kept busy by other processes during a timing: the noise this benchmark cannot avoid."""
    if before is None or after is None or seconds <= 0:
        return None
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / seconds)


def run_steps(step, n: int, device: torch.device):
    """(seconds for ``n`` steps by wall clock, last loss, cores used by other processes meanwhile)."""
    synchronize(device)
    cpu = _cpu_busy_s()
    start = time.perf_counter()
    for _ in range(n):
        loss = step()
    synchronize(device)
    seconds = time.perf_counter() - start
    return seconds, loss, foreign_load(cpu, _cpu_busy_s(), seconds)


def measure(steps: dict, batch: int, args, device: torch.device) -> dict:
    """Warm up, pick the window length, then time the implementations in alternating windows.

    Warm-up (in the given order, which is the construction order) absorbs one-off costs: the
    optimizer's state is allocated at the first step, the allocator grows, kernels are
    chosen. Each implementation runs at least ``--warmup`` steps and ``--min-time`` seconds.
    With ``--steps`` unset, the fastest warm-up step sets the window so that it lasts about
    ``--min-time`` seconds; both sides use the same window.
    """
    warmup = {}
    for name, step in steps.items():
        passes = []
        while len(passes) < args.warmup or sum(passes) < args.min_time:
            passes.append(run_steps(step, 1, device)[0])
        warmup[name] = passes
    n = args.steps or max(1, math.ceil(args.min_time / statistics.mean(min(p) for p in warmup.values())))

    names = list(steps)
    samples = {name: [] for name in names}
    losses = {name: [] for name in names}
    foreign = {name: [] for name in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            seconds, loss, other = run_steps(steps[name], n, device)
            samples[name].append(n * batch / seconds)
            losses[name].append(loss.item())
            foreign[name].append(other)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    return {"iters_per_timing": n, "samples_img_s": samples, "median_img_s": medians,
            "spread_max_over_min": {name: max(s) / min(s) for name, s in samples.items()},
            "ratio_vitkit_over_timm": medians["vitkit"] / medians["timm"],
            "paired_ratios": [v / t for v, t in zip(samples["vitkit"], samples["timm"])],
            "foreign_load_cores": foreign, "warmup_step_s": warmup, "window_last_loss": losses}


def pool_rows(results: list) -> dict:
    """bench_inference.pool (timm-first build, then vitkit-first) plus the training extras."""
    row = pool(results)
    paired = [p for r in results for p in r["paired_ratios"]]
    row["steps_per_timing"] = row.pop("iters_per_timing")
    row["paired_ratios"] = paired
    row["median_paired_ratio"] = statistics.median(paired)
    row["foreign_load_cores"] = {k: [v for r in results for v in r["foreign_load_cores"][k]]
                                 for k in ("timm", "vitkit")}
    # Rounds in which neither window shared the machine (other processes < QUIET_LOAD cores).
    quiet = [p for r in results for p, a, b in zip(r["paired_ratios"], r["foreign_load_cores"]["timm"],
                                                    r["foreign_load_cores"]["vitkit"])
             if a is not None and b is not None and max(a, b) < QUIET_LOAD]
    row["quiet_rounds"] = len(quiet)
    row["median_paired_ratio_quiet"] = statistics.median(quiet) if quiet else None
    row["warmup_step_s"] = [r["warmup_step_s"] for r in results]
    row["window_last_loss"] = [r["window_last_loss"] for r in results]
    return row


# ---------------------------------------------------------------------------- output


def fmt_row(cells) -> str:
    widths = (24, 13, 9, 9, 11, 12, 7, 7, 8)
    return "  ".join(str(c).ljust(w) if i < 4 else str(c).rjust(w)
                     for i, (c, w) in enumerate(zip(cells, widths)))


# ---------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", help=f"default: {' '.join(DEFAULT_MODELS)}")
    p.add_argument("--batch-size", type=int, help=f"default {DEFAULT_BATCH_SIZE}")
    p.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                   help="fp32, and/or bf16 autocast with the loss in fp32 (default: both)")
    p.add_argument("--vitkit-attn", nargs="+", choices=["auto", "sdpa", "explicit"], default=["auto"],
                   help="vitkit's attn_impl; each value gives its own rows (default: auto)")
    p.add_argument("--rounds", type=int, help=f"interleaved windows per implementation and build "
                                              f"(default {DEFAULT_ROUNDS}; two builds: twice the samples)")
    p.add_argument("--steps", type=int, help="training steps per window (default: as many as last "
                                             "--min-time seconds, at least 1)")
    p.add_argument("--min-time", type=float, default=1.0,
                   help="seconds a window should last when --steps is unset; also the least warm-up (default 1)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per implementation, at least (default 2)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda when available, else cpu")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--compile", action="store_true", help="also time both models under torch.compile (own rows)")
    p.add_argument("--out", help="results file, or a folder for the default name (default: benchmarks/results/"
                                 f"training_<device-slug>_<date>.json; with --quick, the same name in {SMOKE_DIR})")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke check: ViT-Ti, batch {QUICK_BATCH_SIZE}, {QUICK_ROUNDS} rounds of 1 step, "
                        "1 warm-up step (explicit options win)")
    args = p.parse_args(argv)
    args.models = args.models or (QUICK_MODELS if args.quick else DEFAULT_MODELS)
    args.batch_size = args.batch_size or (QUICK_BATCH_SIZE if args.quick else DEFAULT_BATCH_SIZE)
    args.rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    if args.quick:
        args.steps = args.steps or 1
        if "--warmup" not in (argv if argv is not None else sys.argv[1:]):
            args.warmup = 1
        if "--min-time" not in (argv if argv is not None else sys.argv[1:]):
            args.min_time = 0.0
    if args.rounds < 1 or args.warmup < 1 or args.min_time < 0 or args.batch_size < 1 \
            or (args.steps is not None and args.steps < 1):
        p.error("--rounds, --warmup, --batch-size and --steps must be >= 1, --min-time >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device, info, out = prepare_run(args, "training")
    if device.type == "cpu":
        info.update(cpu_details())
    info["device_name"] = info["cuda_device"] if device.type == "cuda" else info["cpu_model"]
    cfg = TrainConfig()
    builds = BUILDS if args.compile else BUILDS[:1]
    settings = {"models": args.models, "batch_size": args.batch_size, "img_size": IMG_SIZE,
                "precisions": args.precisions, "vitkit_attn": args.vitkit_attn, "compile": args.compile,
                "rounds": args.rounds,
                "steps": args.steps or "auto", "min_time_s": args.min_time, "warmup": args.warmup,
                "device": str(device), "threads": torch.get_num_threads(),
                "interop_threads": torch.get_num_interop_threads(), "quick": args.quick,
                "step": "forward (bf16: autocast) + cross_entropy(logits.float()) + backward + "
                        "AdamW.step + zero_grad(set_to_none=True); no grad clipping",
                "optimizer": {"name": "AdamW (vitkit.train.loop.make_optimizer)", "lr": cfg.lr,
                              "betas": list(cfg.betas), "weight_decay": cfg.weight_decay,
                              "decay_on": "weight matrices only"},
                "dropout": "all 0 (dropout, attention dropout, drop-path)",
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    print(f"{info['device_name']} | torch {info['torch']} | timm {info['timm']} | vitkit {info['vitkit']} | "
          f"threads {settings['threads']} | batch {args.batch_size}", flush=True)
    print(describe(info["limits"]), flush=True)
    t_start = time.perf_counter()

    checks, rows = {}, []
    header = fmt_row(["model", "prec", "vk attn", "timm att", "timm img/s", "vitkit img/s", "ratio", "paired",
                      "vk MFU"])
    for name in args.models:
        for attn_impl in args.vitkit_attn:
            measured, skipped, paths, steps = {}, {}, {}, {}
            key = f"{name} attn_impl={attn_impl}"
            for vitkit_first in (False, True):
                timm_model, vk_model = build_pair(name, device, vitkit_first, attn_impl)
                train_gflop = 3 * complexity(vk_model.config).flops / 1e9
                check = check_training_parity(timm_model, vk_model, device)
                prev = checks.get(key)
                if prev is None or check["grad_max_rel_diff"] > prev["grad_max_rel_diff"]:
                    checks[key] = check
                models = {"timm": timm_model, "vitkit": vk_model}
                order = ["vitkit", "timm"] if vitkit_first else ["timm", "vitkit"]
                optimizers = {k: make_optimizer(m, cfg) for k, m in models.items()}
                gen = torch.Generator().manual_seed(args.batch_size)
                x = torch.randn(args.batch_size, 3, IMG_SIZE, IMG_SIZE, generator=gen).to(device)
                y = torch.randint(0, vk_model.num_classes, (args.batch_size,), generator=gen).to(device)
                for dtype in args.precisions:
                    skip = bf16_skip_reason(models.values(), x[:1], device) if dtype == "bf16" else None
                    if skip:
                        skipped[dtype] = skip
                        continue
                    paths[dtype] = {k: attention_path(m, device, dtype) for k, m in models.items()}
                    steps = {k: make_step(models[k], optimizers[k], x, y, device, dtype) for k in order}
                    for build in builds:
                        if build == "compiled":  # the same modules and optimizers, their forward compiled
                            steps = {k: make_step(torch.compile(models[k]), optimizers[k], x, y, device, dtype)
                                     for k in order}
                        load = os.getloadavg() if hasattr(os, "getloadavg") else None
                        result = measure(steps, args.batch_size, args, device)
                        result["loadavg_at_start"] = load
                        measured.setdefault((dtype, build), []).append(result)
                del timm_model, vk_model, models, optimizers, steps
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            c = checks[key]
            print(f"\n{name} (vitkit attn_impl={attn_impl}): fp32 training step, max |logits diff| "
                  f"{c['logits_max_abs_diff']:.1e}, max relative gradient diff {c['grad_max_rel_diff']:.1e}")
            print(header)
            print("-" * len(header))
            for dtype, build in [(d, b) for d in args.precisions for b in builds]:
                row = {"model": name, "batch": args.batch_size, "precision": dtype, "compiled": build == "compiled",
                       "vitkit_attn_impl": attn_impl, "train_gflop_per_image": train_gflop}
                label = dtype + (" compiled" if build == "compiled" else "")
                if dtype in skipped:
                    row["skipped"] = skipped[dtype]
                    print(fmt_row([name, label, attn_impl, "-", "-", "-", "-", "-"]) + f"  skipped: {row['skipped']}")
                else:
                    row["attention_path"] = paths[dtype]
                    parts = measured[(dtype, build)]
                    row.update(pool_rows(parts))
                    row["loadavg_at_start"] = [r["loadavg_at_start"] for r in parts]
                    med, spread = row["median_img_s"], max(row["spread_max_over_min"].values())
                    peak = info["limits"][f"{dtype}_gflop_s"]
                    row["mfu"] = {k: at_limit(v, train_gflop, peak) for k, v in med.items()}
                    note = f"  noisy: samples vary {spread:.2f}x" if spread > NOISY_SPREAD else ""
                    loads = [v for side in row["foreign_load_cores"].values() for v in side if v is not None]
                    if loads:
                        note += f"  other load {statistics.mean(loads):.2f} cores"
                        quiet = row["median_paired_ratio_quiet"]
                        note += (f", quiet rounds {row['quiet_rounds']}/{len(row['paired_ratios'])}"
                                 + (f" -> {quiet:.3f}" if quiet is not None else ""))
                    print(fmt_row([name, label, paths[dtype]["vitkit"], paths[dtype]["timm"],
                                   f"{med['timm']:.2f}", f"{med['vitkit']:.2f}",
                                   f"{row['ratio_vitkit_over_timm']:.3f}",
                                   f"{row['median_paired_ratio']:.3f}",
                                   f"{row['mfu']['vitkit']['fraction_of_limit']:.1%}"]) + note, flush=True)
                rows.append(row)

    settings["finished"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    settings["wall_s"] = round(time.perf_counter() - t_start, 1)
    info["loadavg_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    info["limits"] = close_limits(info["limits"])
    write_json_atomic(out, {"benchmark": "training", "machine": info, "settings": settings,
                            "parity_fp32_training_step": checks, "rows": rows})
    print(f"\nwrote {out} ({settings['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
