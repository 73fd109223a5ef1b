"""Small data: plain ViT, ConViT, the DeiT recipe and a ResNetV2 on 1%, 10% and 100% of the labels.

The seeds claim that a CNN's inductive bias (locality, translation equivariance) wins when
labelled data is scarce, that ConViT's soft convolutional prior closes most of that gap, and
that a plain ViT catches up as the data grows; DeiT's claim is that strong augmentation and
regularisation (and distillation from a CNN) make a ViT data-efficient. This benchmark puts
those claims to the test on Fashion-MNIST at the scale of a CPU.

Arms, all about 0.45M parameters and all reading a 7x7 grid of 4x4-pixel cells:

- ``vit``: ViT-Ti's design (class token, learned positions, pre-norm blocks) at width 96,
  4 layers, 4 heads, MLP 192, patch 4.
- ``convit``: the same sizes as ConViT: gated positional self-attention in the first 3 of
  4 layers (local init, locality strength 1), the class token joining before the last.
- ``deit``: the ``vit`` arm trained with DeiT's regularisers: RandAugment m9-mstd0.5,
  Mixup 0.8, CutMix 1.0, random erasing 0.25, stochastic depth 0.1, repeated
  augmentation 3, label smoothing 0.1.
- ``resnet``: the hybrids' ResNetV2 (weight-standardised convolutions, GroupNorm) as a
  classifier, with the BiT stem (7x7 stride-2 convolution and max pool: the same 7x7 grid)
  and two stages of one bottleneck block each.
- ``deit_distilled`` (optional): ``deit`` plus a distillation token, hard-distilled from
  the ``resnet`` arm's model trained on the same labels (DeiT's CNN teacher).

Budget rule: every run makes the same number of optimiser steps (``--steps``, batch 128),
so every arm sees the same number of images whatever the fraction; 1% of the labels is then
many passes over few images. The optimiser is the same for all (AdamW, lr 2e-3, weight
decay 0.05, cosine to 1e-5 after ``--warmup`` steps, clip 1), as is the data: the labelled
subset of a fraction is fixed, class-balanced and nested (``train_fraction``), validation is
5,000 training images outside every subset, and the score is top-1 on the 10,000 test
images.

    python benchmarks/small_data.py                      # 4 arms x 3 fractions, 1 seed (about 35 min on 2 cores)
    python benchmarks/small_data.py --smoke              # smoke check: 30 steps, 1%, arms vit and resnet
    python benchmarks/small_data.py --arms vit convit deit resnet deit_distilled --seeds 0 1

Every run is a ``vitkit train`` subprocess with its own run directory under ``--work``;
a finished run is not repeated when the benchmark is started again (a crash loses at most
the run in progress), and processes given disjoint ``--arms`` can share ``--work``.
Results: ``benchmarks/results/small_data_<device>_<date>.json`` (rewritten after every run),
the table as Markdown (``--table``; docs/small_data.md quotes it) and a figure (``--figure``).
A smoke check (``--smoke``) writes its results and runs under ``bench_inference.SMOKE_DIR``
instead (unless ``--out`` / ``--work`` say otherwise): run names do not carry the step count,
so a 200-step run left in ``runs/small_data`` would be reused by the full benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import torch

from vitkit.studies import data_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inference import SMOKE_DIR, dated_name, machine_info, results_path, work_dir, write_json_atomic  # noqa: E402

FRACTIONS = (0.01, 0.1, 1.0)
DEFAULT_ARMS = ("vit", "convit", "deit", "resnet")
#: --smoke: the options a smoke check runs with (explicit options win)
SMOKE = {"arms": ["vit", "resnet"], "fractions": [0.01], "steps": 30, "warmup": 5}

#: arm -> (model name, model_args, extra training options, what it is): one definition, the
#: data-size study's (``vitkit study data-size`` runs three of these arms at four label fractions)
ARMS: Dict[str, Dict[str, Any]] = data_size.ARMS


def run_name(arm: str, fraction: float, seed: int) -> str:
    return f"{arm}-f{fraction:g}-s{seed}"


#: the regularisers the recipe adds (fmnist-adamw's), off where an arm sets none of its own
PLAIN = {"label_smoothing": 0.0, "random_erasing": 0.0}


def run_config(arm: str, fraction: float, seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    """The TrainConfig fields of one run (written to a JSON file and given to ``vitkit train --config``)."""
    # the arms without DeiT's regularisers train without the recipe's too, as measured (2026-11-22)
    cfg = {**PLAIN, **data_size.train_config(arm, fraction, args.steps, args.warmup), "seed": seed,
           "runs_dir": str(args.work), "name": run_name(arm, fraction, seed), "tensorboard": False,
           "threads": args.threads}
    if args.data_dir:
        cfg["data_dir"] = args.data_dir
    if "teacher_arm" in ARMS[arm]:
        cfg["teacher"] = str(args.work / run_name(ARMS[arm]["teacher_arm"], fraction, seed) / "model")
    return cfg


def train_one(arm: str, fraction: float, seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    """Run (or reuse) one ``vitkit train``; its JSON summary plus the wall time."""
    name = run_name(arm, fraction, seed)
    run_dir = args.work / name
    if (run_dir / "summary.json").is_file():
        return json.loads((run_dir / "summary.json").read_text())
    teacher = ARMS[arm].get("teacher_arm")
    if teacher and not (args.work / run_name(teacher, fraction, seed) / "model").is_dir():
        raise SystemExit(f"{arm} needs the {teacher} arm's model of the same fraction and seed first: "
                         f"list {teacher} before {arm} in --arms")
    if run_dir.exists():  # an interrupted run: start it again from scratch
        shutil.rmtree(run_dir)
    args.work.mkdir(parents=True, exist_ok=True)
    cfg_file = args.work / f"{name}.json"
    cfg_file.write_text(json.dumps(run_config(arm, fraction, seed, args), indent=1))
    # the recipe it was measured with, on every machine (naming none picks one by the machine's precision)
    cmd = [sys.executable, "-m", "vitkit", "train", "--recipe", "fmnist-adamw", "--config", str(cfg_file), "--json",
           "--no-progress"]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    summary["wall_seconds"] = round(time.time() - t0, 1)
    return summary


def _accuracies(results: Dict[str, Any], arm: str, fraction: float) -> List[float]:
    """Test top-1 of every seed of one arm at one fraction."""
    return [r["test_top1"] for r in results["runs"].values() if r["arm"] == arm and r["fraction"] == fraction]


def table(results: Dict[str, Any]) -> str:
    """Markdown: one row per arm, test top-1 (mean over seeds, +- std when several) per fraction."""
    fractions = results["settings"]["fractions"]
    head = "| model | params | " + " | ".join(f"{100 * f:g}% ({results['n_labels'][str(f)]:,} labels)"
                                               for f in fractions) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(fractions)]
    for arm in results["settings"]["arms"]:
        cells = []
        for f in fractions:
            accs = _accuracies(results, arm, f)
            if not accs:
                cells.append("–")
                continue
            mean = 100 * statistics.mean(accs)
            cells.append(f"{mean:.1f}%" + (f" ± {100 * statistics.stdev(accs):.1f}" if len(accs) > 1 else ""))
        params = next((r["params"] for r in results["runs"].values() if r["arm"] == arm), 0)
        lines.append(f"| {ARMS[arm]['label']} | {params / 1e6:.2f}M | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: Dict[str, Any], path: Path) -> None:
    """Test top-1 against the number of labels (log axis), one line per arm."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for arm in results["settings"]["arms"]:
        xs, ys = [], []
        for f in results["settings"]["fractions"]:
            accs = _accuracies(results, arm, f)
            if accs:
                xs.append(results["n_labels"][str(f)])
                ys.append(100 * statistics.mean(accs))
        ax.plot(xs, ys, marker="o", label=ARMS[arm]["label"])
    ax.set_xscale("log")
    ax.set_xlabel("labelled training images (log scale)")
    ax.set_ylabel("test top-1 (%)")
    ax.set_title(f"Fashion-MNIST, {results['settings']['steps']} steps of 128 for every run")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), help=f"default: {' '.join(DEFAULT_ARMS)}")
    ap.add_argument("--fractions", nargs="+", type=float, help=f"default: {' '.join(map(str, FRACTIONS))}")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--steps", type=int, help=f"optimiser steps of batch 128, every run (default {data_size.STEPS})")
    ap.add_argument("--warmup", type=int, help=f"warm-up steps (default {data_size.WARMUP})")
    ap.add_argument("--threads", type=int, help="torch threads per run (default: torch's)")
    ap.add_argument("--data-dir", help="Fashion-MNIST files (default: vitkit's search order)")
    ap.add_argument("--work", type=Path, help=f"run directories (default runs/small_data; smoke: "
                                              f"{SMOKE_DIR}/small_data)")
    ap.add_argument("--out", help="results file, or a folder for the default name (default benchmarks/results/"
                                  f"small_data_<device>_<date>.json; smoke: the same name in {SMOKE_DIR})")
    ap.add_argument("--table", type=Path, help="also write the Markdown table here")
    ap.add_argument("--figure", type=Path, help="also write the figure (PNG) here")
    ap.add_argument("--smoke", action="store_true", help="smoke check: " + ", ".join(
        f"{k} {v}" for k, v in SMOKE.items()) + " (explicit options win)")
    args = ap.parse_args(argv)
    defaults = {"arms": list(DEFAULT_ARMS), "fractions": list(FRACTIONS), "steps": data_size.STEPS,
                "warmup": data_size.WARMUP}
    for key, value in (SMOKE if args.smoke else defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.work = work_dir(args.work, "small_data", args.smoke)
    if any(not 0 < f <= 1 for f in args.fractions):
        ap.error("fractions must be in (0, 1]")

    info = machine_info(torch.device("cpu"))
    out = results_path(args.out, dated_name("small_data", torch.device("cpu"), info), smoke=args.smoke)
    results: Dict[str, Any] = {
        "benchmark": "small_data", "date": datetime.date.today().isoformat(), "machine": info,
        "settings": {"arms": args.arms, "fractions": args.fractions, "seeds": args.seeds, "steps": args.steps,
                     "batch_size": 128, "warmup_steps": args.warmup},
        "arms": {a: ARMS[a] for a in args.arms}, "n_labels": {}, "runs": {}}
    jobs = [(a, f, s) for s in args.seeds for f in args.fractions for a in args.arms]
    for i, (arm, fraction, seed) in enumerate(jobs, 1):
        name = run_name(arm, fraction, seed)
        print(f"[{i}/{len(jobs)}] {name} ...", end=" ", flush=True)
        summary = train_one(arm, fraction, seed, args)
        cfg = json.loads((args.work / name / "config.json").read_text())
        results["runs"][name] = {"arm": arm, "fraction": fraction, "seed": seed, **summary, "config": cfg}
        results["n_labels"][str(fraction)] = summary["train_images"]
        print(f"test top-1 {100 * summary['test_top1']:.2f}%  ({summary['seconds']:.0f} s, "
              f"{summary['train_img_s']:.0f} img/s)", flush=True)
        write_json_atomic(out, results)  # after every run: nothing finished is lost
    md = table(results)
    print("\n" + md)
    print(f"\nwrote {out}")
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(md + "\n")
    if args.figure:
        plot(results, args.figure)
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
